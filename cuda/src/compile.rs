//! The CUDA C kernels (`cuda/kernels/*.cu`, one file per op family named like its WGSL twin,
//! each compiled with `common.cuh` before it) and their compilation by NVRTC to a cubin for
//! the device's architecture, cached on disk keyed by the source's hash, NVRTC's version and
//! the architecture, so that a run compiles each kernel once per machine.
//!
//! Unstable: public for Alpha's tools and tests; it changes with any release (see the crate's
//! Stability section).

use crate::error::CudaError;
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::ffi::{c_char, CString};
use std::path::PathBuf;

/// What every kernel file starts with.
const COMMON: &str = include_str!("../kernels/common.cuh");

/// The kernel files: (name, source).
pub const SOURCES: [(&str, &str); 11] = [
    ("embedding", include_str!("../kernels/embedding.cu")),
    ("layernorm", include_str!("../kernels/layernorm.cu")),
    ("rmsnorm", include_str!("../kernels/rmsnorm.cu")),
    ("matmul", include_str!("../kernels/matmul.cu")),
    ("row_blocks", include_str!("../kernels/row_blocks.cu")),
    ("attention", include_str!("../kernels/attention.cu")),
    ("cross_entropy", include_str!("../kernels/cross_entropy.cu")),
    ("dropout", include_str!("../kernels/dropout.cu")),
    ("adamw", include_str!("../kernels/adamw.cu")),
    ("grad_norm", include_str!("../kernels/grad_norm.cu")),
    ("peak", include_str!("../kernels/peak.cu")),
];

/// The kernels' entry points, by file.
pub const ENTRY_POINTS: [(&str, &[&str]); 11] = [
    ("embedding", &["embedding_forward", "embedding_backward_tokens", "embedding_backward_positions"]),
    ("layernorm", &["layernorm_forward", "layernorm_forward_bf16", "layernorm_backward_input", "layernorm_params_partials"]),
    ("rmsnorm", &["rmsnorm_forward", "rmsnorm_forward_bf16", "rmsnorm_backward_input", "rmsnorm_weight_partials"]),
    (
        "matmul",
        &[
            "matmul_epilogue",
            "matmul_epilogue_bf16",
            "gelu_backward",
            "swiglu_forward",
            "swiglu_forward_bf16",
            "swiglu_backward",
            "bias_grad_partials",
            "round_to_bf16",
            "add_weight_grad_slices",
        ],
    ),
    ("row_blocks", &["add_partials"]),
    (
        "attention",
        &[
            "attention_forward",
            "attention_backward_query",
            "attention_backward_key_value",
            "attention_forward_bf16",
            "attention_backward_query_bf16",
            "attention_backward_key_value_bf16",
            "attention_sum_key_value",
            "attention_rope_backward",
            "attention_decode",
            "attention_tensor_forward",
            "attention_tensor_backward_query",
            "attention_tensor_backward_key_value",
            "attention_tensor_forward_bf16",
            "attention_tensor_backward_query_bf16",
            "attention_tensor_backward_key_value_bf16",
            "attention_tf32x3_forward",
            "attention_tf32x3_backward_query",
            "attention_tf32x3_backward_key_value",
        ],
    ),
    ("cross_entropy", &["cross_entropy", "add_mean_loss"]),
    ("dropout", &["dropout"]),
    ("adamw", &["adamw"]),
    ("grad_norm", &["sum_squares_partials", "check_step"]),
    ("peak", &["copy_bandwidth"]),
];

