//! Every GPU kernel against its CPU op (alpha_core::ops) on random inputs with odd shapes
//! (not multiples of the tiles), forward and backward. Runs on any Vulkan/Metal/DX12
//! adapter; CI uses lavapipe (mesa-vulkan-drivers). With `ALPHA_GPU_TENSOR_CORES=1` the
//! device is opened with tensor cores (`--tensor-cores`: NVIDIA's drivers, or Mesa 26's
//! lavapipe through `scripts/lavapipe-coop.sh`, as CI runs them; Debian 12's lavapipe has
//! none) and the large products run `matmul_tensor`, checked at f16's tolerance.

use alpha_core::gemm::Operands;
use alpha_core::ops::attention::AttentionShape;
use alpha_core::ops::dropout::{DropoutKey, Site};
use alpha_core::ops::row_blocks::blocks;
use alpha_core::ops::{attention, cross_entropy, dropout, embedding, grad_norm, layernorm, matmul, rmsnorm};
use alpha_core::{Rng, Serial};
use alpha_gpu::kernels::{Kernel, Kernels, ProgramBuilder, View};
use alpha_gpu::{block_on, ops, read, Gpu, Precision, TensorCores};
use std::sync::OnceLock;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        block_on(Gpu::open_local(None, 0, Some(if tensor_cores() { Precision::F16 } else { Precision::F32 }), tensor_core_mode()))
            .unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"))
    })
}

/// Whether the tests run with tensor cores (`ALPHA_GPU_TENSOR_CORES=1`).
fn tensor_cores() -> bool {
    std::env::var_os("ALPHA_GPU_TENSOR_CORES").is_some_and(|v| v == "1")
}

/// The devices' tensor cores: required with `ALPHA_GPU_TENSOR_CORES=1`, else off (the SIMT
/// kernels are tested on every adapter).
fn tensor_core_mode() -> TensorCores {
    if tensor_cores() {
        TensorCores::On
    } else {
        TensorCores::Off
    }
}

/// The large products' tolerance: f32 sums agree with the CPU's to 1e-5; with tensor cores
/// the operands are rounded to f16 (2^-11 relative each), 2e-3.
fn wide_tol() -> f32 {
    if tensor_cores() {
        2e-3
    } else {
        1e-5
    }
}

fn random(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale).collect()
}

fn buffer<T: bytemuck::Pod>(data: &[T]) -> wgpu::Buffer {
    let g = gpu();
    let buf = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (data.len().max(64) * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    g.queue.write_buffer(&buf, 0, bytemuck::cast_slice(data));
    buf
}

/// An output buffer of `len` elements filled with a value no kernel writes by chance.
fn fresh(len: usize) -> wgpu::Buffer {
    buffer(&vec![7.25f32; len])
}

fn whole<'a, T>(buf: &'a wgpu::Buffer, data: &[T]) -> View<'a> {
    View::first(buf, data.len())
}

fn download(buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    block_on(read(gpu(), buf, 0, len)).unwrap()
}

/// Builds the dispatches `f` pushes for a head size, runs them, waits.
fn run<'a>(head_size: usize, f: impl FnOnce(&mut ProgramBuilder<'a>)) {
    run_limited(head_size, u64::MAX, f)
}

/// [`run`] with the ops splitting tensors over `max_binding` bytes.
fn run_limited<'a>(head_size: usize, max_binding: u64, f: impl FnOnce(&mut ProgramBuilder<'a>)) {
    let kernels = block_on(Kernels::new(gpu(), head_size)).unwrap();
    let mut p = ProgramBuilder::default().with_max_binding(max_binding);
    f(&mut p);
    p.build(gpu(), &kernels).unwrap().submit(gpu(), &kernels);
}

/// |gpu - cpu| <= tol * max(1, max |cpu|), element by element.
fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tol: f32) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let scale = cpu.iter().fold(1f32, |m, x| m.max(x.abs()));
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!((g - c).abs() <= tol * scale, "{what}[{i}]: GPU {g} vs CPU {c} (scale {scale})");
    }
}

#[test]
fn matmul_forward_with_each_epilogue_and_backward() {
    let (n, k, m) = (37, 45, 70);
    let mut rng = Rng::new(3);
    let x = random(&mut rng, n * k, 1.0);
    let w = random(&mut rng, m * k, 0.5);
    let bias = random(&mut rng, m, 0.5);
    let residual = random(&mut rng, n * m, 1.0);
    // Epilogues: none, GELU keeping the pre-activation, GELU leaving its slope, residual; each
    // also with 4 KiB bindings (every operand in pieces of rows, columns and depth).
    for (epi, limit) in (0..4).flat_map(|e| [(e, u64::MAX), (e, 4096)]) {
        let mut out = vec![0.0; n * m];
        let mut pre = vec![0.0; n * m];
        let mut wt = vec![0.0; matmul::scratch_len(k, m)];
        let epilogue = match epi {
            0 => matmul::Epilogue::None,
            1 | 2 => matmul::Epilogue::Gelu { pre: () },
            _ => matmul::Epilogue::Residual { input: () },
        };
        let save_slope = epi == 2;
        let cpu_epi = epilogue.map(|()| &mut pre[..], |()| &residual[..]);
        matmul::forward(
            &Serial,
            matmul::Forward { out: &mut out[..], x: &x[..], weight: &w[..], bias: Some(&bias[..]), epilogue: cpu_epi, save_slope, k, m },
            &mut wt,
            Operands::F32,
        );
        let (gx, gw, gb, gr, gout, gpre) = (buffer(&x), buffer(&w), buffer(&bias), buffer(&residual), fresh(n * m), fresh(n * m));
        run_limited(8, limit, |p| {
            let epilogue = epilogue.map(|()| whole(&gpre, &pre), |()| whole(&gr, &residual));
            ops::matmul::forward(
                p,
                matmul::Forward {
                    out: whole(&gout, &out),
                    x: whole(&gx, &x),
                    weight: whole(&gw, &w),
                    bias: Some(whole(&gb, &bias)),
                    epilogue,
                    save_slope,
                    k,
                    m,
                },
            );
        });
        assert_close(&format!("matmul forward, epilogue {epi}, bindings of {limit} bytes"), &download(&gout, n * m), &out, 1e-5);
        if epi == 1 || epi == 2 {
            assert_close(&format!("GELU pre-activation or slope, epilogue {epi}"), &download(&gpre, n * m), &pre, 1e-5);
        }
    }
    matmul_backward_matches_cpu(n, k, m, &mut rng, u64::MAX);
    matmul_backward_matches_cpu(n, k, m, &mut rng, 4096);
    // Enough rows that the weight gradient is split by depth (chunks of 150 rows).
    assert_eq!(ops::matmul::weight_grad_splits(300, k, m), 2);
    matmul_backward_matches_cpu(300, k, m, &mut rng, u64::MAX);
    // An LM head's shape: the weight gradient not split by depth, its products in pieces.
    matmul_backward_matches_cpu(70, 45, 400, &mut rng, 8192);
}

/// Products large enough for the 128 x 128 tiles (`matmul_wide`), with edges in every
/// dimension: the forward (a row-major, b transposed) with bias and residual, and the split
/// weight gradient (a transposed, b row-major). At a depth of 150 no tile is staged whole;
/// at 200 (rows of whole vec4s) the inner tiles are (`whole_block` in matmul.wgsl).
#[test]
fn matmul_wide_tiles_match_the_cpu() {
    assert_eq!(gpu().tensor_cores(), tensor_cores(), "ALPHA_GPU_TENSOR_CORES opens the device with them");
    for (n, k, m) in [(2000, 150, 1100), (2000, 200, 1100)] {
        matmul_wide_matches_the_cpu(n, k, m);
    }
}

