//! Every kernel file compiles with NVRTC, for the lent H200's architecture and the oldest
//! one bf16 products need: no GPU needed, only NVRTC's library (CI installs PyPI's
//! `nvidia-cuda-nvrtc`, pinned to CUDA 13.0, and sets `ALPHA_REQUIRE_NVRTC=1` so that a
//! missing library fails instead of skipping).

use alpha_cuda::compile::{compile, SOURCES};

#[test]
fn every_kernel_compiles_for_sm_80_and_sm_90() {
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        assert!(std::env::var_os("ALPHA_REQUIRE_NVRTC").is_none(), "ALPHA_REQUIRE_NVRTC is set but NVRTC's library was not found (LD_LIBRARY_PATH?)");
        eprintln!("skipped: NVRTC's library (libnvrtc.so) is not on the loader's path");
        return;
    }
    for arch in ["sm_80", "sm_90"] {
        for (name, source) in SOURCES {
            let cubin = compile(name, source, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(cubin.starts_with(b"\x7fELF"), "{name} for {arch}: not a cubin");
        }
    }
}
