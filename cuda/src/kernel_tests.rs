//! Every kernel against its CPU op (alpha_core::ops), through the executor, on random inputs
//! with odd shapes (rows past a warp's 32 lanes, head sizes past 32 dimensions), forward and
//! backward: on a CUDA device where there is one (`ALPHA_REQUIRE_CUDA=1` makes it required),
//! else on the host's emulation. The products' operands are f32 here (bf16: the engine's test).

use crate::blas::{Arithmetic, Products};
use crate::device::Device;
use crate::executor::{group_rows_by_token, Arenas, CudaExecutor, Decoding, TokenGroups};
use crate::memory::{Buffer, Tensor};
use alpha_core::gemm::bf16::{bf16_to_f32, round_bf16};
use alpha_core::gemm::Operands;
use alpha_core::ops::attention::KvCache;
use alpha_core::ops::dropout::{DropoutKey, Site};
use alpha_core::ops::{attention, cross_entropy, dropout, embedding, layernorm, matmul, rmsnorm};
use alpha_core::walk::Executor;
use alpha_core::{Arch, GptConfig, Llama, Plan, Rng, RopeScaling, Serial};

fn device() -> Device {
    match crate::device::check_libraries().and_then(|()| Device::open(0)) {
        Ok(d) => d,
        Err(why) if std::env::var_os("ALPHA_REQUIRE_CUDA").is_some() => panic!("ALPHA_REQUIRE_CUDA is set: {why}"),
        Err(_) => Device::emulated().expect("the host's emulation needs a C++20 compiler"),
    }
}

fn random(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale).collect()
}

/// `xs` rounded to bf16, as bits.
fn bf16_bits(xs: &[f32]) -> Vec<u16> {
    xs.iter().map(|&x| round_bf16(x)).collect()
}

/// `got` equal to `want` element by element (f32 values, or bf16 bits); a NaN fails.
fn assert_same<T: Copy + PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}[{i}]: {:?} where the f32 kernels give {:?}", got[i], want[i]);
    }
}

/// bf16 bits as f32 values.
fn widened(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| bf16_to_f32(b)).collect()
}

/// `got` within `tol` of `want`, relative to 1 or the value.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs the CPU's {w}");
    }
}

/// A device, its products, and the tensors of one test.
struct Rig {
    products: Products,
    plan: Plan,
    acts: Buffer,
    tokens: Buffer,
    targets: Buffer,
    buffers: Vec<Buffer>,
    /// The plan's rotary table, where it has RoPE.
    rope: Option<Buffer>,
    /// The batch's rows grouped by token (in the first of `buffers`).
    token_groups: TokenGroups,
    /// With grouped heads, attention's partials (in `buffers`).
    attention_partials: Option<Tensor>,
    /// Where a large batch's weight gradients are cut in token slices (in `buffers`).
    weight_grad_slices: Option<Tensor>,
    /// With bf16 products, the scratch their activation operands are rounded into (in
    /// `buffers`).
    operands_bf16: Option<(Tensor, Tensor)>,
    /// Last: dropped after everything allocated on it.
    device: Device,
}

impl Rig {
    /// A rig for ops of `plan`'s shapes, its batch's tokens and targets `ids`.
    fn new(plan: Plan, ids: &[u32]) -> Rig {
        Rig::with_arithmetic(plan, ids, Arithmetic::F32)
    }

    /// As [`Rig::new`], the products (and what follows them) in `arithmetic`.
    fn with_arithmetic(plan: Plan, ids: &[u32], arithmetic: Arithmetic) -> Rig {
        let device = device();
        let products = Products::new(&device, arithmetic).unwrap();
        let acts = Buffer::f32s(&device, "activations", plan.acts_len()).unwrap();
        let (tokens, targets) = (Buffer::zeroed(&device, "tokens", ids.len(), 4).unwrap(), Buffer::zeroed(&device, "targets", ids.len(), 4).unwrap());
        tokens.upload(0, ids).unwrap();
        targets.upload(0, ids).unwrap();
        let rope = crate::executor::rope_table(&plan).map(|table| {
            let b = Buffer::f32s(&device, "rotary table", table.len()).unwrap();
            b.upload(0, &table).unwrap();
            b
        });
        let (mut rows, mut starts) = (vec![0; ids.len()], Vec::new());
        group_rows_by_token(ids, &mut rows, &mut starts);
        let groups = Buffer::zeroed(&device, "rows by token", rows.len() + starts.len(), 4).unwrap();
        groups.upload(0, &rows).unwrap();
        groups.upload(rows.len(), &starts).unwrap();
        let all = groups.tensor();
        let token_groups = TokenGroups { rows: all.part(0, rows.len()), starts: all.part(rows.len(), starts.len()), count: starts.len() - 1 };
        let mut buffers = vec![groups];
        let partials_len = crate::executor::attention_partials_len(&plan);
        if partials_len > 0 {
            buffers.push(Buffer::f32s(&device, "attention partials", partials_len).unwrap());
        }
        let attention_partials = (partials_len > 0).then(|| buffers.last().unwrap().tensor());
        let slices_len = crate::executor::weight_grad_slices_len(&plan);
        if slices_len > 0 {
            buffers.push(Buffer::f32s(&device, "weight gradient slices", slices_len).unwrap());
        }
        let weight_grad_slices = (slices_len > 0).then(|| buffers.last().unwrap().tensor());
        // bf16 products round their activation operands into two scratch tensors, each as
        // large as any activation.
        let mut operands_bf16 = None;
        if arithmetic == Arithmetic::Bf16 {
            buffers.push(Buffer::zeroed(&device, "bf16 operands", plan.acts_len(), 2).unwrap());
            buffers.push(Buffer::zeroed(&device, "bf16 operands", plan.acts_len(), 2).unwrap());
            operands_bf16 = Some((buffers[buffers.len() - 2].tensor(), buffers[buffers.len() - 1].tensor()));
        }
        Rig { device, products, plan, acts, tokens, targets, buffers, rope, token_groups, attention_partials, weight_grad_slices, operands_bf16 }
    }

