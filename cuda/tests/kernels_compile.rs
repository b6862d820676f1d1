//! Every kernel file compiles with NVRTC, for the lent H200's architecture and the oldest
//! one bf16 products need, and no kernel spills registers to local memory there (ptxas's
//! report: a spilling kernel is slow on every card): no GPU needed, only NVRTC's library (CI
//! installs PyPI's `nvidia-cuda-nvrtc`, pinned to CUDA 13.0, and sets `ALPHA_REQUIRE_NVRTC=1`
//! so that a missing library fails instead of skipping).

use alpha_cuda::compile::{compile_verbose, SOURCES};

/// The kernels of ptxas's `report` that spill registers, with the line saying how much.
fn spills(report: &str) -> Vec<String> {
    let mut kernel = "";
    let mut found = Vec::new();
    for line in report.lines() {
        if let Some(name) = line.split("Compiling entry function '").nth(1) {
            kernel = name.split('\'').next().unwrap_or(name);
        }
        if line.contains("bytes spill stores") && !line.contains(" 0 bytes spill stores, 0 bytes spill loads") {
            found.push(format!("{kernel}: {}", line.trim()));
        }
    }
    found
}

#[test]
fn every_kernel_compiles_for_sm_80_and_sm_90() {
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        assert!(std::env::var_os("ALPHA_REQUIRE_NVRTC").is_none(), "ALPHA_REQUIRE_NVRTC is set but NVRTC's library was not found (LD_LIBRARY_PATH?)");
        eprintln!("skipped: NVRTC's library (libnvrtc.so) is not on the loader's path");
        return;
    }
    let mut spilled = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        for (name, source) in SOURCES {
            let (cubin, report) = compile_verbose(name, source, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(cubin.starts_with(b"\x7fELF"), "{name} for {arch}: not a cubin");
            assert!(report.contains("Compiling entry function"), "{name} for {arch}: no ptxas report in NVRTC's log:\n{report}");
            spilled.extend(spills(&report).into_iter().map(|s| format!("{arch} {s}")));
        }
    }
    assert!(spilled.is_empty(), "kernels spill registers:\n{}", spilled.join("\n"));
}

#[test]
fn a_spill_in_ptxas_report_is_found() {
    let report = "ptxas info    : Compiling entry function 'a' for 'sm_90'\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                  ptxas info    : Compiling entry function 'b' for 'sm_90'\n    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n";
    assert_eq!(spills(report), ["b: 8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads"]);
}