fn matmul_wide_matches_the_cpu(n: usize, k: usize, m: usize) {
    assert_eq!(ops::matmul::kernel_for(n, m, 1).0, Kernel::MatmulWide);
    let splits = ops::matmul::weight_grad_splits(n, k, m);
    assert!(splits > 1 && ops::matmul::kernel_for(m, k, splits).0 == Kernel::MatmulWide);
    let mut rng = Rng::new(5);
    let (x, w, bias, residual) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 0.5), random(&mut rng, m, 0.5), random(&mut rng, n * m, 1.0));
    let mut out = vec![0.0; n * m];
    let cpu = matmul::Forward {
        out: &mut out[..],
        x: &x[..],
        weight: &w[..],
        bias: Some(&bias[..]),
        epilogue: matmul::Epilogue::Residual { input: &residual[..] },
        save_slope: false,
        k,
        m,
    };
    matmul::forward(&Serial, cpu, &mut vec![0.0; matmul::scratch_len(k, m)], Operands::F32);
    let (gx, gw, gb, gr) = (buffer(&x), buffer(&w), buffer(&bias), buffer(&residual));
    // The product on the GPU with bindings of at most `limit` bytes.
    let gpu_forward = |limit: u64| {
        let gout = fresh(n * m);
        run_limited(8, limit, |p| {
            let epilogue = matmul::Epilogue::Residual { input: whole(&gr, &residual) };
            let gpu = matmul::Forward {
                out: whole(&gout, &out),
                x: whole(&gx, &x),
                weight: whole(&gw, &w),
                bias: Some(whole(&gb, &bias)),
                epilogue,
                save_slope: false,
                k,
                m,
            };
            ops::matmul::forward(p, gpu);
        });
        download(&gout, n * m)
    };
    let wide = gpu_forward(u64::MAX);
    assert_close(&format!("wide matmul forward {n}x{k}x{m}"), &wide, &out, wide_tol());
    // In pieces of at most 256 KiB (columns split to 128 or fewer, the depth whole) the
    // 64 x 64 kernel runs: the same sums in the same order, so the same bits (tensor cores
    // round the operands: there it is held to the CPU).
    let pieces = gpu_forward(1 << 18);
    if tensor_cores() {
        assert_close("64 x 64 tiles", &pieces, &out, 1e-5);
    } else {
        assert!(pieces == wide, "matmul and matmul_wide differ at {n}x{k}x{m}");
    }
    matmul_backward_matches_cpu(n, k, m, &mut rng, u64::MAX);
}

/// Backward with GELU (given its slope) and bias over `n` rows; gradients accumulate onto
/// existing values. The products bind at most `limit` bytes each (the bias gradient's
/// passes bind `dout` whole).
fn matmul_backward_matches_cpu(n: usize, k: usize, m: usize, rng: &mut Rng, limit: u64) {
    let x = random(rng, n * k, 1.0);
    let w = random(rng, m * k, 0.5);
    let slope = random(rng, n * m, 2.0);
    let dout0 = random(rng, n * m, 1.0);
    let (dw0, db0) = (random(rng, m * k, 1.0), random(rng, m, 1.0));
    let (mut dout, mut dw, mut db, mut dx) = (dout0.clone(), dw0.clone(), db0.clone(), vec![0.0; n * k]);
    let (mut partials, mut scratch) = (vec![0.0; blocks(n) * m], vec![0.0; matmul::scratch_len(k, m)]);
    let grads = matmul::Backward {
        dx: Some(&mut dx[..]),
        dweight: &mut dw[..],
        dbias: Some(&mut db[..]),
        dout: &mut dout[..],
        x: &x[..],
        weight: &w[..],
        activation: Some(matmul::ActivationGrad::Gelu { slope: &slope[..] }),
        k,
        m,
    };
    matmul::backward(&Serial, grads, &mut partials, &mut scratch, Operands::F32);
    let (gdout, gdw, gdb, gdx, gpart, gslope, gx, gw) =
        (buffer(&dout0), buffer(&dw0), buffer(&db0), fresh(n * k), fresh(partials.len()), buffer(&slope), buffer(&x), buffer(&w));
    let split_len = ops::matmul::weight_grad_scratch_len(n, k, m).max(1);
    let gsplit = fresh(split_len);
    run_limited(8, limit, |p| {
        let grads = matmul::Backward {
            dx: Some(whole(&gdx, &dx)),
            dweight: whole(&gdw, &dw),
            dbias: Some(whole(&gdb, &db)),
            dout: whole(&gdout, &dout),
            x: whole(&gx, &x),
            weight: whole(&gw, &w),
            activation: Some(matmul::ActivationGrad::Gelu { slope: whole(&gslope, &slope) }),
            k,
            m,
        };
        ops::matmul::backward(p, grads, whole(&gpart, &partials), View::first(&gsplit, split_len))
    });
    // The products may run on 128 x 128 tiles, on tensor cores if the device has them.
    assert_close(&format!("dout after GELU backward ({n} rows)"), &download(&gdout, n * m), &dout, 1e-5);
    assert_close(&format!("dx ({n} rows)"), &download(&gdx, n * k), &dx, wide_tol());
    assert_close(&format!("dw ({n} rows, bindings of {limit} bytes)"), &download(&gdw, m * k), &dw, wide_tol());
    assert_close(&format!("dbias ({n} rows)"), &download(&gdb, m), &db, 1e-5);
}

/// LayerNorm over 601 rows: ten blocks of 64 for the weight and bias gradients (the last of
/// 25 rows), so that their sums take both paths: blocks and rows loaded ahead in groups, and
/// the rest one by one.
#[test]
fn layernorm_forward_and_backward() {
    let (n, c) = (601, 83);
    let mut rng = Rng::new(5);
    let x: Vec<f32> = random(&mut rng, n * c, 2.0).iter().map(|v| v + 0.7).collect();
    let (w, b) = (random(&mut rng, c, 1.0), random(&mut rng, c, 1.0));
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm::forward(&Serial, layernorm::Forward { out: &mut out, mean: &mut mean, rstd: &mut rstd, x: &x, weight: &w, bias: &b });
    let (gx, gw, gb, gout, gmean, grstd) = (buffer(&x), buffer(&w), buffer(&b), fresh(n * c), fresh(n), fresh(n));
    run(8, |p| {
        let a = layernorm::Forward {
            out: whole(&gout, &out),
            mean: whole(&gmean, &mean),
            rstd: whole(&grstd, &rstd),
            x: whole(&gx, &x),
            weight: whole(&gw, &w),
            bias: whole(&gb, &b),
        };
        ops::layernorm::forward(p, a)
    });
    assert_close("layernorm out", &download(&gout, n * c), &out, 1e-5);
    assert_close("mean", &download(&gmean, n), &mean, 1e-5);
    assert_close("rstd", &download(&grstd, n), &rstd, 1e-5);

    let dout = random(&mut rng, n * c, 1.0);
    let (dx0, dw0, db0) = (random(&mut rng, n * c, 1.0), random(&mut rng, c, 1.0), random(&mut rng, c, 1.0));
    let (mut dx, mut dw, mut db) = (dx0.clone(), dw0.clone(), db0.clone());
    let mut partials = vec![0.0; blocks(n) * 2 * c];
    let grads = layernorm::Backward {
        dx: &mut dx[..],
        dweight: &mut dw[..],
        dbias: &mut db[..],
        dout: &dout[..],
        x: &x[..],
        mean: &mean[..],
        rstd: &rstd[..],
        weight: &w[..],
    };
    layernorm::backward(&Serial, grads, &mut partials);
    let (gdx, gdw, gdb, gpart, gdout) = (buffer(&dx0), buffer(&dw0), buffer(&db0), fresh(partials.len()), buffer(&dout));
    run(8, |p| {
        let grads = layernorm::Backward {
            dx: whole(&gdx, &dx),
            dweight: whole(&gdw, &dw),
            dbias: whole(&gdb, &db),
            dout: whole(&gdout, &dout),
            x: whole(&gx, &x),
            mean: whole(&gmean, &mean),
            rstd: whole(&grstd, &rstd),
            weight: whole(&gw, &w),
        };
        ops::layernorm::backward(p, grads, whole(&gpart, &partials))
    });
    assert_close("layernorm dx", &download(&gdx, n * c), &dx, 1e-5);
    assert_close("layernorm dw", &download(&gdw, c), &dw, 1e-5);
    assert_close("layernorm db", &download(&gdb, c), &db, 1e-5);
}

