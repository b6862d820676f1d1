//! The whole model on the GPU against the CPU: same initialisation, same batches, 20 steps
//! with gradient accumulation and clipping; evaluation; parameters round-tripping.

use alpha_core::cpu::{Batch, CpuExecutor};
use alpha_core::model::init_params;
use alpha_core::model::{generate, SamplingConfig, SamplingMemory};
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::Serial;
use alpha_core::train::LossScaleState;
use alpha_core::train::{OwnedMemory, TrainConfig, Trainer};
use alpha_core::walk;
use alpha_core::{GptConfig, Plan, Rng};
use alpha_gpu::trainer::INITIAL_LOSS_SCALE;
use alpha_gpu::{block_on, Gpu, GpuForward, GpuTrainer, Precision, TensorCores};

fn setup() -> (Plan, TrainConfig, Vec<u32>) {
    // Head size 12 and T = 21: neither fills the kernels' tiles.
    setup_for(GptConfig::gpt2(23, 24, 2, 2, 24))
}

/// A Llama-family model of [`setup`]'s size: 4 heads over 2 key/value heads (head size 6),
/// SwiGLU 40 wide, Llama 3's RoPE scaling, q/k/v biases, an untied head.
fn llama() -> GptConfig {
    let rope_scaling = Some(alpha_core::RopeScaling { factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 2.0, original_max_position_embeddings: 8 });
    let llama = alpha_core::Llama { n_kv_head: 2, intermediate_size: 40, norm_eps: 1e-5, rope_theta: 100.0, rope_scaling, qkv_bias: true, tied: false };
    GptConfig { arch: alpha_core::Arch::Llama(llama), ..GptConfig::gpt2(23, 24, 2, 4, 24) }
}

fn setup_for(config: GptConfig) -> (Plan, TrainConfig, Vec<u32>) {
    let plan = Plan::new(config, 3, 21).unwrap();
    let cfg = TrainConfig {
        schedule: LrSchedule { max_lr: 3e-3, min_lr: 3e-4, warmup_iters: 3, decay_iters: 20 },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum: 2,
    };
    let data: Vec<u32> = (0..2000u32).map(|i| (i * 7 + i / 5 + (i * i) % 3) % 23).collect();
    (plan, cfg, data)
}

fn open_gpu() -> Gpu {
    block_on(Gpu::open(None)).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"))
}

/// The device with f16 products (lavapipe has shader-f16; CI runs these there).
fn open_f16_gpu() -> Gpu {
    block_on(Gpu::open_local(None, 0, Some(Precision::F16), TensorCores::Off)).unwrap_or_else(|e| panic!("the f16 tests need an adapter with shader-f16: {e}"))
}

/// A fresh GPU trainer for [`setup`]'s model, its parameters initialised with `init_seed`
/// (returned too) and batches drawn with seed 2.
fn fresh_trainer(gpu: Gpu, init_seed: u64) -> (GpuTrainer, Vec<f32>, Vec<u32>) {
    let (plan, cfg, data) = setup();
    let mut params = vec![0.0; plan.params_len()];
    init_params(&plan, &mut params, &mut Rng::new(init_seed));
    (block_on(GpuTrainer::new(gpu, plan, cfg, Rng::new(2), &params)).unwrap(), params, data)
}

#[test]
fn twenty_steps_match_the_cpu() {
    twenty_steps_against_the_cpu(false, 0.0);
}

/// The Llama family on the GPU (RMSNorm, SwiGLU, rotary attention over grouped heads), with
/// recompute and dropout too.
#[test]
fn llama_steps_match_the_cpu() {
    for (recompute, dropout) in [(false, 0.0), (true, 0.2)] {
        twenty_steps_of(llama(), recompute, dropout);
    }
}

/// Activation checkpointing on the GPU: the walk's recompute recorded into the backward
/// program, within the same tolerance of the CPU.
#[test]
fn twenty_steps_with_recompute_match_the_cpu() {
    twenty_steps_against_the_cpu(true, 0.0);
}

/// Dropout draws the CPU's masks on the device (each micro-batch's key in its batch slot),
/// recomputed blocks included.
#[test]
fn twenty_steps_with_dropout_match_the_cpu() {
    twenty_steps_against_the_cpu(false, 0.2);
    twenty_steps_against_the_cpu(true, 0.2);
}

