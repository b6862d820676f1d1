//! The matrix products through cuBLASLt's `result` layer: column-major `D = A·B (+ D)` with
//! each operand transposed or not, f32 or bf16 operands, f32 sums and output, and what
//! cuBLASLt's epilogue can add as it writes D ([`Addends`]: a bias, a residual). Each product's
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

/// What cuBLASLt's epilogue adds to a product's sums as it writes D, in place of a pass of
/// Alpha's own over D after it (`matmul_epilogue`): a bias `[m]` over D's columns and a matrix
/// C `[m, n]` laid out as D (the residual stream), both f32; 0 for none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Addends {
    /// The bias's device address, or 0.
    pub bias: u64,
    /// C's device address, or 0.
    pub c: u64,
}

impl Addends {
    /// Whether it adds anything.
    pub fn any(self) -> bool {
        self.bias != 0 || self.c != 0
    }
}

/// What picks an algorithm: the product, its operands' alignments (A, B, D; cuBLASLt's fast
/// algorithms assume aligned operands) and its addends' (0: none).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    product: Product,
    align: [u32; 3],
    bias: u32,
    c: u32,
}

/// A product's descriptor and its operands' layouts (A, B, and D, which C shares).
struct Descriptors {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
}

/// A product's descriptors and its pinned algorithm.
struct Pinned {
    d: Descriptors,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// The bytes of workspace cuBLASLt may use (its recommendation on Hopper).
const WORKSPACE: usize = 32 << 20;

/// The products of one engine, in one [`Arithmetic`].
pub struct Products {
    arithmetic: Arithmetic,
    /// Whether [`Addends`] ride on cuBLASLt's epilogue where it has an algorithm for them.
    fuse: bool,
    workspace: Buffer,
    /// Each key's algorithm; none where cuBLASLt has none for a key with addends.
    pinned: RefCell<HashMap<Key, Option<Pinned>>>,
}

fn blas(what: &str) -> impl FnOnce(lt::CublasError) -> CudaError + '_ {
    move |e| CudaError::new(format!("cuBLASLt: {what}: {e}"))
}

/// The largest power of two dividing `ptr`, at most 256 bytes.
fn alignment(ptr: u64) -> u32 {
    1 << (ptr | 256).trailing_zeros()
}

/// [`alignment`] of an addend, 0 where there is none.
fn addend_alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        0
    } else {
        alignment(ptr)
    }
}

impl Products {
    /// Products in `arithmetic` (an error where the device lacks it).
    pub fn new(device: &Device, arithmetic: Arithmetic) -> Result<Products, CudaError> {
        if arithmetic == Arithmetic::Bf16 && !device.info.has_bf16() {
            return Err(CudaError::new(format!("--precision bf16 needs sm_80 or later; {} is {}", device.info.name, device.info.arch())));
        }
        Ok(Products { arithmetic, fuse: true, workspace: Buffer::zeroed(device, "cuBLASLt's workspace", WORKSPACE, 1)?, pinned: RefCell::new(HashMap::new()) })
    }

    /// The products with [`Addends`] summed in by cuBLASLt's epilogue where `on` (the default)
    /// and it has an algorithm for them, else never ([`Products::fuses`] says no).
    pub fn with_fused_epilogues(self, on: bool) -> Self {
        Products { fuse: on, ..self }
    }

    /// The arithmetic.
    pub fn arithmetic(&self) -> Arithmetic {
        self.arithmetic
    }

    /// Whether [`Products::run`] takes `add` with `p` over these pointers: fused epilogues on
    /// and an algorithm for them (on the host's emulation: a bias 16-byte aligned, the
    /// alignment cuBLASLt's bias epilogues are reported to need). Picks and pins the algorithm.
    pub fn fuses(&self, device: &Device, p: Product, a: u64, b: u64, d: u64, add: Addends) -> Result<bool, CudaError> {
        if !self.fuse || !add.any() {
            return Ok(!add.any());
        }
        #[cfg(feature = "emulate")]
        if device.is_host() {
            return Ok(add.bias.is_multiple_of(16));
        }
        let key = Products::key(p, a, b, d, add);
        let mut pinned = self.pinned.borrow_mut();
        if let Some(pin) = pinned.get(&key) {
            return Ok(pin.is_some());
        }
        let pin = self.pin(device.blas(), key, add.bias)?;
        Ok(pinned.entry(key).or_insert(pin).is_some())
    }