/// RMSNorm (the Llama family's), forward and backward, over rows not a multiple of a row
/// block and a width not a multiple of the workgroup.
#[test]
fn rmsnorm_forward_and_backward() {
    let (n, c, eps) = (601, 83, 1e-6);
    let mut rng = Rng::new(6);
    let x = random(&mut rng, n * c, 2.0);
    let w = random(&mut rng, c, 1.0);
    let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
    rmsnorm::forward(&Serial, rmsnorm::Forward { out: &mut out, rstd: &mut rstd, x: &x, weight: &w, eps });
    let (gx, gw, gout, grstd) = (buffer(&x), buffer(&w), fresh(n * c), fresh(n));
    run(8, |p| {
        let a = rmsnorm::Forward { out: whole(&gout, &out), rstd: whole(&grstd, &rstd), x: whole(&gx, &x), weight: whole(&gw, &w), eps };
        ops::rmsnorm::forward(p, a)
    });
    assert_close("rmsnorm out", &download(&gout, n * c), &out, 1e-5);
    assert_close("rmsnorm rstd", &download(&grstd, n), &rstd, 1e-5);

    let dout = random(&mut rng, n * c, 1.0);
    let (dx0, dw0) = (random(&mut rng, n * c, 1.0), random(&mut rng, c, 1.0));
    let (mut dx, mut dw) = (dx0.clone(), dw0.clone());
    let mut partials = vec![0.0; blocks(n) * c];
    rmsnorm::backward(&Serial, rmsnorm::Backward { dx: &mut dx[..], dweight: &mut dw[..], dout: &dout, x: &x, rstd: &rstd, weight: &w }, &mut partials);
    let (gdx, gdw, gpart, gdout) = (buffer(&dx0), buffer(&dw0), fresh(partials.len()), buffer(&dout));
    run(8, |p| {
        let grads = rmsnorm::Backward {
            dx: whole(&gdx, &dx),
            dweight: whole(&gdw, &dw),
            dout: whole(&gdout, &dout),
            x: whole(&gx, &x),
            rstd: whole(&grstd, &rstd),
            weight: whole(&gw, &w),
        };
        ops::rmsnorm::backward(p, grads, whole(&gpart, &partials))
    });
    assert_close("rmsnorm dx", &download(&gdx, n * c), &dx, 1e-5);
    assert_close("rmsnorm dw", &download(&gdw, c), &dw, 1e-5);
}

/// The SwiGLU epilogue (gate and up as one product, SiLU-times-up after it) and its backward
/// (the slopes times the output's gradient, then the product's gradients), against the CPU.
#[test]
fn swiglu_matmul_forward_and_backward() {
    let (n, k, m) = (67, 29, 2 * 45);
    let mut rng = Rng::new(8);
    let (x, w) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 1.0));
    let (mut out, mut pre) = (vec![0.0; n * m / 2], vec![0.0; n * m]);
    let a = matmul::Forward {
        out: &mut out[..],
        x: &x[..],
        weight: &w[..],
        bias: None,
        epilogue: matmul::Epilogue::SwiGlu { pre: &mut pre[..] },
        save_slope: true,
        k,
        m,
    };
    matmul::forward(&Serial, a, &mut vec![0.0; matmul::scratch_len(k, m)], Operands::F32);
    let (gx, gw, gout, gpre) = (buffer(&x), buffer(&w), fresh(n * m / 2), fresh(n * m));
    run(8, |p| {
        let epilogue = matmul::Epilogue::SwiGlu { pre: whole(&gpre, &pre) };
        let a = matmul::Forward { out: whole(&gout, &out), x: whole(&gx, &x), weight: whole(&gw, &w), bias: None, epilogue, save_slope: true, k, m };
        ops::matmul::forward(p, a)
    });
    assert_close("swiglu out", &download(&gout, n * m / 2), &out, 1e-5);
    assert_close("swiglu slopes", &download(&gpre, n * m), &pre, 1e-5);

    let dh = random(&mut rng, n * m / 2, 1.0);
    let (mut dx, mut dw, mut slopes) = (vec![0.0; n * k], vec![0.0; m * k], pre.clone());
    let (mut partials, mut scratch) = (vec![0.0; blocks(n) * m], vec![0.0; matmul::scratch_len(k, m)]);
    let grads = matmul::Backward {
        dx: Some(&mut dx[..]),
        dweight: &mut dw[..],
        dbias: None,
        dout: &mut slopes[..],
        x: &x[..],
        weight: &w[..],
        activation: Some(matmul::ActivationGrad::SwiGlu { dh: &dh[..] }),
        k,
        m,
    };
    matmul::backward(&Serial, grads, &mut partials, &mut scratch, Operands::F32);
    let (gdh, gdx, gdw, gpart) = (buffer(&dh), fresh(n * k), buffer(&vec![0f32; m * k]), fresh(partials.len()));
    let split_len = ops::matmul::weight_grad_scratch_len(n, k, m).max(1);
    let gsplit = fresh(split_len);
    run(8, |p| {
        let grads = matmul::Backward {
            dx: Some(whole(&gdx, &dx)),
            dweight: whole(&gdw, &dw),
            dbias: None,
            dout: whole(&gpre, &pre),
            x: whole(&gx, &x),
            weight: whole(&gw, &w),
            activation: Some(matmul::ActivationGrad::SwiGlu { dh: whole(&gdh, &dh) }),
            k,
            m,
        };
        ops::matmul::backward(p, grads, whole(&gpart, &partials), View::first(&gsplit, split_len))
    });
    assert_close("swiglu product gradient", &download(&gpre, n * m), &slopes, 1e-5);
    assert_close("swiglu dx", &download(&gdx, n * k), &dx, 1e-5);
    assert_close("swiglu dw", &download(&gdw, m * k), &dw, 1e-5);
}

/// A micro-batch's dropout key, and the same on the device.
const KEY: DropoutKey = DropoutKey { seed: 0x1234_5678_9abc_def0, draw: 0x1_0000_0003 };

/// Llama 3's rotary embeddings with scaling, every band in use (see the CPU's tests).
const ROPE: Option<attention::Rope> = Some(attention::Rope {
    theta: 500.0,
    scaling: Some(alpha_core::RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 64 }),
});