/// `steps` steps of `gt` and `ct` on `data`: the same learning rates, and losses and gradient
/// norms within 1e-4 relative; no step skipped.
fn steps_match(gt: &mut GpuTrainer, ct: &mut Trainer<'_, f32>, data: &[u32], steps: usize, what: &str) {
    for step in 0..steps {
        let cpu = ct.train_step(&Serial, data).unwrap();
        let lr = gt.step(data);
        let s = block_on(gt.stats(lr)).unwrap();
        assert_eq!(s.skipped, 0);
        let g = s.last;
        assert_eq!(g.lr, cpu.lr);
        assert!((g.loss - cpu.loss).abs() <= 1e-4 * cpu.loss, "{what}, step {step}: loss GPU {} vs CPU {}", g.loss, cpu.loss);
        assert!((g.grad_norm - cpu.grad_norm).abs() <= 1e-4 * cpu.grad_norm, "{what}, step {step}: norm GPU {} vs CPU {}", g.grad_norm, cpu.grad_norm);
    }
}

/// `steps` steps of two trainers that must agree to the bit: each step's loss and gradient
/// norm, then the parameters.
fn steps_keep_their_bits(a: &mut GpuTrainer, b: &mut GpuTrainer, data: &[u32], steps: usize, what: &str) {
    for step in 0..steps {
        let (x, y) = (a.step(data), b.step(data));
        let (x, y) = (block_on(a.stats(x)).unwrap().last, block_on(b.stats(y)).unwrap().last);
        assert_eq!((x.loss.to_bits(), x.grad_norm.to_bits()), (y.loss.to_bits(), y.grad_norm.to_bits()), "{what}, step {step}");
    }
    let (x, y) = (block_on(a.download()).unwrap(), block_on(b.download()).unwrap());
    assert!(x.0.iter().zip(&y.0).all(|(p, q)| p.to_bits() == q.to_bits()), "{what}: the parameters keep their bits");
}

fn twenty_steps_against_the_cpu(recompute: bool, dropout: f64) {
    twenty_steps_of(setup().0.config, recompute, dropout);
}

fn twenty_steps_of(config: GptConfig, recompute: bool, dropout: f64) {
    let (plan, cfg, data) = setup_for(config);
    let plan = plan.with_dropout(dropout, 42).unwrap();
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    init_params(&plan, &mut mem.params, &mut Rng::new(7));
    let gpu = open_gpu();
    let gpu_plan = plan.with_recompute(recompute);
    let mut gt = block_on(GpuTrainer::new(gpu, gpu_plan, cfg, Rng::new(11), &mem.params)).unwrap();
    assert_eq!(gt.device_bytes() < block_on(GpuTrainer::new(open_gpu(), plan, cfg, Rng::new(11), &mem.params)).unwrap().device_bytes(), recompute);
    let mut ct = mem.trainer(plan, cfg, Rng::new(11)).unwrap();
    steps_match(&mut gt, &mut ct, &data, 20, &format!("recompute {recompute}, dropout {dropout}"));
    assert_eq!(gt.step, ct.step);
    assert_eq!(gt.rng.state(), ct.rng.state(), "the same batches were drawn");
    let cpu_eval = ct.evaluate(&Serial, &data, 3, &mut Rng::new(5));
    let gpu_eval = block_on(gt.evaluate(&data, 3, &mut Rng::new(5))).unwrap();
    assert!((gpu_eval - cpu_eval).abs() <= 1e-4 * cpu_eval, "eval GPU {gpu_eval} vs CPU {cpu_eval}");
    // The trained parameters and moments agree, and come back in the host layout.
    let (params, m, v) = block_on(gt.download()).unwrap();
    // Largest difference relative to the largest element of each arena.
    let diff = |a: &[f32], b: &[f32]| {
        let scale = b.iter().fold(0f32, |m, y| m.max(y.abs()));
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    };
    let d = (diff(&params, ct.mem.params), diff(&m, ct.mem.adam_m), diff(&v, ct.mem.adam_v));
    eprintln!("relative differences after 20 steps: params {:.1e}, m {:.1e}, v {:.1e}", d.0, d.1, d.2);
    assert!(d.0 < 1e-4 && d.1 < 1e-5 && d.2 < 1e-5, "parameters or moments drifted apart: {d:?}");
}

