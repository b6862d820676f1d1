//! Proves that training steps, evaluation and sampling perform no heap allocation once the
//! memory is set up: a counting global allocator watches several steps after the first.
//! It runs without libtest (`harness = false`): the harness's own threads allocate at
//! unpredictable moments, which the process-wide counter would see.

use alpha_core::gemm::Operands;
use alpha_core::model::{generate, SamplingConfig, SamplingMemory};
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::ThreadPool;
use alpha_core::train::{OwnedMemory, TrainConfig};
use alpha_core::{GptConfig, Plan, Rng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let gpt2 = GptConfig::gpt2(13, 16, 2, 2, 16);
    // The Llama family: grouped heads, RoPE (its table in attention's scratch), SwiGLU.
    let llama = alpha_core::Llama { n_kv_head: 1, intermediate_size: 24, norm_eps: 1e-5, rope_theta: 10000.0, rope_scaling: None, qkv_bias: true, tied: false };
    // bf16 products (`--precision bf16` on the CPU) where this CPU has them.
    let bf16 = alpha_core::gemm::bf16::bf16_kernel_name().is_some();
    let mut operands = vec![Operands::F32];
    if bf16 {
        operands.push(Operands::Bf16);
    } else {
        println!("zero_alloc: bf16 products untested: this CPU has no AVX512-BF16");
    }
    for operands in operands {
        for cfg in [gpt2, GptConfig { arch: alpha_core::Arch::Llama(llama), ..gpt2 }] {
            training_evaluation_and_sampling_do_not_allocate(cfg, operands);
        }
    }
    let precisions = if bf16 { "f32 and bf16 products" } else { "f32 products" };
    println!("zero_alloc: 4 training steps, an evaluation and sampling made no heap allocation, GPT-2 and Llama, {precisions}");
}

fn training_evaluation_and_sampling_do_not_allocate(cfg: GptConfig, operands: Operands) {
    let plan = Plan::new(cfg, 3, 16).unwrap();
    let train_cfg = TrainConfig {
        schedule: LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 2, decay_iters: 10 },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum: 2,
    };
    let data: Vec<u32> = (0..500u32).map(|i| (i * 7 + i / 3) % 13).collect();
    let pool = ThreadPool::new(2);
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    alpha_core::model::init_params(&plan, &mut mem.params, &mut Rng::new(1));
    let sample_plan = Plan::new(cfg, 1, 16).unwrap();
    let mut sample_mem = OwnedMemory::<f32>::new(&sample_plan).unwrap();
    let mut window = vec![0u32; 16];
    let mut trainer = mem.trainer(plan, train_cfg, Rng::new(2)).unwrap();
    trainer.operands = operands;
    trainer.train_step(&pool, &data).unwrap();

    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let mut eval_rng = Rng::new(3);
    for _ in 0..4 {
        trainer.train_step(&pool, &data).unwrap();
    }
    let eval_loss = trainer.evaluate(&pool, &data, 2, &mut eval_rng);
    let mut emitted = 0;
    let scfg = SamplingConfig { top_k: 5, ..SamplingConfig::new(20) };
    let params = &*trainer.mem.params;
    let mem = SamplingMemory { plan: &sample_plan, tape: &sample_mem.tape, acts: &mut sample_mem.acts, window: &mut window, decoding: None };
    generate(&pool, mem, params, &[1, 2], &scfg, &mut eval_rng, |_| emitted += 1);
    let after = ALLOCATIONS.load(Ordering::SeqCst);

    assert!(eval_loss.is_finite());
    assert_eq!(emitted, 20);
    assert_eq!(after - before, 0, "heap allocations during 4 training steps, an evaluation and sampling ({:?}, {operands:?} products)", cfg.arch);
}