/// The rotary table of `shape` on the device (sized for its sequence), where it has RoPE.
fn rope_table(shape: AttentionShape) -> Option<wgpu::Buffer> {
    ops::attention::rope_table(shape, shape.seq).map(|t| buffer(&t))
}

/// Attention for head sizes below, at and above one 64-dimension block of the kernels (5, 16
/// and 36 padded with zeros, 64 the GPT-2 models', 100 over two blocks, the second short),
/// sequences longer than one 64-row block and not a multiple of it, without and with dropout
/// on the probabilities; and scores large enough (hundreds) that exponentials taken before
/// their row's maximum is subtracted would overflow. The Llama family's: grouped key/value
/// heads (three and two query heads to each), with rotary embeddings.
#[test]
fn attention_forward_and_backward() {
    let shapes = [
        (AttentionShape { batch: 2, seq: 70, heads: 6, kv_heads: 2, head_size: 8, rope: ROPE }, 1.5),
        (AttentionShape { batch: 1, seq: 67, heads: 4, kv_heads: 2, head_size: 64, rope: ROPE }, 1.5),
        (AttentionShape { batch: 1, seq: 66, heads: 2, kv_heads: 1, head_size: 100, rope: None }, 1.5),
        (AttentionShape { batch: 2, seq: 70, heads: 3, kv_heads: 3, head_size: 5, rope: None }, 1.5),
        (AttentionShape { batch: 1, seq: 131, heads: 2, kv_heads: 2, head_size: 16, rope: None }, 1.5),
        (AttentionShape { batch: 1, seq: 67, heads: 2, kv_heads: 2, head_size: 36, rope: None }, 1.5),
        (AttentionShape { batch: 1, seq: 75, heads: 1, kv_heads: 1, head_size: 64, rope: None }, 1.5),
        (AttentionShape { batch: 1, seq: 66, heads: 1, kv_heads: 1, head_size: 100, rope: None }, 1.5),
        (AttentionShape { batch: 1, seq: 70, heads: 2, kv_heads: 2, head_size: 32, rope: None }, 12.0),
    ];
    let gkey = buffer(&KEY.words());
    for ((shape, spread), dropout) in shapes.into_iter().flat_map(|s| [(s, None), (s, Some(Site::new(7, 0.25)))]) {
        let AttentionShape { batch, seq, heads, head_size, .. } = shape;
        let (c, w) = (heads * head_size, shape.width());
        let n = batch * seq;
        let mut rng = Rng::new(9);
        let qkv = random(&mut rng, n * w, spread);
        let table = rope_table(shape);
        let table = table.as_ref().map(|t| View::first(t, seq * head_size));
        let (mut out, mut lse, mut scratch) = (vec![0.0; n * c], vec![0.0; batch * heads * seq], vec![0.0; shape.scratch_len()]);
        attention::forward(&Serial, attention::Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape, dropout }, &mut scratch, Some(KEY), Operands::F32);
        let (gqkv, gout, glse) = (buffer(&qkv), fresh(n * c), fresh(lse.len()));
        let key = View::first(&gkey, 4);
        run(head_size, |p| {
            let a = attention::Forward { out: whole(&gout, &out), lse: whole(&glse, &lse), qkv: whole(&gqkv, &qkv), shape, dropout };
            ops::attention::forward(p, a, key, table)
        });
        let what = format!("{shape:?} dropout {dropout:?}");
        assert_close(&format!("{what} out"), &download(&gout, n * c), &out, 1e-5);
        assert_close(&format!("{what} lse"), &download(&glse, lse.len()), &lse, 1e-5);

        let dout = random(&mut rng, n * c, 1.0);
        let mut dqkv = vec![0.0; n * w];
        let a: attention::Backward<&mut [f32], &[f32]> =
            attention::Backward { dqkv: &mut dqkv[..], dout: &dout, qkv: &qkv, out: &out, lse: &lse, shape, dropout };
        attention::backward(&Serial, a, &mut scratch, Some(KEY), Operands::F32);
        let (gdqkv, gdout, gdelta) = (fresh(n * w), buffer(&dout), fresh(lse.len()));
        run(head_size, |p| {
            let grads = attention::Backward {
                dqkv: whole(&gdqkv, &dqkv),
                dout: whole(&gdout, &dout),
                qkv: whole(&gqkv, &qkv),
                out: whole(&gout, &out),
                lse: whole(&glse, &lse),
                shape,
                dropout,
            };
            ops::attention::backward(p, grads, whole(&gdelta, &lse), key, table)
        });
        assert_close(&format!("{what} dqkv"), &download(&gdqkv, n * w), &dqkv, 1e-5);
    }
}

/// Decoding: a token against the KV cache gives the CPU's decode (its key and value written
/// into the cache, the softmax over the keys so far), at positions below, at and past one
/// workgroup's 64 threads, for heads that do and do not fill a vec4; with grouped key/value
/// heads and rotary embeddings (keys cached rotated).
#[test]
fn attention_decode_matches_the_cpu() {
    for (heads, kv_heads, head_size, rope) in [(3, 3, 5, None), (2, 2, 16, None), (1, 1, 100, None), (6, 2, 8, ROPE)] {
        let shape = AttentionShape { batch: 1, seq: 1, heads, kv_heads, head_size, rope };
        let (t, c, w) = (70, heads * head_size, shape.width());
        let kv = kv_heads * head_size;
        let qkv = random(&mut Rng::new(21), t * w, 1.5);
        let mut cpu_cache = vec![0f32; 2 * t * kv];
        let table = ops::attention::rope_table(shape, t).map(|t| buffer(&t));
        let table = table.as_ref().map(|b| View::first(b, t * head_size));
        for pos in 0..t {
            // The device's cache starts as the CPU's before this token.
            let (gkeys, gvalues) = (buffer(&cpu_cache[..t * kv]), buffer(&cpu_cache[t * kv..]));
            let row = &qkv[pos * w..(pos + 1) * w];
            let (mut out, mut lse) = (vec![0f32; c], vec![0f32; heads]);
            let a = attention::Forward { out: &mut out[..], lse: &mut lse[..], qkv: row, shape, dropout: None };
            attention::decode(&Serial, a, attention::KvCache { rows: &mut cpu_cache, len: t }, pos, &mut vec![0.0; shape.scratch_len()]);
            if ![0, 1, 5, 63, 64, 69].contains(&pos) {
                continue;
            }
            let (grow, gout, glse, gwords) = (buffer(row), fresh(c), fresh(heads), buffer(&[0u32, 0, 0, 0, pos as u32, 0, 0, 0]));
            run(head_size, |p| {
                let a = attention::Forward { out: View::first(&gout, c), lse: View::first(&glse, heads), qkv: View::first(&grow, w), shape, dropout: None };
                ops::attention::decode(p, a, View::first(&gkeys, t * kv), View::first(&gvalues, t * kv), View::first(&gwords, 8), table)
            });
            let what = format!("heads {heads}x{head_size}, position {pos}");
            assert_close(&format!("{what}: out"), &download(&gout, c), &out, 1e-5);
            assert_close(&format!("{what}: lse"), &download(&glse, heads), &lse, 1e-5);
            if rope.is_some() {
                // Rotated on the device by the table's f32 values, on the CPU by f64 ones.
                assert_close(&format!("{what}: the cache's keys"), &download(&gkeys, t * kv), &cpu_cache[..t * kv], 1e-6);
            } else {
                assert_eq!(download(&gkeys, t * kv), cpu_cache[..t * kv], "{what}: the cache's keys");
            }
            assert_eq!(download(&gvalues, t * kv), cpu_cache[t * kv..], "{what}: the cache's values");
        }
    }
}

