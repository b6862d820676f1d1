//! No leaks over long runs: a tiny model trained for 10,000 steps on the CPU (1,000 on the GPU:
//! lavapipe in CI, about 90 ms a step) with evaluations, samples and checkpoints every
//! twentieth of the run, while the process's resident memory is sampled. After the first
//! evaluation, sample and checkpoint have allocated what they keep, the resident set stays
//! flat: its peak over the last fifth of the run is at most `MAX_GROWTH_KIB` above its peak
//! over the second and third tenths (ten saves, evaluations and samples apart on either
//! backend).

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Allowed growth of the resident set between the two windows: allocator noise, far below
/// what a leak of one checkpoint's copy (66 KiB) per save would show, or one of a hundred bytes
/// per CPU step (a kilobyte per GPU step: a buffer, a bind group).
const MAX_GROWTH_KIB: u64 = 512;

/// The resident set of process `pid` in KiB (Linux's /proc).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// Trains for `steps` on `backend`, evaluating, sampling and saving every twentieth of them,
/// and returns `(step, rss)` samples taken every 20 ms.
fn soak(backend: &str, steps: u64) -> Vec<(u64, u64)> {
    let dir = workdir(&format!("soak-{backend}"));
    text_file(&dir);
    let (iters, every) = (steps.to_string(), (steps / 20).to_string());
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--iters", &iters, "--backend", backend, "--log-interval", "50"];
    args.extend(["--eval-interval", &every, "--eval-iters", "5", "--sample-interval", &every, "--checkpoint-interval", &every]);
    args.extend(TINY);
    let mut child = alpha_native().args(&args).current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
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

fn assert_flat(backend: &str, steps: u64) {
    if !cfg!(target_os = "linux") {
        return;
    }
    let samples = soak(backend, steps);
    let peak = |from: u64, to: u64| samples.iter().filter(|(s, _)| (from..to).contains(s)).map(|&(_, r)| r).max();
    let (early, late) = (steps / 10..steps * 3 / 10, steps * 8 / 10..steps);
    let (early_peak, late_peak) =
        (peak(early.start, early.end).expect("samples early in the run"), peak(late.start, late.end).expect("samples late in the run"));
    let growth = late_peak.saturating_sub(early_peak);
    eprintln!(
        "soak {backend}: {} samples; peak RSS {early_peak} KiB over steps {early:?}, {late_peak} KiB over {late:?} (+{growth} KiB); whole run {}-{} KiB",
        samples.len(),
        samples.iter().map(|s| s.1).min().unwrap(),
        samples.iter().map(|s| s.1).max().unwrap()
    );
    assert!(growth <= MAX_GROWTH_KIB, "{backend}: the resident set grew by {growth} KiB over the run");
}

#[test]
fn ten_thousand_cpu_steps_keep_memory_flat() {
    assert_flat("cpu", 10_000);
}

#[test]
fn a_thousand_gpu_steps_keep_memory_flat() {
    assert_flat("gpu", 1_000);
}
