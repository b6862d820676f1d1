//! Nothing a user wrote is lost, replaced or half-written, and no input crashes the binary:
//! one test per hole a hostile probe of `alpha-native` found (each fails on the code before
//! its fix), plus a sweep of every numeric flag with hostile values.

mod common;

use alpha_core::settings::SavePolicy;
use alpha_native::checkpoint;
use common::*;
use std::fs;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A run that ends with an error: one `error:` line naming `needle`, and a non-zero exit.
fn assert_one_line_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected a failure, got success: {err}");
    assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1, "stderr {err:?}");
    assert!(err.contains(needle), "{err:?} does not contain {needle:?}");
}

fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", "--data", "text.txt"];
    args.extend(TINY);
    args.extend(QUIET);
    args.extend(extra);
    args
}

/// A diverging update (a learning rate past f32's range) makes the parameters infinite while
/// the step's loss, computed before the update, is finite. The checkpoint after that step is
/// refused: the previous one stays, the run says so and exits non-zero. On both backends.
#[test]
fn a_model_that_is_not_finite_is_never_saved() {
    for backend in ["cpu", "gpu"] {
        let dir = workdir(&format!("nonfinite-{backend}"));
        let ckpt = train(&dir, &["--iters", "2", "--backend", backend]);
        let before = fs::read(&ckpt).unwrap();
        let args =
            ["train", "--resume", "out/ckpt.safetensors", "--iters", "5", "--lr", "1e39", "--min-lr", "1e39", "--warmup", "0", "--checkpoint-interval", "1"];
        let o = run(&dir, &[&args[..], QUIET, &["--backend", backend]].concat());
        assert_one_line_error(&o, "not saving step 3: the model is not finite");
        assert!(String::from_utf8_lossy(&o.stderr).contains("the last good checkpoint (out/ckpt.safetensors, step 2) is kept"), "{o:?}");
        assert_eq!(fs::read(&ckpt).unwrap(), before, "{backend}: the good checkpoint was replaced");
        // Nothing half-written is left beside it.
        assert_eq!(fs::read_dir(dir.join("out")).unwrap().count(), 3, "{backend}: only the checkpoint, the run file and the lock file");
    }
}

/// Checkpoints carry per-tensor checksums: a flipped byte of tensor data is an error naming
/// the file and the tensor, in every command that reads checkpoints.
#[test]
fn a_flipped_byte_in_a_checkpoint_is_an_error_naming_file_and_tensor() {
    let dir = workdir("flip");
    let ckpt = train(&dir, &["--iters", "2"]);
    let mut bytes = fs::read(&ckpt).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x01; // in the last tensor: optimizer.exp_avg_sq.transformer.ln_f.bias
    fs::write(dir.join("flip.safetensors"), &bytes).unwrap();
    let needle = "checkpoint flip.safetensors is corrupt: tensor optimizer.exp_avg_sq.transformer.ln_f.bias does not match its checksum";
    assert_one_line_error(&run(&dir, &train_args(&["--resume", "flip.safetensors", "--out", "o2"])), needle);
    // Sampling and evaluation read the weights only, whose checksums still hold.
    assert!(run(&dir, &["sample", "--checkpoint", "flip.safetensors", "--tokens", "5"]).status.success());
    // A flipped byte in the first tensor's data (right after the header) is caught by all.
    let mut bytes = fs::read(&ckpt).unwrap();
    let data = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[data + 3] ^= 0x01;
    fs::write(dir.join("flip.safetensors"), &bytes).unwrap();
    for args in [
        &["sample", "--checkpoint", "flip.safetensors"][..],
        &["eval", "--checkpoint", "flip.safetensors", "--text", "text.txt"],
        &["export", "--checkpoint", "flip.safetensors", "--out", "hf"],
    ] {
        let o = run(&dir, args);
        assert_one_line_error(&o, "checkpoint flip.safetensors is corrupt: tensor transformer.");
        assert!(String::from_utf8_lossy(&o.stderr).contains("does not match its checksum"), "{o:?}");
    }
    // The checksums cannot be edited away: without "crc32" a file of this format is refused,
    // its flipped byte with it.
    fs::write(dir.join("renamed.safetensors"), edit_header(&bytes, "\"crc32\"", "\"brc32\"")).unwrap();
    for args in [&["sample", "--checkpoint", "renamed.safetensors"][..], &train_args(&["--resume", "renamed.safetensors", "--out", "o3"])] {
        assert_one_line_error(&run(&dir, args), "checkpoint renamed.safetensors is not a valid Alpha checkpoint: it has no crc32");
    }
    // A file from before checksums were required (format 1, none) still loads, saying that
    // nothing verifies its bytes.
    let v1 = edit_header(&edit_header(&fs::read(&ckpt).unwrap(), "alpha-gpt/2", "alpha-gpt/1"), "\"crc32\"", "\"brc32\"");
    fs::write(dir.join("v1.safetensors"), v1).unwrap();
    let o = run(&dir, &["sample", "--checkpoint", "v1.safetensors", "--tokens", "5"]);
    assert_ok(&o);
    let note = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        note.trim_end(),
        "note: v1.safetensors carries no checksums (written before Alpha required them, or by another tool): nothing verifies its bytes"
    );
}