/// Dropout draws the CPU's masks bit for bit (the same Philox words), with and without the
/// residual, over a length that is not a multiple of the Philox block or the workgroup.
#[test]
fn dropout_masks_are_the_cpus() {
    let len = 64 * 4 * 3 + 7;
    let mut rng = Rng::new(4);
    let (y, res) = (random(&mut rng, len, 1.0), random(&mut rng, len, 1.0));
    let site = Site::new(11, 0.3);
    let (gy, gres, gkey) = (buffer(&y), buffer(&res), buffer(&KEY.words()));
    for residual in [false, true] {
        let mut out = vec![0.0; len];
        dropout::forward(&Serial, dropout::Forward { out: &mut out, y: &y, residual: residual.then_some(&res[..]), site }, KEY);
        let gout = fresh(len);
        run(1, |p| {
            let a = dropout::Forward { out: whole(&gout, &out), y: whole(&gy, &y), residual: residual.then(|| whole(&gres, &res)), site };
            ops::dropout::forward(p, a, View::first(&gkey, 4))
        });
        let got = download(&gout, len);
        assert!(got.iter().zip(&out).all(|(g, c)| g.to_bits() == c.to_bits()), "residual {residual}: the GPU's dropout differs from the CPU's");
        let dropped = out.iter().zip(&res).filter(|(o, r)| if residual { o == r } else { **o == 0.0 }).count();
        assert!((len / 5..len * 2 / 5).contains(&dropped), "{dropped} of {len} dropped at p = 0.3");
    }
}

/// The embedding, and its gradients summed in the CPU's order to the bit: over 6 sequences
/// (a group of four and two more), with token 2 in every third row (14 and more rows: a run
/// of eight loaded ahead and the rest one by one).
#[test]
fn embedding_forward_and_backward() {
    let (batch, t, c, vocab) = (6, 7, 70, 11);
    let n = batch * t;
    let mut rng = Rng::new(13);
    let tokens: Vec<u32> = (0..n).map(|i| if i % 3 == 0 { 2 } else { rng.below(vocab) as u32 }).collect();
    let (wte, wpe) = (random(&mut rng, vocab * c, 1.0), random(&mut rng, 9 * c, 1.0));
    let mut out = vec![0.0; n * c];
    embedding::forward(&Serial, embedding::Forward { out: &mut out, wte: &wte, wpe: Some(&wpe), seq: t }, &tokens);
    let (gtok, gwte, gwpe, gout) = (buffer(&tokens), buffer(&wte), buffer(&wpe), fresh(n * c));
    run(8, |p| {
        ops::embedding::forward(
            p,
            embedding::Forward { out: whole(&gout, &out), wte: whole(&gwte, &wte), wpe: Some(whole(&gwpe, &wpe)), seq: t },
            whole(&gtok, &tokens),
            None,
        )
    });
    assert_eq!(download(&gout, n * c), out, "embedding forward is exact");
    // Decoding one token at position 5 (words[4]): the position table's row 5.
    let gwords = buffer(&[0u32, 0, 0, 0, 5, 0, 0, 0]);
    let gone = fresh(c);
    run(8, |p| {
        let a = embedding::Forward { out: View::first(&gone, c), wte: whole(&gwte, &wte), wpe: Some(whole(&gwpe, &wpe)), seq: 1 };
        ops::embedding::forward(p, a, View::first(&gtok, 1), Some(View::first(&gwords, 8)))
    });
    let want: Vec<f32> = (0..c).map(|j| wte[tokens[0] as usize * c + j] + wpe[5 * c + j]).collect();
    assert_eq!(download(&gone, c), want, "the decoded token's position row");

    let dout = random(&mut rng, n * c, 1.0);
    let (mut dwte, mut dwpe) = (wte.clone(), wpe.clone());
    embedding::backward(&Serial, embedding::Backward { dwte: &mut dwte, dwpe: Some(&mut dwpe), dout: &dout, seq: t }, &tokens);
    let (mut order, mut starts) = (vec![0u32; n], vec![0u32; vocab + 1]);
    ops::embedding::group_rows_by_token(&tokens, &mut order, &mut starts);
    for v in 0..vocab {
        let rows: Vec<u32> = (0..n as u32).filter(|&i| tokens[i as usize] == v as u32).collect();
        assert_eq!(&order[starts[v] as usize..starts[v + 1] as usize], &rows[..], "rows of token {v}");
    }
    let (gdwte, gdwpe, gorder, gstarts, gdout) = (buffer(&wte), buffer(&wpe), buffer(&order), buffer(&starts), buffer(&dout));
    run(8, |p| {
        let grads = embedding::Backward { dwte: whole(&gdwte, &wte), dwpe: Some(whole(&gdwpe, &wpe)), dout: whole(&gdout, &dout), seq: t };
        ops::embedding::backward(p, grads, whole(&gorder, &order), whole(&gstarts, &starts))
    });
    assert_eq!(download(&gdwte, dwte.len()), dwte, "dwte sums in the CPU's order");
    assert_eq!(download(&gdwpe, dwpe.len()), dwpe, "dwpe sums in the CPU's order");
}

#[test]
fn cross_entropy_loss_gradient_and_sum() {
    // Without padding, and with the last 40 logits of each row padding; 300 rows, so that
    // the loss sum's threads load rows four ahead and the rest one by one.
    for classes in [131, 91] {
        let (n, v) = (300, 131);
        let mut rng = Rng::new(17);
        let logits = random(&mut rng, n * v, 4.0);
        let targets: Vec<u32> = (0..n).map(|_| rng.below(classes) as u32).collect();
        let grad_scale = Some(1.0 / n as f64);
        let (mut grad, mut losses) = (logits.clone(), vec![0.0; n]);
        cross_entropy::forward(&Serial, cross_entropy::Forward { losses: &mut losses, logits: &mut grad, grad_scale, classes }, &targets);
        // Slot 3 holds a loss scale of 8 (a power of two: the scaled gradient is exact).
        let (glogits, glosses, gtargets, gstats) = (buffer(&logits), fresh(n), buffer(&targets), buffer(&[0.5f32, 0.5, 0.5, 8.0]));
        run(8, |p| {
            ops::cross_entropy::forward(
                p,
                cross_entropy::Forward { losses: whole(&glosses, &losses), logits: whole(&glogits, &logits), grad_scale, classes },
                whole(&gtargets, &targets),
                View::first(&gstats, 4),
                3,
            );
            ops::cross_entropy::sum_losses(p, whole(&glosses, &losses), View::first(&gstats, 4), 1);
        });
        assert_close(&format!("{classes} classes: losses"), &download(&glosses, n), &losses, 1e-5);
        let scaled: Vec<f32> = grad.iter().map(|g| g * 8.0).collect();
        assert_close(&format!("{classes} classes: dlogits, loss scale 8"), &download(&glogits, n * v), &scaled, 1e-5);
        let stats = download(&gstats, 4);
        let sum: f32 = losses.iter().sum();
        assert!((stats[1] - (0.5 + sum)).abs() < 1e-4 * sum, "loss sum {} vs {}", stats[1], 0.5 + sum);
        assert_eq!((stats[0], stats[2], stats[3]), (0.5, 0.5, 8.0), "other slots untouched");
    }
}