    /// `data` on the device.
    fn put(&mut self, data: &[f32]) -> Tensor {
        let b = Buffer::f32s(&self.device, "a test tensor", data.len()).unwrap();
        b.upload(0, data).unwrap();
        self.buffers.push(b);
        self.buffers.last().unwrap().tensor()
    }

    /// A tensor's elements, after the queued work.
    fn get(&self, t: Tensor) -> Vec<f32> {
        let b = self.buffers.iter().find(|b| b.tensor() == t).expect("a tensor of this rig");
        let mut out = vec![0f32; t.len];
        b.download(0, &mut out).unwrap();
        out
    }

    /// Weight `data` as the products read it: under bf16 products, rounded to bf16 (the engine's
    /// bf16 copy of the weights, which a rig has not).
    fn put_weight(&mut self, data: &[f32], arithmetic: Arithmetic) -> Tensor {
        match arithmetic {
            Arithmetic::Bf16 => self.put_bf16(data),
            _ => self.put(data),
        }
    }

    /// `data` rounded to bf16 on the device, as a bf16 run stores an activation.
    fn put_bf16(&mut self, data: &[f32]) -> Tensor {
        let b = Buffer::zeroed(&self.device, "a bf16 test tensor", data.len(), 2).unwrap();
        b.upload(0, &bf16_bits(data)).unwrap();
        self.buffers.push(b);
        self.buffers.last().unwrap().tensor()
    }

    /// A bf16 tensor's elements as their bits, after the queued work.
    fn get_bits(&self, t: Tensor) -> Vec<u16> {
        let b = self.buffers.iter().find(|b| b.tensor() == t).expect("a tensor of this rig");
        let mut out = vec![0u16; t.len];
        b.download(0, &mut out).unwrap();
        out
    }

    fn exec(&self) -> CudaExecutor<'_> {
        let t = self.acts.tensor();
        let arenas = Arenas {
            params: t,
            params_bf16: None,
            grads: None,
            acts: t,
            tokens: self.tokens.tensor(),
            targets: Some(self.targets.tensor()),
            operands_bf16: self.operands_bf16,
            rope: self.rope.as_ref().map(Buffer::tensor),
            token_groups: Some(self.token_groups),
            attention_partials: self.attention_partials,
            weight_grad_slices: self.weight_grad_slices,
        };
        CudaExecutor::new(&self.device, &self.products, &self.plan, arenas)
    }

    /// Runs `f` on an executor (with dropout `key`) and checks that it queued no error.
    fn run(&self, key: Option<DropoutKey>, f: impl FnOnce(&mut CudaExecutor<'_>)) {
        let mut e = self.exec();
        let key_words = Buffer::zeroed(&self.device, "a dropout key", 4, 4).unwrap();
        if let Some(k) = key {
            key_words.upload(0, &k.words()).unwrap();
            e = e.with_dropout_key(key_words.tensor());
        }
        f(&mut e);
        e.finish().unwrap();
        self.device.synchronize().unwrap();
    }
}

fn plan(vocab: usize, batch: usize, seq: usize, heads: usize, embd: usize) -> Plan {
    Plan::new(GptConfig::gpt2(vocab, seq, 1, heads, embd), batch, seq).unwrap()
}

/// A Llama-family plan: `kv_heads` key/value heads, Llama 3's RoPE scaling with every band in
/// use.
fn llama_plan(batch: usize, seq: usize, heads: usize, kv_heads: usize, embd: usize) -> Plan {
    let rope_scaling = Some(RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 4 });
    let llama = Llama { n_kv_head: kv_heads, intermediate_size: 8, norm_eps: 1e-5, rope_theta: 500.0, rope_scaling, qkv_bias: false, tied: true };
    Plan::new(GptConfig { arch: Arch::Llama(llama), ..GptConfig::gpt2(5, seq, 1, heads, embd) }, batch, seq).unwrap()
}

#[test]
fn embedding_matches_the_cpu() {
    // Tokens that repeat (a token's rows in order), columns over a block of threads.
    let (b, t, c, v) = (3, 7, 300, 5);
    let mut rng = Rng::new(1);
    let ids: Vec<u32> = (0..b * t).map(|i| (i * 7 % v) as u32).collect();
    let mut rig = Rig::new(plan(v, b, t, 1, c), &ids);
    let (wte, wpe, dout) = (random(&mut rng, v * c, 1.0), random(&mut rng, t * c, 1.0), random(&mut rng, b * t * c, 1.0));
    let (dwte0, dwpe0) = (random(&mut rng, v * c, 1.0), random(&mut rng, t * c, 1.0));
    let (g_out, g_wte, g_wpe) = (rig.put(&vec![0f32; b * t * c]), rig.put(&wte), rig.put(&wpe));
    let (g_dwte, g_dwpe, g_dout) = (rig.put(&dwte0), rig.put(&dwpe0), rig.put(&dout));
    rig.run(None, |e| {
        e.embedding_forward(embedding::Forward { out: g_out, wte: g_wte, wpe: Some(g_wpe), seq: t });
        e.embedding_backward(embedding::Backward { dwte: g_dwte, dwpe: Some(g_dwpe), dout: g_dout, seq: t });
    });
    let mut out = vec![0f32; b * t * c];
    embedding::forward(&Serial, embedding::Forward { out: &mut out, wte: &wte, wpe: Some(&wpe), seq: t }, &ids);
    let (mut dwte, mut dwpe) = (dwte0, dwpe0);
    embedding::backward(&Serial, embedding::Backward { dwte: &mut dwte, dwpe: Some(&mut dwpe), dout: &dout, seq: t }, &ids);
    // The same sums in the same order: the same bits.
    assert_eq!(rig.get(g_out), out);
    assert_eq!((rig.get(g_dwte), rig.get(g_dwpe)), (dwte, dwpe));
}