/// A header whose config claims a billion layers (or a million, within the size limit) is an
/// error before anything is allocated, not an abort.
#[test]
fn hostile_checkpoint_configs_are_errors_not_aborts() {
    let dir = workdir("hostile-config");
    let ckpt = train(&dir, &["--iters", "1"]);
    let bytes = fs::read(&ckpt).unwrap();
    for (layers, needle) in [
        ("1000000000", "n_layer is 1000000000, more than the largest allowed (16777216)"),
        ("16777216", "48 tensors, but its config implies 603979788"),
        ("18446744073709551615", "n_layer is 18446744073709551615"),
    ] {
        fs::write(dir.join("h.safetensors"), edit_header(&bytes, r#"\"n_layer\":1"#, &format!(r#"\"n_layer\":{layers}"#))).unwrap();
        for args in [&["sample", "--checkpoint", "h.safetensors"][..], &["eval", "--checkpoint", "h.safetensors", "--text", "text.txt"]] {
            let o = run(&dir, args);
            assert_eq!(o.status.code(), Some(1), "{layers}: {o:?}");
            assert_one_line_error(&o, needle);
        }
    }
}

/// Out of memory is an error, not an abort, under a real limit on the address space (with
/// Linux's overcommit an unchecked allocation would pass otherwise). 1 GiB is enough to start,
/// not for these arenas; the memory check (which reads the machine's free memory) passes.
#[test]
fn out_of_memory_under_a_real_limit_is_an_error() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let dir = workdir("oom");
    text_file(&dir);
    let limited = |args: &str| {
        let script = format!("ulimit -v 1048576 && exec {BIN} {args}");
        Command::new("sh").args(["-c", &script]).env("ALPHA_CACHE_DIR", test_cache_dir()).current_dir(&dir).output().unwrap()
    };
    let o = limited("train --data text.txt --layers 8 --heads 8 --embd 512 --block 256 --batch 32 --threads 1 --out big");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_one_line_error(&o, "not enough memory");
    assert!(!dir.join("big/ckpt.safetensors").exists());
    // On a GPU (lavapipe's buffers are host memory, so the limit reaches them too): the
    // device's out-of-memory error, not wgpu's panic.
    let script =
        format!("ulimit -v 2500000 && exec {BIN} train --data text.txt --backend gpu --layers 6 --heads 8 --embd 512 --block 256 --batch 32 --out big");
    let o = Command::new("sh").args(["-c", &script]).env("ALPHA_CACHE_DIR", test_cache_dir()).current_dir(&dir).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ") && !l.contains("XDG_RUNTIME_DIR")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    // A real GPU's memory is not under the limit; there the driver may fail otherwise.
    if err.contains("llvmpipe") {
        assert!(errors[0].contains("is out of memory for this model"), "{err}");
    }
    // A text whose tokens do not fit: 300 MB of it under the limit.
    fs::write(dir.join("big.txt"), "ab\n".repeat(100_000_000)).unwrap();
    let o = limited("train --data big.txt --iters 1 --out big2");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("big.txt"), "{o:?}");
    assert_one_line_error(&o, "memory");
    fs::remove_file(dir.join("big.txt")).unwrap();
}

