//! The machine: CPU model, SIMD features found at run time, and its peak GFLOP/s, measured
//! with a short calibrated GEMM run on every thread and cached per CPU, thread count and
//! kernel (no table of known CPUs).

use crate::fsutil::write_atomic;
use alpha_core::gemm::f32_kernel_name;
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_gpu::peak::Real;
use alpha_gpu::{block_on, Gpu};
use anyhow::{anyhow, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

/// A peak and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Peak {
    /// Peak GFLOP/s of all threads together.
    pub gflops: f64,
    /// `"given"` (`--peak-gflops`), `"measured"` or `"cached"` (measured by an earlier run).
    pub source: &'static str,
}

/// This machine as reports describe it: the CPU, its cores, the threads used, the SIMD
/// features and the GEMM kernel they select.
pub fn machine_json(pool: &ThreadPool) -> serde_json::Value {
    serde_json::json!({
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "threads": pool.threads(),
        "simd": simd_features(),
        "gemm_kernel": alpha_core::gemm::f32_kernel_name(),
    })
}

/// The CPU's model name (`/proc/cpuinfo`), or the architecture where that is unknown.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|m| m.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// SIMD features of this CPU that Alpha's kernels use, detected at run time, less those
/// `ALPHA_CPU_MASK` names (the kernels run as without them).
pub fn simd_features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        let all = [
            ("sse2", has!("sse2")),
            ("avx", has!("avx")),
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("avx512f", has!("avx512f")),
            ("avx512dq", has!("avx512dq")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512bf16", has!("avx512bf16")),
        ];
        all.into_iter().filter(|&(name, on)| on && !alpha_core::simd::masked(name)).map(|(name, _)| name).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Where measured peaks are cached: `$ALPHA_CACHE_DIR`, else `$XDG_CACHE_HOME/alpha`, else
/// `$HOME/.cache/alpha`.
fn cache_file() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir =
        env("ALPHA_CACHE_DIR").or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("alpha"))).or_else(|| env("HOME").map(|d| d.join(".cache").join("alpha")))?;
    Some(dir.join("peak.json"))
}

/// The peak for `pool`: `given`, else the cached measurement, else a new one (then cached).
pub fn peak(pool: &ThreadPool, given: Option<f64>) -> Result<Peak> {
    cached_peak(pool, given, false)
}

/// [`peak`], measured again even when cached (`info`): the cache keeps the highest
/// measurement, so one taken while other work shared the cores (too low, and every MFU after
/// it too high) is replaced by the next one on a quiet machine.
pub fn measured_peak(pool: &ThreadPool, given: Option<f64>) -> Result<Peak> {
    cached_peak(pool, given, true)
}

fn cached_peak(pool: &ThreadPool, given: Option<f64>, remeasure: bool) -> Result<Peak> {
    let key = format!("{} | {} threads | {}", cpu_model(), pool.threads(), f32_kernel_name());
    cached(&key, given, remeasure, || Ok(measure(pool)))
}

/// The arithmetic limit of `gpu`'s FMA units in GFLOP/s for `real` (f32: the MFU
/// denominator of f32 runs): `given`, else the cached measurement for this adapter and driver
/// (measured again with `remeasure`, as [`measured_peak`]), else a new one (then cached).
pub fn gpu_peak(gpu: &Gpu, real: Real, given: Option<f64>, remeasure: bool) -> Result<Peak> {
    // "all lanes": the probe since every lane of its chains is read (earlier probes' cached
    // figures counted lanes the compiler had dropped, and stay unread).
    let key = format!("gpu {} | {} | {real:?} FMA all lanes", gpu.adapter.name, gpu.adapter.driver);
    cached(&key, given, remeasure, || measure_gpu(gpu, real))
}

/// [`alpha_gpu::peak::measure`] on `gpu`, timed by this machine's clock.
fn measure_gpu(gpu: &Gpu, real: Real) -> Result<f64> {
    Ok(on_clock(|now| block_on(alpha_gpu::peak::measure(gpu, real, now)))?)
}

/// `f` given this machine's clock: seconds since the call (the core's measurements take the
/// caller's clock).
fn on_clock<R>(f: impl FnOnce(&dyn Fn() -> f64) -> R) -> R {
    let start = Instant::now();
    f(&|| start.elapsed().as_secs_f64())
}