#[test]
fn layernorm_matches_the_cpu() {
    // Rows over two row blocks of the parameters' sums, columns over a block of threads.
    let (n, c) = (150, 300);
    let mut rng = Rng::new(2);
    let mut rig = Rig::new(plan(5, 1, n, 1, c), &vec![0; n]);
    let (x, w, bias, dout, dx0) =
        (random(&mut rng, n * c, 2.0), random(&mut rng, c, 1.0), random(&mut rng, c, 1.0), random(&mut rng, n * c, 1.0), random(&mut rng, n * c, 1.0));
    let (dw0, db0) = (random(&mut rng, c, 1.0), random(&mut rng, c, 1.0));
    let (g_out, g_mean, g_rstd) = (rig.put(&vec![0f32; n * c]), rig.put(&vec![0f32; n]), rig.put(&vec![0f32; n]));
    let (g_x, g_w, g_b, g_dout) = (rig.put(&x), rig.put(&w), rig.put(&bias), rig.put(&dout));
    let (g_dx, g_dw, g_db) = (rig.put(&dx0), rig.put(&dw0), rig.put(&db0));
    rig.run(None, |e| {
        e.layernorm_forward(layernorm::Forward { out: g_out, mean: g_mean, rstd: g_rstd, x: g_x, weight: g_w, bias: g_b });
        let a = layernorm::Backward { dx: g_dx, dweight: g_dw, dbias: g_db, dout: g_dout, x: g_x, mean: g_mean, rstd: g_rstd, weight: g_w };
        e.layernorm_backward(a);
    });
    let (mut out, mut mean, mut rstd) = (vec![0f32; n * c], vec![0f32; n], vec![0f32; n]);
    layernorm::forward(&Serial, layernorm::Forward { out: &mut out, mean: &mut mean, rstd: &mut rstd, x: &x, weight: &w, bias: &bias });
    let (mut dx, mut dw, mut db) = (dx0, dw0, db0);
    let mut partials = vec![0f32; alpha_core::ops::row_blocks::blocks(n) * 2 * c];
    let a = layernorm::Backward {
        dx: &mut dx[..],
        dweight: &mut dw[..],
        dbias: &mut db[..],
        dout: &dout[..],
        x: &x[..],
        mean: &mean[..],
        rstd: &rstd[..],
        weight: &w[..],
    };
    layernorm::backward(&Serial, a, &mut partials);
    for (what, g, want) in
        [("out", g_out, &out), ("mean", g_mean, &mean), ("rstd", g_rstd, &rstd), ("dx", g_dx, &dx), ("dweight", g_dw, &dw), ("dbias", g_db, &db)]
    {
        assert_close(what, &rig.get(g), want, 1e-5);
    }
}

#[test]
fn rmsnorm_matches_the_cpu() {
    // Ten row blocks: the partials' sums eight blocks at a time, then the rest.
    let (n, c, eps) = (600, 300, 1e-6);
    let mut rng = Rng::new(2);
    let mut rig = Rig::new(plan(5, 1, n, 1, c), &vec![0; n]);
    let (x, w, dout, dx0, dw0) =
        (random(&mut rng, n * c, 2.0), random(&mut rng, c, 1.0), random(&mut rng, n * c, 1.0), random(&mut rng, n * c, 1.0), random(&mut rng, c, 1.0));
    let (g_out, g_rstd, g_x, g_w, g_dout) = (rig.put(&vec![0f32; n * c]), rig.put(&vec![0f32; n]), rig.put(&x), rig.put(&w), rig.put(&dout));
    let (g_dx, g_dw) = (rig.put(&dx0), rig.put(&dw0));
    rig.run(None, |e| {
        e.rmsnorm_forward(rmsnorm::Forward { out: g_out, rstd: g_rstd, x: g_x, weight: g_w, eps });
        e.rmsnorm_backward(rmsnorm::Backward { dx: g_dx, dweight: g_dw, dout: g_dout, x: g_x, rstd: g_rstd, weight: g_w });
    });
    let (mut out, mut rstd) = (vec![0f32; n * c], vec![0f32; n]);
    rmsnorm::forward(&Serial, rmsnorm::Forward { out: &mut out, rstd: &mut rstd, x: &x, weight: &w, eps });
    let (mut dx, mut dw) = (dx0, dw0);
    let mut partials = vec![0f32; alpha_core::ops::row_blocks::blocks(n) * c];
    rmsnorm::backward(&Serial, rmsnorm::Backward { dx: &mut dx[..], dweight: &mut dw[..], dout: &dout, x: &x, rstd: &rstd, weight: &w }, &mut partials);
    for (what, g, want) in [("out", g_out, &out), ("rstd", g_rstd, &rstd), ("dx", g_dx, &dx), ("dweight", g_dw, &dw)] {
        assert_close(what, &rig.get(g), want, 1e-5);
    }
}