#[test]
fn resumes_from_cpu_state_and_round_trips_it_exactly() {
    let (plan, cfg, data) = setup();
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    init_params(&plan, &mut mem.params, &mut Rng::new(3));
    // Three CPU steps; their state (what a checkpoint holds) continues on the GPU.
    let mut ct = mem.trainer(plan, cfg, Rng::new(2)).unwrap();
    for _ in 0..3 {
        ct.train_step(&Serial, &data).unwrap();
    }
    let state = (ct.mem.params.to_vec(), ct.mem.adam_m.to_vec(), ct.mem.adam_v.to_vec());
    let (step, rng) = (ct.step, ct.rng);
    let cpu_next = ct.train_step(&Serial, &data).unwrap();
    let gpu = open_gpu();
    let mut gt = block_on(GpuTrainer::new(gpu, plan, cfg, rng, &state.0)).unwrap();
    gt.upload(&state.0, Some((&state.1, &state.2))).unwrap();
    gt.step = step;
    assert_eq!(block_on(gt.download()).unwrap(), state, "upload then download is exact");
    let lr = gt.step(&data);
    let g = block_on(gt.stats(lr)).unwrap().last;
    assert!((g.loss - cpu_next.loss).abs() <= 1e-4 * cpu_next.loss, "resumed loss GPU {} vs CPU {}", g.loss, cpu_next.loss);
    assert!((g.grad_norm - cpu_next.grad_norm).abs() <= 1e-4 * cpu_next.grad_norm);
}

#[test]
fn non_finite_steps_are_skipped_and_counted() {
    let (mut gt, mut params, data) = fresh_trainer(open_gpu(), 3);
    let lr = gt.step(&data);
    assert_eq!(block_on(gt.stats(lr)).unwrap().skipped, 0);
    // A NaN in the final LayerNorm's bias makes every loss NaN.
    let lnf_bias = gt.plan.params().last().unwrap().span;
    params[lnf_bias.offset] = f32::NAN;
    gt.upload(&params, None).unwrap();
    gt.step(&data);
    let lr = gt.step(&data);
    let s = block_on(gt.stats(lr)).unwrap();
    assert!(s.last.loss.is_nan() && s.skipped == 2, "{s:?}");
    let lr = gt.step(&data);
    assert_eq!(block_on(gt.stats(lr)).unwrap().skipped, 1, "the count restarts after each read");
    let (after, _, _) = block_on(gt.download()).unwrap();
    assert!(after.iter().zip(&params).all(|(a, b)| a.to_bits() == b.to_bits()), "no update was applied");
}

#[test]
fn forward_model_matches_the_cpu_losses_and_greedy_samples() {
    for config in [setup().0.config, llama()] {
        forward_model_against_the_cpu(config);
    }
}

fn forward_model_against_the_cpu(config: GptConfig) {
    let (plan, _, data) = setup_for(config);
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    init_params(&plan, &mut mem.params, &mut Rng::new(5));
    let gpu = open_gpu();
    // Losses of one batch.
    let n = plan.tokens();
    let (x, y) = (&data[..n], &data[1..n + 1]);
    walk::forward(&mut CpuExecutor::new(&Serial, &plan, &mem.params, &mut mem.acts, Batch { tokens: x, targets: Some(y) }), &mem.tape, None);
    let cpu = &mem.acts[plan.head_acts().losses.range()];
    let mut model = block_on(GpuForward::new(gpu.clone(), plan, &mem.params)).unwrap();
    let got = block_on(model.losses(x, y)).unwrap();
    let worst = got.iter().zip(cpu).map(|(g, c)| ((g - c) / c).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "losses differ by {worst:e} relative");
    assert!(block_on(model.losses(&x[1..], y)).is_err(), "a batch of the wrong size is an error");
    // Greedy samples: the same tokens as the CPU, past the end of the window.
    let sampling = Plan::new(plan.config, 1, 9).unwrap();
    let greedy = SamplingConfig { temperature: 0.0, top_k: 0, ..SamplingConfig::new(12) };
    let want = cpu_samples(&sampling, &mem.params, &greedy);
    let mut sampler = block_on(GpuForward::new(gpu, sampling, &mem.params)).unwrap();
    let mut got = Vec::new();
    block_on(sampler.generate(&[3, 1, 4], &greedy, &mut Rng::new(1), |t| got.push(t))).unwrap();
    assert_eq!(got, want);
    // A stop token ends both before it is emitted.
    let stop = SamplingConfig { stop: Some(want[2]), ..greedy };
    let until = want.iter().position(|&t| t == want[2]).unwrap();
    let mut got = Vec::new();
    block_on(sampler.generate(&[3, 1, 4], &stop, &mut Rng::new(1), |t| got.push(t))).unwrap();
    assert_eq!(got, want[..until]);
    assert_eq!(cpu_samples(&sampling, &mem.params, &stop), want[..until]);
}

