//! Data parallelism on the CUDA engine: 2 ranks (threads here, each with its own device or
//! emulation, exchanging through host memory as MPI ranks do) take the steps of one process
//! with `--grad-accum 2` (losses within 1e-6 per step) and hold the same model, with and
//! without ZeRO-1; whole gradients summed piece by piece during the backward give the bits
//! of the sum after it. On the host's
//! emulation where no CUDA device is found (scripts/cuda-check.sh runs the CLI's mpirun
//! check on a GPU).

use alpha_core::engine::Engine;
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::shard;
use alpha_core::train::{OneRank, Ranks, RunState, TrainConfig};
use alpha_core::{GptConfig, Plan};
use alpha_cuda::{Arithmetic, CudaEngine, Device};
use std::cell::RefCell;
use std::sync::{Barrier, Mutex};

/// Ranks as threads: each collective posts this rank's values, waits for the others', and
/// combines them in rank order. A started sum waits for `finish_sums`, as a non-blocking MPI
/// sum may: a caller that reads its values before then reads them unsummed.
struct Threads<'a> {
    rank: usize,
    ranks: usize,
    barrier: &'a Barrier,
    posted: &'a Mutex<Vec<Vec<f64>>>,
    started: RefCell<Vec<(*mut f32, usize)>>,
}

impl<'a> Threads<'a> {
    fn new(rank: usize, ranks: usize, barrier: &'a Barrier, posted: &'a Mutex<Vec<Vec<f64>>>) -> Self {
        Threads { rank, ranks, barrier, posted, started: RefCell::new(Vec::new()) }
    }
}

impl Threads<'_> {
    /// Every rank's `values` (f32s held exactly as f64s), in rank order.
    fn exchange(&self, values: impl Iterator<Item = f64>) -> Vec<Vec<f64>> {
        self.posted.lock().unwrap()[self.rank] = values.collect();
        self.barrier.wait();
        let all = self.posted.lock().unwrap().clone();
        self.barrier.wait();
        all
    }
}

impl Ranks<f32> for Threads<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn ranks(&self) -> usize {
        self.ranks
    }
    fn sum(&self, values: &mut [f32]) {
        let all = self.exchange(values.iter().map(|&v| v as f64));
        for (i, v) in values.iter_mut().enumerate() {
            *v = all.iter().fold(0f32, |s, r| s + r[i] as f32);
        }
    }
    fn sum_f64(&self, value: f64) -> f64 {
        self.exchange(std::iter::once(value)).iter().map(|r| r[0]).sum()
    }
    unsafe fn start_sum(&self, values: &mut [f32]) {
        self.started.borrow_mut().push((values.as_mut_ptr(), values.len()));
    }
    fn finish_sums(&self) {
        for (ptr, len) in self.started.take() {
            // SAFETY: `start_sum`'s caller keeps the values alive and untouched until now.
            self.sum(unsafe { std::slice::from_raw_parts_mut(ptr, len) });
        }
    }
    fn sum_shard(&self, values: &mut [f32]) {
        self.sum(values)
    }
    fn gather_shards(&self, values: &mut [f32]) {
        let all = self.exchange(values.iter().map(|&v| v as f64));
        for (r, theirs) in all.iter().enumerate() {
            for i in shard(values.len(), self.ranks, r) {
                values[i] = theirs[i] as f32;
            }
        }
    }
    fn collect_shards(&self, mine: &[f32], all: &mut [f32]) {
        let posted = self.exchange(mine.iter().map(|&v| v as f64));
        let len = all.len();
        if self.rank == 0 {
            for (r, theirs) in posted.iter().enumerate() {
                for (a, &t) in all[shard(len, self.ranks, r)].iter_mut().zip(theirs) {
                    *a = t as f32;
                }
            }
        }
    }
}

fn device() -> Device {
    match alpha_cuda::device::check_libraries().and_then(|()| Device::open(0)) {
        Ok(d) => d,
        Err(why) if std::env::var_os("ALPHA_REQUIRE_CUDA").is_some() => panic!("ALPHA_REQUIRE_CUDA is set: {why}"),
        Err(_) => Device::emulated().unwrap(),
    }
}

fn now<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("CUDA engines resolve at once"),
    }
}

fn setup() -> (Plan, TrainConfig, RunState<f32>, Vec<u32>) {
    let config = GptConfig::gpt2(65, 16, 1, 2, 64);
    let plan = Plan::new(config, 2, 16).unwrap();
    let schedule = LrSchedule { max_lr: 3e-3, min_lr: 3e-4, warmup_iters: 1, decay_iters: 10 };
    let cfg = TrainConfig { schedule, adamw: AdamWConfig::default(), grad_clip: 1.0, grad_accum: 2 };
    let data = (0..5_000u32).map(|i| (i * 7 + i / 13) % 65).collect();
    (plan, cfg, RunState::fresh(&plan, 8).unwrap(), data)
}

/// Losses of 4 steps, and the parameters after them.
fn run(engine: &mut dyn Engine, data: &[u32]) -> (Vec<f64>, Vec<f32>) {
    let losses = (0..4).map(|_| now(engine.step(data.into(), true, &mut ())).unwrap().stats.unwrap().loss).collect();
    (losses, now(engine.state()).unwrap().0.into_owned())
}

/// Each of 2 ranks' losses and model after 4 steps.
fn two_ranks(zero: bool, overlap: bool) -> Vec<(Vec<f64>, Vec<f32>)> {
    let (plan, cfg, start, data) = setup();
    let (barrier, posted) = (Barrier::new(2), Mutex::new(vec![Vec::new(); 2]));
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (start, data, barrier, posted) = (&start, &data, &barrier, &posted);
                s.spawn(move || {
                    let ranks = Threads::new(rank, 2, barrier, posted);
                    let engine = CudaEngine::new(device(), Arithmetic::F32, plan, cfg, start, &ranks, zero).unwrap();
                    run(&mut engine.with_overlapped_sums(overlap), data)
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

fn two_ranks_equal_grad_accum(zero: bool) -> Vec<(Vec<f64>, Vec<f32>)> {
    let (plan, cfg, start, data) = setup();
    let mut alone = CudaEngine::new(device(), Arithmetic::F32, plan, cfg, &start, &OneRank, false).unwrap();
    let (want, _) = run(&mut alone, &data);
    let results = two_ranks(zero, true);
    for (rank, (losses, params)) in results.iter().enumerate() {
        for (step, (a, b)) in losses.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b, "zero {zero}, rank {rank}, step {step}: loss {a} vs one process's {b}");
        }
        assert!(*params == results[0].1, "zero {zero}: rank {rank} holds another model than rank 0");
    }
    results
}

#[test]
fn two_ranks_take_the_steps_of_grad_accum_2() {
    let overlapped = two_ranks_equal_grad_accum(false);
    assert!(overlapped == two_ranks(false, false), "the sums started during the backward differ from the sums after it");
}

#[test]
fn two_zero_1_ranks_take_the_steps_of_grad_accum_2() {
    two_ranks_equal_grad_accum(true);
}