/// SwiGLU after the gate and up product, and its backward into the product's.
#[test]
fn swiglu_matches_the_cpu() {
    let (n, k, m) = (19, 37, 2 * 23);
    let mut rng = Rng::new(3);
    let mut rig = Rig::new(plan(5, 1, n, 1, k), &vec![0; n]);
    let (x, w, dh, dw0) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 1.0), random(&mut rng, n * m / 2, 1.0), random(&mut rng, m * k, 1.0));
    let (g_out, g_pre, g_x, g_w, g_dh) = (rig.put(&vec![0f32; n * m / 2]), rig.put(&vec![0f32; n * m]), rig.put(&x), rig.put(&w), rig.put(&dh));
    let (g_dx, g_dw) = (rig.put(&vec![0f32; n * k]), rig.put(&dw0));
    rig.run(None, |e| {
        let epilogue = matmul::Epilogue::SwiGlu { pre: g_pre };
        e.matmul_forward(matmul::Forward { out: g_out, x: g_x, weight: g_w, bias: None, epilogue, save_slope: true, k, m });
        let activation = Some(matmul::ActivationGrad::SwiGlu { dh: g_dh });
        e.matmul_backward(matmul::Backward { dx: Some(g_dx), dweight: g_dw, dbias: None, dout: g_pre, x: g_x, weight: g_w, activation, k, m });
    });
    let (mut out, mut pre) = (vec![0f32; n * m / 2], vec![0f32; n * m]);
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
    matmul::forward(&Serial, a, &mut vec![0f32; matmul::scratch_len(k, m)], Operands::F32);
    let (mut dx, mut dw) = (vec![0f32; n * k], dw0);
    let a = matmul::Backward {
        dx: Some(&mut dx[..]),
        dweight: &mut dw[..],
        dbias: None,
        dout: &mut pre[..],
        x: &x[..],
        weight: &w[..],
        activation: Some(matmul::ActivationGrad::SwiGlu { dh: &dh[..] }),
        k,
        m,
    };
    let mut partials = vec![0f32; alpha_core::ops::row_blocks::blocks(n) * m];
    matmul::backward(&Serial, a, &mut partials, &mut vec![0f32; matmul::scratch_len(k, m)], Operands::F32);
    for (what, g, want) in [("out", g_out, &out), ("d(pre)", g_pre, &pre), ("dx", g_dx, &dx), ("dweight", g_dw, &dw)] {
        assert_close(what, &rig.get(g), want, 1e-5);
    }
}

/// With bf16 products too, against the CPU's f32 op in norm (as the other bf16 tests): there the
/// bias gradient's pass also writes the products' bf16 copy of dout. The bias and residual on
/// cuBLASLt's epilogue and on Alpha's own pass (fused epilogues off, or a bias 4 bytes past an
/// alignment that cuBLASLt's bias epilogue may decline, as the host's emulation does).
#[test]
fn matmul_and_its_epilogues_match_the_cpu() {
    check_matmul_in(Arithmetic::F32);
    check_matmul_in(Arithmetic::Bf16);
}

fn check_matmul_in(arithmetic: Arithmetic) {
    for kind in ["none", "gelu", "residual"] {
        for bias_at in [Some(0), Some(1), None] {
            check_matmul_case(arithmetic, kind, bias_at, true);
            check_matmul_case(arithmetic, kind, bias_at, false);
        }
    }
}

/// One linear layer, its epilogue `kind`, its bias (where there is one) `bias_at` floats past
/// an alignment, with `fused` epilogues or without.
fn check_matmul_case(arithmetic: Arithmetic, kind: &str, bias_at: Option<usize>, fused: bool) {
    // The bias gradient's rows over two row blocks, its columns over a block of threads.
    let (n, k, m) = (150, 70, 270);
    let close = |what: &str, got: &[f32], want: &[f32]| match arithmetic {
        Arithmetic::Bf16 => assert_close_in_norm(what, got, want, 1e-2),
        _ => assert_close(what, got, want, 1e-5),
    };
    let with_bias = bias_at.is_some();
    let what = format!("{arithmetic:?}, {kind}, bias at {bias_at:?} floats past an alignment, fused epilogues {fused}");
    let mut rng = Rng::new(3);
    let mut rig = Rig::with_arithmetic(plan(5, 1, n, 1, k), &vec![0; n], arithmetic);
    rig.products = Products::new(&rig.device, arithmetic).unwrap().with_fused_epilogues(fused);
    let (x, w, bias, res) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 1.0), random(&mut rng, m, 1.0), random(&mut rng, n * m, 1.0));
    let (dout, dw0, db0) = (random(&mut rng, n * m, 1.0), random(&mut rng, m * k, 1.0), random(&mut rng, m, 1.0));
    let skip = bias_at.unwrap_or(0);
    let g_b = rig.put(&[vec![0f32; skip], bias.clone()].concat()).part(skip, m);
    let (g_out, g_pre, g_x, g_w, g_res) =
        (rig.put(&vec![0f32; n * m]), rig.put(&vec![0f32; n * m]), rig.put(&x), rig.put_weight(&w, arithmetic), rig.put(&res));
    let (g_dout, g_dx, g_dw, g_db) = (rig.put(&dout), rig.put(&vec![0f32; n * k]), rig.put(&dw0), rig.put(&db0));
    let gpu_epilogue = match kind {
        "gelu" => matmul::Epilogue::Gelu { pre: g_pre },
        "residual" => matmul::Epilogue::Residual { input: g_res },
        _ => matmul::Epilogue::None,
    };
    rig.run(None, |e| {
        let bias = with_bias.then_some(g_b);
        e.matmul_forward(matmul::Forward { out: g_out, x: g_x, weight: g_w, bias, epilogue: gpu_epilogue, save_slope: true, k, m });
        let gelu_slope = (kind == "gelu").then_some(g_pre);
        let dbias = with_bias.then_some(g_db);
        e.matmul_backward(matmul::Backward {
            dx: Some(g_dx),
            dweight: g_dw,
            dbias,
            dout: g_dout,
            x: g_x,
            weight: g_w,
            activation: gelu_slope.map(|slope| matmul::ActivationGrad::Gelu { slope }),
            k,
            m,
        });
    });
    let (mut out, mut pre) = (vec![0f32; n * m], vec![0f32; n * m]);
    let epilogue = match kind {
        "gelu" => matmul::Epilogue::Gelu { pre: &mut pre[..] },
        "residual" => matmul::Epilogue::Residual { input: &res[..] },
        _ => matmul::Epilogue::None,
    };
    let a = matmul::Forward { out: &mut out[..], x: &x[..], weight: &w[..], bias: with_bias.then_some(&bias[..]), epilogue, save_slope: true, k, m };
    matmul::forward(&Serial, a, &mut vec![0f32; matmul::scratch_len(k, m)], Operands::F32);
    let (mut d, mut dx, mut dw, mut db) = (dout.clone(), vec![0f32; n * k], dw0, db0);
    let a = matmul::Backward {
        dx: Some(&mut dx[..]),
        dweight: &mut dw[..],
        dbias: with_bias.then_some(&mut db[..]),
        dout: &mut d[..],
        x: &x[..],
        weight: &w[..],
        activation: (kind == "gelu").then_some(matmul::ActivationGrad::Gelu { slope: &pre[..] }),
        k,
        m,
    };
    let mut partials = vec![0f32; alpha_core::ops::row_blocks::blocks(n) * m];
    matmul::backward(&Serial, a, &mut partials, &mut vec![0f32; matmul::scratch_len(k, m)], Operands::F32);
    close(&format!("{what}: out"), &rig.get(g_out), &out);
    if kind == "gelu" {
        close(&format!("{what}: gelu slope"), &rig.get(g_pre), &pre);
    }
    close(&format!("{what}: d(pre)"), &rig.get(g_dout), &d);
    close(&format!("{what}: dx"), &rig.get(g_dx), &dx);
    close(&format!("{what}: dweight"), &rig.get(g_dw), &dw);
    if with_bias {
        close(&format!("{what}: dbias"), &rig.get(g_db), &db);
    }
}