/// `--trace`, `--metrics` and `--out` never replace a file the user did not ask to replace.
#[test]
fn outputs_never_clobber_what_the_run_reads_or_other_files() {
    let dir = workdir("clobber");
    let ckpt = train(&dir, &["--iters", "2"]);
    let text = fs::read(dir.join("text.txt")).unwrap();
    let ckpt_bytes = fs::read(&ckpt).unwrap();
    fs::write(dir.join("mine.json"), "precious").unwrap();
    fs::create_dir(dir.join("adir")).unwrap();
    for (extra, needle) in [
        (&["--trace", "text.txt", "--out", "o"][..], "--trace text.txt is the same file as --data"),
        (&["--metrics", "text.txt", "--out", "o"], "--metrics text.txt is the same file as --data"),
        (&["--trace", "out/ckpt.safetensors", "--out", "out", "--overwrite"], "is the same file as the checkpoint"),
        (&["--metrics", "o/ckpt.safetensors", "--out", "o"], "is the same file as the checkpoint"),
        (&["--trace", "./t.json", "--metrics", "t.json", "--out", "o"], "--trace ./t.json is the same file as --metrics"),
        (&["--trace", "mine.json", "--out", "o"], "--trace mine.json already exists"),
        (&["--metrics", "mine.json", "--out", "o"], "--metrics mine.json already exists"),
        (&["--trace", "/dev/null", "--out", "o", "--overwrite"], "is not a regular file"),
        (&["--trace", "adir", "--out", "o", "--overwrite"], "is not a regular file"),
        (&["--metrics", "adir", "--out", "o", "--overwrite"], "--metrics adir is a directory"),
        (&["--out", "text.txt"], "--out text.txt exists and is not a directory"),
        (&["--resume", "out/ckpt.safetensors", "--trace", "out/ckpt.safetensors"], "is the same file as"),
    ] {
        assert_one_line_error(&run(&dir, &train_args(extra)), needle);
    }
    // The data named as the checkpoint's place.
    fs::create_dir(dir.join("d")).unwrap();
    fs::write(dir.join("d/ckpt.safetensors"), &text).unwrap();
    assert_one_line_error(&run(&dir, &["train", "--data", "d/ckpt.safetensors", "--out", "d", "--overwrite"]), "would replace --data");
    assert_eq!(fs::read(dir.join("text.txt")).unwrap(), text);
    assert_eq!(fs::read(&ckpt).unwrap(), ckpt_bytes);
    assert_eq!(fs::read_to_string(dir.join("mine.json")).unwrap(), "precious");
    assert!(dir.join("adir").is_dir());
    // bench's trace too.
    let bench = ["bench", "--data", "text.txt", "--iters", "1", "--warmup", "0", "--peak-gflops", "1"];
    assert_one_line_error(&run(&dir, &[&bench[..], TINY, &["--trace", "text.txt"]].concat()), "same file as --data");
    assert_one_line_error(&run(&dir, &[&bench[..], TINY, &["--trace", "mine.json"]].concat()), "already exists");
    assert_eq!(fs::read_to_string(dir.join("mine.json")).unwrap(), "precious");
    assert_ok(&run(&dir, &[&bench[..], TINY, &["--trace", "mine.json", "--overwrite"]].concat()));
    assert!(fs::read_to_string(dir.join("mine.json")).unwrap().contains("traceEvents"));
}

/// A new run refuses an existing metrics file unless --overwrite, which starts it anew; a
/// resumed run appends to it.
#[test]
fn metrics_are_started_anew_only_when_asked_and_appended_on_resume() {
    let dir = workdir("metrics-files");
    train(&dir, &["--iters", "2", "--log-interval", "1", "--metrics", "m.jsonl"]);
    let records = |p: &str| fs::read_to_string(dir.join(p)).unwrap().lines().count();
    assert_eq!(records("m.jsonl"), 4, "start + 2 train records + the final save");
    let again = train_args(&["--iters", "2", "--log-interval", "1", "--metrics", "m.jsonl", "--out", "o2"]);
    assert_one_line_error(&run(&dir, &again), "--metrics m.jsonl already exists");
    assert_eq!(records("m.jsonl"), 4);
    assert_ok(&run(&dir, &[&again[..], &["--overwrite"]].concat()));
    assert_eq!(records("m.jsonl"), 4, "--overwrite starts the file anew");
    let resume = ["train", "--resume", "o2/ckpt.safetensors", "--iters", "4", "--log-interval", "1", "--metrics", "m.jsonl"];
    assert_ok(&run(&dir, &[&resume[..], QUIET].concat()));
    assert_eq!(records("m.jsonl"), 8, "a resumed run appends its start, 2 train records and its save");
}

