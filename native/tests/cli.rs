//! End-to-end tests of the `alpha-native` binary: bad input, exact resume, Ctrl-C, divergence,
//! evaluation, sampling and metrics. Models are tiny so the whole file runs in seconds.

mod common;

use alpha_native::checkpoint;
use common::*;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn help_explains_every_flag_with_its_default() {
    let o = run(Path::new("."), &["train", "--help"]);
    assert_ok(&o);
    let help = stdout(&o);
    for flag in [
        "--data",
        "--out",
        "--iters",
        "--batch",
        "--block",
        "--layers",
        "--heads",
        "--embd",
        "--lr",
        "--min-lr",
        "--warmup",
        "--weight-decay",
        "--grad-clip",
        "--grad-accum",
        "--seed",
        "--eval-interval",
        "--eval-iters",
        "--sample-interval",
        "--checkpoint-interval",
        "--threads",
        "--resume",
        "--metrics",
    ] {
        assert!(help.contains(flag), "train --help lacks {flag}");
    }
    for default in ["[default: 2000]", "[default: 12]", "Default: 64, or 1024 with --model", "[default: 0.001]", "[default: 0.0001]", "[default: 0.99]"] {
        assert!(help.contains(default), "train --help lacks {default}");
    }
}

#[test]
fn bad_training_input_is_a_clear_error() {
    let dir = workdir("bad_train");
    let base = |extra: &[&str]| {
        let mut v = vec!["train", "--out", "out"];
        v.extend(TINY);
        v.extend(QUIET);
        v.extend(extra.iter().copied());
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let check = |extra: &[&str], needle: &str| {
        let args = base(extra);
        expect_error(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>(), needle);
    };
    fs::write(dir.join("empty.txt"), "").unwrap();
    fs::write(dir.join("short.txt"), "a short text, much too short for a block of 16.\n").unwrap();
    fs::write(dir.join("binary.txt"), b"valid start \xff\xfe then junk").unwrap();
    text_file(&dir);
    check(&["--data", "missing.txt"], "cannot read data file missing.txt");
    check(&["--data", "empty.txt"], "is empty");
    check(&["--data", "short.txt"], "is too short");
    check(&["--data", "binary.txt"], "not valid UTF-8 (invalid byte at offset 12)");
    check(&["--data", "text.txt", "--heads", "3"], "number of heads (3) must divide the embedding width (16)");
    check(&["--data", "text.txt", "--batch", "0"], "batch size must be at least 1");
    check(&["--data", "text.txt", "--layers", "0"], "n_layer must be at least 1");
    check(&["--data", "text.txt", "--embd", "0"], "n_embd must be at least 1");
    check(&["--data", "text.txt", "--block", "0"], "block_size must be at least 1");
    check(&["--data", "text.txt", "--iters", "0"], "--iters must be at least 1");
    check(&["--data", "text.txt", "--threads", "0"], "--threads must be at least 1");
    check(&["--data", "text.txt", "--threads", "5000"], "--threads 5000 is more than 1024");
    // Petabytes of activations: refused before any allocation (which would abort), and
    // before the output directory is made.
    check(&["--data", "text.txt", "--batch", "16000000", "--out", "never"], "of memory (model state");
    assert!(!dir.join("never").exists());
    check(&["--data", "text.txt", "--grad-accum", "0"], "--grad-accum must be at least 1");
    check(&["--data", "text.txt", "--lr=-1"], "--lr must be a positive number");
    // A negative number after a flag is its value, judged by the flag's range.
    check(&["--data", "text.txt", "--lr", "-1"], "--lr must be a positive number, got -1");
    check(&["--data", "text.txt", "--beta2", "1"], "--beta1 and --beta2 must be below 1");
    check(&["--data", "text.txt", "--dropout", "1"], "--dropout must be at least 0 and below 1");
    check(&["--data", "text.txt", "--resume", "missing.safetensors"], "cannot read checkpoint missing.safetensors");
}

/// A command line missing required arguments names them, on one line (status 2).
#[test]
fn missing_arguments_are_named() {
    let dir = workdir("missing-args");
    for (args, names) in [
        (&["sample"][..], "--checkpoint <FILE|DIR|NAME>"),
        (&["eval", "--checkpoint", "x"], "--text <FILE>"),
        (&["report", "--out", "x"], "--metrics <FILE>"),
        (&["prepare", "--data", "x"], "--tokenizer <PATH>, --out <DIR>"),
    ] {
        let o = run(&dir, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.trim_end().lines().count() == 1 && err.contains(&format!("not provided: {names} (see --help)")), "{args:?}: {err:?}");
    }
}

#[test]
fn bad_checkpoints_and_texts_are_clear_errors() {
    let dir = workdir("bad_ckpt");
    let ckpt = train(&dir, &["--iters", "2"]);
    let bytes = fs::read(&ckpt).unwrap();
    let v = checkpoint::load(&ckpt).unwrap().config.vocab_size;
    fs::write(dir.join("truncated.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    fs::write(dir.join("garbage.safetensors"), b"this is not a checkpoint at all, just some text").unwrap();
    // Header lies: a tensor claims a bigger shape than its byte range holds.
    fs::write(dir.join("shape_lie.safetensors"), edit_header(&bytes, &format!("[{v},16]"), &format!("[{v},17]"))).unwrap();
    // Header lies: the config claims a width that the tensors do not have.
    fs::write(dir.join("config_lie.safetensors"), edit_header(&bytes, r#"\"n_embd\":16"#, r#"\"n_embd\":32"#)).unwrap();
    let (vocab, vocab_plus) = (format!(r#"\"vocab_size\":{v}"#), format!(r#"\"vocab_size\":{}"#, v - 1));
    fs::write(dir.join("vocab_lie.safetensors"), edit_header(&bytes, &vocab, &vocab_plus)).unwrap();
    fs::write(dir.join("unknown.txt"), "To be, or not to be: that is the question.\nWhither 日本?\n").unwrap();
    for (file, needle) in [
        ("truncated.safetensors", "not a valid Alpha checkpoint".to_string()),
        ("garbage.safetensors", "not a valid Alpha checkpoint".into()),
        ("shape_lie.safetensors", "not a valid Alpha checkpoint".into()),
        ("config_lie.safetensors", format!("expected F32 [{v}, 32]")),
        ("vocab_lie.safetensors", format!("the tokenizer has {v} tokens but vocab_size is only {}", v - 1)),
        ("missing.safetensors", "cannot read checkpoint missing.safetensors".into()),
    ] {
        expect_error(&dir, &["sample", "--checkpoint", file], &needle);
        expect_error(&dir, &["eval", "--checkpoint", file, "--text", "text.txt"], &needle);
    }
    let c = "out/ckpt.safetensors";
    expect_error(&dir, &["sample", "--checkpoint", c, "--prompt", "Whither 日本"], "character '日' (U+65E5) at line 1, column 9");
    expect_error(&dir, &["eval", "--checkpoint", c, "--text", "unknown.txt"], "character '日' (U+65E5) at line 2, column 9");
    expect_error(&dir, &["sample", "--checkpoint", c, "--block", "17"], "--block 17 is larger than the checkpoint's block size 16");
    expect_error(&dir, &["eval", "--checkpoint", c, "--text", "text.txt", "--block", "99"], "larger than the checkpoint's block size 16");
    expect_error(&dir, &["eval", "--checkpoint", c, "--text", "missing.txt"], "cannot read text file missing.txt");
    let resume = ["train", "--data", "text.txt", "--out", "out", "--resume", c, "--block", "32"];
    expect_error(&dir, &resume, "--block 32 is larger than the checkpoint's block size 16");
    expect_error(&dir, &["sample", "--checkpoint", c, "--temperature=-1"], "--temperature must be a non-negative number");
}

/// N+M steps in one run equal N steps, save, resume, M steps: loss for loss, bit for bit,
/// and the final checkpoints hold identical tensors. With dropout, which the checkpoint keeps
/// and whose masks the resumed run draws as the whole run did.
/// A build without MPI launched as several MPI processes (mpirun sets the world size in the
/// environment) says how to build one with it instead of training N copies into one place.
#[cfg(not(feature = "mpi"))]
#[test]
fn ranks_need_a_build_with_mpi() {
    let dir = workdir("no-mpi");
    text_file(&dir);
    let o = alpha_native().args(["train", "--data", "text.txt", "--iters", "1"]).env("OMPI_COMM_WORLD_SIZE", "2").current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end(), "error: launched as one of 2 MPI processes, but this alpha-native was built without MPI: build it with `cargo build --release -p alpha-native --features mpi`");
    assert!(!dir.join("out").exists());
}

#[test]
fn resume_is_exact() {
    let dir = workdir("resume");
    let common = ["--iters", "12", "--lr-decay-iters", "12", "--warmup", "3", "--log-interval", "1", "--eval-interval", "4", "--dropout", "0.1"];
    train(&dir, &[&common[..], &["--out", "whole", "--metrics", "whole.jsonl"]].concat());
    let whole = dir.join("whole/ckpt.safetensors");
    let mut first = common.to_vec();
    first[1] = "7";
    train(&dir, &[&first[..], &["--out", "split", "--metrics", "split.jsonl"]].concat());
    let c = dir.join("split/ckpt.safetensors");
    let state = checkpoint::load(&c).unwrap().optimizer.unwrap().2;
    assert_eq!(state.step, 7);
    let args = ["train", "--resume", "split/ckpt.safetensors", "--out", "split", "--iters", "12", "--threads", "2", "--metrics", "split.jsonl"];
    assert_ok(&run(&dir, &[&args[..], QUIET, &["--log-interval", "1"]].concat()));

    let (a, b) = (train_losses(&dir.join("whole.jsonl")), train_losses(&dir.join("split.jsonl")));
    assert_eq!(a.len(), 12);
    assert_eq!(a, b, "per-step losses differ between the whole run and the resumed one");
    let (x, y) = (checkpoint::load(&whole).unwrap(), checkpoint::load(&c).unwrap());
    assert_eq!(x.params, y.params);
    let ((xm, xv, xs), (ym, yv, ys)) = (x.optimizer.unwrap(), y.optimizer.unwrap());
    assert_eq!((xm, xv, xs.step, xs.rng_state), (ym, yv, ys.step, ys.rng_state));
}

/// `--recompute` changes memory, not results: the same losses and checkpoint bit for bit
/// (with gradient accumulation and evaluation), and `info` reports the smaller activations and
/// the larger batch that fits.
#[test]
fn recompute_keeps_the_run_and_shrinks_the_activations() {
    let dir = workdir("recompute");
    let common = ["--iters", "6", "--layers", "3", "--grad-accum", "2", "--log-interval", "1", "--eval-interval", "3"];
    train(&dir, &[&common[..], &["--out", "plain", "--metrics", "plain.jsonl"]].concat());
    train(&dir, &[&common[..], &["--out", "recomputed", "--metrics", "recomputed.jsonl", "--recompute"]].concat());
    let (a, b) = (train_losses(&dir.join("plain.jsonl")), train_losses(&dir.join("recomputed.jsonl")));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b, "--recompute changed the losses");
    let (x, y) = (checkpoint::load(&dir.join("plain/ckpt.safetensors")).unwrap(), checkpoint::load(&dir.join("recomputed/ckpt.safetensors")).unwrap());
    assert_eq!((x.params, x.optimizer.unwrap().0), (y.params, y.optimizer.unwrap().0));
    // The metrics' HFU counts the recomputed forward (each block's: 2 x its parameters + 4 x T x C
    // per token), MFU does not.
    let records: Vec<serde_json::Value> = fs::read_to_string(dir.join("recomputed.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (model, hardware) = (records[0]["flops_per_token"].as_f64().unwrap(), records[0]["hardware_flops_per_token"].as_f64().unwrap());
    let (c, t, layers, tables) = (16.0, 16.0, 3.0, (64.0 + 16.0 + 2.0) * 16.0);
    assert_eq!(hardware - model, 2.0 * (records[0]["params"].as_f64().unwrap() - tables) + 4.0 * layers * t * c);
    let step = records.iter().find(|r| r["type"] == "train").unwrap();
    assert!((step["hfu"].as_f64().unwrap() / step["mfu"].as_f64().unwrap() - hardware / model).abs() < 1e-9, "{step}");
    let info = |extra: &[&str]| {
        let args = [&["info", "--data", "text.txt", "--json", "--measure-steps", "0", "--layers", "6", "--peak-gflops", "1"], extra].concat();
        json_of(&run(&dir, &args))
    };
    let (plain, recomputed) = (info(&[]), info(&["--recompute"]));
    let acts = |r: &serde_json::Value| r["memory_mib"]["activations"].as_f64().unwrap();
    assert!(acts(&recomputed) < 0.5 * acts(&plain), "{} vs {} MiB", acts(&recomputed), acts(&plain));
    assert_eq!((plain["recompute"].as_bool(), recomputed["recompute"].as_bool()), (Some(false), Some(true)));
    let largest = &plain["largest_batch"];
    let (without, with) = (largest["without_recompute"].as_u64().unwrap(), largest["with_recompute"].as_u64().unwrap());
    assert!(without >= 1 && with > without, "{largest}");
}

/// `--config`: a preset or a run file sets the flags, the command line overrides them, and the
/// resolved run file written beside the checkpoint repeats the run bit for bit.
#[test]
fn run_files_set_flags_and_the_resolved_one_repeats_the_run() {
    let dir = workdir("runfile");
    text_file(&dir);
    let start = |metrics: &str| {
        let first = fs::read_to_string(dir.join(metrics)).unwrap().lines().next().unwrap().to_string();
        serde_json::from_str::<serde_json::Value>(&first).unwrap()
    };
    let base = ["train", "--data", "text.txt", "--iters", "4", "--log-interval", "1", "--eval-interval", "2", "--threads", "2"];
    // The tiny preset, with --lr given on the command line over the preset's 3e-3.
    assert_ok(&run(&dir, &[&base[..], &["--config", "tiny", "--lr", "2e-3", "--out", "a", "--metrics", "a.jsonl"]].concat()));
    let a = start("a.jsonl");
    assert_eq!((a["config"]["n_layer"].as_u64(), a["config"]["n_embd"].as_u64(), a["settings"]["batch"].as_u64()), (Some(2), Some(32), Some(8)));
    assert_eq!((a["settings"]["lr"].as_f64(), a["settings"]["warmup"].as_u64()), (Some(2e-3), Some(10)));
    let resolved = fs::read_to_string(dir.join("a/run.toml")).unwrap();
    assert!(resolved.contains("lr = 0.002\n") && resolved.contains("layers = 2\n") && resolved.contains("data = \"text.txt\""), "{resolved}");
    // The resolved file alone repeats the run: the same records and checkpoint.
    assert_ok(&run(&dir, &["train", "--config", "a/run.toml", "--out", "b", "--metrics", "b.jsonl", "--threads", "2"]));
    assert_eq!(train_losses(&dir.join("a.jsonl")), train_losses(&dir.join("b.jsonl")));
    assert_eq!(fs::read(dir.join("a/ckpt.safetensors")).unwrap(), fs::read(dir.join("b/ckpt.safetensors")).unwrap());
    assert_eq!(fs::read_to_string(dir.join("b/run.toml")).unwrap(), resolved);
    // A hand-written file.
    fs::write(dir.join("mine.toml"), "# mine\nlayers = 1\nembd = 16\nheads = 2\nblock = 16\nbatch = 4\niters = 2\nrecompute = true\n").unwrap();
    assert_ok(&run(&dir, &["train", "--data", "text.txt", "--config", "mine.toml", "--out", "c", "--metrics", "c.jsonl"]));
    assert_eq!(start("c.jsonl")["config"]["n_layer"].as_u64(), Some(1));
    assert!(fs::read_to_string(dir.join("c/run.toml")).unwrap().contains("recompute = true"));
    // Bad run files: one line, exit status 2, nothing written.
    for (text, needle) in [
        ("lrr = 1", "`lrr` is not a flag of alpha-native train"),
        ("lr = [1]", "`lr` must be a number or a string, not array"),
        ("recompute = 1", "`recompute` must be true or false"),
        ("lr = ", "bad.toml: "),
    ] {
        fs::write(dir.join("bad.toml"), text).unwrap();
        let o = run(&dir, &["train", "--data", "text.txt", "--config", "bad.toml", "--out", "bad"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{text}: {err}");
        assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1 && err.contains(needle), "{text}: {err}");
        assert!(!dir.join("bad").exists());
    }
    for (args, needle) in [
        (&["--config", "mine.toml", "--lr", "x"][..], "invalid value 'x' for '--lr <LR>'"),
        (&["--config", "nope"], "no such file, nor a preset (tiny, small, llama, shakespeare_char, baby)"),
    ] {
        let o = run(&dir, &[&["train", "--data", "text.txt"], args].concat());
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains(needle), "{args:?}");
    }
    // The resolved file never replaces the run file read, nor a file of another run.
    expect_error(&dir, &["train", "--config", "a/run.toml", "--out", "a", "--overwrite"], "a/run.toml would replace --config");
    fs::remove_file(dir.join("b/ckpt.safetensors")).unwrap();
    fs::write(dir.join("b/run.toml"), "# a user's notes\n").unwrap();
    expect_error(&dir, &["train", "--data", "text.txt", "--config", "tiny", "--out", "b"], "b/run.toml exists and is not a run file alpha-native wrote");
    assert_eq!(fs::read_to_string(dir.join("b/run.toml")).unwrap(), "# a user's notes\n");
    // A run that saved no checkpoint leaves its own run file, which the next run replaces.
    fs::write(dir.join("b/run.toml"), &resolved).unwrap();
    assert_ok(&run(&dir, &["train", "--data", "text.txt", "--config", "tiny", "--iters", "1", "--out", "b"]));
}

#[test]
fn ctrl_c_saves_a_checkpoint_and_exits_zero() {
    let dir = workdir("sigint");
    text_file(&dir);
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--iters", "100000", "--log-interval", "1"];
    args.extend(TINY);
    args.extend(QUIET);
    let mut child = alpha_native().args(&args).current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait until training is under way.
    for line in lines.by_ref() {
        if line.unwrap().starts_with("step 3:") {
            break;
        }
    }
    // The shell's builtin kill: no procps needed.
    let kill = Command::new("sh").args(["-c", &format!("kill -INT {}", child.id())]).status().unwrap();
    assert!(kill.success());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
    let msg = rest.iter().find(|l| l.starts_with("interrupted")).expect("an 'interrupted' line");
    assert!(msg.contains("out/ckpt.safetensors"), "{msg}");
    let state = checkpoint::load(&dir.join("out/ckpt.safetensors")).unwrap().optimizer.unwrap().2;
    assert!(state.step >= 4 && state.step < 100_000, "saved at step {}", state.step);
    // The saved run continues.
    let resume = ["train", "--resume", "out/ckpt.safetensors", "--out", "out", "--iters", &(state.step + 2).to_string()];
    assert_ok(&run(&dir, &[&resume[..], QUIET].concat()));
}

/// A diverging run stops with the step and keeps the last good checkpoint. The GPU finds it
/// at the next read of its statistics (here the checkpoint after the bad step).
#[test]
fn divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint() {
    for (backend, message) in
        [("cpu", "training diverged at step 1: loss is NaN"), ("gpu", "training diverged at step 1: the loss or gradient norm was not finite")]
    {
        let dir = workdir(&format!("nan-{backend}"));
        text_file(&dir);
        let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--lr", "1e30", "--warmup", "0", "--checkpoint-interval", "1", "--backend", backend];
        args.extend(TINY);
        args.extend(QUIET);
        let o = run(&dir, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(message), "{err}");
        assert!(err.contains("the last good checkpoint (out/ckpt.safetensors, step 1) is kept"), "{err}");
        let ck = checkpoint::load(&dir.join("out/ckpt.safetensors")).unwrap();
        assert!(ck.params.iter().all(|p| p.is_finite()));
        assert_eq!(ck.optimizer.unwrap().2.step, 1);
    }
}

#[test]
fn an_existing_checkpoint_is_never_overwritten_by_a_new_run() {
    let dir = workdir("overwrite");
    let ckpt = train(&dir, &["--iters", "2"]);
    let before = fs::read(&ckpt).unwrap();
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--iters", "3"];
    args.extend(TINY);
    expect_error(&dir, &args, "out/ckpt.safetensors already exists");
    assert_eq!(fs::read(&ckpt).unwrap(), before);
    args.push("--overwrite");
    args.extend(QUIET);
    assert_ok(&run(&dir, &args));
    assert_eq!(checkpoint::load(&ckpt).unwrap().optimizer.unwrap().2.step, 3);
}

#[test]
fn eval_is_deterministic_and_counts_windows() {
    let dir = workdir("eval");
    train(&dir, &["--iters", "5"]);
    let eval = |extra: &[&str]| {
        let o = run(&dir, &[&["eval", "--checkpoint", "out/ckpt.safetensors", "--text", "text.txt"][..], extra].concat());
        assert_ok(&o);
        serde_json::from_str::<serde_json::Value>(stdout(&o).trim()).unwrap()
    };
    let a = eval(&["--threads", "1", "--batch", "16"]);
    let b = eval(&["--threads", "2", "--batch", "3"]);
    assert_eq!(a, b);
    let windows = (20_000 - 1) / 16;
    assert_eq!(a["windows"], windows);
    assert_eq!(a["tokens"], windows * 16);
    let loss = a["loss"].as_f64().unwrap();
    assert!(loss > 0.5 && loss < (65f64).ln() + 0.5, "loss {loss}");
    let short = eval(&["--block", "8"]);
    assert_eq!(short["windows"], (20_000 - 1) / 8);
}

#[test]
fn sample_continues_the_prompt_deterministically() {
    let dir = workdir("sample");
    train(&dir, &["--iters", "5"]);
    let sample = |checkpoint: &str, seed: &str| {
        let o = run(&dir, &["sample", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--tokens", "40", "--seed", seed]);
        assert_ok(&o);
        stdout(&o)
    };
    let (a, b, c) = (sample("out/ckpt.safetensors", "1"), sample("out/ckpt.safetensors", "1"), sample("out/ckpt.safetensors", "2"));
    assert!(a.starts_with("ROMEO:"));
    assert_eq!(a.trim_end_matches('\n').chars().count() + 1, "ROMEO:".len() + 40 + 1 - a.ends_with("\n\n") as usize);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // The run's directory stands for its checkpoint.
    assert_eq!(sample("out", "1"), a);
}

#[test]
fn metrics_hold_one_record_per_logged_step_with_timings() {
    let dir = workdir("metrics");
    train(&dir, &["--iters", "6", "--log-interval", "2", "--eval-interval", "3", "--eval-iters", "2", "--metrics", "m.jsonl"]);
    let records: Vec<serde_json::Value> = fs::read_to_string(dir.join("m.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |t: &str| records.iter().filter(|r| r["type"] == t).collect::<Vec<_>>();
    assert_eq!(of("start").len(), 1);
    // The start record says where and how the run trains.
    let start = of("start")[0];
    assert_eq!((start["backend"].as_str(), start["precision"].as_str(), start["ranks"].as_u64()), (Some("cpu"), Some("f32"), Some(1)));
    assert_eq!(start["machine"]["threads"], 2);
    assert!(start["machine"]["cpu"].is_string() && start["machine"]["gemm_kernel"].is_string(), "{start}");
    assert!(start["memory_mib"]["total"].as_f64().unwrap() > start["memory_mib"]["params"].as_f64().unwrap() * 4.0, "{start}");
    assert!(start["peak_gflops"].as_f64().unwrap() > 0.0 && start["flops_per_token"] == start["hardware_flops_per_token"], "{start}");
    let steps: Vec<u64> = of("train").iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [0, 2, 4, 5]);
    // The evaluations at steps 0 and 3 fall into the windows logged at steps 0 and 4.
    let eval_ms: Vec<f64> = of("train").iter().map(|r| r["ms"]["eval"].as_f64().unwrap()).collect();
    assert!(eval_ms[0] > 0.0 && eval_ms[1] == 0.0 && eval_ms[2] > 0.0 && eval_ms[3] == 0.0, "{eval_ms:?}");
    for r in of("train") {
        for key in ["loss", "lr", "grad_norm", "tokens_per_sec", "ms_per_step", "mfu"] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key} in {r}");
        }
        let mfu = start["flops_per_token"].as_f64().unwrap() * r["tokens_per_sec"].as_f64().unwrap() / 1e9 / start["peak_gflops"].as_f64().unwrap();
        assert!((r["mfu"].as_f64().unwrap() - mfu).abs() <= 1e-9 * mfu && r["hfu"] == r["mfu"], "{r}");
        let ms = &r["ms"];
        let phases = ["data", "forward", "backward", "allreduce", "grad_norm", "optimizer", "eval", "sample", "checkpoint", "submit", "device_wait", "idle"];
        assert_eq!(ms.as_object().unwrap().len(), phases.len(), "{ms}");
        for k in phases {
            assert!(ms[k].as_f64().unwrap() >= 0.0, "{k} in {ms}");
        }
        for k in ["forward", "backward", "optimizer"] {
            assert!(ms[k].as_f64().unwrap() > 0.0, "{k} in {ms}");
        }
        let parts: f64 = phases.iter().map(|k| ms[k].as_f64().unwrap()).sum();
        let total = r["ms_per_step"].as_f64().unwrap();
        assert!((parts - total).abs() <= 0.05 * total, "phases add to {parts} ms, the step took {total} ms");
    }
    let evals: Vec<u64> = of("eval").iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(evals, [0, 3, 6]);
}

#[test]
fn bench_json_is_complete_and_consistent() {
    let dir = workdir("bench");
    text_file(&dir);
    let mut args = vec!["bench", "--data", "text.txt", "--iters", "6", "--warmup", "1", "--peak-gflops", "50", "--json"];
    args.extend(TINY);
    let r = json_of(&run(&dir, &args));
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    let ms = &r["ms_per_iter"];
    let (median, mean, min, max) = (f(&ms["median"]), f(&ms["mean"]), f(&ms["min"]), f(&ms["max"]));
    assert!(0.0 < min && min <= median && median <= max && min <= mean && mean <= max, "{ms}");
    // Every timed step, in order: the summary is theirs.
    let steps: Vec<f64> = r["step_ms"].as_array().unwrap().iter().map(f).collect();
    assert_eq!(steps.len(), 6);
    assert!((steps.iter().sum::<f64>() / 6.0 - mean).abs() < 1e-9 && steps.iter().all(|&s| min <= s && s <= max), "{steps:?}");
    assert_eq!(steps.iter().copied().fold(f64::INFINITY, f64::min), min);
    assert_eq!(r["tokens_per_step"], 4 * 16);
    assert!((f(&r["tokens_per_sec"]) * median / 1e3 - 64.0).abs() < 1e-6);
    let phases = r["phases_ms"].as_object().unwrap();
    let sum: f64 = phases.values().map(f).sum();
    assert!((sum - mean).abs() <= 0.05 * mean, "phases add to {sum} ms, mean step {mean} ms");
    assert!(f(&phases["forward"]) > 0.0 && f(&phases["backward"]) > 0.0 && f(&phases["optimizer"]) > 0.0);
    let params = r["params"].as_u64().unwrap();
    let v = r["config"]["vocab_size"].as_u64().unwrap();
    // wte + wpe + one block (12C² + 13C) + ln_f, with C = 16, block 16.
    assert_eq!(params, v * 16 + 16 * 16 + 12 * 256 + 13 * 16 + 2 * 16);
    // 6 per parameter but wpe's (looked up, not multiplied) and attention's 12 · L · T · C.
    assert_eq!(f(&r["flops_per_token"]), 6.0 * (params - 16 * 16) as f64 + 12.0 * 16.0 * 16.0);
    assert!((f(&r["achieved_gflops"]) - f(&r["flops_per_token"]) * f(&r["tokens_per_sec"]) / 1e9).abs() < 1e-9);
    assert_eq!((f(&r["peak_gflops"]), r["peak_source"].as_str()), (50.0, Some("given")));
    assert!((f(&r["mfu"]) - f(&r["achieved_gflops"]) / 50.0).abs() < 1e-12);
    expect_error(&dir, &["bench", "--data", "text.txt", "--peak-gflops=-3"], "--peak-gflops must be a positive number");
    args.push("--no-phases");
    let r = json_of(&run(&dir, &args));
    assert!(r["phases_ms"].is_null(), "{r}");
    assert!(f(&r["ms_per_iter"]["median"]) > 0.0 && f(&r["tokens_per_sec"]) > 0.0, "{r}");
}

/// The GPU backend (lavapipe in CI): one submit per step of a known number of kernels
/// (15 outside the blocks + 32 per block: forward 7, backward 25).
#[test]
fn bench_runs_on_the_gpu() {
    let dir = workdir("bench-gpu");
    text_file(&dir);
    let mut args = vec!["bench", "--backend", "gpu", "--data", "text.txt", "--iters", "3", "--warmup", "1", "--json"];
    args.extend(TINY);
    let r = json_of(&run(&dir, &args));
    assert_eq!(r["backend"], "gpu");
    assert_eq!(r["device"]["kernels_per_step"], 15 + 32);
    assert_eq!(r["device"]["submits_per_step"], 1);
    assert!(r["device"]["device_memory_mib"].as_f64().unwrap() > 0.0 && r["tokens_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    // MFU against the GPU's measured f32 FMA limit.
    assert!(["measured", "cached"].contains(&r["peak_source"].as_str().unwrap()) && r["mfu"].as_f64().unwrap() > 0.0, "{r}");
    // Host time: submitting, then waiting for the step and its loss; nothing else.
    let ms = &r["phases_ms"];
    let part = |k: &str| ms[k].as_f64().unwrap();
    assert!(part("submit") > 0.0 && part("device_wait") > 0.0 && part("forward") == 0.0, "{ms}");
    let sum: f64 = ms.as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
    let mean = r["ms_per_iter"]["mean"].as_f64().unwrap();
    assert!((sum - mean).abs() <= 0.05 * mean, "phases add to {sum} ms, mean step {mean} ms");
    expect_error(&dir, &["bench", "--backend", "gpu", "--data", "text.txt", "--adapter", "no-such-gpu"], "no adapter matches --adapter no-such-gpu");
    expect_error(&dir, &["bench", "--data", "text.txt", "--adapter", "0"], "--adapter selects a GPU; add --backend gpu");
    assert_eq!(r["precision"], "f32");
    expect_error(&dir, &["bench", "--data", "text.txt", "--precision", "f16"], "--precision f16 runs on a GPU; add --backend gpu");
    expect_error(&dir, &["bench", "--backend", "gpu", "--data", "text.txt", "--tensor-cores"], "--tensor-cores runs the products in f16: add --precision f16");
    // f16 products (lavapipe has shader-f16), on the tensor cores where the adapter has them
    // (--tensor-cores auto, the default), else on the SIMT kernels; off: never.
    args.extend(["--precision", "f16"]);
    let tensor = json_of(&run(&dir, &["info", "--backend", "gpu", "--json", "--measure-steps", "0"]))["gpu_adapters"][0]["no_tensor_cores"].is_null();
    assert_eq!(json_of(&run(&dir, &args))["precision"], if tensor { "f16 (tensor cores)" } else { "f16" });
    let off: Vec<&str> = args.iter().copied().chain(["--tensor-cores", "off"]).collect();
    assert_eq!(json_of(&run(&dir, &off))["precision"], "f16");
    // --tensor-cores (on): a one-line error naming what the adapter lacks (lavapipe:
    // cooperative matrices), or where it has them a run that says so.
    expect_error(&dir, &["bench", "--data", "text.txt", "--tensor-cores"], "--tensor-cores runs products on a GPU; add --backend gpu");
    args.push("--tensor-cores");
    let o = run(&dir, &args);
    if o.status.success() {
        assert_eq!(json_of(&o)["precision"], "f16 (tensor cores)");
    } else {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.code() == Some(1) && err.starts_with("error: --tensor-cores: ") && err.contains(" lacks ") && err.lines().count() == 1, "{err}");
    }
}

/// `--precision bf16` on the CPU (bf16 products, f32 everything else): 20 steps within 2e-2 of
/// f32's loss at every step, the run saying so, bench and eval in bf16; on a CPU without
/// AVX512-BF16 (masked here where it has one) a one-line error naming it.
#[test]
fn bf16_products_on_the_cpu_follow_f32_and_a_cpu_without_them_says_so() {
    let dir = workdir("cpu-bf16");
    text_file(&dir);
    let losses = |precision: &str| {
        let metrics = format!("{precision}.jsonl");
        let mut args =
            vec!["train", "--data", "text.txt", "--out", precision, "--iters", "20", "--log-interval", "1", "--metrics", &metrics, "--precision", precision];
        args.extend(TINY);
        args.extend(QUIET);
        let o = run(&dir, &args);
        assert_ok(&o);
        if precision == "bf16" {
            assert!(stdout(&o).contains("precision: bf16 products"), "{}", stdout(&o));
        }
        train_losses(&dir.join(&metrics)).into_iter().map(|(_, l)| l.parse::<f64>().unwrap()).collect::<Vec<f64>>()
    };
    let has_bf16 = json_of(&run(&dir, &["info", "--json", "--measure-steps", "0", "--peak-gflops", "1"]))["bf16_kernel"].is_string();
    if has_bf16 {
        let (f32s, bf16s) = (losses("f32"), losses("bf16"));
        assert_eq!((f32s.len(), bf16s.len()), (20, 20));
        for (i, (a, b)) in f32s.iter().zip(&bf16s).enumerate() {
            assert!((a - b).abs() <= 2e-2 * a, "step {i}: f32 {a}, bf16 {b}");
        }
        assert_ne!(f32s, bf16s, "the bf16 run rounded nothing");
        let mut args = vec!["bench", "--json", "--iters", "2", "--warmup", "1", "--precision", "bf16", "--peak-gflops", "50"];
        args.extend(TINY);
        let bench = json_of(&run(&dir, &args));
        assert_eq!(bench["precision"], "bf16", "{bench}");
        // eval takes the same products: its loss a little off f32's, not f32's to the bit.
        let eval =
            |precision: &str| json_of(&run(&dir, &["eval", "--checkpoint", "f32", "--text", "text.txt", "--precision", precision]))["loss"].as_f64().unwrap();
        let (f32_loss, bf16_loss) = (eval("f32"), eval("bf16"));
        assert!(f32_loss != bf16_loss && (f32_loss - bf16_loss).abs() < 1e-2 * f32_loss, "eval: f32 {f32_loss}, bf16 {bf16_loss}");
    } else {
        println!("bf16 products untested: this CPU has no AVX512-BF16");
    }
    let mut args = vec!["train", "--data", "text.txt", "--iters", "1", "--precision", "bf16"];
    args.extend(TINY);
    let o = alpha_native().args(&args).env("ALPHA_CPU_MASK", "avx512bf16").current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: ") && err.contains("needs AVX512-BF16") && err.trim_end().lines().count() == 1, "{err}");
}

/// ALPHA_CPU_MASK runs the kernels as on a CPU without the features it names: info's GEMM
/// kernel, bf16 peak and SIMD list follow it, and a name it cannot mask is a one-line error.
#[test]
fn the_cpu_mask_narrows_the_kernels_and_a_misspelt_one_is_an_error() {
    let dir = workdir("cpu-mask");
    let info = |mask: &str| {
        let o = alpha_native()
            .args(["info", "--json", "--measure-steps", "0", "--peak-gflops", "1"])
            .env("ALPHA_CPU_MASK", mask)
            .current_dir(&dir)
            .output()
            .unwrap();
        json_of(&o)
    };
    let all = info("");
    if all["gemm_kernel"] == "avx512" {
        let masked = info("avx512f");
        assert_eq!(masked["gemm_kernel"], "avx2+fma");
        let simd = |r: &serde_json::Value| r["simd"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect::<Vec<_>>();
        assert!(simd(&all).contains(&"avx512f".into()) && !simd(&masked).contains(&"avx512f".into()), "{all} {masked}");
    } else {
        println!("the AVX-512 mask untested: the GEMM kernel here is {}", all["gemm_kernel"]);
    }
    if all["bf16_kernel"] == "avx512-bf16" {
        assert!(all["peak_bf16_gflops"].as_f64().unwrap() > 0.0, "{all}");
        let masked = info("avx512bf16");
        assert!(masked["bf16_kernel"].is_null() && masked["peak_bf16_gflops"].is_null(), "{masked}");
        assert_eq!(masked["gemm_kernel"], all["gemm_kernel"]);
    } else {
        assert!(all["peak_bf16_gflops"].is_null(), "{all}");
        println!("the bf16 mask untested: this CPU has no AVX512-BF16");
    }
    let o = alpha_native().args(["info", "--measure-steps", "0"]).env("ALPHA_CPU_MASK", "avx512f,avx512_bf16").current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: ALPHA_CPU_MASK names \"avx512_bf16\"") && err.trim_end().lines().count() == 1, "{err}");
}

#[test]
fn info_reports_machine_memory_and_estimate_and_caches_the_peak() {
    let dir = workdir("info");
    text_file(&dir);
    let cache = dir.join("cache");
    let info = || {
        let mut args = vec!["info", "--data", "text.txt", "--json", "--measure-steps", "2", "--iters", "100"];
        args.extend(TINY);
        let o = alpha_native().args(&args).current_dir(&dir).env("ALPHA_CACHE_DIR", &cache).output().unwrap();
        json_of(&o)
    };
    let first = info();
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    assert!(!first["cpu"].as_str().unwrap().is_empty());
    assert!(first["cores"].as_u64().unwrap() >= 1);
    assert!(first["simd"].is_array());
    assert!(f(&first["peak_gflops"]) > 0.0);
    assert_eq!(first["peak_source"], "measured");
    // The FMA limit is measured wherever the GEMM kernel has vector FMAs.
    if first["gemm_kernel"] != "portable" {
        assert!(f(&first["fma_limit_gflops"]) > 0.0, "{first}");
    } else {
        assert!(first["fma_limit_gflops"].is_null(), "{first}");
    }
    let mem = &first["memory_mib"];
    let parts: f64 = ["params", "grads", "adam_m", "adam_v", "activations", "batch"].iter().map(|k| f(&mem[k])).sum();
    assert!((parts - f(&mem["total"])).abs() < 1e-9);
    assert!((f(&mem["params"]) - first["params"].as_f64().unwrap() * 4.0 / 1048576.0).abs() < 1e-12);
    let e = &first["estimate"];
    assert!(f(&e["ms_per_iter"]) > 0.0 && f(&e["ms_per_eval_batch"]) > 0.0);
    assert!((f(&e["training_s"]) - f(&e["ms_per_iter"]) * 100.0 / 1e3).abs() < 1e-9);
    assert!((f(&e["run_s"]) - f(&e["training_s"]) - f(&e["evaluation_s"])).abs() < 1e-9);
    assert!(first["memory_error"].is_null());
    // A run too large for the machine is described, with why it is not measured.
    let mut args = vec!["info", "--data", "text.txt", "--json", "--measure-steps", "2", "--peak-gflops", "1"];
    args.extend(TINY);
    args.extend(["--batch", "16000000"]);
    let huge = json_of(&alpha_native().args(&args).current_dir(&dir).output().unwrap());
    assert!(huge["estimate"].is_null() && f(&huge["memory_mib"]["activations"]) > 1e5);
    assert!(huge["memory_error"].as_str().unwrap().contains("but this machine has"), "{huge}");
    // info measures again and the cache keeps the highest, f32's and (where the CPU has
    // them) bf16's; bench (as train) reuses them.
    let second = info();
    assert_eq!(second["peak_source"], "measured");
    assert!(f(&second["peak_gflops"]) >= f(&first["peak_gflops"]));
    let bf16 = second["bf16_kernel"].is_string();
    if bf16 {
        assert!(f(&second["peak_bf16_gflops"]) >= f(&first["peak_bf16_gflops"]));
    }
    let cached: serde_json::Value = serde_json::from_str(&fs::read_to_string(cache.join("peak.json")).unwrap()).unwrap();
    let mut want = vec![f(&second["peak_gflops"])];
    want.extend(bf16.then(|| f(&second["peak_bf16_gflops"])));
    let mut got: Vec<f64> = cached.as_object().unwrap().values().map(f).collect();
    got.sort_by(f64::total_cmp);
    want.sort_by(f64::total_cmp);
    assert_eq!(got, want);
    for (precision, peak) in [("f32", &second["peak_gflops"]), ("bf16", &second["peak_bf16_gflops"])].into_iter().take(1 + usize::from(bf16)) {
        let mut args = vec!["bench", "--data", "text.txt", "--json", "--iters", "1", "--warmup", "0", "--precision", precision];
        args.extend(TINY);
        let bench = json_of(&alpha_native().args(&args).current_dir(&dir).env("ALPHA_CACHE_DIR", &cache).output().unwrap());
        assert_eq!((&bench["peak_source"], &bench["peak_gflops"]), (&serde_json::json!("cached"), peak), "{precision}");
    }
}

#[test]
fn trace_spans_nest_step_then_phase_then_op() {
    let dir = workdir("trace");
    train(&dir, &["--iters", "3", "--trace", "t.json", "--trace-steps", "2"]);
    let doc: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("t.json")).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let span = |e: &serde_json::Value| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap());
    let inside = |inner: (f64, f64), outer: (f64, f64)| inner.0 >= outer.0 - 1e-3 && inner.1 <= outer.1 + 1e-3;
    let named = |names: &[&str]| events.iter().filter(|e| names.contains(&e["name"].as_str().unwrap())).collect::<Vec<_>>();
    let tracks: Vec<_> = events.iter().filter(|e| e["ph"] == "M").map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap())).collect();
    assert_eq!(tracks, [(1, "CPU"), (2, "GPU")]);
    assert!(events.iter().filter(|e| e["ph"] != "M").all(|e| e["ph"] == "X" && e["tid"] == 1 && e["dur"].as_f64().unwrap() >= 0.0));
    let steps = named(&["step"]);
    assert_eq!(steps.len(), 2, "--trace-steps 2");
    let phases = named(&["data", "forward", "backward", "grad_norm", "optimizer"]);
    assert_eq!(phases.len(), 10);
    for p in &phases {
        assert_eq!(steps.iter().filter(|s| inside(span(p), span(s))).count(), 1, "phase {p} not inside exactly one step");
    }
    let families = ["embedding", "layernorm", "matmul", "matmul+gelu", "matmul+residual", "attention", "cross_entropy"];
    let ops = named(&families);
    // One layer: a tape of 7 * 1 + 4 ops, walked forward and backward, per step.
    assert_eq!(ops.len(), 2 * 2 * 11);
    for op in &ops {
        let pass = op["args"]["pass"].as_str().unwrap();
        let home = phases.iter().filter(|p| p["name"] == pass && inside(span(op), span(p))).count();
        assert_eq!(home, 1, "op {op} not inside its {pass} phase");
        assert!(!op["args"]["shape"].as_str().unwrap().is_empty());
    }
    for f in families {
        assert!(ops.iter().any(|o| o["name"] == f), "no {f} span");
    }
}

/// SIGKILL at many moments of a run that checkpoints every step: whatever is on disk always
/// loads (writes are temp file + fsync + rename), and once the next run in the directory has
/// started, no temporary file of a killed one is left. Each kill waits for the run's first
/// checkpoint, then lands a few milliseconds into writing the next one.
#[test]
fn killing_the_process_never_leaves_a_corrupt_checkpoint() {
    let dir = workdir("sigkill");
    text_file(&dir);
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--iters", "100000", "--checkpoint-interval", "1", "--overwrite"];
    // ~2.4M parameters: each checkpoint (with moments) is ~29 MB, so kills often land mid-write.
    args.extend(["--layers", "3", "--heads", "4", "--embd", "256", "--block", "16", "--batch", "4"]);
    args.extend(QUIET);
    let ckpt = dir.join("out/ckpt.safetensors");
    let modified = || fs::metadata(&ckpt).and_then(|m| m.modified()).ok();
    for delay_ms in [0u64, 4, 9, 15, 22, 30, 39, 49] {
        let before = modified();
        let mut child = alpha_native().args(&args).current_dir(&dir).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while modified() == before {
            assert!(std::time::Instant::now() < deadline, "no checkpoint within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let own = format!(".ckpt.safetensors.tmp-{}", child.id());
        assert_eq!(temp_files(&dir).into_iter().filter(|f| *f != own).collect::<Vec<_>>(), Vec::<String>::new(), "a killed run's temporary file survived");
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let ck = checkpoint::load(&ckpt).unwrap_or_else(|e| panic!("after SIGKILL {delay_ms} ms after a checkpoint: {e}"));
        assert!(ck.optimizer.is_some());
    }
    let step = checkpoint::load(&ckpt).unwrap().optimizer.unwrap().2.step;
    assert_ok(&run(&dir, &[&["train", "--resume", "out/ckpt.safetensors", "--iters", &(step + 1).to_string()][..], QUIET].concat()));
    assert_eq!(temp_files(&dir), Vec::<String>::new());
}

/// The temporary checkpoint files in `dir/out`.
fn temp_files(dir: &Path) -> Vec<String> {
    fs::read_dir(dir.join("out")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|f| f.contains(".tmp-")).collect()
}

// The GPU backend through the CLI (lavapipe in CI).

/// Per-step losses of a metrics file, as numbers.
fn loss_curve(metrics: &Path) -> Vec<(u64, f64)> {
    train_losses(metrics).into_iter().map(|(step, loss)| (step, loss.parse().unwrap())).collect()
}

fn assert_same_curve(gpu: &[(u64, f64)], cpu: &[(u64, f64)]) {
    assert_eq!(gpu.len(), cpu.len());
    for ((gs, g), (cs, c)) in gpu.iter().zip(cpu) {
        assert_eq!(gs, cs);
        assert!((g - c).abs() <= 1e-4 * c, "step {gs}: GPU loss {g}, CPU loss {c}");
    }
}

/// `train --backend gpu` follows the CPU's loss curve, and checkpoints move between the
/// backends: a GPU run resumed on the CPU and a CPU run resumed on the GPU continue it.
#[test]
fn gpu_training_follows_the_cpu_and_checkpoints_cross_backends() {
    let dir = workdir("train-gpu");
    let common = ["--iters", "8", "--lr-decay-iters", "8", "--warmup", "2", "--log-interval", "1"];
    train(&dir, &[&common[..], &["--out", "cpu", "--metrics", "cpu.jsonl"]].concat());
    train(&dir, &[&common[..], &["--out", "gpu", "--metrics", "gpu.jsonl", "--backend", "gpu"]].concat());
    let (cpu, gpu) = (loss_curve(&dir.join("cpu.jsonl")), loss_curve(&dir.join("gpu.jsonl")));
    assert_eq!(cpu.len(), 8);
    assert_same_curve(&gpu, &cpu);
    let records: Vec<serde_json::Value> = fs::read_to_string(dir.join("gpu.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for r in records.iter().filter(|r| ["start", "train"].contains(&r["type"].as_str().unwrap())) {
        assert_eq!(r["device"]["kernels_per_step"], 15 + 32, "{r}");
        assert!(r["device"]["device_memory_mib"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(records.iter().filter(|r| r["type"] == "train").all(|r| r["loss_scale"].is_null()), "f32 runs have no loss scale");
    // f16 products (`--precision auto` on lavapipe, which has shader-f16): the same curve
    // within 2e-2, the precision and the loss scale in the records.
    train(&dir, &[&common[..], &["--out", "f16", "--metrics", "f16.jsonl", "--backend", "gpu", "--precision", "auto"]].concat());
    let f16 = loss_curve(&dir.join("f16.jsonl"));
    assert_eq!(f16.len(), cpu.len());
    for ((fs, f), (cs, c)) in f16.iter().zip(&cpu) {
        assert!(fs == cs && (f - c).abs() <= 2e-2 * c, "step {fs}: f16 loss {f}, CPU loss {c}");
    }
    let records: Vec<serde_json::Value> = fs::read_to_string(dir.join("f16.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records[0]["precision"], "f16", "{}", records[0]);
    // The run says where its f16 products run: on the tensor cores, or why not.
    let o = run(&dir, &[&["train", "--data", "text.txt", "--out", "f16-line", "--iters", "1", "--backend", "gpu", "--precision", "f16"], TINY].concat());
    assert_ok(&o);
    let line = stdout(&o).lines().find(|l| l.starts_with("precision: ")).map(str::to_string);
    let no_tensor_cores = |l: &str| l.starts_with("precision: f16 (no tensor cores: ") && l.contains(" lacks ");
    assert!(line.as_deref().is_some_and(|l| l == "precision: f16 (tensor cores)" || no_tensor_cores(l)), "{line:?}");
    // The resolved run files repeat the arithmetic each run resolved to.
    let tensor_cores = if line.as_deref() == Some("precision: f16 (tensor cores)") { "on" } else { "off" };
    for (out, precision, tensor_cores) in [("gpu", "f32", "off"), ("f16", "f16", tensor_cores)] {
        let resolved = fs::read_to_string(dir.join(out).join("run.toml")).unwrap();
        let want = format!("precision = \"{precision}\"\ntensor_cores = \"{tensor_cores}\"\n");
        assert!(resolved.ends_with(&want), "{out}/run.toml:\n{resolved}");
    }
    for r in records.iter().filter(|r| r["type"] == "train") {
        assert_eq!((r["loss_scale"].as_f64(), r["skipped_steps"].as_u64()), (Some(65536.0), Some(0)), "{r}");
    }
    // Halfway checkpoints of each backend, resumed on the other.
    let mut half = common.to_vec();
    half[1] = "4";
    train(&dir, &[&half[..], &["--out", "cpu-half"]].concat());
    train(&dir, &[&half[..], &["--out", "gpu-half", "--backend", "gpu"]].concat());
    for (from, on) in [("cpu-half", "gpu"), ("gpu-half", "cpu")] {
        let ckpt = format!("{from}/ckpt.safetensors");
        let metrics = format!("{from}.jsonl");
        let args = ["train", "--resume", &ckpt, "--out", from, "--iters", "8", "--backend", on, "--metrics", &metrics, "--log-interval", "1"];
        assert_ok(&run(&dir, &[&args[..], QUIET].concat()));
        assert_same_curve(&loss_curve(&dir.join(&metrics)), &cpu[4..]);
    }
    // The final models agree.
    let (c, g) = (checkpoint::load(&dir.join("cpu/ckpt.safetensors")).unwrap(), checkpoint::load(&dir.join("gpu-half/ckpt.safetensors")).unwrap());
    let worst = c.params.iter().zip(&g.params).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "parameters differ by {worst}");
    // An f16 run stopped halfway and resumed (its checkpoint keeps the loss scale, and the
    // resumed run its precision without --precision) ends with the uninterrupted f16 run's
    // parameters, to the bit.
    train(&dir, &[&half[..], &["--out", "f16-half", "--backend", "gpu", "--precision", "f16"]].concat());
    let args = ["train", "--resume", "f16-half/ckpt.safetensors", "--out", "f16-half", "--iters", "8", "--backend", "gpu"];
    let o = run(&dir, &[&args[..], QUIET].concat());
    assert_ok(&o);
    let line = stdout(&o).lines().find(|l| l.starts_with("precision: ")).map(str::to_string);
    assert!(line.as_deref().is_some_and(|l| l.starts_with("precision: f16") && l.contains("the resumed checkpoint's")), "{line:?}");
    let (whole, resumed) = (checkpoint::load(&dir.join("f16/ckpt.safetensors")).unwrap(), checkpoint::load(&dir.join("f16-half/ckpt.safetensors")).unwrap());
    assert!(whole.params.iter().zip(&resumed.params).all(|(a, b)| a.to_bits() == b.to_bits()), "the resumed f16 run differs");
    let state = |c: &checkpoint::Checkpoint| c.optimizer.as_ref().unwrap().2.loss_scale;
    assert_eq!(state(&whole), state(&resumed));
    assert_eq!(state(&whole).map(|s| (s.scale, s.good_steps)), Some((65536.0, 8)));
}

/// `eval` and `sample` on the GPU give the CPU's loss and the CPU's greedy text.
#[test]
fn gpu_eval_and_sample_match_the_cpu() {
    let dir = workdir("eval-gpu");
    train(&dir, &["--iters", "5"]);
    let eval = |backend: &str| {
        let o = run(&dir, &["eval", "--checkpoint", "out/ckpt.safetensors", "--text", "text.txt", "--batch", "64", "--backend", backend]);
        json_of(&o)
    };
    let (c, g) = (eval("cpu"), eval("gpu"));
    assert_eq!(c["windows"], g["windows"]);
    let (c, g) = (c["loss"].as_f64().unwrap(), g["loss"].as_f64().unwrap());
    assert!((c - g).abs() <= 1e-5 * c, "eval loss CPU {c}, GPU {g}");
    let sample = |backend: &str| {
        let o =
            run(&dir, &["sample", "--checkpoint", "out/ckpt.safetensors", "--prompt", "ROMEO:", "--tokens", "30", "--temperature", "0", "--backend", backend]);
        assert_ok(&o);
        stdout(&o)
    };
    let text = sample("gpu");
    assert!(text.starts_with("ROMEO:") && text.chars().count() > 30, "{text:?}");
    assert_eq!(text, sample("cpu"));
}

/// `--trace` on the GPU: every kernel of each traced step on the GPU track, inside its step.
#[test]
fn gpu_trace_has_every_kernel_inside_its_step() {
    let dir = workdir("trace-gpu");
    train(&dir, &["--iters", "3", "--trace", "t.json", "--trace-steps", "2", "--backend", "gpu"]);
    let doc: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("t.json")).unwrap()).unwrap();
    let spans: Vec<&serde_json::Value> = doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
    let span = |e: &serde_json::Value| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap());
    let steps: Vec<_> = spans.iter().filter(|e| e["name"] == "step" && e["tid"] == 1).map(|e| span(e)).collect();
    assert_eq!(steps.len(), 2);
    let kernels: Vec<_> = spans.iter().filter(|e| e["tid"] == 2).collect();
    assert_eq!(kernels.len(), 2 * (15 + 32));
    for k in &kernels {
        let (a, b) = span(k);
        assert!(b >= a && steps.iter().filter(|s| a >= s.0 && b <= s.1 + 1.0).count() == 1, "kernel {k} outside its step");
        assert!(["forward", "backward", "update"].contains(&k["args"]["pass"].as_str().unwrap()), "{k}");
    }
    assert!(kernels.iter().any(|k| k["name"] == "attention" && k["args"]["kernel"] == "attention_backward_q"));
    // Each kernel's work, for its achieved rates: bytes bound by every kernel, and the
    // forward's products (matmuls and attention; the other kernels count none) the FLOPs the
    // CPU's ops count for the same steps.
    assert!(kernels.iter().all(|k| k["args"]["bytes"].as_f64().unwrap() > 0.0), "a kernel without bytes");
    let forward_flops = |spans: &[&serde_json::Value], track: u64| -> f64 {
        let product = |e: &serde_json::Value| e["name"].as_str().is_some_and(|n| n.starts_with("matmul") || n == "attention");
        let forward = spans.iter().filter(|e| e["tid"] == track && e["args"]["pass"] == "forward" && (track == 2 || product(e)));
        forward.map(|e| e["args"]["flops"].as_f64().unwrap_or(0.0)).sum()
    };
    train(&dir, &["--iters", "3", "--trace", "c.json", "--trace-steps", "2", "--out", "cpu"]);
    let cpu: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("c.json")).unwrap()).unwrap();
    let cpu_spans: Vec<&serde_json::Value> = cpu["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
    let (gpu_flops, cpu_flops) = (forward_flops(&spans, 2), forward_flops(&cpu_spans, 1));
    assert!(gpu_flops > 0.0 && (gpu_flops - cpu_flops).abs() <= 1e-9 * cpu_flops, "forward FLOPs: GPU {gpu_flops}, CPU {cpu_flops}");
}

/// `info` lists the adapters and measures the estimate on the GPU when asked.
#[test]
fn info_lists_gpu_adapters_and_estimates_on_the_gpu() {
    let dir = workdir("info-gpu");
    text_file(&dir);
    let mut args = vec!["info", "--data", "text.txt", "--json", "--measure-steps", "1", "--peak-gflops", "10", "--backend", "gpu"];
    args.extend(TINY);
    let r = json_of(&run(&dir, &args));
    let adapters = r["gpu_adapters"].as_array().unwrap();
    assert!(!adapters.is_empty(), "{r}");
    for a in adapters {
        assert!(!a["name"].as_str().unwrap().is_empty() && a["max_storage_binding_bytes"].as_u64().unwrap() > 0, "{a}");
        assert!(a["features"].is_array() && a["cooperative_matrices"].is_array(), "{a}");
    }
    assert_eq!(r["backend"], "gpu");
    // The GPU's FMA limits: f32 as given, f16 measured where the adapter has shader-f16.
    let peaks = &r["gpu_peak_gflops"];
    assert_eq!(peaks["f32"].as_f64(), Some(10.0), "{r}");
    let f16 = r["gpu_adapters"][0]["features"].as_array().unwrap().iter().any(|f| f == "shader-f16");
    assert_eq!(peaks["f16"].as_f64().is_some_and(|g| g > 0.0), f16, "{r}");
    // The tensor cores' only on a device that runs the f16 products on them (lavapipe cannot).
    assert!(peaks["tensor"].is_null(), "{r}");
    assert_eq!(r["device"]["kernels_per_step"], 15 + 32);
    assert!(r["estimate"]["ms_per_iter"].as_f64().unwrap() > 0.0, "{r}");
}

/// `info --kernels` reports what the Vulkan driver compiled of every kernel, or says in one
/// line why it cannot: without --backend gpu, or where the driver lacks the extension (as
/// lavapipe does).
#[test]
fn info_kernels_gives_the_drivers_statistics_or_says_why_not() {
    let dir = workdir("info-kernels");
    text_file(&dir);
    expect_error(&dir, &["info", "--data", "text.txt", "--kernels"], "--kernels needs --backend gpu");
    let args = [&["info", "--data", "text.txt", "--json", "--measure-steps", "0", "--backend", "gpu", "--kernels"], TINY].concat();
    let o = run(&dir, &args);
    if o.status.success() {
        let r = json_of(&o);
        let kernels = r["gpu_kernels"].as_array().unwrap();
        assert_eq!(kernels.len(), 23, "every kernel but the tensor-core GEMM: {r}");
        assert!(kernels.iter().all(|k| !k["statistics"].as_array().unwrap().is_empty()), "{r}");
    } else {
        expect_error(&dir, &args, "lacks");
    }
}

/// `--save best` writes a checkpoint only after an evaluation with the lowest val loss so far
/// (and records it, so a resumed run compares with it); `--keep N` keeps the last N saves.
#[test]
fn save_best_and_keep_last() {
    let dir = workdir("save-best");
    train(&dir, &["--iters", "12", "--eval-interval", "2", "--eval-iters", "1", "--lr", "3e-2", "--save", "best", "--metrics", "m.jsonl", "--out", "best"]);
    let records: Vec<serde_json::Value> = fs::read_to_string(dir.join("m.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut best = f64::INFINITY;
    let mut saved = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if r["type"] == "eval" {
            let val = r["val_loss"].as_f64().unwrap();
            let followed_by_save = records.get(i + 1).is_some_and(|n| n["type"] == "save" && n["step"] == r["step"]);
            assert_eq!(followed_by_save, val < best, "step {}: val {val}, best so far {best}", r["step"]);
            if val < best {
                best = val;
                saved.push(r["step"].as_u64().unwrap());
            }
        }
    }
    assert_eq!(records.iter().filter(|r| r["type"] == "save").count(), saved.len());
    let ck = checkpoint::load(&dir.join("best/ckpt.safetensors")).unwrap();
    let state = ck.optimizer.unwrap().2;
    assert_eq!((state.step, state.best_val_loss), (*saved.last().unwrap(), Some(best)));
    expect_error(&dir, &["train", "--data", "text.txt", "--save", "best", "--eval-interval", "0", "--out", "x"], "--save best saves after evaluations");

    train(&dir, &["--iters", "7", "--checkpoint-interval", "2", "--keep", "3", "--out", "kept"]);
    let mut files: Vec<String> =
        fs::read_dir(dir.join("kept")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("ckpt")).collect();
    files.sort();
    assert_eq!(files, ["ckpt-00000004.safetensors", "ckpt-00000006.safetensors", "ckpt-00000007.safetensors", "ckpt.safetensors"]);
    assert_eq!(fs::read(dir.join("kept/ckpt-00000007.safetensors")).unwrap(), fs::read(dir.join("kept/ckpt.safetensors")).unwrap());
    expect_error(&dir, &["train", "--data", "text.txt", "--keep", "0", "--out", "y"], "--keep must be 1 to 1000");
}

/// `--model` sets GPT-2's sizes: 124,439,808 parameters for gpt2 (OpenAI's count), 1.5B for
/// gpt2-xl; training one needs GPT-2's vocabulary.
#[test]
fn gpt2_presets_have_gpt2s_sizes() {
    let dir = workdir("gpt2-presets");
    text_file(&dir);
    // SmolLM2's: Hugging Face's parameter counts of SmolLM2-135M and -360M (tied heads).
    let presets = [
        ("gpt2", "124439808 parameters"),
        ("gpt2-medium", "354823168 parameters"),
        ("gpt2-xl", "1557611200 parameters"),
        ("smollm2-135m", "134515008 parameters"),
        ("smollm2-360m", "361821120 parameters"),
    ];
    for (model, params) in presets {
        let o = run(&dir, &["info", "--model", model, "--data", "text.txt", "--measure-steps", "0"]);
        assert_ok(&o);
        assert!(stdout(&o).contains(params), "{model}: {}", stdout(&o));
    }
    expect_error(&dir, &["train", "--model", "gpt2", "--data", "text.txt", "--iters", "1"], "--model gpt2 has 50257 tokens, but the tokenizer has 64");
    expect_error(&dir, &["train", "--model", "smollm2-135m", "--data", "text.txt", "--iters", "1"], "--model smollm2-135m has 49152 tokens");
}

/// `--async-checkpoint` writes the same checkpoints in the background: the same tensors and
/// state at every save (the settings differ only in recording it), the same run.
#[test]
fn async_checkpoints_are_the_same_checkpoints() {
    let dir = workdir("async-checkpoint");
    let common = ["--iters", "9", "--checkpoint-interval", "3", "--keep", "4", "--log-interval", "1", "--eval-interval", "0"];
    train(&dir, &[&common[..], &["--out", "sync", "--metrics", "sync.jsonl"]].concat());
    train(&dir, &[&common[..], &["--out", "async", "--metrics", "async.jsonl", "--async-checkpoint"]].concat());
    assert_eq!(train_losses(&dir.join("sync.jsonl")), train_losses(&dir.join("async.jsonl")));
    for file in ["ckpt-00000003.safetensors", "ckpt-00000006.safetensors", "ckpt-00000009.safetensors", "ckpt.safetensors"] {
        let (sync, mut background) = (checkpoint::load(&dir.join("sync").join(file)).unwrap(), checkpoint::load(&dir.join("async").join(file)).unwrap());
        let state = &mut background.optimizer.as_mut().unwrap().2;
        assert!(state.settings.async_checkpoint, "{file}");
        state.settings.async_checkpoint = false;
        assert!(sync == background, "{file}");
    }
}

/// `report` reads what a run wrote and refuses what would lose a file: a truncated or
/// mangled metrics file still reports (its bad lines counted), a file that is not a trace is a
/// one-line error, and the report never replaces its inputs or an existing file unasked.
#[test]
fn report_survives_bad_metrics_and_refuses_to_replace_files() {
    let dir = workdir("report");
    train(&dir, &["--iters", "4", "--log-interval", "1", "--metrics", "m.jsonl", "--trace", "t.json", "--trace-steps", "2"]);
    let mut mangled = fs::read_to_string(dir.join("m.jsonl")).unwrap();
    let middle = mangled[..mangled.len() / 2].rfind('\n').unwrap() + 10;
    mangled.insert_str(middle, "\u{0}garbage\n");
    mangled.truncate(mangled.len() - 7);
    fs::write(dir.join("mangled.jsonl"), &mangled).unwrap();
    let o = run(&dir, &["report", "--metrics", "m.jsonl", "--metrics", "mangled.jsonl", "--trace", "t.json", "--out", "r.html"]);
    assert_ok(&o);
    assert!(stdout(&o).contains("malformed metrics lines skipped"), "{}", stdout(&o));
    // The line cut in two by the garbage (both halves) and the truncated last one.
    let page = fs::read_to_string(dir.join("r.html")).unwrap();
    assert!(page.contains("\"skipped\":0") && page.contains("\"skipped\":3"), "lost count of the bad lines");
    assert!(!page.contains("http://") && !page.contains("https://"), "the report links out");
    expect_error(&dir, &["report", "--metrics", "m.jsonl", "--out", "r.html"], "already exists");
    expect_error(&dir, &["report", "--metrics", "m.jsonl", "--out", "m.jsonl"], "same file");
    expect_error(&dir, &["report", "--metrics", "m.jsonl", "--trace", "m.jsonl", "--out", "x.html"], "not a JSON trace");
    expect_error(&dir, &["report", "--metrics", "absent.jsonl", "--out", "x.html"], "cannot read --metrics absent.jsonl");
    assert!(!dir.join("x.html").exists());
}

/// `report` streams its input: a metrics file of 300,000 train records (about 100 MB) is read
/// in bounded memory (the charts keep an evenly thinned set, the latest record included).
#[test]
fn report_reads_a_large_metrics_file_in_bounded_memory() {
    use std::io::Write;
    let dir = workdir("report-large");
    let path = dir.join("big.jsonl");
    {
        let mut f = std::io::BufWriter::new(fs::File::create(&path).unwrap());
        writeln!(f, r#"{{"type":"start","step":0,"params":1000,"settings":{{"batch":4,"grad_accum":1,"grad_clip":1.0}}}}"#).unwrap();
        for step in 0..300_000u64 {
            writeln!(
                f,
                r#"{{"type":"train","step":{step},"loss":{:.6},"lr":0.001,"grad_norm":0.5,"tokens_per_sec":123456.7,"ms_per_step":1.25,"ms":{{"data":0.01,"forward":0.4,"backward":0.7,"optimizer":0.1,"idle":0.04}},"device":"cpu","mfu":0.12,"hfu":0.12,"loss_scale":null,"skipped_steps":null,"time_s":{:.3}}}"#,
                4.0 / (1.0 + step as f64 / 1e4),
                step as f64 * 0.00125
            )
            .unwrap();
        }
    }
    let size = fs::metadata(&path).unwrap().len();
    assert!(size > 80_000_000, "{size}");
    let started = std::time::Instant::now();
    let (o, peak_kib) = run_measuring_memory(&dir, &["report", "--metrics", "big.jsonl", "--out", "r.html"]);
    assert_ok(&o);
    assert!(peak_kib < 100 * 1024, "report of a {size}-byte metrics file took {peak_kib} KiB");
    let page = fs::read_to_string(dir.join("r.html")).unwrap();
    assert!(page.contains("\"step\":299999"), "the latest record is drawn");
    assert!(page.len() < 4 << 20, "the report holds {} bytes", page.len());
    eprintln!("report of {size} bytes: {peak_kib} KiB, {:?}", started.elapsed());
    fs::remove_file(&path).unwrap();
}

/// `train --serve`: the live dashboard while the run trains: the page, the records (whole
/// when they changed since a version, else 204), nothing else (`..` and absolute paths are
/// 404, a Host that is not the loopback 403). No client stalls another: while 100 idle
/// connections and one that drips a byte every 400 ms are open, a viewer is answered within a
/// second, the drip is cut at the request deadline, the waiting clients cost no CPU (their
/// threads sleep) and the run goes on.
#[test]
fn serve_shows_the_run_live_and_no_client_stalls_it() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = workdir("serve");
    text_file(&dir);
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--threads", "1", "--iters", "100000", "--log-interval", "10", "--serve", "127.0.0.1:0"];
    args.extend(TINY);
    args.extend(QUIET);
    let mut child = alpha_native().args(&args).current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // The run's plain lines are read away, so that a full pipe never holds it.
    std::thread::spawn(move || lines.for_each(drop));
    let addr = first.strip_prefix("dashboard: http://").and_then(|a| a.strip_suffix('/')).unwrap_or_else(|| panic!("{first}")).to_string();
    let request = |target: &str, host: &str| {
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(s, "GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    };
    let get = |target: &str| request(target, &addr);
    let page = get("/");
    assert!(page.starts_with("HTTP/1.1 200 OK") && page.contains("data-live=\"/records\""), "{page}");
    // The steps of the train records.
    let train_steps = |answer: &str| -> Vec<u64> {
        let records = answer.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        records.filter(|r| r["type"] == "train").map(|r| r["step"].as_u64().unwrap()).collect()
    };
    // The run's first train records (its start measures the CPU's peak first, unless cached).
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let records = get("/records");
        if !train_steps(&records).is_empty() || Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(records.starts_with("HTTP/1.1 200 OK") && records.contains("\"type\":\"start\""), "{records}");
    let version = records.lines().find_map(|l| l.strip_prefix("X-Records-Version: ")).unwrap().to_string();
    let before = train_steps(&records).len();
    assert!(before > 0, "the run logged nothing in 30 s");
    for bad in ["/../etc/passwd", "/records/../../etc/passwd", "/etc/passwd", "http://localhost/etc/passwd", "//etc/passwd"] {
        assert!(get(bad).starts_with("HTTP/1.1 404"), "{bad}");
    }
    assert!(request("/records", "attacker.example").starts_with("HTTP/1.1 403"), "a rebound DNS name was answered");

    // 100 idle connections and a slow drip, then a viewer.
    let idle: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let drip_addr = addr.clone();
    let drip = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&drip_addr).unwrap();
        let started = Instant::now();
        for b in b"GET /records HTTP/1.1\r\nHost: localhost\r\n\r\n" {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(400));
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        (started.elapsed(), answer)
    });
    std::thread::sleep(Duration::from_millis(200));
    let asked = Instant::now();
    let answer = get(&format!("/records?since={version}"));
    let waited = asked.elapsed();
    assert!(waited < Duration::from_secs(1), "a viewer waited {waited:?} behind idle and slow clients");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "the records did not change since version {version}: {answer}");
    // The waiting clients cost the run no CPU: their threads sleep until their deadline.
    let server_ticks: u64 = fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .flatten()
        .filter(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "viewer" || c.trim() == "dashboard"))
        .filter_map(|t| fs::read_to_string(t.path().join("stat")).ok())
        .map(|stat| stat.rsplit(')').next().unwrap().split_whitespace().skip(11).take(2).map(|v| v.parse::<u64>().unwrap()).sum::<u64>())
        .sum();
    assert!(server_ticks <= 5, "the dashboard's threads used {server_ticks} clock ticks of CPU while clients stalled");
    let (dripped, cut) = drip.join().unwrap();
    assert!(cut.starts_with("HTTP/1.1 408") && dripped < Duration::from_secs(5), "the slow drip got {cut:?} after {dripped:?}");
    drop(idle);
    let after = train_steps(&get("/records")).len();
    assert!(after > before + 2, "the run stopped logging while clients stalled: {before} then {after}");
    // Nothing changed in between: 204 and no records.
    let version = get("/records").lines().find_map(|l| l.strip_prefix("X-Records-Version: ")).unwrap().to_string();
    let unchanged = get(&format!("/records?since={version}"));
    assert!(unchanged.starts_with("HTTP/1.1 204") || unchanged.starts_with("HTTP/1.1 200"), "{unchanged}");
    child.kill().unwrap();
    child.wait().unwrap();
}
