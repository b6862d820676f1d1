//! The CUDA engine against the CPU's: f32 steps within 1e-5 relative of the CPU's (TF32
//! off; attention in 3xTF32 on the tensor cores, as PyTorch's fp32 attention), dropout's
//! masks the CPU's, bf16 within 2e-2 of f32, `--recompute` and a resumed run bit for bit,
//! evaluation's losses, greedy samples. On a CUDA device where there is one
//! (scripts/cuda-check.sh sets `ALPHA_REQUIRE_CUDA=1`: a missing device fails); elsewhere on
//! the host's emulation of one (`Device::emulated`: the kernels' and the executor's logic,
//! not the device's rounding).

use alpha_core::engine::{CpuEngine, Engine, StepError};
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::train::{OneRank, RunState, StepStats, TrainConfig};
use alpha_core::{GptConfig, Plan, Serial};
use alpha_cuda::{device, Arithmetic, CudaEngine, Device};

/// CUDA device 0, else the host's emulation of one (a failure under `ALPHA_REQUIRE_CUDA`).
fn device() -> Device {
    let found = device::check_libraries().and_then(|()| Device::open(0));
    match found {
        Ok(d) => d,
        Err(why) if std::env::var_os("ALPHA_REQUIRE_CUDA").is_some() => panic!("ALPHA_REQUIRE_CUDA is set: {why}"),
        Err(why) => {
            eprintln!("no CUDA device ({why}): on the host's emulation of one");
            Device::emulated().unwrap()
        }
    }
}

/// Runs a future the engines have already resolved.
fn now<F: std::future::Future>(f: F) -> F::Output {
    let waker = std::task::Waker::noop();
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("CPU and CUDA engines resolve at once"),
    }
}

/// Two blocks, head size 48 (lanes past the first 32 dims idle), a padded vocabulary.
fn plan(dropout: f64, recompute: bool) -> Plan {
    plan_of(GptConfig::gpt2(72, 32, 2, 2, 96), dropout, recompute)
}

/// A Llama-family model of the same size: 6 heads over 2 key/value heads (head size 16),
/// SwiGLU 160, Llama 3's RoPE scaling, q/k/v biases, an untied head.
fn llama(dropout: f64) -> Plan {
    let rope_scaling = Some(alpha_core::RopeScaling { factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 2.0, original_max_position_embeddings: 8 });
    let llama = alpha_core::Llama { n_kv_head: 2, intermediate_size: 160, norm_eps: 1e-5, rope_theta: 1000.0, rope_scaling, qkv_bias: true, tied: false };
    plan_of(GptConfig { arch: alpha_core::Arch::Llama(llama), ..GptConfig::gpt2(72, 32, 2, 6, 96) }, dropout, false)
}

fn plan_of(config: GptConfig, dropout: f64, recompute: bool) -> Plan {
    let plan = Plan::new(config, 4, 32).and_then(|p| p.with_classes(65)).and_then(|p| p.with_dropout(dropout, 5)).unwrap();
    plan.with_recompute(recompute)
}

fn cfg(grad_accum: usize) -> TrainConfig {
    let schedule = LrSchedule { max_lr: 3e-3, min_lr: 3e-4, warmup_iters: 3, decay_iters: 20 };
    TrainConfig { schedule, adamw: AdamWConfig::default(), grad_clip: 1.0, grad_accum }
}

fn data() -> Vec<u32> {
    (0..20_000u32).map(|i| (i * 7 + i / 13 + (i * i) % 11) % 65).collect()
}

fn steps(engine: &mut dyn Engine, n: usize) -> Vec<StepStats> {
    let data = data();
    (0..n).map(|_| now(engine.step(data[..].into(), true, &mut ())).unwrap().stats.unwrap()).collect()
}

fn cuda(dev: Device, arithmetic: Arithmetic, plan: Plan, start: &RunState<f32>) -> CudaEngine<'static> {
    CudaEngine::new(dev, arithmetic, plan, cfg(1), start, &OneRank, false).unwrap()
}