/// `given`, else the peak cached under `key`, else (or with `remeasure`) `measure()`'s, which
/// the cache keeps when it is the highest so far.
fn cached(key: &str, given: Option<f64>, remeasure: bool, measure: impl FnOnce() -> Result<f64>) -> Result<Peak> {
    if let Some(p) = peak_given(given)? {
        return Ok(p);
    }
    let file = cache_file();
    let mut cache: BTreeMap<String, f64> =
        file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    let cached = cache.get(key).copied();
    if let (Some(g), false) = (cached, remeasure) {
        return Ok(Peak { gflops: g, source: "cached" });
    }
    let gflops = measure()?.max(cached.unwrap_or(0.0));
    if let Some(f) = file {
        cache.insert(key.to_string(), gflops);
        // A cache that cannot be written only costs a new measurement next time.
        let _ = std::fs::create_dir_all(f.parent().expect("cache file in a directory"))
            .and_then(|_| write_atomic(&f, serde_json::to_string_pretty(&cache).expect("a map of numbers").as_bytes()));
    }
    Ok(Peak { gflops, source: "measured" })
}

/// The peak `--peak-gflops` gives, if any (an error unless it is a positive number).
fn peak_given(given: Option<f64>) -> Result<Option<Peak>> {
    match given {
        Some(g) if !(g.is_finite() && g > 0.0) => Err(anyhow!("--peak-gflops must be a positive number, got {g}")),
        Some(gflops) => Ok(Some(Peak { gflops, source: "given" })),
        None => Ok(None),
    }
}

/// The GEMM's peak on every thread of `pool` (alpha-core's measurement on this clock).
fn measure(pool: &ThreadPool) -> f64 {
    on_clock(|now| alpha_core::gemm::peak_gflops(pool, now))
}

/// The bf16 GEMM's peak on every thread of `pool`, measured now; `None` where the CPU has no
/// bf16 kernel.
fn measure_bf16(pool: &ThreadPool) -> Option<f64> {
    on_clock(|now| alpha_core::gemm::bf16::peak_gflops(pool, now))
}

/// The bf16 GEMM's peak for `pool` (the MFU denominator of bf16 runs), as [`peak`] gives the
/// f32 one: `given`, else the cached measurement, else a new one (then cached). An error where
/// the CPU has no bf16 kernel.
pub fn bf16_peak(pool: &ThreadPool, given: Option<f64>) -> Result<Peak> {
    cached_bf16_peak(pool, given, false)
}

/// [`bf16_peak`], measured again even when cached, as [`measured_peak`] (`info`); `None`
/// where the CPU has no bf16 kernel.
pub fn measured_bf16_peak(pool: &ThreadPool) -> Option<f64> {
    cached_bf16_peak(pool, None, true).ok().map(|p| p.gflops)
}

fn cached_bf16_peak(pool: &ThreadPool, given: Option<f64>, remeasure: bool) -> Result<Peak> {
    let no_bf16 = || anyhow!("this CPU has no bf16 products (AVX512-BF16)");
    let kernel = alpha_core::gemm::bf16::bf16_kernel_name().ok_or_else(no_bf16)?;
    let key = format!("{} | {} threads | {kernel}", cpu_model(), pool.threads());
    cached(&key, given, remeasure, || measure_bf16(pool).ok_or_else(no_bf16))
}

/// Memory read bandwidth in GB/s, all threads of `pool` at once, the best round
/// ([`alpha_core::parallel::best_rate`]): what streaming a model's weights once per token
/// (sampling a token with the KV cache) can reach at best. The buffer is twice the last-level
/// cache (at least 256 MiB, at most 2 GiB): a smaller one is read from the cache, not from
/// memory. Each thread reads its share as eight streams at once, prefetching ahead, the
/// pattern that read fastest (docs/performance.md, "Kernel choices").
pub fn memory_bandwidth(pool: &ThreadPool) -> f64 {
    const MIB: usize = 1 << 20;
    let bytes = (2 * last_level_cache_bytes().unwrap_or(0)).clamp(256 * MIB, 2048 * MIB);
    // Whole 64-byte lines per stream.
    let per_thread = bytes / 4 / pool.threads() / (READ_STREAMS * 16) * (READ_STREAMS * 16);
    // Not zeros: a zeroed allocation's pages may all map one shared zero page.
    let buffers: Vec<Vec<f32>> = (0..pool.threads()).map(|i| vec![i as f32 + 1.0; per_thread]).collect();
    let sink = Mutex::new(0f32);
    best_rate(pool, 1, (per_thread * 4) as f64, &|i, reps| {
        let total: f32 = (0..reps).map(|_| read_streams(&buffers[i])).sum();
        // Used, so that the reads are not optimised away.
        *sink.lock().unwrap_or_else(|e| e.into_inner()) += total;
    })
}

