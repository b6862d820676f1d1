//! Run-time SIMD dispatch for the element-wise loops outside the GEMM.
//!
//! [`wide_dispatch!`] defines a function that runs a loop body compiled a second time with
//! AVX-512 enabled when the CPU has it (detected at run time with `std`), else the baseline
//! build. Both builds perform the same IEEE operations (no FMA contraction), so results are
//! bit-identical whichever runs.

/// Whether the wide (AVX-512) builds can run here.
#[inline]
pub fn has_avx512() -> bool {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(all(target_arch = "x86_64", feature = "std")))]
    {
        false
    }
}

/// `wide_dispatch!(pub fn name<T>(args) => body_fn)` defines `name`, which calls the
/// `#[inline(always)]` function `body_fn(args)` compiled for AVX-512 where available.
macro_rules! wide_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident<T>($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name<T: $crate::float::Float>($($arg: $ty),*) {
            #[cfg(all(target_arch = "x86_64", feature = "std"))]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide<T: $crate::float::Float>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if $crate::simd::has_avx512() {
                    // SAFETY: the CPU has the features (checked above).
                    return unsafe { wide::<T>($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use wide_dispatch;