fn params(engine: &dyn Engine) -> Vec<f32> {
    now(engine.state()).unwrap().0.into_owned()
}

/// ‖got − want‖ / ‖want‖.
fn distance_in_norm(got: &[f32], want: &[f32]) -> f64 {
    let norm = |x: &mut dyn Iterator<Item = f32>| x.map(|e| (e as f64).powi(2)).sum::<f64>().sqrt();
    norm(&mut got.iter().zip(want).map(|(g, w)| g - w)) / norm(&mut want.iter().copied())
}

fn assert_steps_close(what: &str, got: &[StepStats], want: &[StepStats], tolerance: f64) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for (name, a, b) in [("loss", g.loss, w.loss), ("gradient norm", g.grad_norm, w.grad_norm)] {
            assert!((a - b).abs() <= tolerance * b.abs(), "{what}, step {i}: {name} {a} vs {b}");
        }
    }
}

fn against_cpu(dropout: f64) {
    against_cpu_for(plan(dropout, false));
}

fn against_cpu_for(plan: Plan) {
    let dropout = plan.dropout();
    let dev = device();
    let start = RunState::fresh(&plan, 3).unwrap();
    let mut cpu = CpuEngine::new(Serial, &OneRank, plan, cfg(1), start.clone()).unwrap();
    let mut gpu = cuda(dev, Arithmetic::F32, plan, &start);
    let (want, got) = (steps(&mut cpu, 20), steps(&mut gpu, 20));
    assert_steps_close(&format!("f32, dropout {dropout}"), &got, &want, 1e-5);
    // The parameters after 20 AdamW steps, which magnify the gradients' last bits (a small
    // gradient's update is nearly its sign): attention's products run in 3xTF32 here (heads of
    // 16 to 64 dimensions from sm_80, as PyTorch's fp32 attention), 1.0e-5 from the CPU's on the
    // emulation where the SIMT kernels' plain f32 gave 7.4e-6.
    let distance = distance_in_norm(&params(&gpu), &params(&cpu));
    assert!(distance <= 3e-5, "f32, dropout {dropout}: the parameters after 20 steps are {distance:e} from the CPU's, relative in norm");
    let data = data();
    let mut rng = (alpha_core::Rng::new(9), alpha_core::Rng::new(9));
    let (a, b) = (now(cpu.evaluate(data[..].into(), 3, &mut rng.0)).unwrap(), now(gpu.evaluate(data[..].into(), 3, &mut rng.1)).unwrap());
    assert!((a - b).abs() <= 1e-5 * a, "evaluation: {b} vs the CPU's {a}");
}

#[test]
fn f32_steps_match_the_cpu() {
    against_cpu(0.0);
}

/// A batch of 1,024 tokens: the weight gradients' products run over token slices (2 of 512
/// here), within the CPU's steps as the unsliced ones are.
#[test]
fn weight_gradients_over_token_slices_match_the_cpu() {
    let plan = Plan::new(GptConfig::gpt2(72, 32, 1, 2, 32), 32, 32).and_then(|p| p.with_classes(65)).unwrap();
    let start = RunState::fresh(&plan, 3).unwrap();
    let mut cpu = CpuEngine::new(Serial, &OneRank, plan, cfg(1), start.clone()).unwrap();
    let mut gpu = cuda(device(), Arithmetic::F32, plan, &start);
    assert_steps_close("f32, 1,024 tokens", &steps(&mut gpu, 4), &steps(&mut cpu, 4), 1e-5);
    let distance = distance_in_norm(&params(&gpu), &params(&cpu));
    assert!(distance <= 1e-5, "the parameters after 4 steps are {distance:e} from the CPU's, relative in norm");
}

#[test]
fn dropout_draws_the_cpus_masks() {
    against_cpu(0.2);
}