/// One run per output directory: a second run into a directory in use fails at once, naming
/// the process that holds it, with or without --overwrite; once the first is gone (killed
/// here, so the kernel released its lock), the directory is free.
#[test]
fn a_second_run_into_one_directory_fails_at_once() {
    let dir = workdir("lock");
    text_file(&dir);
    let long = train_args(&["--iters", "1000000", "--out", "out", "--log-interval", "1"]);
    let mut first = alpha_native().args(&long).current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut out = std::io::BufReader::new(first.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("step 1:") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "the first run ended early");
    }
    let pid = first.id().to_string();
    for extra in [&[][..], &["--overwrite"]] {
        let started = Instant::now();
        let o = run(&dir, &[&train_args(&["--iters", "2", "--out", "out"])[..], extra].concat());
        assert_one_line_error(&o, &format!("out is in use by process {pid}"));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    assert_ok(&run(&dir, &train_args(&["--iters", "2", "--out", "out", "--overwrite"])));
}

/// `--resume DIR/ckpt.safetensors` writes back to DIR (not `./out`), and more `--iters`
/// continue the step count and the learning-rate schedule of the saved run.
#[test]
fn resume_continues_in_the_checkpoints_directory_and_schedule() {
    let dir = workdir("resume-dir");
    train(&dir, &["--iters", "4", "--out", "runs/a", "--lr-decay-iters", "6", "--warmup", "2"]);
    let resume = ["train", "--resume", "runs/a/ckpt.safetensors", "--iters", "8", "--log-interval", "1", "--metrics", "r.jsonl"];
    let o = run(&dir, &[&resume[..], QUIET].concat());
    assert_ok(&o);
    assert!(stdout(&o).contains("checkpoint saved to runs/a/ckpt.safetensors"), "{}", stdout(&o));
    assert!(!dir.join("out").exists(), "a resumed run wrote to ./out");
    let state = checkpoint::load(&dir.join("runs/a/ckpt.safetensors")).unwrap().optimizer.unwrap().2;
    assert_eq!((state.step, state.settings.iters, state.settings.lr_decay_iters), (8, 8, 6));
    let lrs: Vec<(u64, f64)> = fs::read_to_string(dir.join("r.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["type"] == "train")
        .map(|r| (r["step"].as_u64().unwrap(), r["lr"].as_f64().unwrap()))
        .collect();
    let steps: Vec<u64> = lrs.iter().map(|s| s.0).collect();
    assert_eq!(steps, [4, 5, 6, 7]);
    // nanoGPT's schedule of the original run: cosine until step 6, then --min-lr.
    let schedule = alpha_core::optim::LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 2, decay_iters: 6 };
    for (step, lr) in lrs {
        assert!((lr - schedule.at(step)).abs() < 1e-12, "step {step}: lr {lr}, schedule {}", schedule.at(step));
    }
}

/// A resumed run keeps the run's own settings (save policy, keep, every interval, eval iters,
/// recompute, async checkpointing): `--save best` survives a resume that gives only --iters and
/// --lr, so a worse model never replaces the best checkpoint; a flag given on resume changes
/// its setting, and the run says which it changed.
#[test]
fn a_resume_keeps_the_runs_own_settings() {
    let dir = workdir("resume-settings");
    let first = ["--iters", "40", "--save", "best", "--keep", "1", "--eval-interval", "20", "--eval-iters", "2", "--log-interval", "7", "--recompute"];
    let ckpt = train(&dir, &first);
    let before = checkpoint::load(&ckpt).unwrap().optimizer.unwrap().2;
    let s = &before.settings;
    assert_eq!((s.save, s.keep, s.eval_interval, s.eval_iters, s.log_interval, s.recompute), (SavePolicy::Best, 1, 20, 2, 7, true));
    let best = before.best_val_loss.unwrap();
    // A learning rate that wrecks the model: no evaluation beats the best, nothing is saved.
    let o = run(&dir, &["train", "--resume", "out/ckpt.safetensors", "--iters", "80", "--lr", "0.5", "--threads", "2"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("the flags change the checkpoint's settings: --iters 80 (was 40), --lr 0.5 (was 0.001)"), "{out}");
    assert!(out.contains("step 60: train loss") && out.contains("step 80: train loss"), "the evaluations of the stored interval: {out}");
    let after = checkpoint::load(&ckpt).unwrap().optimizer.unwrap().2;
    assert!(after.best_val_loss.is_some_and(|b| b <= best), "the best checkpoint was replaced by a worse model: {:?} after {best}", after.best_val_loss);
    assert_eq!(after.settings.save, SavePolicy::Best);
    // A flag given on resume overrides the stored setting.
    let o = run(&dir, &["train", "--resume", "out/ckpt.safetensors", "--iters", "90", "--save", "always", "--eval-interval", "0", "--threads", "2"]);
    assert_ok(&o);
    assert!(stdout(&o).contains("--eval-interval 0 (was 20), --save always (was best)"), "{}", stdout(&o));
    let last = checkpoint::load(&ckpt).unwrap().optimizer.unwrap().2;
    assert_eq!((last.step, last.settings.save, last.settings.eval_interval, last.settings.log_interval), (90, SavePolicy::Always, 0, 7));
}

/// Sends `signal` (e.g. "TERM") to process `pid` (the shell's builtin kill: no procps needed).
fn signal(pid: u32, signal: &str) {
    assert!(Command::new("sh").args(["-c", &format!("kill -{signal} {pid}")]).status().unwrap().success());
}

/// Sends SIGTERM and then SIGINT to process `pid` back to back (one shell, two kills).
fn signal_twice(pid: u32) {
    assert!(Command::new("sh").args(["-c", &format!("kill -TERM {pid}; kill -INT {pid}")]).status().unwrap().success());
}

/// SIGTERM, as schedulers stop jobs, is Ctrl-C: the run saves at the end of its step and exits
/// 0, saying where. A second signal stops it at once (status 130): the temporary file of a
/// write in progress is removed and the run says which checkpoint is kept.
#[test]
fn sigterm_saves_the_run_and_a_second_signal_stops_it_at_once() {
    let dir = workdir("sigterm");
    text_file(&dir);
    // About a third of a second per step on one thread.
    let model = ["--layers", "2", "--heads", "2", "--embd", "128", "--block", "128", "--batch", "32", "--threads", "1"];
    let start = |args: &[&str]| alpha_native().args(args).current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = [&["train", "--data", "text.txt", "--out", "out", "--iters", "100000", "--log-interval", "1"][..], &model, QUIET].concat();
    first.extend(["--checkpoint-interval", "0"]);
    let child = start(&first);
    let lock = dir.join("out/train.lock");
    while !lock.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(1500));
    signal(child.id(), "TERM");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("stopping: the run saves at the end of this step"), "{o:?}");
    let out = stdout(&o);
    let step = checkpoint::load(&dir.join("out/ckpt.safetensors")).unwrap().optimizer.unwrap().2.step;
    assert!(step > 0 && out.contains(&format!("interrupted: checkpoint at step {step} saved to out/ckpt.safetensors")), "{out}");

    // Resumed, then stopped twice in one step, while (as far as it knows) a save is under way.
    let child = start(&["train", "--resume", "out/ckpt.safetensors", "--iters", "100000", "--threads", "1"]);
    std::thread::sleep(Duration::from_millis(1500));
    let temp = dir.join(format!("out/.ckpt.safetensors.tmp-{}", child.id()));
    fs::write(&temp, b"half a checkpoint").unwrap();
    // Two signals back to back, within the step in hand.
    signal_twice(child.id());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains(&format!("interrupted again: stopped at once; the last good checkpoint (out/ckpt.safetensors, step {step}) is kept")), "{err}");
    assert!(!temp.exists(), "the temporary file was left");
    assert_eq!(checkpoint::load(&dir.join("out/ckpt.safetensors")).unwrap().optimizer.unwrap().2.step, step);
}