/// Streams [`read_streams`] reads at once.
const READ_STREAMS: usize = 8;

/// The sum of `data` (a multiple of `READ_STREAMS * 16` values), read as [`READ_STREAMS`]
/// consecutive parts at once, 16 lanes each, each prefetched 512 bytes ahead (as the one-row
/// matmul reads its weight rows).
fn read_streams(data: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[target_feature(enable = "avx512f")]
        fn wide(data: &[f32]) -> f32 {
            read_streams_body(data)
        }
        // SAFETY: the CPU has AVX-512F (detected).
        return unsafe { wide(data) };
    }
    read_streams_body(data)
}

#[inline(always)]
fn read_streams_body(data: &[f32]) -> f32 {
    let part = data.len() / READ_STREAMS;
    let mut lanes = [[0f32; 16]; READ_STREAMS];
    for at in (0..part).step_by(16) {
        for (s, lanes) in lanes.iter_mut().enumerate() {
            let line = &data[s * part + at..s * part + at + 16];
            alpha_core::simd::prefetch(line.as_ptr().wrapping_add(128));
            for (l, x) in lanes.iter_mut().zip(line) {
                *l += x;
            }
        }
    }
    lanes.iter().flatten().sum()
}

/// The size of the last-level cache in bytes, where Linux says it (sysfs).
fn last_level_cache_bytes() -> Option<usize> {
    let caches = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let level_and_size = |dir: PathBuf| -> Option<(u32, usize)> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let level = read("level")?.trim().parse().ok()?;
        let size = read("size")?;
        let size = size.trim();
        let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
        let scale = match unit {
            "" => 1,
            "K" => 1 << 10,
            "M" => 1 << 20,
            "G" => 1 << 30,
            _ => return None,
        };
        Some((level, digits.parse::<usize>().ok()? * scale))
    };
    caches.filter_map(|e| level_and_size(e.ok()?.path())).max().map(|(_, size)| size)
}

/// alpha-core's [`alpha_core::parallel::best_rate`] on `pool`, timed by this machine's clock.
fn best_rate(pool: &ThreadPool, unit: usize, flops_per_rep: f64, work: &(dyn Fn(usize, usize) + Sync)) -> f64 {
    on_clock(|now| alpha_core::parallel::best_rate(pool, unit, flops_per_rep, work, now))
}

/// The cores' arithmetic limit in GFLOP/s, all threads together: each thread runs independent
/// chains of the GEMM kernel's vector FMAs on registers only (no loads or stores), the best
/// round ([`alpha_core::parallel::best_rate`]). No GEMM, Alpha's or any library's, can run
/// faster at the same clock; but boost clocks follow the load, so the two compare only when
/// measured together.
/// `None` where the GEMM kernel has no vector FMA (the portable and WebAssembly builds).
pub fn fma_limit(pool: &ThreadPool) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use alpha_core::simd::{width, Width};
        /// Chains per thread: more than an FMA's latency times the FMA pipes of current x86
        /// cores (4-5 cycles x 2), and few enough to stay in the 16 AVX2 registers.
        const CHAINS: usize = 12;
        /// `$name(reps)`: `reps` rounds of one FMA on each chain's register; returns the first
        /// lane of their sum, so that the work is not optimised away.
        macro_rules! chains {
            ($name:ident, $features:literal, $vec:ty, $splat:ident, $fmadd:ident, $add:ident, $first:ident) => {
                #[target_feature(enable = $features)]
                fn $name(reps: usize) -> f32 {
                    use std::arch::x86_64::*;
                    let (a, b) = ($splat(0.999_999), $splat(1e-7));
                    let mut acc: [$vec; CHAINS] = [$splat(1.0); CHAINS];
                    for _ in 0..reps {
                        for x in &mut acc {
                            *x = $fmadd(*x, a, b);
                        }
                    }
                    $first(acc.into_iter().fold($splat(0.0), |s, x| $add(s, x)))
                }
            };
        }
        chains!(avx512, "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_cvtss_f32);
        chains!(avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32);
        let (lanes, run): (usize, fn(usize) -> f32) = match width() {
            // SAFETY (both): the CPU has the features the function enables (detected).
            Width::Avx512 => (16, |reps| unsafe { avx512(reps) }),
            Width::Avx2 => (8, |reps| unsafe { avx2(reps) }),
            Width::Baseline => return None,
        };
        Some(best_rate(pool, 100_000, 2.0 * (CHAINS * lanes) as f64, &|_, reps| {
            std::hint::black_box(run(std::hint::black_box(reps)));
        }))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = pool;
        None
    }
}