/// GPT-2's heads, and the Llama family's: three query heads to each key/value head, rotary
/// embeddings (dQ and dK rotated back); on the SIMT kernels (heads the tensor cores' kernels
/// do not take).
#[test]
fn attention_matches_the_cpu_with_and_without_dropout() {
    // Short and long sequences (past one block of 64 rows and one staged tile), head sizes
    // of one to eight threads per row (8, 40, 72, 200 dimensions).
    let info = device().info;
    for p in [plan(5, 2, 7, 3, 120), llama_plan(2, 7, 6, 2, 48), plan(5, 1, 150, 3, 120), llama_plan(1, 70, 2, 1, 144), plan(5, 1, 40, 1, 200)] {
        assert_eq!(crate::executor::attention_kernels(&info, Arithmetic::F32, p.attention_shape(), false).forward, "attention_forward");
        check_attention_in(p, Arithmetic::F32);
    }
}

/// A weight gradient over many tokens for its outputs is summed over token slices (here 1600
/// tokens in 3 slices of 576, 576 and 448) added in order: against the CPU's element by element
/// in f32, in norm with bf16 operands.
#[test]
fn weight_gradients_over_token_slices_match_the_cpu() {
    let (n, k, m) = (1600, 24, 40);
    assert_eq!(crate::executor::weight_grad_slices(k * m, n), (3, 576));
    for arithmetic in [Arithmetic::F32, Arithmetic::Bf16] {
        let mut rng = Rng::new(8);
        let mut rig = Rig::with_arithmetic(plan(5, 1, n, 1, k), &vec![0; n], arithmetic);
        let (x, w, dout, dw0) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 1.0), random(&mut rng, n * m, 1.0), random(&mut rng, m * k, 1.0));
        let (g_x, g_w, g_dout, g_dw) = (rig.put(&x), rig.put(&w), rig.put(&dout), rig.put(&dw0));
        rig.run(None, |e| {
            e.matmul_backward(matmul::Backward { dx: None, dweight: g_dw, dbias: None, dout: g_dout, x: g_x, weight: g_w, activation: None, k, m });
        });
        let (mut d, mut dw) = (dout.clone(), dw0);
        let a = matmul::Backward { dx: None, dweight: &mut dw[..], dbias: None, dout: &mut d[..], x: &x[..], weight: &w[..], activation: None, k, m };
        matmul::backward(&Serial, a, &mut vec![0f32; alpha_core::ops::row_blocks::blocks(n) * m], &mut vec![0f32; matmul::scratch_len(k, m)], Operands::F32);
        match arithmetic {
            Arithmetic::Bf16 => assert_close_in_norm("bf16: dweight", &rig.get(g_dw), &dw, 1e-2),
            _ => assert_close("f32: dweight", &rig.get(g_dw), &dw, 1e-5),
        }
    }
}

/// Heads of 16 to 64 dimensions run on the tensor cores. With bf16 products their operands
/// are bf16 (the probabilities and their gradients rounded too), summed in f32: against the
/// CPU's f32 op within 1e-2 relative in norm, the bound core's own bf16 attention keeps from
/// f32 (its bf16 kernel needs AVX512-BF16, which a test machine may lack). In f32 runs each
/// f32 operand is split into two TF32 parts and three products summed: element by element
/// within 1e-5, as the SIMT kernels are. Several blocks and tiles, GQA, RoPE, dropout, heads of
/// 16, 32 and 64.
#[test]
fn attention_on_the_tensor_cores_matches_the_cpu() {
    let info = device().info;
    for (arithmetic, kernel) in [(Arithmetic::Bf16, "attention_tensor_forward"), (Arithmetic::F32, "attention_tf32x3_forward")] {
        for p in [plan(5, 2, 70, 3, 96), llama_plan(1, 150, 4, 2, 256), plan(5, 1, 40, 2, 32)] {
            assert_eq!(crate::executor::attention_kernels(&info, arithmetic, p.attention_shape(), false).forward, kernel);
            check_attention_in(p, arithmetic);
        }
    }
}

