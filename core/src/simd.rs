//! Run-time SIMD dispatch for the element-wise loops outside the GEMM.
//!
//! [`wide_dispatch!`] defines a function that runs a loop body compiled again with AVX-512
//! or with AVX2 enabled, whichever is the widest the CPU has (detected at run time with
//! `std`), else the baseline build. Every build performs the same IEEE operations (no FMA
//! contraction, and sums in the order the code spells out), so results are bit-identical
//! whichever runs.

/// The widest vector extension the element-wise loops are compiled for that this CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// AVX-512 (F, DQ, VL, BW): 16 f32 lanes.
    Avx512,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2,
    /// What the build targets (SSE2 on x86-64).
    Baseline,
}

/// The [`Width`] the element-wise loops run at here.
#[inline]
pub fn width() -> Width {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq") {
            return Width::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Width::Avx2;
        }
    }
    Width::Baseline
}

/// `wide_dispatch!(pub fn name<T>(args) => body_fn)` defines `name`, which calls the
/// `#[inline(always)]` function `body_fn(args)` compiled for the CPU's [`width`].
macro_rules! wide_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident<T>($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name<T: $crate::float::Float>($($arg: $ty),*) {
            #[cfg(all(target_arch = "x86_64", feature = "std"))]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512<T: $crate::float::Float>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
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
            $body($($arg),*)
        }
    };
}
pub(crate) use wide_dispatch;
