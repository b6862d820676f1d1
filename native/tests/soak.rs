//! No leaks over long runs: a tiny model trained for 10,000 steps with evaluations, samples
//! and checkpoints every 500, on the CPU and on the GPU (lavapipe in CI), while the process's
//! resident memory is sampled. After the first evaluation, sample and checkpoint have
//! allocated what they keep, the resident set stays flat: its peak over the last 2,000 steps
//! is at most `MAX_GROWTH_KIB` above its peak over steps 1,000 to 3,000.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const STEPS: u64 = 10_000;
/// Allowed growth of the resident set between the two windows: allocator noise, far below
/// what a leak of a few bytes per step (20 KiB per 10 bytes over these 2,000 steps) or of
/// one checkpoint's copy (66 KiB) per save would show.
const MAX_GROWTH_KIB: u64 = 512;

/// The resident set of process `pid` in KiB (Linux's /proc).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// Trains for `STEPS` on `backend` and returns `(step, rss)` samples taken every 20 ms.
fn soak(backend: &str) -> Vec<(u64, u64)> {
    let dir = workdir(&format!("soak-{backend}"));
    text_file(&dir);
    let iters = STEPS.to_string();
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--iters", &iters, "--backend", backend, "--log-interval", "100"];
    args.extend(["--eval-interval", "500", "--eval-iters", "5", "--sample-interval", "500", "--checkpoint-interval", "500"]);
    args.extend(TINY);
    let mut child = Command::new(BIN).args(&args).current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let step = Arc::new(AtomicU64::new(0));
    let reader = {
        let (step, out) = (Arc::clone(&step), child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("step ").and_then(|r| r.split(':').next()).and_then(|n| n.parse().ok()) {
                    step.store(n, Ordering::Relaxed);
                }
            }
        })
    };
    let mut samples = Vec::new();
    while child.try_wait().unwrap().is_none() {
        if let Some(rss) = rss_kib(child.id()) {
            samples.push((step.load(Ordering::Relaxed), rss));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.wait().unwrap().success(), "the {backend} soak run failed");
    reader.join().unwrap();
    samples
}

fn assert_flat(backend: &str) {
    if !cfg!(target_os = "linux") {
        return;
    }
    let samples = soak(backend);
    let peak = |from: u64, to: u64| samples.iter().filter(|(s, _)| (from..to).contains(s)).map(|&(_, r)| r).max();
    let (early, late) = (peak(1000, 3000).expect("samples of steps 1000-3000"), peak(8000, STEPS).expect("samples of steps 8000-10000"));
    let growth = late.saturating_sub(early);
    eprintln!(
        "soak {backend}: {} samples; peak RSS {early} KiB over steps 1000-3000, {late} KiB over 8000-10000 (+{growth} KiB); whole run {}-{} KiB",
        samples.len(),
        samples.iter().map(|s| s.1).min().unwrap(),
        samples.iter().map(|s| s.1).max().unwrap()
    );
    assert!(growth <= MAX_GROWTH_KIB, "{backend}: the resident set grew by {growth} KiB over the run");
}

#[test]
fn ten_thousand_cpu_steps_keep_memory_flat() {
    assert_flat("cpu");
}

#[test]
fn ten_thousand_gpu_steps_keep_memory_flat() {
    assert_flat("gpu");
}