/// SIGKILL at any moment leaves no stray temporary file once the next run in the directory
/// starts (the killed run's `.ckpt.safetensors.tmp-PID`).
#[test]
fn the_next_run_removes_what_a_killed_run_left() {
    let dir = workdir("stale");
    train(&dir, &["--iters", "2"]);
    for pid in ["1", "4194304"] {
        fs::write(dir.join(format!("out/.ckpt.safetensors.tmp-{pid}")), b"half a checkpoint").unwrap();
        fs::write(dir.join(format!("out/.run.toml.tmp-{pid}")), b"half a run file").unwrap();
    }
    assert_ok(&run(&dir, &["train", "--resume", "out/ckpt.safetensors", "--iters", "3", "--eval-interval", "0", "--sample-interval", "0"]));
    let mut left: Vec<String> = fs::read_dir(dir.join("out")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["ckpt.safetensors", "run.toml", "train.lock"]);
}

/// The numeric flags of every subcommand (`tokenizer bench` as ["tokenizer", "bench"]), read
/// from the command line's own definition: a flag added later is swept without a list to edit.
fn numeric_flags() -> Vec<(Vec<String>, Vec<String>)> {
    use std::any::TypeId;
    let numeric = [TypeId::of::<u8>(), TypeId::of::<u32>(), TypeId::of::<u64>(), TypeId::of::<usize>(), TypeId::of::<f64>()];
    fn leaves(path: Vec<String>, command: &clap::Command, out: &mut Vec<(Vec<String>, clap::Command)>) {
        if command.has_subcommands() {
            for sub in command.get_subcommands() {
                leaves([path.clone(), vec![sub.get_name().to_string()]].concat(), sub, out);
            }
        } else {
            out.push((path, command.clone()));
        }
    }
    let mut all = Vec::new();
    leaves(Vec::new(), &alpha_native::cli::command(), &mut all);
    all.into_iter()
        .map(|(path, command)| {
            let flags = command
                .get_arguments()
                .filter(|a| numeric.iter().any(|t| a.get_value_parser().type_id() == *t))
                .map(|a| format!("--{}", a.get_long().expect("numeric flags are long flags")))
                .collect();
            (path, flags)
        })
        .collect()
}