/// The Llama family (RMSNorm, SwiGLU, rotary attention over grouped heads) with dropout, and
/// its greedy samples against the KV cache of the key/value heads.
#[test]
fn llama_steps_and_samples_match_the_cpu() {
    against_cpu_for(llama(0.1));
    samples_against_cpu(llama(0.0));
}

#[test]
fn bf16_steps_stay_near_f32() {
    let dev = device();
    let plan = plan(0.0, false);
    let start = RunState::fresh(&plan, 3).unwrap();
    let f32_steps = steps(&mut cuda(dev, Arithmetic::F32, plan, &start), 20);
    let bf16_steps = steps(&mut cuda(device(), Arithmetic::Bf16, plan, &start), 20);
    for (i, (b, f)) in bf16_steps.iter().zip(&f32_steps).enumerate() {
        assert!((b.loss - f.loss).abs() <= 2e-2 * f.loss, "step {i}: bf16 loss {} vs f32 {}", b.loss, f.loss);
    }
}

/// bf16 runs store the products' inputs and qkv as bf16 (the default): their forward is that of
/// f32 activations rounded for each product, bit for bit (each product, and attention on the
/// tensor cores, reads them as bf16 either way): the first step's loss is the same. The
/// backward's attention sums dO · O over the stored O, so later steps drift by a little. With
/// --recompute, every bit of the stored run.
#[test]
fn bf16_activations_keep_the_forward_and_stay_near_f32_ones() {
    let plan = plan(0.0, false);
    let start = RunState::fresh(&plan, 3).unwrap();
    let engine = |plan, on| cuda(device(), Arithmetic::Bf16, plan, &start).with_bf16_activations(on).unwrap();
    let (mut stored, mut rounded) = (engine(plan, true), engine(plan, false));
    assert!(stored.stores_bf16_activations() && !rounded.stores_bf16_activations());
    let (got, want) = (steps(&mut stored, 10), steps(&mut rounded, 10));
    assert_eq!(got[0].loss, want[0].loss, "the first step's loss");
    // On the emulation the losses drift by at most 4.2e-5 relative over 10 steps, the gradient
    // norms by 2.0e-3 (the norm sums every gradient's rounding): bounds of ten times those, far
    // inside the 2e-2 bf16 keeps from f32.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g.loss - w.loss).abs() <= 5e-4 * w.loss, "step {i}: loss {} storing bf16 activations, {} rounding f32 ones", g.loss, w.loss);
        assert!((g.grad_norm - w.grad_norm).abs() <= 2e-2 * w.grad_norm, "step {i}: gradient norm {} against {}", g.grad_norm, w.grad_norm);
    }
    let mut recomputed = engine(plan_of(GptConfig::gpt2(72, 32, 2, 2, 96), 0.0, true), true);
    steps(&mut recomputed, 10);
    assert!(params(&recomputed) == params(&stored), "--recompute changed the parameters of a run storing bf16 activations");
}

#[test]
fn recompute_and_resume_keep_every_bit() {
    let dev = device();
    let (plain, recomputed) = (plan(0.1, false), plan(0.1, true));
    let start = RunState::fresh(&plain, 4).unwrap();
    let mut whole = cuda(dev, Arithmetic::F32, plain, &start);
    steps(&mut whole, 4);
    let mut again = cuda(device(), Arithmetic::F32, recomputed, &start);
    steps(&mut again, 4);
    assert!(params(&whole) == params(&again), "--recompute changed the parameters");
    let mut first = cuda(device(), Arithmetic::F32, plain, &start);
    steps(&mut first, 2);
    let (p, m, v) = now(first.state()).unwrap();
    let resumed = RunState { params: p.into_owned(), moments: Some((m.into_owned(), v.into_owned())), step: first.step_count(), rng: first.rng() };
    drop(first);
    let mut second = cuda(device(), Arithmetic::F32, plain, &resumed);
    steps(&mut second, 2);
    assert!(params(&whole) == params(&second), "a resumed run differs from the uninterrupted one");
}