/// The CPU's samples after the prompt [3, 1, 4] (seed 1) of a `plan` model.
fn cpu_samples(plan: &Plan, params: &[f32], cfg: &SamplingConfig) -> Vec<u32> {
    let mut smem = OwnedMemory::<f32>::new(plan).unwrap();
    let (mut tokens, mut window) = (Vec::new(), vec![0; plan.seq]);
    let cpu_mem = SamplingMemory { plan, tape: &smem.tape, acts: &mut smem.acts, window: &mut window, decoding: None };
    generate(&Serial, cpu_mem, params, &[3, 1, 4], cfg, &mut Rng::new(1), |t| tokens.push(t));
    tokens
}

/// Under f16 precision a model decodes against its KV cache (attention writing f16), then
/// slides its window: on this model its greedy tokens are the CPU's.
#[test]
fn f16_greedy_samples_are_the_cpus() {
    let (plan, _, _) = setup();
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    init_params(&plan, &mut mem.params, &mut Rng::new(5));
    let sampling = Plan::new(plan.config, 1, 9).unwrap();
    let greedy = SamplingConfig { temperature: 0.0, top_k: 0, ..SamplingConfig::new(12) };
    let mut sampler = block_on(GpuForward::new(open_f16_gpu(), sampling, &mem.params)).unwrap();
    assert!(sampler.plan().is_half(sampler.plan().head_acts().lnf));
    let mut got = Vec::new();
    block_on(sampler.generate(&[3, 1, 4], &greedy, &mut Rng::new(1), |t| got.push(t))).unwrap();
    assert_eq!(got, cpu_samples(&sampling, &mem.params, &greedy));
}

/// A trainer's forward model reads the parameters as updated (under f16 precision, the f16
/// copy the update refreshed), as a model given them does (its copy made on upload).
#[test]
fn a_trainers_forward_model_sees_its_updates() {
    for gpu in [open_gpu(), open_f16_gpu()] {
        let (mut gt, _, data) = fresh_trainer(gpu.clone(), 8);
        let mut shared = gt.forward_model(1, 8).unwrap();
        let (x, y) = (&data[..8], &data[1..9]);
        let before = block_on(shared.losses(x, y)).unwrap();
        gt.step(&data);
        let after = block_on(shared.losses(x, y)).unwrap();
        let (trained, _, _) = block_on(gt.download()).unwrap();
        let mut own = block_on(GpuForward::new(gpu.clone(), *shared.plan(), &trained)).unwrap();
        assert_ne!(before, after, "{:?}", gpu.precision);
        assert_eq!(after, block_on(own.losses(x, y)).unwrap(), "the shared model reads the trained parameters ({:?})", gpu.precision);
        own.upload(&vec![0.0; trained.len()]).unwrap();
        assert_ne!(after, block_on(own.losses(x, y)).unwrap(), "an upload replaces the parameters ({:?})", gpu.precision);
    }
}