/// Every numeric flag of every subcommand (found from clap) with values past its range, past
/// its type, negative, not a number: a one-line error and a non-zero exit, or a valid run
/// (stopped after a few seconds if it would go on), never a panic or an abort.
#[test]
fn hostile_numbers_in_every_flag_are_one_line_errors() {
    let dir = workdir("flags");
    train(&dir, &["--iters", "1"]);
    let tokenizer = run(&dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "tok.json"]);
    assert_ok(&tokenizer);
    fs::write(dir.join("m.jsonl"), "{\"type\":\"train\",\"step\":0,\"loss\":4.2}\n").unwrap();
    let cache = dir.join("cache");
    // A valid command line of each subcommand, which the flag's value is appended to.
    let base = |path: &[String]| -> Vec<&'static str> {
        let tiny = |head: &[&'static str]| [head, TINY].concat();
        match path.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["train"] => tiny(&["train", "--data", "text.txt", "--out", "o", "--overwrite", "--iters", "2"]),
            ["bench"] => tiny(&["bench", "--data", "text.txt", "--iters", "1", "--warmup", "0"]),
            ["info"] => tiny(&["info", "--data", "text.txt", "--measure-steps", "1", "--peak-gflops", "1"]),
            ["sample"] => vec!["sample", "--checkpoint", "out/ckpt.safetensors", "--tokens", "5"],
            ["eval"] => vec!["eval", "--checkpoint", "out/ckpt.safetensors", "--text", "text.txt"],
            ["report"] => vec!["report", "--metrics", "m.jsonl", "--out", "r.html", "--overwrite"],
            ["export"] => vec!["export", "--checkpoint", "out/ckpt.safetensors", "--out", "hf", "--force"],
            ["prepare"] => vec!["prepare", "--data", "text.txt", "--tokenizer", "tok.json", "--out", "ds", "--force"],
            ["tokenizer", "train"] => vec!["tokenizer", "train", "--data", "text.txt", "--vocab-size", "280", "--out", "t2.json", "--force"],
            ["tokenizer", "encode"] => vec!["tokenizer", "encode", "--tokenizer", "tok.json", "--text", "text.txt"],
            ["tokenizer", "decode"] => vec!["tokenizer", "decode", "--tokenizer", "tok.json"],
            ["tokenizer", "info"] => vec!["tokenizer", "info", "--tokenizer", "tok.json"],
            ["tokenizer", "bench"] => vec!["tokenizer", "bench", "--tokenizer", "tok.json", "--text", "text.txt"],
            _ => panic!("subcommand {path:?} has no base command line in this test: add one"),
        }
    };
    let values = ["18446744073709551615", "18446744073709551616", "4294967296", "-1", "0", "1e400", "nan", "-inf", "x"];
    let mut swept = 0;
    for (path, flags) in numeric_flags() {
        let base = base(&path);
        for flag in &flags {
            swept += 1;
            for value in values {
                let mut args = base.clone();
                args.extend([flag.as_str(), value]);
                let mut child = alpha_native()
                    .args(&args)
                    .current_dir(&dir)
                    .env("ALPHA_CACHE_DIR", &cache)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let deadline = Instant::now() + Duration::from_secs(3);
                while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if child.try_wait().unwrap().is_none() {
                    // A valid value of a long run (e.g. --iters 2^64-1): stopped.
                    child.kill().unwrap();
                    child.wait().unwrap();
                    continue;
                }
                let o = child.wait_with_output().unwrap();
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(!err.contains("panicked") && o.status.code().is_some(), "{args:?}: {:?} {err}", o.status);
                if !o.status.success() {
                    assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1, "{args:?}: {err:?}");
                }
            }
        }
    }
    assert!(swept >= 40, "only {swept} numeric flags found");
    // The products of sizes are checked too: each within 2^24, together past any address space.
    let huge = ["--batch", "16777216", "--block", "1000", "--layers", "16777216", "--embd", "16777216", "--heads", "1"];
    for command in [&["train", "--out", "o"][..], &["bench"], &["info"]] {
        assert_one_line_error(&run(&dir, &[command, &["--data", "text.txt"], &huge].concat()), "more than this machine's address space holds");
    }
}

