//! The matrix products through cuBLASLt's `result` layer: column-major `D = A·B (+ D)` with
//! each operand transposed or not, f32 or bf16 operands, f32 sums and output. Each product's
//! algorithm is chosen once, on its first call, among those without split-K reductions (so
//! that every run sums in the same order), and pinned.
//!
//! Unstable: public for Alpha's tools and tests; it changes with any release (see the crate's
//! Stability section).

use crate::device::Device;
use crate::error::CudaError;
use crate::memory::Buffer;
use cudarc::cublaslt::{result as lt, sys};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

/// What the products' operands are and how they are summed (`--precision`, `--tf32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// f32 operands, f32 products and sums (PyTorch's default on CUDA: TF32 off).
    F32,
    /// f32 operands, the products on the tensor cores in TF32 (`--tf32`, PyTorch's `allow_tf32`).
    Tf32,
    /// bf16 operands, f32 sums (sm_80 and later).
    Bf16,
}

/// One product: `D [m, n] = op(A) [m, k] · op(B) [k, n] (+ D)`, column-major, leading
/// dimensions as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Product {
    /// A is stored `[k, m]` and transposed.
    pub transpose_a: bool,
    /// B is stored `[n, k]` and transposed.
    pub transpose_b: bool,
    /// Rows of D.
    pub m: usize,
    /// Columns of D.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// D += the product, instead of D = it.
    pub accumulate: bool,
}

/// What picks an algorithm: the product and its operands' alignments (cuBLASLt's fast
/// algorithms assume aligned operands).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    product: Product,
    align: [u32; 3],
}

/// A product's descriptors and its pinned algorithm.
struct Pinned {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

/// The bytes of workspace cuBLASLt may use (its recommendation on Hopper).
const WORKSPACE: usize = 32 << 20;

/// The products of one engine, in one [`Arithmetic`].
pub struct Products {
    arithmetic: Arithmetic,
    workspace: Buffer,
    pinned: RefCell<HashMap<Key, Pinned>>,
}

fn blas(what: &str) -> impl FnOnce(lt::CublasError) -> CudaError + '_ {
    move |e| CudaError::new(format!("cuBLASLt: {what}: {e}"))
}

/// The largest power of two dividing `ptr`, at most 256 bytes.
fn alignment(ptr: u64) -> u32 {
    1 << (ptr | 256).trailing_zeros()
}

impl Products {
    /// Products in `arithmetic` (an error where the device lacks it).
    pub fn new(device: &Device, arithmetic: Arithmetic) -> Result<Products, CudaError> {
        if arithmetic == Arithmetic::Bf16 && !device.info.has_bf16() {
            return Err(CudaError::new(format!("--precision bf16 needs sm_80 or later; {} is {}", device.info.name, device.info.arch())));
        }
        Ok(Products { arithmetic, workspace: Buffer::zeroed(device, "cuBLASLt's workspace", WORKSPACE, 1)?, pinned: RefCell::new(HashMap::new()) })
    }

    /// The arithmetic.
    pub fn arithmetic(&self) -> Arithmetic {
        self.arithmetic
    }