#[test]
fn squared_norm_and_adamw_with_clip() {
    use alpha_core::optim::AdamWConfig;
    // 1001 elements: AdamW's last four-element group holds one.
    let len = 1001;
    let mut rng = Rng::new(23);
    let grads = random(&mut rng, len, 3.0);
    let params = random(&mut rng, len, 1.0);
    let (m0, v0) = (random(&mut rng, len, 0.1), random(&mut rng, len, 0.1).iter().map(|x| x * x).collect::<Vec<_>>());
    let sumsq = grad_norm::sum_squares(&Serial, &grads);
    // Bound in pieces of 256 elements, the decayed range ending inside the third (and inside
    // a four-element group).
    let pieces = ops::binding_pieces(len, 256);
    assert_eq!(pieces.len(), 4);
    let partials = pieces.len() * ops::grad_norm::NORM_CHUNKS;
    // The gradients as a loss scale of 1024 leaves them (slot 3): the norm and the update
    // divide it out.
    let scaled: Vec<f32> = grads.iter().map(|g| g * 1024.0).collect();
    let (gg, gp, gm, gv, gpart, gstats) = (buffer(&scaled), buffer(&params), buffer(&m0), buffer(&v0), fresh(partials), buffer(&[2.5f32, 0.0, 0.0, 1024.0]));
    let cfg = AdamWConfig::default();
    let (lr, step, clip, decay_end) = (3e-3, 4u64, 1.0, 642);
    let kernels = block_on(Kernels::new(gpu(), 8)).unwrap();
    let mut p = ProgramBuilder::default();
    ops::grad_norm::sum_squares(&mut p, whole(&gg, &grads), &pieces, View::first(&gpart, partials), View::first(&gstats, 4), 1);
    let arenas = [whole(&gp, &params), whole(&gg, &grads), whole(&gm, &m0), whole(&gv, &v0)];
    let indices = ops::adamw::dispatch(&mut p, arenas, &pieces, 0, View::first(&gstats, 4));
    let program = p.build(gpu(), &kernels).unwrap();
    for (i, piece) in indices.into_iter().zip(&pieces) {
        program.set_words(&gpu().queue, i, &ops::adamw::words(piece, decay_end, &cfg, lr, step, clip, [0, 1, 2, 3]));
    }
    program.submit(gpu(), &kernels);
    let stats = download(&gstats, 3);
    let scaled_sumsq = sumsq * 1024.0 * 1024.0;
    assert!((stats[1] as f64 - scaled_sumsq).abs() < 1e-5 * scaled_sumsq, "Σ g² {} vs {scaled_sumsq}", stats[1]);
    assert_eq!(stats[2], 0.0, "a finite step is not counted as skipped");
    // The reference: PyTorch's AdamW formula in f64, decaying the first `decay_end` elements.
    let clip_factor = grad_norm::clip_factor(sumsq.sqrt(), clip);
    let (p_gpu, m_gpu, v_gpu) = (download(&gp, len), download(&gm, len), download(&gv, len));
    for i in 0..len {
        let g = grads[i] as f64 * clip_factor;
        let mut p = params[i] as f64;
        if i < decay_end {
            p *= 1.0 - lr * cfg.weight_decay;
        }
        let m = cfg.beta1 * m0[i] as f64 + (1.0 - cfg.beta1) * g;
        let v = cfg.beta2 * v0[i] as f64 + (1.0 - cfg.beta2) * g * g;
        let mhat = m / (1.0 - cfg.beta1.powi(step as i32));
        let vhat = v / (1.0 - cfg.beta2.powi(step as i32));
        p -= lr * mhat / (vhat.sqrt() + cfg.eps);
        assert!((p_gpu[i] as f64 - p).abs() < 1e-6, "param {i}: {} vs {p}", p_gpu[i]);
        assert!((m_gpu[i] as f64 - m).abs() < 1e-6 && (v_gpu[i] as f64 - v).abs() < 1e-6, "moments {i}");
    }
    // A non-finite loss sum skips the update, and each skip is counted once.
    gpu().queue.write_buffer(&gstats, 0, bytemuck::cast_slice(&[f32::NAN]));
    program.submit(gpu(), &kernels);
    program.submit(gpu(), &kernels);
    assert_eq!(download(&gp, len), p_gpu, "update skipped after a NaN loss");
    assert_eq!(download(&gstats, 3)[2], 2.0, "two skipped steps counted, once each over the four pieces");
}

/// The loss scale's update: an overflowed step (non-finite Σ g²) halves the scale and restarts
/// the good steps' count; `growth_interval` good steps double it; a non-finite loss is
/// counted apart.
#[test]
fn loss_scale_halves_on_overflow_and_doubles_after_good_steps() {
    // Slots: 0 scale, 1 used, 2 Σ g², 3 good steps, 4 loss sum, 5 non-finite losses.
    let gstats = buffer(&[1024f32, 0.0, f32::INFINITY, 5.0, 3.0, 0.0]);
    let kernels = block_on(Kernels::new(gpu(), 8)).unwrap();
    let mut p = ProgramBuilder::default();
    ops::adamw::loss_scale_update(&mut p, View::first(&gstats, 6), [0, 1, 2, 3, 4, 5], 3);
    let program = p.build(gpu(), &kernels).unwrap();
    program.submit(gpu(), &kernels);
    assert_eq!(download(&gstats, 6), [512.0, 1024.0, f32::INFINITY, 0.0, 3.0, 0.0], "overflow: halved, count restarted");
    gpu().queue.write_buffer(&gstats, 8, bytemuck::cast_slice(&[2.0f32]));
    program.submit(gpu(), &kernels);
    program.submit(gpu(), &kernels);
    assert_eq!(download(&gstats, 6)[..4], [512.0, 512.0, 2.0, 2.0], "two good steps counted");
    program.submit(gpu(), &kernels);
    assert_eq!(download(&gstats, 6)[..4], [1024.0, 512.0, 2.0, 0.0], "the third doubles the scale");
    gpu().queue.write_buffer(&gstats, 16, bytemuck::cast_slice(&[f32::NAN]));
    program.submit(gpu(), &kernels);
    assert_eq!(download(&gstats, 6)[5], 1.0, "a non-finite loss is counted");
}

