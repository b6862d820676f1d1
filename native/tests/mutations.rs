//! The suite hunts for the next hole: thousands of mutations of every file Alpha reads
//! (checkpoints, with the tokenizer and the training state in their header, and training
//! texts), generated from a seed, go through the real loading path in this process (no
//! `catch_unwind`: a panic or an abort fails the test), a sample of them through the file
//! path and through the binary. Each either loads into something consistent or is a one-line
//! error naming the file and what is wrong with it.

mod common;

use alpha_core::checkpoint::{self, TrainState};
use alpha_core::settings::RunSettings;
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::{GptConfig, Plan, Rng};
use common::*;
use serde_json::{json, Value};
use std::fs;

/// The seed of every case: `ALPHA_MUTATION_SEED=N` hunts with another.
fn seed() -> u64 {
    std::env::var("ALPHA_MUTATION_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x00a1_fa5e_ed00)
}
const CHECKPOINT_CASES: usize = 20_000;
const TEXT_CASES: usize = 5000;
/// One case in this many also goes through the file path, one in `BINARY_EVERY` through
/// the binary.
const FILE_EVERY: usize = 10;
const BINARY_EVERY: usize = 150;

const CONFIG: GptConfig = GptConfig::gpt2(12, 8, 2, 2, 8);
const CHARS: &str = "\n !,.:;?ETae";

/// A valid checkpoint of `CONFIG`: resumable (with moments and state) or weights only.
fn base_checkpoint(resumable: bool) -> Vec<u8> {
    let plan = Plan::new(CONFIG, 1, 1).unwrap();
    let mut rng = Rng::new(1);
    let mut arena = || (0..plan.params_len()).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
    let (params, m, v) = (arena(), arena(), arena().iter().map(|x| x * x).collect::<Vec<f32>>());
    let settings = RunSettings { batch: 2, iters: 10, lr_decay_iters: 10, warmup: 2, seed: 7, ..RunSettings::defaults("text.txt") };
    let state = TrainState { step: 3, rng_state: "12345".into(), settings, best_val_loss: None, loss_scale: None };
    let tokenizer = Tokenizer::from(CharTokenizer::new(CHARS.chars().collect()).unwrap());
    checkpoint::to_bytes(CONFIG, &tokenizer, &params, resumable.then_some((&m[..], &v[..], &state))).unwrap()
}

/// Numbers and values a hostile header might hold where sizes, offsets and names belong.
fn hostile_value(rng: &mut Rng) -> Value {
    let pool = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1),
        json!(3),
        json!(1_000_000_000),
        json!(16_777_217),
        json!(4_294_967_296u64),
        json!(9_007_199_254_740_993u64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!(-1e300),
        json!(1.5),
        json!(""),
        json!("x"),
        json!("18446744073709551616"),
        json!([]),
        json!([-1]),
        json!([1e20, 2]),
        json!([u64::MAX, u64::MAX]),
        json!({}),
        json!({"a": 1}),
        json!("F16"),
        json!("BF16"),
        json!("F64"),
        json!("I8"),
        json!("BOOL"),
        json!("\u{0}\u{ffff}"),
    ];
    pool[rng.below(pool.len())].clone()
}

/// Replaces one field of a JSON object (or the whole value) with a hostile one, or removes it.
fn mutate_json(v: &mut Value, rng: &mut Rng) {
    let Value::Object(map) = v else {
        *v = hostile_value(rng);
        return;
    };
    if map.is_empty() || rng.below(8) == 0 {
        *v = hostile_value(rng);
        return;
    }
    let keys: Vec<String> = map.keys().cloned().collect();
    let key = &keys[rng.below(keys.len())];
    match rng.below(6) {
        0 => {
            map.remove(key);
        }
        1 => {
            let value = map[key].clone();
            map.insert(format!("{key}x"), value);
        }
        // Into arrays: one element hostile (shapes, data offsets).
        2 if map[key].is_array() => {
            if let Value::Array(items) = &mut map[key] {
                if !items.is_empty() {
                    let i = rng.below(items.len());
                    items[i] = hostile_value(rng);
                } else {
                    items.push(hostile_value(rng));
                }
            }
        }
        3 if map[key].is_object() => mutate_json(&mut map[key], rng),
        _ => map[key] = hostile_value(rng),
    }
}