/// Steps that do not report queue the same work as those that do (the same bits); a step whose
/// loss or gradient norm is not finite is skipped on the device, and the next read (a report,
/// or `check` before a checkpoint) is an error naming the skipped steps.
#[test]
fn unreported_steps_keep_every_bit_and_a_divergence_is_found_at_the_next_read() {
    let plan = plan(0.0, false);
    let start = RunState::fresh(&plan, 5).unwrap();
    let data = data();
    let quiet_step = |e: &mut CudaEngine| assert!(now(e.step(data[..].into(), false, &mut ())).unwrap().stats.is_none());
    let mut reported = cuda(device(), Arithmetic::F32, plan, &start);
    let want = steps(&mut reported, 3);
    let mut quiet = cuda(device(), Arithmetic::F32, plan, &start);
    quiet_step(&mut quiet);
    quiet_step(&mut quiet);
    now(quiet.check()).unwrap();
    assert_eq!(now(quiet.step(data[..].into(), true, &mut ())).unwrap().stats.unwrap(), want[2]);
    assert!(params(&quiet) == params(&reported), "unreported steps changed the parameters");

    // At a learning rate of 1e30 the first step applies (its loss is finite) and the next two
    // are not finite: skipped, so the parameters stay those of the first step.
    let wild = TrainConfig { schedule: LrSchedule { max_lr: 1e30, min_lr: 1e30, warmup_iters: 0, decay_iters: 10 }, ..cfg(1) };
    let diverging = |steps: usize| {
        let mut e = CudaEngine::new(device(), Arithmetic::F32, plan, wild, &start, &OneRank, false).unwrap();
        (0..steps).for_each(|_| quiet_step(&mut e));
        e
    };
    let mut three = diverging(3);
    let err = now(three.check()).unwrap_err();
    assert!(matches!(err, StepError::Diverged(_)), "{err:?}");
    assert!(err.to_string().starts_with("2 of steps 0..=2: the loss or gradient norm was not finite"), "{err}");
    now(three.check()).expect("the skipped steps were reported once");
    let mut one = diverging(1);
    now(one.check()).expect("the first step applies");
    assert!(params(&three) == params(&one), "a skipped step changed the parameters");
    let err = now(three.step(data[..].into(), true, &mut ())).unwrap_err();
    assert!(err.to_string().starts_with("step 3: the loss or gradient norm was not finite"), "{err}");
}

/// Micro-batches replayed as a CUDA graph (captured at the second, with dropout and two
/// micro-batches a step) give the bits of the same work queued launch by launch. On a device
/// only: the host's emulation captures nothing (both would queue launch by launch).
#[test]
fn graphs_keep_every_bit() {
    if !device().captures() {
        eprintln!("skipped: the host's emulation captures no graphs (scripts/cuda-check.sh runs this on a GPU)");
        return;
    }
    let plan = plan(0.1, false);
    let start = RunState::fresh(&plan, 7).unwrap();
    for arithmetic in [Arithmetic::F32, Arithmetic::Bf16] {
        let engine = |graphs| CudaEngine::new(device(), arithmetic, plan, cfg(2), &start, &OneRank, false).unwrap().with_graphs(graphs);
        let (mut graphed, mut launched) = (engine(true), engine(false));
        assert_eq!(steps(&mut graphed, 3), steps(&mut launched, 3), "{arithmetic:?}: the steps' statistics differ");
        assert_eq!(graphed.graph_captured(), graphed.device().captures(), "{arithmetic:?}: a device that captures graphs runs the micro-batches as one");
        assert!(!launched.graph_captured());
        assert!(params(&graphed) == params(&launched), "{arithmetic:?}: the parameters differ");
    }
}

#[test]
fn samples_decode_what_the_cpu_decodes() {
    samples_against_cpu(plan(0.0, false));
}