/// A bf16 run stores the products' inputs and qkv as bf16: the kernels writing them give the f32
/// kernels' results rounded to bf16, bit for bit (the same arithmetic, one rounding at the
/// store), and what they save beside (the norms' statistics, GELU's and SwiGLU's slopes) is the
/// same. The products before: a linear layer into a bf16 output (qkv) with and without a bias,
/// and into GELU.
#[test]
fn stored_bf16_activations_are_the_f32_results_rounded() {
    let (n, c) = (70, 300);
    let mut rng = Rng::new(5);
    let mut rig = Rig::with_arithmetic(plan(5, 1, n, 1, c), &vec![0; n], Arithmetic::Bf16);
    let (x, w, bias) = (random(&mut rng, n * c, 2.0), random(&mut rng, c, 1.0), random(&mut rng, c, 1.0));
    let (g_x, g_w, g_b) = (rig.put(&x), rig.put(&w), rig.put(&bias));
    let (out32, out16) = (rig.put(&vec![0f32; n * c]), rig.put_bf16(&vec![0f32; n * c]));
    let stats: Vec<Tensor> = (0..4).map(|_| rig.put(&vec![0f32; n])).collect();
    rig.run(None, |e| {
        e.layernorm_forward(layernorm::Forward { out: out32, mean: stats[0], rstd: stats[1], x: g_x, weight: g_w, bias: g_b });
        e.layernorm_forward(layernorm::Forward { out: out16, mean: stats[2], rstd: stats[3], x: g_x, weight: g_w, bias: g_b });
    });
    assert_same("layernorm's output", &rig.get_bits(out16), &bf16_bits(&rig.get(out32)));
    assert_same("layernorm's means", &rig.get(stats[2]), &rig.get(stats[0]));
    assert_same("layernorm's rstd", &rig.get(stats[3]), &rig.get(stats[1]));
    rig.run(None, |e| {
        e.rmsnorm_forward(rmsnorm::Forward { out: out32, rstd: stats[0], x: g_x, weight: g_w, eps: 1e-6 });
        e.rmsnorm_forward(rmsnorm::Forward { out: out16, rstd: stats[2], x: g_x, weight: g_w, eps: 1e-6 });
    });
    assert_same("rmsnorm's output", &rig.get_bits(out16), &bf16_bits(&rig.get(out32)));
    assert_same("rmsnorm's rstd", &rig.get(stats[2]), &rig.get(stats[0]));

    let (k, m) = (c, 2 * 46);
    let (weight, pre_bias) = (rig.put_weight(&random(&mut rng, m * k, 1.0), Arithmetic::Bf16), rig.put(&random(&mut rng, m, 1.0)));
    let (pre32, pre16) = (rig.put(&vec![0f32; n * m]), rig.put(&vec![0f32; n * m]));
    let (wide32, wide16) = (rig.put(&vec![0f32; n * m]), rig.put_bf16(&vec![0f32; n * m]));
    for bias in [Some(pre_bias), None] {
        rig.run(None, |e| {
            for out in [wide32, wide16] {
                e.matmul_forward(matmul::Forward { out, x: g_x, weight, bias, epilogue: matmul::Epilogue::None, save_slope: false, k, m });
            }
        });
        assert_same(&format!("a product into bf16 (bias {})", bias.is_some()), &rig.get_bits(wide16), &bf16_bits(&rig.get(wide32)));
    }
    for swiglu in [false, true] {
        let width = if swiglu { m / 2 } else { m };
        let (half32, half16) = (rig.put(&vec![0f32; n * width]), rig.put_bf16(&vec![0f32; n * width]));
        rig.run(None, |e| {
            for (out, pre) in [(half32, pre32), (half16, pre16)] {
                let epilogue = if swiglu { matmul::Epilogue::SwiGlu { pre } } else { matmul::Epilogue::Gelu { pre } };
                let bias = (!swiglu).then_some(pre_bias);
                e.matmul_forward(matmul::Forward { out, x: g_x, weight, bias, epilogue, save_slope: true, k, m });
            }
        });
        let what = if swiglu { "SwiGLU" } else { "GELU" };
        assert_same(&format!("{what}'s output"), &rig.get_bits(half16), &bf16_bits(&rig.get(half32)));
        assert_same(&format!("{what}'s slopes"), &rig.get(pre16), &rig.get(pre32));
    }
}

/// Attention over qkv and an output stored as bf16 (bf16 runs) gives, on the tensor cores and
/// on the SIMT kernels, the f32 kernels' results on the same values: the output rounded to
/// bf16, lse and dqkv bit for bit. GQA, RoPE and dropout included.
#[test]
fn attention_over_bf16_activations_gives_the_f32_kernels_results() {
    let info = device().info;
    let cases = [
        (plan(5, 2, 70, 3, 96), "attention_tensor_forward_bf16"),
        (llama_plan(1, 80, 4, 2, 256), "attention_tensor_forward_bf16"),
        (plan(5, 1, 40, 3, 120), "attention_forward_bf16"),
    ];
    for (p, kernel) in cases {
        let s = p.attention_shape();
        if info.has_bf16() {
            assert_eq!(crate::executor::attention_kernels(&info, Arithmetic::Bf16, s, true).forward, kernel);
        }
        let (c, w, n) = (s.heads * s.head_size, s.width(), s.batch * s.seq);
        let (site, key) = (Some(Site { id: 4, threshold: 1 << 30 }), Some(DropoutKey { seed: 11, draw: 3 }));
        let mut rng = Rng::new(6);
        let mut rig = Rig::with_arithmetic(p, &vec![0; n], Arithmetic::Bf16);
        let (qkv, dout) = (widened(&bf16_bits(&random(&mut rng, n * w, 1.0))), random(&mut rng, n * c, 1.0));
        let lse_len = s.batch * s.heads * s.seq;
        let (qkv32, qkv16, g_dout) = (rig.put(&qkv), rig.put_bf16(&qkv), rig.put(&dout));
        let (out32, out16, lse32, lse16) =
            (rig.put(&vec![0f32; n * c]), rig.put_bf16(&vec![0f32; n * c]), rig.put(&vec![0f32; lse_len]), rig.put(&vec![0f32; lse_len]));
        rig.run(key, |e| {
            e.attention_forward(attention::Forward { out: out32, lse: lse32, qkv: qkv32, shape: s, dropout: site });
            e.attention_forward(attention::Forward { out: out16, lse: lse16, qkv: qkv16, shape: s, dropout: site });
        });
        let what = format!("{:?}, head size {}", s.rope.map(|_| "RoPE"), s.head_size);
        assert_same(&format!("{what}: out"), &rig.get_bits(out16), &bf16_bits(&rig.get(out32)));
        assert_same(&format!("{what}: lse"), &rig.get(lse16), &rig.get(lse32));
        // The backward reads the output as stored: the f32 kernels its widened values.
        let out_widened = rig.put(&widened(&rig.get_bits(out16)));
        let (dqkv32, dqkv16) = (rig.put(&vec![0f32; n * w]), rig.put(&vec![0f32; n * w]));
        rig.run(key, |e| {
            for (dqkv, qkv, out) in [(dqkv32, qkv32, out_widened), (dqkv16, qkv16, out16)] {
                e.attention_backward(attention::Backward { dqkv, dout: g_dout, qkv, out, lse: lse32, shape: s, dropout: site });
            }
        });
        assert_same(&format!("{what}: dqkv"), &rig.get(dqkv16), &rig.get(dqkv32));
    }
}

