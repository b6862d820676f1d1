//! Data parallelism over MPI (a build with `--features mpi`, Open MPI's `mpirun` on PATH):
//! N ranks take the step one process of N times the gradient accumulation takes, rank 0
//! alone writes, ranks that disagree are named, and a dead rank stops the run.
#![cfg(feature = "mpi")]

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `mpirun -np ranks alpha-native ARGS` in `dir` (as root too: CI containers run as root),
/// with extra mpirun options before the program.
fn mpirun(dir: &Path, ranks: usize, mpi_options: &[&str], args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.current_dir(dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("ALPHA_CACHE_DIR", test_cache_dir())
        .args(["--oversubscribe", "-np", &ranks.to_string()])
        .args(mpi_options)
        .arg(BIN)
        .args(args);
    c
}

/// The tiny model's training flags with `extra`.
fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", "--data", "text.txt", "--threads", "1", "--log-interval", "1"];
    args.extend(TINY);
    args.extend(extra);
    args
}

/// The train and eval losses of a metrics file, in order.
fn losses(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .flat_map(|r| ["loss", "train_loss", "val_loss"].map(|k| r[k].as_f64()))
        .flatten()
        .collect()
}

fn assert_close(ranked: &[f64], alone: &[f64], what: &str) {
    assert_eq!(ranked.len(), alone.len(), "{what}: the runs logged different records");
    for (i, (a, b)) in ranked.iter().zip(alone).enumerate() {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{what}: record {i}: {a} on ranks, {b} alone");
    }
}

/// Checks that checkpoints `a` and `b` hold the same run state: step and batch stream exactly,
/// parameters and both AdamW moments within 1e-4 of their largest value (only the order of
/// the ranks' sums differs). Returns `a`'s training state.
fn assert_same_state(a: &Path, b: &Path, what: &str) -> alpha_native::checkpoint::TrainState {
    let (x, y) = (alpha_native::checkpoint::load(a).unwrap(), alpha_native::checkpoint::load(b).unwrap());
    let ((xm, xv, xs), (ym, yv, ys)) = (x.optimizer.unwrap(), y.optimizer.unwrap());
    assert_eq!((xs.step, &xs.rng_state), (ys.step, &ys.rng_state), "{what}");
    for (tensor, a, b) in [("parameters", &x.params, &y.params), ("first moments", &xm, &ym), ("second moments", &xv, &yv)] {
        let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-4 * scale, "{what}: {tensor} differ by {worst} (largest {scale})");
    }
    xs
}