/// `bytes` with its JSON header changed: a tensor entry, or a metadata entry (itself JSON in
/// a string, mutated inside the string or replaced), with a correct length prefix.
fn mutate_header(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let map = header.as_object_mut().unwrap();
    let keys: Vec<String> = map.keys().cloned().collect();
    let key = keys[rng.below(keys.len())].clone();
    if key == "__metadata__" && rng.below(4) != 0 {
        let meta = map[&key].as_object_mut().unwrap();
        let names: Vec<String> = meta.keys().cloned().collect();
        let name = &names[rng.below(names.len())];
        let inner: Option<Value> = meta[name].as_str().and_then(|s| serde_json::from_str(s).ok());
        match inner {
            Some(mut inner) if rng.below(4) != 0 => {
                // Nested objects (train.settings) too.
                if let Some(settings) = inner.get_mut("settings").filter(|_| rng.below(2) == 0) {
                    mutate_json(settings, rng);
                } else {
                    mutate_json(&mut inner, rng);
                }
                meta[name] = Value::String(inner.to_string());
            }
            _ => mutate_json(&mut meta[name], rng),
        }
    } else {
        mutate_json(&mut map[&key], rng);
    }
    let text = header.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text.as_bytes());
    out.extend(&bytes[8 + n..]);
    out
}

/// One mutation of `base` and what it was.
fn mutate(base: &[u8], rng: &mut Rng) -> (Vec<u8>, &'static str) {
    let mut b = base.to_vec();
    let what = match rng.below(6) {
        0 => {
            b.truncate(rng.below(b.len()));
            "truncated"
        }
        1 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] ^= 1 + rng.below(255) as u8;
            }
            "bytes flipped"
        }
        2 => {
            // The header's length prefix.
            let n = u64::from_le_bytes(b[..8].try_into().unwrap());
            let choices = [0, 1, 7, n - 1, n + 1, n + 8, b.len() as u64, b.len() as u64 - 8, u64::MAX, 1 << 63, rng.next_u64()];
            b[..8].copy_from_slice(&choices[rng.below(choices.len())].to_le_bytes());
            "length prefix"
        }
        3 => {
            let at = rng.below(b.len());
            let junk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.below(256) as u8).collect();
            b.splice(at..at, junk);
            "bytes inserted"
        }
        _ => {
            b = mutate_header(&b, rng);
            "header"
        }
    };
    (b, what)
}

/// A loaded checkpoint must be self-consistent: what `from_bytes` accepts, every frontend
/// can use without further checks.
fn assert_consistent(ck: &checkpoint::Checkpoint) {
    let plan = Plan::new(ck.config, 1, 1).expect("an accepted config plans");
    assert_eq!(ck.params.len(), plan.params_len());
    assert_eq!(ck.tokenizer.vocab_size(), ck.config.vocab_size);
    if let Some((m, v, state)) = &ck.optimizer {
        assert_eq!((m.len(), v.len()), (plan.params_len(), plan.params_len()));
        state.settings.validate(|f| f.to_string()).expect("accepted settings are valid");
        state.rng().expect("an accepted rng state parses");
    }
}