/// ‖got − want‖ / ‖want‖ at most `tol`.
fn assert_close_in_norm(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let diff: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum();
    let relative = (diff / norm).sqrt();
    assert!(relative <= tol, "{what}: {relative:.2e} relative in norm from the CPU's (at most {tol:.0e})");
}

/// Attention's kernels against the CPU's f32 op: element by element in f32, in norm with bf16
/// products.
fn check_attention_in(p: Plan, arithmetic: Arithmetic) {
    let s = p.attention_shape();
    let (c, w) = (s.heads * s.head_size, s.width());
    for (site, key) in [(None, None), (Some(Site { id: 4, threshold: 1 << 30 }), Some(DropoutKey { seed: 11, draw: 3 }))] {
        let mut rng = Rng::new(4);
        let n = s.batch * s.seq;
        let mut rig = Rig::with_arithmetic(p, &vec![0; n], arithmetic);
        let (qkv, dout) = (random(&mut rng, n * w, 1.0), random(&mut rng, n * c, 1.0));
        let lse_len = s.batch * s.heads * s.seq;
        let (g_out, g_lse, g_qkv, g_dout, g_dqkv) =
            (rig.put(&vec![0f32; n * c]), rig.put(&vec![0f32; lse_len]), rig.put(&qkv), rig.put(&dout), rig.put(&vec![0f32; n * w]));
        rig.run(key, |e| {
            e.attention_forward(attention::Forward { out: g_out, lse: g_lse, qkv: g_qkv, shape: s, dropout: site });
            e.attention_backward(attention::Backward { dqkv: g_dqkv, dout: g_dout, qkv: g_qkv, out: g_out, lse: g_lse, shape: s, dropout: site });
        });
        let (mut out, mut lse, mut dqkv) = (vec![0f32; n * c], vec![0f32; lse_len], vec![0f32; n * w]);
        let mut scratch = vec![0f32; s.scratch_len()];
        attention::forward(&Serial, attention::Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape: s, dropout: site }, &mut scratch, key, Operands::F32);
        let a = attention::Backward { dqkv: &mut dqkv[..], dout: &dout[..], qkv: &qkv[..], out: &out[..], lse: &lse[..], shape: s, dropout: site };
        attention::backward(&Serial, a, &mut scratch, key, Operands::F32);
        let what = format!("{:?}, head size {}, {}", s.rope.map(|_| "RoPE"), s.head_size, if site.is_some() { "with dropout" } else { "without dropout" });
        let outputs = [("out", rig.get(g_out), out), ("lse", rig.get(g_lse), lse), ("dqkv", rig.get(g_dqkv), dqkv)];
        for (name, got, want) in outputs {
            match arithmetic {
                Arithmetic::Bf16 => assert_close_in_norm(&format!("{what}: {name}"), &got, &want, 1e-2),
                _ => assert_close(&format!("{what}: {name}"), &got, &want, 1e-5),
            }
        }
    }
}

/// Decoding against the cache, GPT-2's and the Llama family's (the cache of the key/value
/// heads, keys rotated).
#[test]
fn decoding_matches_the_cpus_decoding() {
    let len = 6;
    let llama = llama_plan(1, len, 6, 2, 48);
    for p in [plan(5, 1, 1, 3, 120), Plan::new(llama.config, 1, 1).unwrap()] {
        check_decoding(p, len);
    }
}

fn check_decoding(p: Plan, len: usize) {
    let s = p.attention_shape();
    let (heads, c, w, kv) = (s.heads, s.heads * s.head_size, s.width(), s.kv_heads * s.head_size);
    let mut rng = Rng::new(5);
    let mut rig = Rig::new(p, &[0]);
    let cache = rig.put(&vec![0f32; 2 * len * kv]);
    let mut cpu_cache = vec![0f32; 2 * len * kv];
    for pos in 0..len {
        let qkv = random(&mut rng, w, 1.0);
        let (g_out, g_lse, g_qkv) = (rig.put(&vec![0f32; c]), rig.put(&vec![0f32; heads]), rig.put(&qkv));
        let mut e = rig.exec().decoding(Decoding { cache, len, position: pos });
        e.attention_forward(attention::Forward { out: g_out, lse: g_lse, qkv: g_qkv, shape: s, dropout: None });
        e.finish().unwrap();
        let (mut out, mut lse) = (vec![0f32; c], vec![0f32; heads]);
        let a = attention::Forward { out: &mut out[..], lse: &mut lse[..], qkv: &qkv[..], shape: s, dropout: None };
        attention::decode(&Serial, a, KvCache { rows: &mut cpu_cache[..], len }, pos, &mut vec![0.0; s.scratch_len()]);
        assert_close(&format!("position {pos}: out"), &rig.get(g_out), &out, 1e-5);
        assert_close(&format!("position {pos}: lse"), &rig.get(g_lse), &lse, 1e-5);
    }
    assert_close("the caches' keys and values", &rig.get(cache), &cpu_cache, 1e-6);
}

