//! Training results do not depend on the number of threads: kernels split work into tasks
//! that write disjoint memory and reduce in a fixed order.

use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_core::train::{OwnedMemory, TrainConfig};
use alpha_core::{model, GptConfig, Plan, Rng, Serial};

fn train(par: &dyn Parallel) -> (Vec<f64>, Vec<f32>) {
    // Odd sizes: rows and columns that split unevenly across threads and tiles.
    let cfg = GptConfig::gpt2(29, 24, 2, 3, 36);
    let plan = Plan::new(cfg, 5, 23).unwrap();
    let data: Vec<u32> = (0..4000u32).map(|i| (i * 17 + i / 7) % 29).collect();
    let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
    model::init_params(&plan, &mut mem.params, &mut Rng::new(1));
    let tc = TrainConfig {
        schedule: LrSchedule { max_lr: 3e-3, min_lr: 3e-4, warmup_iters: 2, decay_iters: 6 },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum: 2,
    };
    let mut trainer = mem.trainer(plan, tc, Rng::new(2)).unwrap();
    let losses = (0..6).map(|_| trainer.train_step(par, &data).unwrap().loss).collect();
    (losses, mem.params)
}

#[test]
fn one_two_and_three_threads_train_bit_identically() {
    let serial = train(&Serial);
    assert!(serial.0[5] < serial.0[0], "the loss went down: {:?}", serial.0);
    for threads in [2, 3] {
        let pooled = train(&ThreadPool::new(threads));
        assert_eq!(serial.0, pooled.0, "losses with {threads} threads");
        assert!(serial.1 == pooled.1, "parameters differ with {threads} threads");
    }
}
