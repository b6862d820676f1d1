//! The whole model on the GPU against the CPU: same initialisation, same batches, 20 steps
//! with gradient accumulation and clipping; evaluation; parameters round-tripping.

use alpha_core::model::init_params;
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::Serial;
use alpha_core::train::{OwnedMemory, TrainConfig};
use alpha_core::{GptConfig, Plan, Rng};
use alpha_gpu::{block_on, Gpu, GpuTrainer};

fn setup() -> (Plan, TrainConfig, Vec<u32>) {
    // Head size 12 and T = 21: neither fills the kernels' tiles.
    let config = GptConfig { vocab_size: 23, block_size: 24, n_layer: 2, n_head: 2, n_embd: 24 };
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

#[test]
fn twenty_steps_match_the_cpu() {
    let (plan, cfg, data) = setup();
    let mut mem = OwnedMemory::<f32>::new(&plan);
    init_params(&plan, &mut mem.params, &mut Rng::new(7));
    let gpu = block_on(Gpu::open(None)).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"));
    let mut gt = block_on(GpuTrainer::new(gpu, plan, cfg, Rng::new(11), &mem.params)).unwrap();
    let mut ct = mem.trainer(plan, cfg, Rng::new(11)).unwrap();
    for step in 0..20 {
        let cpu = ct.train_step(&Serial, &data).unwrap();
        let lr = gt.step(&data);
        let g = block_on(gt.stats(lr)).unwrap().unwrap();
        assert_eq!(g.lr, cpu.lr);
        assert!((g.loss - cpu.loss).abs() <= 1e-4 * cpu.loss, "step {step}: loss GPU {} vs CPU {}", g.loss, cpu.loss);
        assert!((g.grad_norm - cpu.grad_norm).abs() <= 1e-4 * cpu.grad_norm, "step {step}: norm GPU {} vs CPU {}", g.grad_norm, cpu.grad_norm);
    }
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
    let mut mem = OwnedMemory::<f32>::new(&plan);
    init_params(&plan, &mut mem.params, &mut Rng::new(3));
    // Three CPU steps; their state (what a checkpoint holds) continues on the GPU.
    let mut ct = mem.trainer(plan, cfg, Rng::new(2)).unwrap();
    for _ in 0..3 {
        ct.train_step(&Serial, &data).unwrap();
    }
    let state = (ct.mem.params.to_vec(), ct.mem.adam_m.to_vec(), ct.mem.adam_v.to_vec());
    let (step, rng) = (ct.step, ct.rng);
    let cpu_next = ct.train_step(&Serial, &data).unwrap();
    let gpu = block_on(Gpu::open(None)).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"));
    let mut gt = block_on(GpuTrainer::new(gpu, plan, cfg, rng, &state.0)).unwrap();
    gt.upload(&state.0, Some((&state.1, &state.2))).unwrap();
    gt.step = step;
    assert_eq!(block_on(gt.download()).unwrap(), state, "upload then download is exact");
    let lr = gt.step(&data);
    let g = block_on(gt.stats(lr)).unwrap().unwrap();
    assert!((g.loss - cpu_next.loss).abs() <= 1e-4 * cpu_next.loss, "resumed loss GPU {} vs CPU {}", g.loss, cpu_next.loss);
    assert!((g.grad_norm - cpu_next.grad_norm).abs() <= 1e-4 * cpu_next.grad_norm);
}