/// The whole source NVRTC compiles for kernel file `source`: the core's row block (the
/// column sums' grouping, see row_blocks.cu), `common.cuh`, the file.
pub fn full_source(source: &str) -> String {
    format!("#define ROW_BLOCK {}\n{COMMON}\n{source}", alpha_core::ops::row_blocks::ROW_BLOCK)
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| CudaError::new(format!("NVRTC: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles kernel file `name` for `arch` (`"sm_90"`): a cubin for a real architecture,
/// PTX for a virtual one (`"compute_90"`). A compile error carries NVRTC's log.
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    compile_with(name, source, arch, false).map(|(image, _)| image)
}

/// As [`compile`] for a real architecture, with ptxas's report of each kernel (`Compiling
/// entry function`, its registers, spills and shared memory: `--ptxas-options=--verbose`).
pub fn compile_verbose(name: &str, source: &str, arch: &str) -> Result<(Vec<u8>, String), CudaError> {
    compile_with(name, source, arch, true)
}

fn compile_with(name: &str, source: &str, arch: &str, verbose: bool) -> Result<(Vec<u8>, String), CudaError> {
    let src = CString::new(full_source(source)).expect("kernel sources hold no NUL");
    let file = CString::new(format!("{name}.cu")).expect("kernel names hold no NUL");
    let fail = |what: &str, e: nvrtc::NvrtcError| CudaError::new(format!("NVRTC {what} {name}.cu: {e:?}"));
    let prog = nvrtc::create_program(&src, Some(&file)).map_err(|e| fail("could not create", e))?;
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "--fmad=true".to_string()];
    if verbose {
        options.push("--ptxas-options=--verbose".to_string());
    }
    // SAFETY: `prog` lives until destroyed below; the out-buffers are sized as NVRTC says.
    let result = unsafe {
        let compiled = nvrtc::compile_program(prog, &options);
        let log = nvrtc::get_program_log(prog).map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>()).unwrap_or_default();
        let log = log.trim_end_matches('\0').to_string();
        match compiled {
            Err(e) => Err(CudaError::new(format!("NVRTC could not compile {name}.cu for {arch} ({e:?}):\n{log}"))),
            Ok(()) if arch.starts_with("sm_") => binary(prog, nvrtc_sys::nvrtcGetCUBINSize, nvrtc_sys::nvrtcGetCUBIN).map_err(|e| fail("gave no cubin for", e)),
            Ok(()) => binary(prog, nvrtc_sys::nvrtcGetPTXSize, nvrtc_sys::nvrtcGetPTX).map_err(|e| fail("gave no PTX for", e)),
        }
        .map(|image| (image, log))
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

type SizeFn = unsafe fn(nvrtc_sys::nvrtcProgram, *mut usize) -> nvrtc_sys::nvrtcResult;
type CopyFn = unsafe fn(nvrtc_sys::nvrtcProgram, *mut c_char) -> nvrtc_sys::nvrtcResult;

/// # Safety
/// `prog` was compiled and not destroyed.
unsafe fn binary(prog: nvrtc_sys::nvrtcProgram, size: SizeFn, copy: CopyFn) -> Result<Vec<u8>, nvrtc::NvrtcError> {
    let mut len = 0;
    // SAFETY: forwarded to the caller; the buffer has the size NVRTC gave.
    unsafe {
        size(prog, &mut len).result()?;
        let mut out = vec![0u8; len];
        copy(prog, out.as_mut_ptr() as *mut c_char).result()?;
        Ok(out)
    }
}

/// Where compiled kernels are kept: `$ALPHA_CUDA_CACHE`, else `$XDG_CACHE_HOME/alpha/cuda`,
/// else `~/.cache/alpha/cuda`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ALPHA_CUDA_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("alpha").join("cuda"))
}

/// FNV-1a over the bytes: the cache key of a source (not a defence against tampering: the
/// cache is the user's own).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Kernel file `name`'s cubin for `arch`, from the cache or compiled now (and cached: written
/// to a temporary file and renamed, so a reader never sees half of one; a cache that cannot be
/// written only costs the compile next time).
pub fn cubin(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let (major, minor) = nvrtc_version()?;
    let key = format!("{name}-{:016x}-nvrtc{major}.{minor}-{arch}.cubin", fnv1a(full_source(source).as_bytes()));
    let path = cache_dir().map(|d| d.join(key));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let bytes = compile(name, source, arch)?;
    if let Some(path) = path {
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let written = path.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok()) && std::fs::write(&tmp, &bytes).is_ok();
        if !(written && std::fs::rename(&tmp, &path).is_ok()) {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(bytes)
}