    fn key(p: Product, a: u64, b: u64, d: u64, add: Addends) -> Key {
        Key { product: p, align: [alignment(a), alignment(b), alignment(d)], bias: addend_alignment(add.bias), c: addend_alignment(add.c) }
    }

    /// Queues `p` with `a` and `b` (bf16 under [`Arithmetic::Bf16`], else f32) into f32 `d`,
    /// `add` summed in (where [`Products::fuses`] said so; an error else).
    ///
    /// # Safety
    /// The pointers hold the operands `p` describes, stored densely (leading dimension the
    /// stored rows), and `d` overlaps neither; `add`'s bias holds `p.m` f32s, its C `p.m *
    /// p.n` (it may be `d`).
    pub unsafe fn run(&self, device: &Device, p: Product, a: u64, b: u64, d: u64, add: Addends) -> Result<(), CudaError> {
        assert!(!(p.accumulate && add.c != 0), "a product accumulates into D or adds a C, not both");
        let declined = || CudaError::new(format!("cuBLASLt: no algorithm adds {add:?} to the product {p:?}"));
        #[cfg(feature = "emulate")]
        if device.is_host() {
            if !self.fuses(device, p, a, b, d, add)? {
                return Err(declined());
            }
            // SAFETY: forwarded to the caller (host pointers).
            unsafe { host_product(p, self.arithmetic == Arithmetic::Bf16, a, b, d, add) };
            return Ok(());
        }
        if add.any() && !self.fuse {
            return Err(declined());
        }
        let handle = device.blas();
        let key = Products::key(p, a, b, d, add);
        let mut pinned = self.pinned.borrow_mut();
        let pin = match pinned.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.pin(handle, key, add.bias)?),
        };
        let pin = pin.as_ref().ok_or_else(declined)?;
        if add.bias != 0 {
            // SAFETY: the bias pointer attribute of a live descriptor (keys of one alignment
            // share it: each call sets its own).
            unsafe { set_bias_pointer(pin.d.desc, add.bias) }?;
        }
        let (alpha, beta) = (1.0f32, if p.accumulate || add.c != 0 { 1.0f32 } else { 0.0 });
        let c = if add.c != 0 { add.c } else { d };
        let [la, lb, ld] = pin.d.layouts;
        // SAFETY: descriptors made for these shapes; pointers as the caller promises.
        unsafe {
            lt::matmul(
                handle,
                pin.d.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a as *const c_void,
                la,
                b as *const c_void,
                lb,
                c as *const c_void,
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

    /// The descriptors of `key`'s product and the fastest algorithm without a split-K
    /// reduction; none where the key has addends and cuBLASLt offers no algorithm for them.
    /// `bias`: the bias's address where the key has one (the search reads its alignment).
    fn pin(&self, handle: sys::cublasLtHandle_t, key: Key, bias: u64) -> Result<Option<Pinned>, CudaError> {
        let p = key.product;
        let (compute, operand) = match self.arithmetic {
            Arithmetic::F32 => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F),
            Arithmetic::Tf32 => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, sys::cudaDataType::CUDA_R_32F),
            Arithmetic::Bf16 => (sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_16BF),
        };
        let (a_rows, a_cols) = if p.transpose_a { (p.k, p.m) } else { (p.m, p.k) };
        let (b_rows, b_cols) = if p.transpose_b { (p.n, p.k) } else { (p.k, p.n) };
        let layout = |ty, rows: usize, cols: usize| lt::create_matrix_layout(ty, rows as u64, cols as u64, rows as i64).map_err(blas("a matrix layout"));
        let d = Descriptors {
            desc: lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(blas("a product's descriptor"))?,
            layouts: [layout(operand, a_rows, a_cols)?, layout(operand, b_rows, b_cols)?, layout(sys::cudaDataType::CUDA_R_32F, p.m, p.n)?],
        };
        let set = |attr, value: &[u8]| {
            // SAFETY: a live descriptor; the value's size is the attribute's.
            unsafe { lt::set_matmul_desc_attribute(d.desc, attr, value.as_ptr() as *const c_void, value.len()) }.map_err(blas("a product's descriptor"))
        };
        use sys::cublasLtMatmulDescAttributes_t as D;
        // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        set(D::CUBLASLT_MATMUL_DESC_TRANSA, &(p.transpose_a as i32).to_ne_bytes())?;
        set(D::CUBLASLT_MATMUL_DESC_TRANSB, &(p.transpose_b as i32).to_ne_bytes())?;
        if key.bias != 0 {
            set(D::CUBLASLT_MATMUL_DESC_EPILOGUE, &(sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32).to_ne_bytes())?;
            set(D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(sys::cudaDataType::CUDA_R_32F as i32).to_ne_bytes())?;
            // SAFETY: a live descriptor.
            unsafe { set_bias_pointer(d.desc, bias) }?;
        }
        let pref = lt::create_matmul_pref().map_err(blas("the search's preferences"))?;
        let set_pref = |attr, value: &[u8]| {
            // SAFETY: a live preference; the value's size is the attribute's.
            unsafe { lt::set_matmul_pref_attribute(pref, attr, value.as_ptr() as *const c_void, value.len()) }.map_err(blas("a search preference"))
        };
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let c_align = if key.c != 0 { key.c } else { key.align[2] };
        let prefs = [
            (P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &(WORKSPACE as u64).to_ne_bytes()[..]),
            // No reduction scheme at all: no split-K, whose sums could land in any order.
            (P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &0u32.to_ne_bytes()),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align[0].to_ne_bytes()),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align[1].to_ne_bytes()),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c_align.to_ne_bytes()),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align[2].to_ne_bytes()),
        ];
        let found = prefs.iter().try_for_each(|&(attr, value)| set_pref(attr, value)).map(|()| {
            let [la, lb, ld] = d.layouts;
            // SAFETY: live descriptors of this product.
            unsafe { lt::get_matmul_algo_heuristic(handle, d.desc, la, lb, ld, ld, pref) }
        });
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        match found? {
            Ok(found) => Ok(Some(Pinned { d, algo: found.algo })),
            // Addends are cuBLASLt's to take or leave: without them Alpha's own pass adds them.
            Err(_) if key.bias != 0 || key.c != 0 => Ok(None),
            Err(e) => Err(CudaError::new(format!("cuBLASLt has no algorithm for the product {p:?} in {:?}: {e}", self.arithmetic))),
        }
    }
}