#[test]
fn mutated_checkpoints_load_consistently_or_are_one_line_errors() {
    let dir = workdir("mutations-checkpoints");
    // A text in the checkpoints' vocabulary, so that a checkpoint that loads evaluates.
    fs::write(dir.join("text.txt"), "Tea aE; a Ea!\nEa, E? Ta: a.\n".repeat(4)).unwrap();
    let bases = [base_checkpoint(true), base_checkpoint(false)];
    for base in &bases {
        assert_consistent(&checkpoint::from_bytes(base).unwrap());
    }
    let mut rng = Rng::new(seed());
    let (mut loaded, mut kinds) = (0, std::collections::BTreeMap::<&str, usize>::new());
    for case in 0..CHECKPOINT_CASES {
        let base = &bases[case % 2];
        let (bytes, what) = mutate(base, &mut rng);
        *kinds.entry(what).or_default() += 1;
        match checkpoint::from_bytes(&bytes) {
            Ok(ck) => {
                assert_consistent(&ck);
                loaded += 1;
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty() && !msg.contains('\n'), "case {case} ({what}): {msg:?}");
            }
        }
        if case % FILE_EVERY == 0 {
            let path = dir.join(format!("case{case}.safetensors"));
            fs::write(&path, &bytes).unwrap();
            if let Err(e) = alpha_native::checkpoint::load(&path) {
                let e = format!("{e:#}");
                assert!(e.starts_with(&format!("checkpoint {} is ", path.display())) && !e.contains('\n'), "case {case} ({what}): {e}");
            }
            if case % BINARY_EVERY == 0 {
                let name = format!("case{case}.safetensors");
                for args in [&["sample", "--checkpoint", &name, "--tokens", "3"][..], &["eval", "--checkpoint", &name, "--text", "text.txt"]] {
                    let o = alpha_native().args(args).current_dir(&dir).output().unwrap();
                    let err = String::from_utf8_lossy(&o.stderr);
                    match o.status.code() {
                        Some(0) => {}
                        // A checkpoint that loads may still not fit the text (another vocabulary).
                        Some(1) => assert!(
                            err.starts_with("error: ") && err.trim_end().lines().count() == 1 && (err.contains(&name) || err.contains("text file text.txt")),
                            "case {case} ({what}) {args:?}: {err}"
                        ),
                        other => panic!("case {case} ({what}) {args:?}: exit {other:?}, {err}"),
                    }
                }
            }
            fs::remove_file(&path).unwrap();
        }
    }
    // The mutations must reach every kind, and most must be refused: a flipped byte of tensor
    // data is caught by its checksum, so only changes that keep the file meaningful load.
    eprintln!("seed {}: {CHECKPOINT_CASES} mutated checkpoints ({kinds:?}), {loaded} loaded", seed());
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    assert!(loaded < CHECKPOINT_CASES / 10, "{loaded} of {CHECKPOINT_CASES} mutated checkpoints loaded");
}

/// Training texts: invalid UTF-8, a text cut mid-character, NULs, CRs, characters outside a
/// checkpoint's vocabulary, empty files. Through the loader of a new run and the encoder of
/// a resumed one, a sample of them through `train`.
#[test]
fn mutated_texts_load_or_are_one_line_errors_naming_the_file() {
    let dir = workdir("mutations-texts");
    let base = include_bytes!("../assets/shakespeare.txt")[..4000].to_vec();
    let vocab = alpha_core::tokenizer::CharTokenizer::from_text(std::str::from_utf8(&base).unwrap()).unwrap();
    let mut rng = Rng::new(seed() ^ 1);
    let inserts: [&[u8]; 8] = [b"\xff", b"\x00", b"\r\n", "\u{e9}".as_bytes(), "\u{65e5}".as_bytes(), "\u{1f600}".as_bytes(), b"\xe6\x97", b"\xed\xa0\x80"];
    for case in 0..TEXT_CASES {
        let mut b = base.clone();
        match rng.below(4) {
            0 => b.truncate(rng.below(b.len() + 1)),
            1 => {
                let i = rng.below(b.len());
                b[i] ^= 1 + rng.below(255) as u8;
            }
            2 => {
                let at = rng.below(b.len());
                let bytes = inserts[rng.below(inserts.len())];
                b.splice(at..at, bytes.iter().copied());
            }
            _ => b = b[rng.below(b.len())..].to_vec(),
        }
        let path = dir.join("text.txt");
        fs::write(&path, &b).unwrap();
        let name = path.to_string_lossy().into_owned();
        match alpha_native::args::load_corpus(&name, None, &alpha_core::Serial) {
            Ok((tok, ids)) => {
                assert_eq!(ids.len(), std::str::from_utf8(&b).unwrap().chars().count());
                assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
            }
            Err(e) => {
                let e = format!("{e:#}");
                assert!(e.contains(&name) && !e.contains('\n'), "case {case}: {e}");
            }
        }
        // A resumed run encodes the text with the checkpoint's vocabulary.
        if let Ok(text) = std::str::from_utf8(&b) {
            if let Err(e) = vocab.encode_to_vec(text) {
                assert!(e.to_string().contains("is not in the model's vocabulary"), "case {case}: {e}");
            }
        }
        if case % BINARY_EVERY == 0 {
            let args = [
                "train",
                "--data",
                "text.txt",
                "--iters",
                "1",
                "--block",
                "8",
                "--batch",
                "2",
                "--layers",
                "1",
                "--heads",
                "1",
                "--embd",
                "8",
                "--out",
                "o",
                "--overwrite",
            ];
            let o = alpha_native().args(args).args(QUIET).current_dir(&dir).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            match o.status.code() {
                Some(0) => {}
                Some(1) => assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1 && err.contains("text.txt"), "case {case}: {err}"),
                other => panic!("case {case}: exit {other:?}, {err}"),
            }
        }
    }
}