/// Products with their operands rounded to f16 (`--precision f16`), against the CPU GEMM on
/// operands rounded the same way (half's round to nearest even): the 64 x 64 and the 128 x 128
/// kernels. Operands past f16's range become infinite (what the loss scaling detects).
#[test]
fn f16_operand_products_match_rounded_cpu_operands() {
    let round = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect::<Vec<_>>();
    let mut rng = Rng::new(31);
    assert_eq!(ops::matmul::kernel_for(2000, 1100, 1).0, Kernel::MatmulWide);
    for (n, k, m) in [(70, 45, 33), (300, 150, 260), (2000, 40, 1100)] {
        // Magnitudes from 1e-6 (f16 subnormals) to 300.
        let x: Vec<f32> = random(&mut rng, n * k, 1.0).iter().enumerate().map(|(i, v)| v * [1e-6, 1e-3, 1.0, 300.0][i % 4]).collect();
        let w = random(&mut rng, m * k, 0.5);
        let mut out = vec![0.0; n * m];
        let cpu = matmul::Forward {
            out: &mut out[..],
            x: &round(&x)[..],
            weight: &round(&w)[..],
            bias: None,
            epilogue: matmul::Epilogue::None,
            save_slope: false,
            k,
            m,
        };
        matmul::forward(&Serial, cpu, &mut vec![0.0; matmul::scratch_len(k, m)], Operands::F32);
        let (gx, gw, gout) = (buffer(&x), buffer(&w), fresh(n * m));
        let kernels = block_on(Kernels::new(gpu(), 8)).unwrap();
        let mut p = ProgramBuilder::default().with_f16_products(true);
        let gpu_args = matmul::Forward {
            out: whole(&gout, &out),
            x: whole(&gx, &x),
            weight: whole(&gw, &w),
            bias: None,
            epilogue: matmul::Epilogue::None,
            save_slope: false,
            k,
            m,
        };
        ops::matmul::forward(&mut p, gpu_args);
        p.build(gpu(), &kernels).unwrap().submit(gpu(), &kernels);
        assert_close(&format!("{n}x{k}x{m} with f16 operands"), &download(&gout, n * m), &out, wide_tol());
    }
    // 1e5 is past f16's range: the product is infinite.
    let (gx, gw, gout) = (buffer(&[1e5f32, 1.0]), buffer(&[1.0f32, 1.0]), fresh(1));
    let kernels = block_on(Kernels::new(gpu(), 8)).unwrap();
    let mut p = ProgramBuilder::default().with_f16_products(true);
    let args = matmul::Forward {
        out: View::first(&gout, 1),
        x: View::first(&gx, 2),
        weight: View::first(&gw, 2),
        bias: None,
        epilogue: matmul::Epilogue::None,
        save_slope: false,
        k: 2,
        m: 1,
    };
    ops::matmul::forward(&mut p, args);
    p.build(gpu(), &kernels).unwrap().submit(gpu(), &kernels);
    assert_eq!(download(&gout, 1)[0], f32::INFINITY, "an operand past f16's range overflows");
}

/// The device with f16 precision, whose kernels are also built for f16 tensors (lavapipe
/// has shader-f16).
fn gpu16() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        block_on(Gpu::open_local(None, 0, Some(Precision::F16), tensor_core_mode()))
            .unwrap_or_else(|e| panic!("the f16 tests need an adapter with shader-f16: {e}"))
    })
}

/// A buffer of `data` on the f16 device.
fn buffer16<T: bytemuck::Pod>(data: &[T]) -> wgpu::Buffer {
    let g = gpu16();
    let size = std::mem::size_of_val(data).next_multiple_of(4).max(256);
    let buf = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: size as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let mut bytes = bytemuck::cast_slice::<T, u8>(data).to_vec();
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    g.queue.write_buffer(&buf, 0, &bytes);
    buf
}

/// `data` stored as f16 on the f16 device, and its view.
fn half_buffer(data: &[f32]) -> wgpu::Buffer {
    buffer16(&data.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>())
}

fn half_view<'a>(buf: &'a wgpu::Buffer, len: usize) -> View<'a> {
    View { half: true, ..View::first(buf, len) }
}

/// `len` f32 elements of a buffer on the f16 device.
fn download16(buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    block_on(read(gpu16(), buf, 0, len)).unwrap()
}

/// `len` f16 elements of a buffer on the f16 device, as f32.
fn download_half(buf: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let words: Vec<u32> = block_on(read(gpu16(), buf, 0, len.div_ceil(2))).unwrap();
    bytemuck::cast_slice::<u32, u16>(&words)[..len].iter().map(|&b| half::f16::from_bits(b).to_f32()).collect()
}

/// Runs what `f` pushes on the f16 device, the products' operands rounded to f16 and
/// tensors over `max_binding` bytes bound in pieces, each checked to start on 256 bytes (WebGPU's
/// offset alignment; lavapipe's is smaller).
fn run16<'a>(head_size: usize, max_binding: u64, f: impl FnOnce(&mut ProgramBuilder<'a>)) {
    let kernels = block_on(Kernels::new(gpu16(), head_size)).unwrap();
    let mut p = ProgramBuilder::default().with_f16_products(true).with_max_binding(max_binding);
    f(&mut p);
    let mut webgpu_aligned = gpu16().clone();
    webgpu_aligned.limits.min_storage_buffer_offset_alignment = 256;
    p.build(&webgpu_aligned, &kernels).unwrap().submit(gpu16(), &kernels);
}

fn round16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Each f16 output within one f16 step (at its magnitude) of the CPU's f32 value: the GPU's
/// f32 result, within 1e-5 of the CPU's, rounded to f16.
fn assert_within_a_half_step(what: &str, gpu: &[f32], cpu: &[f32]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let step = (c.abs().max(f32::from(half::f16::MIN_POSITIVE))).log2().floor().exp2() / 1024.0;
        assert!((g - c).abs() <= step, "{what}[{i}]: GPU {g} vs CPU {c}");
    }
}