#[test]
fn cross_entropy_matches_the_cpu_with_padding() {
    let (n, v, classes) = (6, 300, 257);
    let mut rng = Rng::new(6);
    let targets: Vec<u32> = vec![0, 256, 17, 100, 100, 3];
    for grad_scale in [None, Some(0.25)] {
        let mut rig = Rig::new(plan(v, 1, n, 1, 4), &targets);
        let logits = random(&mut rng, n * v, 5.0);
        let (g_losses, g_logits) = (rig.put(&vec![0f32; n]), rig.put(&logits));
        rig.run(None, |e| e.cross_entropy(cross_entropy::Forward { losses: g_losses, logits: g_logits, grad_scale, classes }));
        let (mut losses, mut grad) = (vec![0f32; n], logits.clone());
        cross_entropy::forward(&Serial, cross_entropy::Forward { losses: &mut losses, logits: &mut grad, grad_scale, classes }, &targets);
        assert_close("losses", &rig.get(g_losses), &losses, 1e-5);
        assert_close("logits or their gradient", &rig.get(g_logits), &grad, 1e-5);
    }
}

/// Under bf16 products the cross-entropy of the plan's logits writes their gradient rounded to
/// bf16 into the LM head's operand scratch: the f32 kernel's gradient rounded, bit for bit, with
/// the same losses; the LM head's backward then reads it, as it would read the f32 gradient
/// rounded by a pass of its own.
#[test]
fn bf16_cross_entropy_leaves_the_lm_heads_operand() {
    let (n, v, classes, c) = (6, 300, 257, 40);
    let mut rng = Rng::new(8);
    let targets: Vec<u32> = vec![0, 256, 17, 100, 100, 3];
    let p = plan(v, 1, n, 1, c);
    let (logits, x, w) = (random(&mut rng, n * v, 5.0), random(&mut rng, n * c, 1.0), random(&mut rng, v * c, 1.0));
    let mut rig32 = Rig::new(p, &targets);
    let (losses32, grad32) = (rig32.put(&vec![0f32; n]), rig32.put(&logits));
    rig32.run(None, |e| e.cross_entropy(cross_entropy::Forward { losses: losses32, logits: grad32, grad_scale: Some(0.25), classes }));

    let mut rig = Rig::with_arithmetic(p, &targets, Arithmetic::Bf16);
    let span = p.head_acts().logits;
    rig.acts.upload(span.offset, &logits).unwrap();
    let g_logits = rig.acts.tensor().part(span.offset, span.len);
    let losses = rig.put(&vec![0f32; n]);
    rig.run(None, |e| e.cross_entropy(cross_entropy::Forward { losses, logits: g_logits, grad_scale: Some(0.25), classes }));
    assert_same("losses", &rig.get(losses), &rig32.get(losses32));
    let copy = rig.operands_bf16.unwrap().1;
    assert_same("the gradient's bf16 copy", &rig.get_bits(copy)[..n * v], &bf16_bits(&rig32.get(grad32)));

    let (g_x, g_w, g_grad) = (rig.put_bf16(&x), rig.put_weight(&w, Arithmetic::Bf16), rig.put(&rig32.get(grad32)));
    let outs: Vec<Tensor> = (0..2).flat_map(|_| [rig.put(&vec![0f32; n * c]), rig.put(&vec![0f32; v * c])]).collect();
    for (dout, dx, dweight) in [(g_logits, outs[0], outs[1]), (g_grad, outs[2], outs[3])] {
        rig.run(None, |e| {
            e.matmul_backward(matmul::Backward { dx: Some(dx), dweight, dbias: None, dout, x: g_x, weight: g_w, activation: None, k: c, m: v });
        });
    }
    assert_same("the LM head's dx", &rig.get(outs[0]), &rig.get(outs[2]));
    assert_same("the LM head's dweight", &rig.get(outs[1]), &rig.get(outs[3]));
}

#[test]
fn dropout_draws_the_cpus_masks() {
    let len = 1000;
    let site = Site::new(7, 0.3);
    let key = DropoutKey { seed: 99, draw: 5 };
    let mut rng = Rng::new(7);
    let mut rig = Rig::new(plan(5, 1, 1, 1, 4), &[0]);
    let (y, res, dout) = (random(&mut rng, len, 1.0), random(&mut rng, len, 1.0), random(&mut rng, len, 1.0));
    let (g_out, g_plain, g_y, g_res, g_dy, g_dout) =
        (rig.put(&vec![0f32; len]), rig.put(&vec![0f32; len]), rig.put(&y), rig.put(&res), rig.put(&vec![0f32; len]), rig.put(&dout));
    rig.run(Some(key), |e| {
        e.dropout_forward(dropout::Forward { out: g_out, y: g_y, residual: Some(g_res), site });
        e.dropout_forward(dropout::Forward { out: g_plain, y: g_y, residual: None, site });
        e.dropout_backward(dropout::Backward { dy: g_dy, dout: g_dout, site });
    });
    let (mut out, mut plain, mut dy) = (vec![0f32; len], vec![0f32; len], vec![0f32; len]);
    dropout::forward(&Serial, dropout::Forward { out: &mut out, y: &y, residual: Some(&res), site }, key);
    dropout::forward(&Serial, dropout::Forward { out: &mut plain, y: &y, residual: None, site }, key);
    dropout::backward(&Serial, dropout::Backward { dy: &mut dy, dout: &dout, site }, key);
    // The same masks and the same arithmetic: the same bits.
    assert_eq!((rig.get(g_out), rig.get(g_plain), rig.get(g_dy)), (out, plain, dy));
}