fn samples_against_cpu(plan: Plan) {
    let dev = device();
    let start = RunState::fresh(&plan, 6).unwrap();
    let mut cpu = CpuEngine::new(Serial, &OneRank, plan, cfg(1), start.clone()).unwrap();
    let mut gpu = cuda(dev, Arithmetic::F32, plan, &start);
    steps(&mut cpu, 15);
    steps(&mut gpu, 15);
    // Greedy: the same tokens where the logits agree to 1e-5 (ties aside, which a trained
    // model's 40 steps of greedy decoding do not meet here).
    let cfg = alpha_core::model::SamplingConfig { temperature: 0.0, ..alpha_core::model::SamplingConfig::new(40) };
    let sample = |e: &mut dyn Engine| {
        let mut ids = Vec::new();
        now(e.sample(&[1, 2, 3], &cfg, &mut alpha_core::Rng::new(1), &mut |id| ids.push(id))).unwrap();
        ids
    };
    assert_eq!(sample(&mut gpu), sample(&mut cpu), "greedy samples past the window's end (32) differ");
}

/// What `--trace` collects: the kernel times of each step.
#[derive(Default)]
struct KernelTimes(Vec<alpha_core::tape::KernelTime>);

impl alpha_core::tape::Observer for KernelTimes {
    fn wants_kernel_times(&self) -> bool {
        true
    }

    fn kernel_times(&mut self, kernels: &[alpha_core::tape::KernelTime]) {
        self.0 = kernels.to_vec();
    }
}

/// A traced step times every kernel in queue order (forward, backward, then the update), and
/// its products count every linear layer's FLOPs: 6 per weight the products read per token.
#[test]
fn traced_steps_time_every_kernel_with_its_work() {
    let plan = plan(0.1, false);
    let mut engine = cuda(device(), Arithmetic::F32, plan, &RunState::fresh(&plan, 2).unwrap());
    let mut times = KernelTimes::default();
    let data = data();
    now(engine.step(data[..].into(), true, &mut times)).unwrap();
    let kernels = &times.0;
    assert!(kernels.len() >= engine.describe().device.unwrap().kernels_per_step, "{} kernels timed", kernels.len());
    let mut passes: Vec<&str> = kernels.iter().map(|k| k.pass).collect();
    passes.dedup();
    assert_eq!(passes, ["forward", "backward", "update"]);
    for (k, next) in kernels.iter().zip(kernels.iter().skip(1)) {
        assert!(0.0 <= k.start_ns && k.start_ns <= k.end_ns && k.end_ns <= next.start_ns, "{k:?} then {next:?}");
        assert!(k.bytes > 0.0, "{k:?} moves no bytes");
    }
    let ops: std::collections::BTreeSet<&str> = kernels.iter().map(|k| k.kernel).collect();
    for kernel in
        ["product", "attention_tf32x3_forward", "attention_tf32x3_backward_key_value", "bias_grad_partials", "add_partials", "adamw", "sum_squares_partials"]
    {
        assert!(ops.contains(kernel), "{kernel} not timed: {ops:?}");
    }
    let weights: usize = plan.params().filter(|p| p.kind.is_matrix() && p.kind != alpha_core::plan::ParamKind::Wpe).map(|p| p.span.len).sum();
    let product_flops: f64 = kernels.iter().filter(|k| k.kernel == "product").map(|k| k.flops).sum();
    assert_eq!(product_flops, 6.0 * (weights * plan.tokens()) as f64);
    // An untraced step between two traced ones: the second has the first's kernels.
    now(engine.step(data[..].into(), true, &mut ())).unwrap();
    let mut again = KernelTimes::default();
    now(engine.step(data[..].into(), true, &mut again)).unwrap();
    let names = |t: &[alpha_core::tape::KernelTime]| t.iter().map(|k| (k.pass, k.op, k.kernel)).collect::<Vec<_>>();
    assert_eq!(names(&again.0), names(kernels));
}