#[test]
fn profiling_times_every_kernel_of_a_step() {
    let (mut gt, _, data) = fresh_trainer(open_gpu(), 4);
    assert!(block_on(gt.kernel_times()).is_err(), "no times without profiling");
    gt.set_profiling(true).unwrap();
    gt.step(&data);
    let times = block_on(gt.kernel_times()).unwrap();
    assert_eq!(times.len(), gt.kernels_per_step());
    assert!(times.iter().all(|t| t.end_ns >= t.start_ns && t.start_ns >= 0.0), "spans are well formed");
    assert!(times.windows(2).all(|w| w[1].start_ns >= w[0].start_ns), "kernels run in encoding order");
    assert!(times.last().unwrap().end_ns > 0.0);
    let passes: Vec<&str> = times.iter().map(|t| t.pass).collect();
    assert_eq!((passes[0], *passes.last().unwrap()), ("forward", "update"));
    assert_eq!((times[0].op, times[0].kernel), ("embedding", "embedding_forward"));
    assert!(times.iter().any(|t| t.pass == "backward" && t.op == "attention"));
}

/// Arenas larger than the adapter binds at once are bound in pieces (AdamW, the gradient
/// norm) and train as the CPU does; a tensor over the limit, or a buffer over the largest, is
/// refused with the sizes before anything large is allocated. (The limits are lowered here, so
/// the test fits any device.)
#[test]
fn arenas_over_the_binding_limit_are_bound_in_pieces() {
    let (plan, cfg, data) = setup();
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    init_params(&plan, &mut mem.params, &mut Rng::new(7));
    let mut gpu = open_gpu();
    // The parameter arena (and AdamW's moments, and the gradients) is over 64 KiB: AdamW and
    // the gradient norm bind it in three pieces or more; every tensor fits on its own.
    gpu.limits.max_storage_buffer_binding_size = 24 * 1024;
    assert!(4 * plan.params_len() > 2 * 24 * 1024);
    let mut gt = block_on(GpuTrainer::new(gpu.clone(), plan, cfg, Rng::new(11), &mem.params)).unwrap();
    let mut ct = mem.trainer(plan, cfg, Rng::new(11)).unwrap();
    steps_match(&mut gt, &mut ct, &data, 6, "arenas in pieces");
    let (params, _, _) = block_on(gt.download()).unwrap();
    let scale = ct.mem.params.iter().fold(0f32, |m, y| m.max(y.abs()));
    let worst = params.iter().zip(ct.mem.params.iter()).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    assert!(worst < 1e-4, "every piece was updated as the CPU updated it ({worst:e})");
    // A vocabulary whose token table and logits are over the limit too: the embedding, the
    // LM head's products and the cross-entropy bind them in pieces.
    let wide = Plan::new(GptConfig::gpt2(700, 32, 1, 2, 128), 4, 32).unwrap();
    let limit = 256 * 1024;
    assert!(4 * 700 * 128 > limit && 4 * wide.tokens() * 700 > limit);
    let mut wide_gpu = open_gpu();
    wide_gpu.limits.max_storage_buffer_binding_size = limit as u64;
    let mut wide_mem = OwnedMemory::<f32>::new(&wide).unwrap();
    init_params(&wide, &mut wide_mem.params, &mut Rng::new(3));
    let text: Vec<u32> = (0..3000u32).map(|i| (i * 37 + i / 7) % 700).collect();
    let mut gt = block_on(GpuTrainer::new(wide_gpu, wide, cfg, Rng::new(5), &wide_mem.params)).unwrap();
    let mut ct = wide_mem.trainer(wide, cfg, Rng::new(5)).unwrap();
    steps_match(&mut gt, &mut ct, &text, 4, "wide vocabulary");
    // A tensor over the limit is refused with the numbers.
    gpu.limits.max_storage_buffer_binding_size = 4 * 1024;
    let err = block_on(GpuTrainer::new(gpu.clone(), plan, cfg, Rng::new(1), &mem.params)).err().expect("refused");
    assert!(err.0.contains("max_storage_buffer_binding_size") && err.0.contains("binds at most 4.0 KiB"), "{err}");
    gpu.limits.max_buffer_size = 8 * 1024;
    let err = block_on(GpuForward::new(gpu, plan, &mem.params)).err().expect("refused");
    assert!(err.0.contains("max_buffer_size") && err.0.contains("allows at most 8.0 KiB"), "{err}");
}