/// Off a terminal (CI, `| tee`) the run prints plain lines and no progress bar; on one the
/// bar fits the terminal's width. `script` gives the run a terminal of 60 columns.
#[test]
fn progress_fits_the_terminal_and_is_plain_lines_off_it() {
    let dir = workdir("progress");
    text_file(&dir);
    let o = run(&dir, &train_args(&["--iters", "40", "--log-interval", "10", "--out", "o"]));
    assert_ok(&o);
    let (out, err) = (stdout(&o), String::from_utf8_lossy(&o.stderr).into_owned());
    assert_eq!(out.lines().filter(|l| l.starts_with("step ") && l.contains("tok/s")).count(), 5, "{out}");
    assert!(!err.contains('\r') && !err.contains("loss"), "a bar was drawn off a terminal: {err:?}");
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("`script` (util-linux) is not installed: the terminal half of this test is skipped");
        return;
    }
    // Every step's line, loss, speed and ETA in a bar; slow enough steps that it redraws.
    let slow = train_args(&["--iters", "300", "--out", "o2", "--threads", "1"]).join(" ");
    let cmd = format!("stty cols 60 rows 20; {BIN} {slow}");
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).current_dir(&dir).output().unwrap();
    assert_ok(&o);
    let screen = String::from_utf8_lossy(&o.stdout);
    let visible = strip_ansi(&screen);
    assert!(visible.contains("/300 loss"), "no progress bar on a terminal: {visible:?}");
    // The bar's lines (other lines, such as the start line, wrap as any long log line does).
    for segment in visible.split(['\r', '\n']).filter(|s| s.contains("/300 loss")) {
        assert!(segment.chars().count() <= 60, "a bar of {} columns on a 60-column terminal: {segment:?}", segment.chars().count());
    }
}

/// The text of terminal output without its escape sequences (CSI `ESC [ ... letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// On a GPU, the adapters are listed once per process: Mesa's drivers print their
/// `XDG_RUNTIME_DIR` warning on each listing (twice per listing for lavapipe), so a run
/// shows it for one listing only.
#[test]
fn gpu_drivers_are_asked_once_per_run() {
    let dir = workdir("xdg");
    text_file(&dir);
    let args = train_args(&["--iters", "2", "--backend", "gpu", "--out", "o"]);
    let once = alpha_native()
        .args(["info", "--data", "text.txt", "--measure-steps", "0", "--peak-gflops", "1"])
        .current_dir(&dir)
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let per_listing = String::from_utf8_lossy(&once.stderr).matches("XDG_RUNTIME_DIR").count();
    let o = alpha_native().args(&args).current_dir(&dir).env_remove("XDG_RUNTIME_DIR").output().unwrap();
    assert_ok(&o);
    let warnings = String::from_utf8_lossy(&o.stderr).matches("XDG_RUNTIME_DIR").count();
    assert_eq!(warnings, per_listing, "{}", String::from_utf8_lossy(&o.stderr));
}