    /// Queues `p` with `a` and `b` (bf16 under [`Arithmetic::Bf16`], else f32) into f32 `d`.
    ///
    /// # Safety
    /// The pointers hold the operands `p` describes, stored densely (leading dimension the
    /// stored rows), and `d` overlaps neither.
    pub unsafe fn run(&self, device: &Device, p: Product, a: u64, b: u64, d: u64) -> Result<(), CudaError> {
        #[cfg(feature = "emulate")]
        if device.is_host() {
            // SAFETY: forwarded to the caller (host pointers).
            unsafe { host_product(p, self.arithmetic == Arithmetic::Bf16, a, b, d) };
            return Ok(());
        }
        let handle = device.blas();
        let key = Key { product: p, align: [alignment(a), alignment(b), alignment(d)] };
        let mut pinned = self.pinned.borrow_mut();
        let pin = match pinned.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.pin(handle, key)?),
        };
        let (alpha, beta) = (1.0f32, if p.accumulate { 1.0f32 } else { 0.0 });
        let [la, lb, ld] = pin.layouts;
        // SAFETY: descriptors made for these shapes; pointers as the caller promises.
        unsafe {
            lt::matmul(
                handle,
                pin.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a as *const c_void,
                la,
                b as *const c_void,
                lb,
                d as *const c_void,
                ld,
                d as *mut c_void,
                ld,
                &pin.algo,
                self.workspace.tensor().ptr as *mut c_void,
                WORKSPACE,
                device.stream() as _,
            )
        }
        .map_err(blas("a product"))
    }

    /// The descriptors of `key`'s product and the fastest algorithm without a split-K reduction.
    fn pin(&self, handle: sys::cublasLtHandle_t, key: Key) -> Result<Pinned, CudaError> {
        let p = key.product;
        let (compute, operand) = match self.arithmetic {
            Arithmetic::F32 => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F),
            Arithmetic::Tf32 => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, sys::cudaDataType::CUDA_R_32F),
            Arithmetic::Bf16 => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_16BF),
        };
        let desc = lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(blas("a product's descriptor"))?;
        let set_op = |attr, transpose: bool| {
            let op: i32 = transpose as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                                            // SAFETY: an i32 attribute of a live descriptor.
            unsafe { lt::set_matmul_desc_attribute(desc, attr, &op as *const i32 as *const c_void, 4) }.map_err(blas("a product's transposes"))
        };
        set_op(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, p.transpose_a)?;
        set_op(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, p.transpose_b)?;
        let (a_rows, a_cols) = if p.transpose_a { (p.k, p.m) } else { (p.m, p.k) };
        let (b_rows, b_cols) = if p.transpose_b { (p.n, p.k) } else { (p.k, p.n) };
        let layout = |ty, rows: usize, cols: usize| lt::create_matrix_layout(ty, rows as u64, cols as u64, rows as i64).map_err(blas("a matrix layout"));
        let layouts = [layout(operand, a_rows, a_cols)?, layout(operand, b_rows, b_cols)?, layout(sys::cudaDataType::CUDA_R_32F, p.m, p.n)?];
        let pref = lt::create_matmul_pref().map_err(blas("the search's preferences"))?;
        let set_pref = |attr, value: &[u8]| {
            // SAFETY: a live preference; the value's size is the attribute's.
            unsafe { lt::set_matmul_pref_attribute(pref, attr, value.as_ptr() as *const c_void, value.len()) }.map_err(blas("a search preference"))
        };
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        set_pref(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &(WORKSPACE as u64).to_ne_bytes())?;
        // No reduction scheme at all: no split-K, whose sums could land in any order.
        set_pref(P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &0u32.to_ne_bytes())?;
        set_pref(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align[0].to_ne_bytes())?;
        set_pref(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align[1].to_ne_bytes())?;
        set_pref(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align[2].to_ne_bytes())?;
        set_pref(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align[2].to_ne_bytes())?;
        // SAFETY: live descriptors of this product.
        let found = unsafe { lt::get_matmul_algo_heuristic(handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref) };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        let found = found.map_err(|e| CudaError::new(format!("cuBLASLt has no algorithm for the product {p:?} in {:?}: {e}", self.arithmetic)))?;
        Ok(Pinned { desc, layouts, algo: found.algo })
    }
}

impl Drop for Products {
    fn drop(&mut self) {
        for pin in self.pinned.get_mut().values() {
            // SAFETY: created in `pin`, destroyed once, no longer queued (the device waits
            // when the workspace is freed after this).
            unsafe {
                let _ = lt::destroy_matmul_desc(pin.desc);
                for &l in &pin.layouts {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
        }
    }
}

#[cfg(feature = "emulate")]
/// `p` on host pointers: column-major `D = op(A)·op(B) (+ D)`, summed in f64; the operands
/// bf16 (as their 16 bits) where `bf16`, else f32.
///
/// # Safety
/// The pointers hold `p`'s operands (host memory), `d` apart from them.
unsafe fn host_product(p: Product, bf16: bool, a: u64, b: u64, d: u64) {
    let read = |ptr: u64, i: usize| -> f64 {
        // SAFETY: in bounds of an operand, as the caller promises.
        unsafe {
            if bf16 {
                f32::from_bits((*(ptr as *const u16).add(i) as u32) << 16) as f64
            } else {
                *(ptr as *const f32).add(i) as f64
            }
        }
    };
    let (m, n, k) = (p.m, p.n, p.k);
    for j in 0..n {
        for i in 0..m {
            let mut sum = 0.0;
            for l in 0..k {
                let x = if p.transpose_a { read(a, l + i * k) } else { read(a, i + l * m) };
                let y = if p.transpose_b { read(b, j + l * n) } else { read(b, l + j * k) };
                sum += x * y;
            }
            // SAFETY: D is m x n, as the caller promises.
            let out = unsafe { &mut *(d as *mut f32).add(i + j * m) };
            *out = if p.accumulate { (*out as f64 + sum) as f32 } else { sum as f32 };
        }
    }
}
