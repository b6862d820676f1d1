//! Run-time SIMD dispatch for the element-wise loops outside the GEMM.
//!
//! Unstable: public for the CPU kernels and the tests; it changes with any release (see the
//! crate's Stability section).
//!
//! `wide_dispatch!` defines a function that runs a loop body compiled again with AVX-512
//! or with AVX2 enabled, whichever is the widest the CPU has (detected at run time with
//! `std`), else the baseline build. Every build performs the same IEEE operations (no FMA
//! contraction, and sums in the order the code spells out), so results are bit-identical
//! whichever runs.

/// The widest vector extension this CPU has of those Alpha's kernels are compiled for: the
/// element-wise loops (`wide_dispatch!`) and the GEMM's micro-kernel both follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// AVX-512 (F, DQ, VL, BW): 16 f32 lanes.
    Avx512,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2,
    /// What the build targets (SSE2 on x86-64).
    Baseline,
}

/// The [`Width`] the kernels run at here: detected at run time with `std` (once; less what
/// `ALPHA_CPU_MASK` masks: [`masked`]), else what the build enables.
#[inline]
pub fn width() -> Width {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        static WIDTH: std::sync::OnceLock<Width> = std::sync::OnceLock::new();
        *WIDTH.get_or_init(|| {
            macro_rules! has {
                ($feature:tt) => {
                    std::is_x86_feature_detected!($feature) && !masked($feature)
                };
            }
            if has!("avx512f") && has!("avx512dq") && has!("avx512vl") && has!("avx512bw") {
                Width::Avx512
            } else if has!("avx2") && has!("fma") {
                Width::Avx2
            } else {
                Width::Baseline
            }
        })
    }
    #[cfg(not(all(target_arch = "x86_64", feature = "std")))]
    {
        if cfg!(all(target_arch = "x86_64", target_feature = "avx512f", target_feature = "avx512dq", target_feature = "avx512vl", target_feature = "avx512bw"))
        {
            return Width::Avx512;
        }
        if cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")) {
            return Width::Avx2;
        }
        Width::Baseline
    }
}

/// The CPU features `ALPHA_CPU_MASK` may name.
pub const MASKABLE: &[&str] = &["avx512f", "avx512dq", "avx512vl", "avx512bw", "avx512bf16", "avx2", "fma"];

/// Whether `ALPHA_CPU_MASK` names `feature` ([`masked_names`]): the kernels then run as on a
/// CPU without it. It measures and tests the narrower kernels, and the errors where one is
/// missing, on a CPU that has the wider ones (e.g. `ALPHA_CPU_MASK=avx512bf16`: no bf16
/// products; `avx512f`: the AVX2 kernels).
#[cfg(feature = "std")]
pub fn masked(feature: &str) -> bool {
    masked_names().any(|f| f == feature)
}

/// The CPU feature names `ALPHA_CPU_MASK` gives (comma-separated; read once), each meant to
/// be one of [`MASKABLE`] (the CLI refuses others).
#[cfg(feature = "std")]
pub fn masked_names() -> impl Iterator<Item = &'static str> {
    static MASK: std::sync::OnceLock<std::string::String> = std::sync::OnceLock::new();
    MASK.get_or_init(|| std::env::var("ALPHA_CPU_MASK").unwrap_or_default()).split(',').map(str::trim).filter(|f| !f.is_empty())
}

/// Asks the CPU to bring the cache line at `at` into the caches ahead of its use (x86's
/// `prefetcht0`; nothing elsewhere). Streaming loops that read several rows at once call it a
/// few lines ahead of each (the one-row matmul that decodes a token streams every weight).
/// Any address is allowed: a prefetch never faults.
#[inline(always)]
pub fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching reads nothing architecturally and never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// `wide_dispatch!(pub fn name<T>(args) => body_fn)` defines `name`, which calls the
/// `#[inline(always)]` function `body_fn(args)` compiled for the CPU's [`width`]. With
/// `=> avx512_body, body_fn` it calls `avx512_body` instead where the width is AVX-512 (a
/// body built for AVX-512's registers, such as a wider step).
macro_rules! wide_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident<T>($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        $crate::simd::wide_dispatch!($(#[$meta])* $vis fn $name<T>($($arg: $ty),*) => $body, $body);
    };
    ($(#[$meta:meta])* $vis:vis fn $name:ident<T>($($arg:ident: $ty:ty),* $(,)?) => $avx512_body:path, $body:path) => {
        $(#[$meta])*
        $vis fn $name<T: $crate::float::Float>($($arg: $ty),*) {
            #[cfg(all(target_arch = "x86_64", feature = "std"))]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
                        unsafe fn avx512<T: $crate::float::Float>($($arg: $ty),*) {
                    $avx512_body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                        unsafe fn avx2<T: $crate::float::Float>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                match $crate::simd::width() {
                    // SAFETY: the CPU has the features (detected).
                    $crate::simd::Width::Avx512 => return unsafe { avx512::<T>($($arg),*) },
                    // SAFETY: as above.
                    $crate::simd::Width::Avx2 => return unsafe { avx2::<T>($($arg),*) },
                    $crate::simd::Width::Baseline => {}
                }
            }
            // Without run-time detection the width is the build's own.
            #[cfg(not(all(target_arch = "x86_64", feature = "std")))]
            if $crate::simd::width() == $crate::simd::Width::Avx512 {
                return $avx512_body($($arg),*);
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use wide_dispatch;