/// An activation arena larger than the device's largest buffer lives in several buffers of
/// whole parts (the limit is lowered here to the largest part): the steps keep every bit, in
/// f32 and f16, with and without recompute, and a forward model reads its losses, logits and
/// samples from them as from one buffer. A part larger than a buffer is refused.
#[test]
fn activations_over_the_buffer_limit_live_in_several_buffers() {
    let (plan, cfg, data) = setup();
    let mut params = vec![0.0; plan.params_len()];
    init_params(&plan, &mut params, &mut Rng::new(4));
    for f16 in [false, true] {
        let open = || if f16 { open_f16_gpu() } else { open_gpu() };
        let precision = if f16 { "f16" } else { "f32" };
        for recompute in [false, true] {
            let what = format!("{precision}, recompute {recompute}");
            let plan = plan.with_recompute(recompute);
            let mut whole = block_on(GpuTrainer::new(open(), plan, cfg, Rng::new(3), &params)).unwrap();
            let largest = whole.plan.arena_parts().map(|(part, _)| part.len).max().unwrap();
            let mut gpu = open();
            gpu.limits.max_buffer_size = 4 * largest as u64;
            let mut split = block_on(GpuTrainer::new(gpu, plan, cfg, Rng::new(3), &params)).unwrap();
            assert_eq!(whole.activation_buffers(), 1, "{what}");
            assert!(split.activation_buffers() >= 3, "{what}: {} buffers", split.activation_buffers());
            steps_keep_their_bits(&mut whole, &mut split, &data, 4, &what);
        }
        // Forward models over the same limit: the training plan's losses and logits, and a
        // batch-1 model's greedy samples (its KV-cache decoder, then its sliding window).
        let limit = 4 * plan.arena_parts().map(|(part, _)| part.len).max().unwrap() as u64;
        let forward = |plan: Plan, lowered: bool| {
            let mut gpu = open();
            if lowered {
                gpu.limits.max_buffer_size = limit;
            }
            block_on(GpuForward::new(gpu, plan, &params)).unwrap()
        };
        let mut models = [forward(plan, false), forward(plan, true)];
        let (tokens, targets) = (&data[..plan.tokens()], &data[1..plan.tokens() + 1]);
        let [a, b] = models.each_mut().map(|m| block_on(m.losses(tokens, targets)).unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{precision}: losses");
        let [a, b] = models.each_mut().map(|m| block_on(m.logits(tokens, plan.tokens() - 1)).unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{precision}: logits");
        let one = Plan::new(plan.config, 1, 21).unwrap();
        let greedy = SamplingConfig { temperature: 0.0, top_k: 0, ..SamplingConfig::new(30) };
        let [a, b] = [forward(one, false), forward(one, true)].map(|mut m| {
            let mut out = Vec::new();
            block_on(m.generate(&[3, 1, 4], &greedy, &mut Rng::new(1), |t| out.push(t))).unwrap();
            out
        });
        assert_eq!(a, b, "{precision}: greedy samples");
    }
    // A part larger than the largest buffer is refused, named, before anything is allocated.
    let (part, what) = plan.arena_parts().max_by_key(|(part, _)| part.len).unwrap();
    let mut gpu = open_gpu();
    gpu.limits.max_buffer_size = 4 * part.len as u64 - 4;
    let err = block_on(GpuTrainer::new(gpu, plan, cfg, Rng::new(3), &params)).err().expect("refused");
    assert!(err.0.starts_with(what) && err.0.contains("(max_buffer_size)"), "{err}");
}

/// Mixed precision (`--precision f16`): 20 steps with every product's operands in f16 and
/// dynamic loss scaling follow the f32 run within 2e-2 relative per step (loss and gradient
/// norm), skip no step at the initial scale, and report the scale.
#[test]
fn twenty_f16_steps_follow_the_f32_run() {
    let (mut f32_run, _, data) = fresh_trainer(open_gpu(), 5);
    let (mut f16_run, _, _) = fresh_trainer(open_f16_gpu(), 5);
    // The linear layers' inputs are stored as f16, in less room.
    let (plan16, plan32) = (f16_run.plan, f32_run.plan);
    assert!(plan16.is_half(plan16.layer_acts(0).fc_gelu) && !plan32.is_half(plan32.layer_acts(0).fc_gelu));
    assert!(plan16.acts_len() < plan32.acts_len());
    for step in 0..20 {
        let (a, b) = (f32_run.step(&data), f16_run.step(&data));
        let (a, b) = (block_on(f32_run.stats(a)).unwrap(), block_on(f16_run.stats(b)).unwrap());
        assert_eq!((a.skipped, b.skipped, a.loss_scale, b.loss_scale), (0, 0, None, Some(INITIAL_LOSS_SCALE as f64)), "step {step}");
        let (a, b) = (a.last, b.last);
        assert!((a.loss - b.loss).abs() <= 2e-2 * a.loss, "step {step}: loss f16 {} vs f32 {}", b.loss, a.loss);
        assert!((a.grad_norm - b.grad_norm).abs() <= 2e-2 * a.grad_norm, "step {step}: norm f16 {} vs f32 {}", b.grad_norm, a.grad_norm);
        // The loss alone may round to the same f32 (it did at one step of twenty).
        assert!((a.loss, a.grad_norm) != (b.loss, b.grad_norm), "step {step}: the f16 run rounds its products' operands");
    }
}

/// Under f16 precision, recomputing the blocks' activations (their f16 ones included) in the
/// backward keeps every bit of the steps, with dropout too: the same kernels on the same
/// values in the same order.
#[test]
fn f16_steps_keep_their_bits_with_recompute() {
    let (plan, cfg, data) = setup();
    let plan = plan.with_dropout(0.1, 42).unwrap();
    let mut params = vec![0.0; plan.params_len()];
    init_params(&plan, &mut params, &mut Rng::new(9));
    let trainer = |recompute| block_on(GpuTrainer::new(open_f16_gpu(), plan.with_recompute(recompute), cfg, Rng::new(3), &params)).unwrap();
    let (mut whole, mut recomputed) = (trainer(false), trainer(true));
    assert!(recomputed.plan.is_half(recomputed.plan.layer_acts(1).ln2));
    steps_keep_their_bits(&mut whole, &mut recomputed, &data, 5, "f16 with recompute");
}

/// A forced overflow: at a loss scale of 2^40 the scaled gradients leave f16's range, so the
/// step is skipped (parameters untouched), counted as an overflow and not a divergence, and
/// the scale halves; at 2^10 the next step applies. Good steps double the scale.
#[test]
fn loss_scaling_skips_overflowed_steps_and_halves_the_scale() {
    let (mut gt, params, data) = fresh_trainer(open_f16_gpu(), 3);
    gt.set_loss_scale(LossScaleState { scale: 2f32.powi(40), good_steps: 0 });
    let lr = gt.step(&data);
    let s = block_on(gt.stats(lr)).unwrap();
    assert_eq!((s.skipped, s.non_finite_losses, s.loss_scale), (1, 0, Some(2f64.powi(40))), "{s:?}");
    assert!(s.last.loss.is_finite() && !s.last.grad_norm.is_finite(), "{s:?}");
    let (after, _, _) = block_on(gt.download()).unwrap();
    assert!(after.iter().zip(&params).all(|(a, b)| a.to_bits() == b.to_bits()), "the overflowed step was not applied");
    let lr = gt.step(&data);
    assert_eq!(block_on(gt.stats(lr)).unwrap().loss_scale, Some(2f64.powi(39)), "halved after the overflow");
    // Good steps: with a growth interval of 3 and one good step counted, the second step
    // from here doubles the scale, which the third uses; a checkpoint's state round-trips.
    gt.set_growth_interval(3);
    gt.set_loss_scale(LossScaleState { scale: 1024.0, good_steps: 1 });
    assert_eq!(block_on(gt.loss_scale()).unwrap(), Some(LossScaleState { scale: 1024.0, good_steps: 1 }));
    for expected in [1024.0, 1024.0, 2048.0] {
        let lr = gt.step(&data);
        let s = block_on(gt.stats(lr)).unwrap();
        assert_eq!((s.skipped, s.loss_scale), (0, Some(expected)), "{s:?}");
    }
    assert_eq!(block_on(gt.loss_scale()).unwrap(), Some(LossScaleState { scale: 2048.0, good_steps: 1 }));
    let (after, _, _) = block_on(gt.download()).unwrap();
    assert!(after.iter().zip(&params).any(|(a, b)| a != b), "good steps were applied");
}
