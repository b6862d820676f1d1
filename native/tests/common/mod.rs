//! Helpers the end-to-end tests of the binary share: a work directory per test, a small text,
//! running the binary, and checking its errors.
#![allow(dead_code)] // Each test file uses its own part of them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_alpha-native");
/// A tiny model: 1 layer, 2 heads, 16 wide, block 16, batch 4.
pub const TINY: &[&str] = &["--layers", "1", "--heads", "2", "--embd", "16", "--block", "16", "--batch", "4"];
pub const QUIET: &[&str] = &["--eval-interval", "0", "--sample-interval", "0"];

/// A fresh directory for one test.
pub fn workdir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli").join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The first 20,000 characters of the embedded corpus, written to `dir/text.txt`.
pub fn text_file(dir: &Path) -> PathBuf {
    let path = dir.join("text.txt");
    let corpus = include_str!("../../assets/shakespeare.txt");
    fs::write(&path, &corpus[..20_000]).unwrap();
    path
}

/// The binary as a command, the peaks it measures cached in the tests' own directory: a
/// test-profile build (debug assertions) measures lower peaks than a release one, which the
/// user's cache would keep, and every MFU after them would be too high.
pub fn alpha_native() -> Command {
    let mut c = Command::new(BIN);
    c.env("ALPHA_CACHE_DIR", test_cache_dir());
    c
}

/// Where the tests' runs cache measured peaks (`ALPHA_CACHE_DIR`).
pub fn test_cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("peak-cache")
}

pub fn run(dir: &Path, args: &[&str]) -> Output {
    alpha_native().args(args).current_dir(dir).output().expect("running alpha-native")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn assert_ok(o: &Output) {
    assert!(o.status.success(), "failed: {}\n{}", String::from_utf8_lossy(&o.stderr), stdout(o));
}

/// Trains the tiny model on `text.txt` with extra flags; returns `dir/out/ckpt.safetensors`
/// (where it lands unless `extra` names another `--out`).
pub fn train(dir: &Path, extra: &[&str]) -> PathBuf {
    text_file(dir);
    let mut args = vec!["train", "--data", "text.txt", "--out", "out", "--threads", "2"];
    args.extend(TINY);
    args.extend(QUIET);
    args.extend(extra);
    assert_ok(&run(dir, &args));
    dir.join("out/ckpt.safetensors")
}

/// Bad input: exit status 1, one line on stderr that starts with "error:" and contains
/// `needle`, and no panic.
pub fn expect_error(dir: &Path, args: &[&str], needle: &str) {
    let o = run(dir, args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: expected exit 1, stderr: {err}");
    assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1, "{args:?}: stderr {err:?}");
    assert!(err.contains(needle), "{args:?}: {err:?} does not contain {needle:?}");
}

/// Rewrites the safetensors JSON header, replacing `from` by `to` (the data is unchanged).
pub fn edit_header(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert!(header.contains(from), "header lacks {from}: {header}");
    let header = header.replacen(from, to, 1);
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(&bytes[8 + n..]);
    out
}

pub fn train_losses(metrics: &Path) -> Vec<(u64, String)> {
    fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["type"] == "train")
        .map(|r| (r["step"].as_u64().unwrap(), r["loss"].to_string()))
        .collect()
}

pub fn json_of(o: &Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_str(stdout(o).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// Runs the binary with `args` in `dir` and returns its output and its peak resident memory
/// in KiB, as GNU time measures it (`/usr/bin/time`, Debian's `time`: the binary is started by
/// that small process, so no copy of this test process's memory counts as the binary's).
pub fn run_measuring_memory(dir: &Path, args: &[&str]) -> (Output, u64) {
    let report = dir.join(".peak-memory");
    let o = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&report)
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running alpha-native under /usr/bin/time (apt install time)");
    let text = fs::read_to_string(&report).unwrap();
    let kib = text.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("/usr/bin/time wrote {text:?}"));
    (o, kib)
}
