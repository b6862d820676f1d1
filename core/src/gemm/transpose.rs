//! Transposes: whole tiles in SIMD registers (8 x 8 with AVX, 4 x 4 with wasm SIMD) for
//! `f32`, the rest element by element.

use crate::float::Float;

/// Transposes `src [rows x cols]` (rows `row_stride` apart, unit column stride) into the
/// contiguous `dst [cols x rows]`: whole 8 x 8 tiles in AVX registers for f32 where the CPU
/// has AVX, the rest element by element.
pub fn transpose<T: Float>(src: &[T], rows: usize, cols: usize, row_stride: usize, dst: &mut [T]) {
    transpose_strided(src, rows, cols, row_stride, dst, rows);
}

/// [`transpose`] into rows `dst_stride` apart (at least `rows`).
pub(crate) fn transpose_strided<T: Float>(src: &[T], rows: usize, cols: usize, row_stride: usize, dst: &mut [T], dst_stride: usize) {
    assert!(rows == 0 || src.len() >= (rows - 1) * row_stride + cols);
    assert!(dst_stride >= rows && (cols == 0 || dst.len() >= (cols - 1) * dst_stride + rows));
    let (full_r, full_c) = transpose_whole_tiles(src, rows, cols, row_stride, dst, dst_stride);
    for r in 0..rows {
        let c_start = if r < full_r { full_c } else { 0 };
        for c in c_start..cols {
            dst[c * dst_stride + r] = src[r * row_stride + c];
        }
    }
}

/// The fast part of [`transpose`]: the whole square tiles (8 x 8 with AVX, 4 x 4 with
/// WebAssembly SIMD) for f32 where the CPU allows; returns the rows and columns they cover
/// (`(0, 0)` where nothing was done).
fn transpose_whole_tiles<T: Float>(src: &[T], rows: usize, cols: usize, row_stride: usize, dst: &mut [T], dst_stride: usize) -> (usize, usize) {
    if core::any::TypeId::of::<T>() != core::any::TypeId::of::<f32>() {
        return (0, 0);
    }
    let (src, dst) = (src.as_ptr().cast::<f32>(), dst.as_mut_ptr().cast::<f32>());
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: T is f32 (checked); the tile is inside both matrices (the caller asserted
        // their sizes); the CPU has AVX (checked).
        return for_whole_tiles(rows, cols, 8, |r, c| unsafe {
            transpose_8x8_avx(src.add(r * row_stride + c), row_stride, dst.add(c * dst_stride + r), dst_stride)
        });
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        // SAFETY: T is f32 (checked); the tile is inside both matrices (the caller asserted
        // their sizes).
        for_whole_tiles(rows, cols, 4, |r, c| unsafe { transpose_4x4_wasm(src.add(r * row_stride + c), row_stride, dst.add(c * dst_stride + r), dst_stride) })
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        let _ = (src, dst, rows, cols, row_stride, dst_stride);
        (0, 0)
    }
}

/// Calls `tile(r, c)` for the top-left corner of every whole `size x size` tile of a
/// `rows x cols` matrix; returns the rows and columns the tiles cover.
#[cfg(any(all(target_arch = "x86_64", feature = "std"), all(target_arch = "wasm32", target_feature = "simd128")))]
#[inline(always)]
fn for_whole_tiles(rows: usize, cols: usize, size: usize, mut tile: impl FnMut(usize, usize)) -> (usize, usize) {
    let (full_r, full_c) = (rows / size * size, cols / size * size);
    for r in (0..full_r).step_by(size) {
        for c in (0..full_c).step_by(size) {
            tile(r, c);
        }
    }
    (full_r, full_c)
}

/// Transposes the 4 x 4 f32 tile at `src` (rows `ld_src` apart) into `dst` (rows `ld_dst`
/// apart) in four `v128` registers.
///
/// # Safety
/// Both tiles must be valid.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline]
unsafe fn transpose_4x4_wasm(src: *const f32, ld_src: usize, dst: *mut f32, ld_dst: usize) {
    use core::arch::wasm32::*;
    // SAFETY: inside the tiles (caller); v128 loads and stores are unaligned.
    unsafe {
        let r: [v128; 4] = core::array::from_fn(|i| v128_load(src.add(i * ld_src).cast()));
        // Interleave pairs of rows, then take the halves of the pairs.
        let lo01 = i32x4_shuffle::<0, 4, 1, 5>(r[0], r[1]);
        let hi01 = i32x4_shuffle::<2, 6, 3, 7>(r[0], r[1]);
        let lo23 = i32x4_shuffle::<0, 4, 1, 5>(r[2], r[3]);
        let hi23 = i32x4_shuffle::<2, 6, 3, 7>(r[2], r[3]);
        v128_store(dst.cast(), i32x4_shuffle::<0, 1, 4, 5>(lo01, lo23));
        v128_store(dst.add(ld_dst).cast(), i32x4_shuffle::<2, 3, 6, 7>(lo01, lo23));
        v128_store(dst.add(2 * ld_dst).cast(), i32x4_shuffle::<0, 1, 4, 5>(hi01, hi23));
        v128_store(dst.add(3 * ld_dst).cast(), i32x4_shuffle::<2, 3, 6, 7>(hi01, hi23));
    }
}

/// Transposes the 8 x 8 f32 tile at `src` (rows `ld_src` apart) into `dst` (rows `ld_dst`
/// apart).
///
/// # Safety
/// The CPU must have AVX; both tiles must be valid.
#[cfg(all(target_arch = "x86_64", feature = "std"))]
#[target_feature(enable = "avx")]
unsafe fn transpose_8x8_avx(src: *const f32, ld_src: usize, dst: *mut f32, ld_dst: usize) {
    use core::arch::x86_64::*;
    // SAFETY: inside the tiles (caller).
    unsafe {
        let r: [__m256; 8] = core::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ld_src)));
        // Interleave pairs of rows, then pairs of pairs, then swap 128-bit halves.
        let t = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for i in 0..4 {
            _mm256_storeu_ps(dst.add(i * ld_dst), _mm256_permute2f128_ps::<0x20>(u[i], u[i + 4]));
            _mm256_storeu_ps(dst.add((i + 4) * ld_dst), _mm256_permute2f128_ps::<0x31>(u[i], u[i + 4]));
        }
    }
}