/// Two ranks of batch B take the steps one process of `--grad-accum 2` takes (dropout and
/// evaluation included), up to the order of the sums; with `--grad-accum 2` on each rank, those
/// of `--grad-accum 4`. The model (1.6M parameters) is summed in several pieces while the
/// backward runs. Only rank 0 writes: one metrics file of one run, one checkpoint.
#[test]
fn ranks_take_the_step_of_one_process() {
    let dir = workdir("mpi-equivalence");
    text_file(&dir);
    let common = [
        "--iters",
        "8",
        "--eval-interval",
        "4",
        "--eval-iters",
        "3",
        "--sample-interval",
        "4",
        "--dropout",
        "0.1",
        "--layers",
        "2",
        "--embd",
        "256",
        "--heads",
        "4",
    ];
    for accum in [1usize, 2] {
        let (ranked, alone) = (format!("ranked{accum}"), format!("alone{accum}"));
        let (per_rank, whole) = (accum.to_string(), (2 * accum).to_string());
        let o =
            mpirun(&dir, 2, &[], &train_args(&[&common[..], &["--grad-accum", &per_rank, "--out", &ranked, "--metrics", &format!("{ranked}.jsonl")]].concat()))
                .output()
                .unwrap();
        assert_ok(&o);
        let out = stdout(&o);
        assert_eq!(out.matches("training from scratch").count(), 1, "one rank prints: {out}");
        assert!(out.contains("on 2 MPI ranks of 1 threads each"), "{out}");
        assert_eq!(out.matches("--- sample at step 4 ---").count(), 1, "{out}");
        let o = run(&dir, &train_args(&[&common[..], &["--grad-accum", &whole, "--out", &alone, "--metrics", &format!("{alone}.jsonl")]].concat()));
        assert_ok(&o);
        let (a, b) = (losses(&dir.join(format!("{ranked}.jsonl"))), losses(&dir.join(format!("{alone}.jsonl"))));
        assert_eq!(b.len(), 8 + 3 * 2, "8 steps and 3 evaluations of two splits");
        assert_close(&a, &b, &format!("--grad-accum {accum} on 2 ranks"));
        let metrics = std::fs::read_to_string(dir.join(format!("{ranked}.jsonl"))).unwrap();
        assert_eq!(metrics.matches(r#""type":"start""#).count(), 1);
        assert!(metrics.contains(r#""ranks":2"#));
        let (x, y) = (
            alpha_native::checkpoint::load(&dir.join(ranked).join("ckpt.safetensors")).unwrap(),
            alpha_native::checkpoint::load(&dir.join(alone).join("ckpt.safetensors")).unwrap(),
        );
        let worst = x.params.iter().zip(&y.params).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "parameters after 8 steps differ by {worst}");
    }
}

/// `--zero 1` (AdamW moments sharded over the ranks) trains as the whole moments do, and its
/// checkpoints are a single process's: a run resumes across rank counts (2 ranks, then 1
/// process of `--grad-accum 2`, then 2 ranks again) and follows the run that never stopped;
/// for GPT-2 and for the Llama family.
#[test]
fn zero_1_shards_the_moments_and_resumes_across_rank_counts() {
    zero_1_resumes_across_rank_counts("mpi-zero", &[]);
    zero_1_resumes_across_rank_counts("mpi-zero-llama", &["--arch", "llama", "--kv-heads", "1"]);
}

fn zero_1_resumes_across_rank_counts(name: &str, family: &[&str]) {
    let dir = workdir(name);
    text_file(&dir);
    let common = [&["--iters", "12", "--lr-decay-iters", "12", "--warmup", "2", "--eval-interval", "0", "--sample-interval", "0"], family].concat();
    assert_ok(&run(&dir, &train_args(&[&common[..], &["--grad-accum", "2", "--out", "alone", "--metrics", "alone.jsonl"]].concat())));
    let first = train_args(&[&common[..], &["--iters", "4", "--zero", "1", "--out", "split", "--metrics", "split.jsonl"]].concat());
    assert_ok(&mpirun(&dir, 2, &[], &first).output().unwrap());
    fn resume<'a>(iters: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        [&["train", "--resume", "split/ckpt.safetensors", "--iters", iters, "--threads", "1", "--log-interval", "1", "--metrics", "split.jsonl"], QUIET, extra]
            .concat()
    }
    assert_ok(&run(&dir, &resume("8", &["--grad-accum", "2"])));
    let last = resume("12", &["--grad-accum", "1", "--zero", "1"]);
    assert_ok(&mpirun(&dir, 2, &[], &last).output().unwrap());
    assert_close(&losses(&dir.join("split.jsonl")), &losses(&dir.join("alone.jsonl")), "2 ranks -> 1 -> 2 with --zero 1");
    let state = assert_same_state(&dir.join("split/ckpt.safetensors"), &dir.join("alone/ckpt.safetensors"), "2 ranks -> 1 -> 2");
    assert_eq!(state.step, 12);
}

/// GPU ranks (two sharing lavapipe here): each step's micro-batches on the device, the
/// gradients summed on the host between two submissions; the same steps as one GPU process
/// of `--grad-accum 2`, with whole moments and with `--zero 1` (each rank's device holds
/// and updates its shard; its checkpoint is one process's), and in f16 with `--zero 1` (the
/// gathered parameters' f16 copy made again before the next step).
#[test]
fn gpu_ranks_take_the_step_of_one_process() {
    let dir = workdir("mpi-gpu");
    text_file(&dir);
    let common = ["--backend", "gpu", "--iters", "4", "--eval-interval", "2", "--eval-iters", "2", "--sample-interval", "0", "--dropout", "0.1"];
    for (precision, zeros) in [("f32", &["0", "1"][..]), ("f16", &["1"][..])] {
        let alone = format!("alone-{precision}");
        let base = [&common[..], &["--precision", precision]].concat();
        let alone_metrics = format!("{alone}.jsonl");
        assert_ok(&run(&dir, &train_args(&[&base[..], &["--grad-accum", "2", "--out", &alone, "--metrics", &alone_metrics]].concat())));
        for zero in zeros {
            let (out, metrics) = (format!("ranked{zero}-{precision}"), format!("ranked{zero}-{precision}.jsonl"));
            let ranked = train_args(&[&base[..], &["--zero", zero, "--out", &out, "--metrics", &metrics]].concat());
            assert_ok(&mpirun(&dir, 2, &[], &ranked).output().unwrap());
            let (a, b) = (losses(&dir.join(&metrics)), losses(&dir.join(&alone_metrics)));
            assert_eq!(b.len(), 4 + 3 * 2);
            let what = format!("GPU ranks in {precision}, --zero {zero}");
            assert_close(&a, &b, &what);
            assert_same_state(&dir.join(&out).join("ckpt.safetensors"), &dir.join(&alone).join("ckpt.safetensors"), &what);
        }
    }
}

/// A multi-node launch: the ranks placed by a hostfile (this machine's name, two slots).
#[test]
fn a_hostfile_places_the_ranks() {
    let dir = workdir("mpi-hostfile");
    text_file(&dir);
    std::fs::write(dir.join("hosts"), "localhost slots=2\n").unwrap();
    let args = train_args(&["--iters", "3", "--out", "out", "--metrics", "m.jsonl", "--eval-interval", "3", "--eval-iters", "2", "--sample-interval", "0"]);
    assert_ok(&mpirun(&dir, 2, &["--hostfile", "hosts"], &args).output().unwrap());
    let alone = train_args(&[
        "--iters",
        "3",
        "--out",
        "alone",
        "--metrics",
        "alone.jsonl",
        "--eval-interval",
        "3",
        "--eval-iters",
        "2",
        "--sample-interval",
        "0",
        "--grad-accum",
        "2",
    ]);
    assert_ok(&run(&dir, &alone));
    assert_close(&losses(&dir.join("m.jsonl")), &losses(&dir.join("alone.jsonl")), "hostfile");
}

/// Ranks launched with different flags stop at the start, naming what differs; nothing is
/// trained.
#[test]
fn ranks_that_disagree_are_named() {
    let dir = workdir("mpi-mismatch");
    text_file(&dir);
    let base = train_args(&["--iters", "3", "--out", "out", "--eval-interval", "0", "--sample-interval", "0"]);
    let mut c = mpirun(&dir, 1, &[], &base);
    c.arg(":").args(["-np", "1", BIN]).args(&base).args(["--lr", "0.002"]);
    let o: Output = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.lines().any(|l| l == "error: the ranks do not train the same run: rank 1's settings differ from rank 0's; give every rank the same flags, files and build"), "{err}");
    assert!(!dir.join("out/ckpt.safetensors").exists());
}

/// A rank killed mid-run stops the others within 60 s with a non-zero status, and the last
/// checkpoint rank 0 wrote is whole (it evaluates).
#[test]
fn a_dead_rank_stops_the_run() {
    let dir = workdir("mpi-fault");
    text_file(&dir);
    let args = train_args(&["--iters", "1000000", "--out", "out", "--checkpoint-interval", "5", "--eval-interval", "0", "--sample-interval", "0"]);
    let mut job = mpirun(&dir, 2, &[], &args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let ckpt = dir.join("out/ckpt.safetensors");
    let started = Instant::now();
    while !ckpt.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no checkpoint within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let victim = rank_pid(&dir, 1);
    assert!(Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap().success());
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = job.try_wait().unwrap() {
            break s;
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "the run went on 60 s after a rank died");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let o = run(&dir, &["eval", "--checkpoint", "out/ckpt.safetensors", "--text", "text.txt"]);
    assert!(json_of(&o)["loss"].as_f64().unwrap().is_finite());
}

/// SIGTERM stops a run of ranks as it stops one process: every rank finishes the same step,
/// rank 0 saves, and the job exits 0, whether the scheduler signals each rank (as Slurm's
/// scancel does) or mpirun (which passes it on to the ranks after Open MPI's
/// odls_base_sigkill_timeout, 1 s, and kills them one timeout later, as the README says; its
/// own status then reports the signal).
#[test]
fn sigterm_stops_every_rank_at_one_step_and_saves() {
    let dir = workdir("mpi-sigterm");
    text_file(&dir);
    let started = |out: &str, mpi_options: &[&str]| {
        // Few lines: mpirun stops forwarding the ranks' output once it is signalled.
        let args = train_args(&[
            "--iters",
            "1000000",
            "--out",
            out,
            "--checkpoint-interval",
            "0",
            "--eval-interval",
            "0",
            "--sample-interval",
            "0",
            "--log-interval",
            "1000",
        ]);
        let job = mpirun(&dir, 2, mpi_options, &args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let lock = dir.join(out).join("train.lock");
        let since = Instant::now();
        while !lock.exists() {
            assert!(since.elapsed() < Duration::from_secs(60), "the run did not start within 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(1500));
        job
    };
    let saved_step = |out: &str| alpha_native::checkpoint::load(&dir.join(out).join("ckpt.safetensors")).unwrap().optimizer.unwrap().2.step;
    let term = |pid: u32| assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());

    let job = started("ranks", &[]);
    for rank in 0..2 {
        term(rank_pid(&dir, rank));
    }
    let o = job.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let step = saved_step("ranks");
    assert!(step > 0 && stdout(&o).contains(&format!("interrupted: checkpoint at step {step} saved to ranks/ckpt.safetensors")), "{}", stdout(&o));

    let job = started("launcher", &[]);
    term(job.id());
    let o = job.wait_with_output().unwrap();
    let step = saved_step("launcher");
    assert!(step > 0 && stdout(&o).contains(&format!("interrupted: checkpoint at step {step} saved to launcher/ckpt.safetensors")), "{}", stdout(&o));
    let left: Vec<String> = std::fs::read_dir(dir.join("launcher")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(left.iter().all(|f| !f.contains(".tmp-")), "{left:?}");
}

/// The process id of the alpha-native process running in `dir` as rank `rank` (its
/// environment says which).
fn rank_pid(dir: &Path, rank: usize) -> u32 {
    let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
        let cwd = std::fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if exe == Path::new(BIN).canonicalize().unwrap() && cwd == dir.canonicalize().unwrap() && env.split(|&b| b == 0).any(|v| v == wanted.as_bytes()) {
            return pid;
        }
    }
    panic!("no alpha-native process is rank {rank}")
}