/// Sets the bias a product with a bias epilogue adds.
///
/// # Safety
/// `desc` is a live descriptor.
unsafe fn set_bias_pointer(desc: sys::cublasLtMatmulDesc_t, bias: u64) -> Result<(), CudaError> {
    // SAFETY: a pointer-sized attribute of a live descriptor.
    unsafe {
        lt::set_matmul_desc_attribute(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias as *const u64 as *const c_void, 8)
    }
    .map_err(blas("a product's bias"))
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: created in `Products::pin`, destroyed once, no longer queued (the products'
        // workspace, freed before their descriptors, waited for the device).
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
        }
    }
}

#[cfg(feature = "emulate")]
/// `p` on host pointers: column-major `D = op(A)·op(B) (+ D)`, summed in f64, then as cuBLASLt's
/// epilogue `+ C + bias` in f32 where `add` has them; the operands bf16 (as their 16 bits)
/// where `bf16`, else f32.
///
/// # Safety
/// The pointers hold `p`'s operands and `add`'s (host memory), `d` apart from A and B.
unsafe fn host_product(p: Product, bf16: bool, a: u64, b: u64, d: u64, add: Addends) {
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
    // op(A)'s rows and op(B)'s columns as f64, each contiguous along the depth: the same sums,
    // in the same order, without strided reads in the inner loop.
    let rows: Vec<f64> = (0..m * k).map(|x| (x / k, x % k)).map(|(i, l)| if p.transpose_a { read(a, l + i * k) } else { read(a, i + l * m) }).collect();
    let columns: Vec<f64> = (0..n * k).map(|x| (x / k, x % k)).map(|(j, l)| if p.transpose_b { read(b, j + l * n) } else { read(b, l + j * k) }).collect();
    for j in 0..n {
        let column = &columns[j * k..(j + 1) * k];
        for i in 0..m {
            let row = &rows[i * k..(i + 1) * k];
            let sum = row.iter().zip(column).fold(0.0, |sum, (x, y)| sum + x * y);
            // SAFETY: D and C are m x n, the bias m, as the caller promises.
            unsafe {
                let out = &mut *(d as *mut f32).add(i + j * m);
                let mut v = if p.accumulate { (*out as f64 + sum) as f32 } else { sum as f32 };
                if add.c != 0 {
                    v += *(add.c as *const f32).add(i + j * m);
                }
                if add.bias != 0 {
                    v += *(add.bias as *const f32).add(i);
                }
                *out = v;
            }
        }
    }
}