/// Under `--precision f16` the linear layers' inputs and qkv are stored as f16: LayerNorm and
/// attention write their outputs as f16, the GEMM reads f16 activations and weight copies
/// (and writes qkv and the GELU output as f16), attention reads qkv and its backward its
/// output as f16, and the
/// weights' copy rounds as `half` does (to nearest even, ±inf past 65504's half step).
/// Each against the CPU op on the same rounded values.
#[test]
fn f16_stored_tensors_match_the_cpu_on_rounded_values() {
    let mut rng = Rng::new(41);
    // The weights' copy, element for element, odd length, in two pieces.
    let mut w = random(&mut rng, 301, 2.0);
    w[..6].copy_from_slice(&[1e-6, -3e-8, 65519.0, 65520.0, -7e4, 0.1]);
    let (gw, gcopy) = (buffer16(&w), buffer16(&vec![0u16; 302]));
    run16(8, u64::MAX, |p| ops::adamw::half_weights(p, View::first(&gw, 301), half_view(&gcopy, 301), &[0..128, 128..301]));
    let want: Vec<f32> = round16(&w);
    assert_eq!(download_half(&gcopy, 301), want, "the weights' f16 copy");
    assert_eq!(&want[2..5], &[65504.0, f32::INFINITY, f32::NEG_INFINITY]);

    // LayerNorm forward writing f16 (an odd count).
    let (n, c) = (71, 83);
    let x: Vec<f32> = random(&mut rng, n * c, 2.0).iter().map(|v| v + 0.7).collect();
    let (lw, lb) = (random(&mut rng, c, 1.0), random(&mut rng, c, 1.0));
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm::forward(&Serial, layernorm::Forward { out: &mut out, mean: &mut mean, rstd: &mut rstd, x: &x, weight: &lw, bias: &lb });
    let (gx, glw, glb, gout, gmean, grstd) = (buffer16(&x), buffer16(&lw), buffer16(&lb), buffer16(&vec![0u16; n * c]), buffer16(&mean), buffer16(&rstd));
    run16(8, u64::MAX, |p| {
        let views = |b, v: &[f32]| View::first(b, v.len());
        let a = layernorm::Forward {
            out: half_view(&gout, n * c),
            mean: views(&gmean, &mean),
            rstd: views(&grstd, &rstd),
            x: views(&gx, &x),
            weight: views(&glw, &lw),
            bias: views(&glb, &lb),
        };
        ops::layernorm::forward(p, a)
    });
    assert_within_a_half_step("layernorm's f16 out", &download_half(&gout, n * c), &out);

    // Products: forward from f16 activations and weights (with bias and residual, and with
    // GELU writing f16), and both backward products from f32 gradients and f16 operands,
    // on the 64 and (at 2000 x 200 x 1100: the forward and the split weight gradient) the 128
    // tiles, or the tensor cores where the device has them, the weight gradient split by depth
    // at 300 rows, and with every tensor bound in pieces (an odd depth: pieces of 128 rows
    // start f16 rows aligned).
    assert_eq!(ops::matmul::kernel_for(2000, 1100, 1).0, Kernel::MatmulWide);
    assert_eq!(ops::matmul::kernel_for(1100, 200, ops::matmul::weight_grad_splits(2000, 200, 1100)).0, Kernel::MatmulWide);
    for (n, k, m, limit) in [(37, 45, 70, u64::MAX), (300, 150, 260, u64::MAX), (300, 45, 130, 4096), (2000, 200, 1100, u64::MAX)] {
        let (x, w, bias, residual) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 0.5), random(&mut rng, m, 0.5), random(&mut rng, n * m, 1.0));
        let (rx, rw) = (round16(&x), round16(&w));
        let (gx, gw, gbias, gres) = (half_buffer(&x), half_buffer(&w), buffer16(&bias), buffer16(&residual));
        let mut scratch = vec![0.0; matmul::scratch_len(k, m)];
        for gelu in [false, true] {
            let (mut out, mut pre) = (vec![0.0; n * m], vec![0.0; n * m]);
            let epilogue = if gelu { matmul::Epilogue::Gelu { pre: &mut pre[..] } } else { matmul::Epilogue::Residual { input: &residual[..] } };
            let cpu = matmul::Forward { out: &mut out[..], x: &rx[..], weight: &rw[..], bias: Some(&bias[..]), epilogue, save_slope: false, k, m };
            matmul::forward(&Serial, cpu, &mut scratch, Operands::F32);
            let (gout, gpre) = (if gelu { buffer16(&vec![0u16; n * m]) } else { buffer16(&vec![0f32; n * m]) }, buffer16(&vec![0f32; n * m]));
            run16(8, limit, |p| {
                let epilogue = if gelu {
                    matmul::Epilogue::Gelu { pre: View::first(&gpre, n * m) }
                } else {
                    matmul::Epilogue::Residual { input: View::first(&gres, n * m) }
                };
                let out = if gelu { half_view(&gout, n * m) } else { View::first(&gout, n * m) };
                let a = matmul::Forward {
                    out,
                    x: half_view(&gx, n * k),
                    weight: half_view(&gw, m * k),
                    bias: Some(View::first(&gbias, m)),
                    epilogue,
                    save_slope: false,
                    k,
                    m,
                };
                ops::matmul::forward(p, a)
            });
            let what = format!("{n}x{k}x{m} from f16 operands");
            if gelu {
                let gpu_pre = download16(&gpre, n * m);
                assert_close(&format!("{what}: GELU pre-activation"), &gpu_pre, &pre, wide_tol());
                // The f16 output is GELU of the GPU's own pre-activation, rounded: the sums'
                // order (the tensor cores' differs from the CPU's) moves small outputs by
                // more than their f16 step.
                let gelu_of_gpu_pre: Vec<f32> = gpu_pre.iter().map(|&x| matmul::gelu(x)).collect();
                assert_within_a_half_step(&format!("{what}: f16 GELU output"), &download_half(&gout, n * m), &gelu_of_gpu_pre);
            } else {
                assert_close(&format!("{what}: out"), &download16(&gout, n * m), &out, wide_tol());
            }
        }
        let dout = random(&mut rng, n * m, 1.0);
        let dw0 = random(&mut rng, m * k, 1.0);
        let (mut dx, mut dw) = (vec![0.0; n * k], dw0.clone());
        let mut partials = vec![0.0; blocks(n) * m];
        let mut rdout = round16(&dout);
        let cpu = matmul::Backward {
            dx: Some(&mut dx[..]),
            dweight: &mut dw[..],
            dbias: None,
            dout: &mut rdout[..],
            x: &rx[..],
            weight: &rw[..],
            activation: None,
            k,
            m,
        };
        matmul::backward(&Serial, cpu, &mut partials, &mut scratch, Operands::F32);
        let (gdout, gdx, gdw, gpart) = (buffer16(&dout), buffer16(&vec![0f32; n * k]), buffer16(&dw0), buffer16(&vec![0f32; partials.len()]));
        let split_len = ops::matmul::weight_grad_scratch_len(n, k, m).max(1);
        let gsplit = buffer16(&vec![0f32; split_len]);
        run16(8, limit, |p| {
            let grads = matmul::Backward {
                dx: Some(View::first(&gdx, n * k)),
                dweight: View::first(&gdw, m * k),
                dbias: None,
                dout: View::first(&gdout, n * m),
                x: half_view(&gx, n * k),
                weight: half_view(&gw, m * k),
                activation: None,
                k,
                m,
            };
            ops::matmul::backward(p, grads, View::first(&gpart, partials.len()), View::first(&gsplit, split_len))
        });
        assert_close(&format!("{n}x{k}x{m}: dx from an f16 weight copy"), &download16(&gdx, n * k), &dx, wide_tol());
        assert_close(&format!("{n}x{k}x{m}: dw from f16 activations"), &download16(&gdw, m * k), &dw, wide_tol());
    }

    // Attention reading qkv as f16 and writing its output as f16; its backward reading both.
    let shape = AttentionShape { batch: 1, seq: 75, heads: 2, kv_heads: 2, head_size: 36, rope: None };
    let (n, c) = (75, 72);
    let qkv = round16(&random(&mut rng, n * 3 * c, 1.5));
    let (mut out, mut lse, mut scratch) = (vec![0.0; n * c], vec![0.0; 2 * 75], vec![0.0; shape.scratch_len()]);
    attention::forward(&Serial, attention::Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape, dropout: None }, &mut scratch, None, Operands::F32);
    let (gqkv, gout, glse, gkey) = (half_buffer(&qkv), buffer16(&vec![0u16; n * c]), buffer16(&lse), buffer16(&KEY.words()));
    run16(36, u64::MAX, |p| {
        let a = attention::Forward { out: half_view(&gout, n * c), lse: View::first(&glse, lse.len()), qkv: half_view(&gqkv, qkv.len()), shape, dropout: None };
        ops::attention::forward(p, a, View::first(&gkey, 4), None)
    });
    let gpu_out = download_half(&gout, n * c);
    assert_within_a_half_step("attention's f16 out", &gpu_out, &out);
    assert_close("attention lse", &download16(&glse, lse.len()), &lse, 1e-5);
    let dout = random(&mut rng, n * c, 1.0);
    let mut dqkv = vec![0.0; n * 3 * c];
    let a: attention::Backward<&mut [f32], &[f32]> =
        attention::Backward { dqkv: &mut dqkv[..], dout: &dout, qkv: &qkv, out: &gpu_out, lse: &lse, shape, dropout: None };
    attention::backward(&Serial, a, &mut scratch, None, Operands::F32);
    let (gdqkv, gdout, gdelta) = (buffer16(&vec![0f32; n * 3 * c]), buffer16(&dout), buffer16(&lse));
    run16(36, u64::MAX, |p| {
        let grads = attention::Backward {
            dqkv: View::first(&gdqkv, n * 3 * c),
            dout: View::first(&gdout, n * c),
            qkv: half_view(&gqkv, qkv.len()),
            out: half_view(&gout, n * c),
            lse: View::first(&glse, lse.len()),
            shape,
            dropout: None,
        };
        ops::attention::backward(p, grads, View::first(&gdelta, lse.len()), View::first(&gkey, 4), None)
    });
    assert_close("attention dqkv from f16 qkv and output", &download16(&gdqkv, n * 3 * c), &dqkv, 1e-5);
}
