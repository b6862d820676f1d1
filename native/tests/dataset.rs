//! `alpha-native prepare` and `train --dataset`: nanoGPT's layout written and read (also as
//! nanoGPT's prepare.py and llm.c write it), exact resumes, bad datasets as one-line errors, and
//! resident memory bounded whatever the dataset's size.

mod common;
use common::*;
use std::fs;
use std::path::Path;

/// A tokenizer of 300 tokens learned from `text.txt`, at `dir/tok.json`.
fn tokenizer(dir: &Path) {
    text_file(dir);
    assert_ok(&run(dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "tok.json"]));
}

fn ids_of(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect()
}

fn encode(dir: &Path, text_file: &str) -> Vec<u32> {
    let o = run(dir, &["tokenizer", "encode", "--tokenizer", "tok.json", "--text", text_file]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn prepare_writes_the_encoded_documents_the_same_for_any_thread_count() {
    let dir = workdir("dataset-prepare");
    tokenizer(&dir);
    let jsonl = "{\"text\": \"First document.\\nWith two lines.\"}\n\n{\"text\": \"Second, naïve 🦀\", \"id\": 2}\n";
    fs::write(dir.join("docs.jsonl"), jsonl).unwrap();
    for threads in ["1", "2"] {
        let out = format!("ds{threads}");
        assert_ok(&run(&dir, &["prepare", "--data", "text.txt", "docs.jsonl", "--tokenizer", "tok.json", "--out", &out, "--threads", threads]));
    }
    for file in ["train.bin", "val.bin", "meta.json"] {
        assert_eq!(fs::read(dir.join("ds1").join(file)).unwrap(), fs::read(dir.join("ds2").join(file)).unwrap(), "{file}");
    }
    // The stream: the text file's ids, <|endoftext|> (id 0), each JSONL document's, each
    // followed by <|endoftext|>; its last tenth is val.bin.
    fs::write(dir.join("doc1.txt"), "First document.\nWith two lines.").unwrap();
    fs::write(dir.join("doc2.txt"), "Second, naïve 🦀").unwrap();
    let mut want = encode(&dir, "text.txt");
    for doc in ["doc1.txt", "doc2.txt"] {
        want.push(0);
        want.extend(encode(&dir, doc));
    }
    want.push(0);
    let (train, val) = (ids_of(&fs::read(dir.join("ds1/train.bin")).unwrap()), ids_of(&fs::read(dir.join("ds1/val.bin")).unwrap()));
    assert_eq!([&train[..], &val[..]].concat(), want);
    assert_eq!(val.len(), (want.len() as f64 * 0.1).round() as usize);
    let meta: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("ds1/meta.json")).unwrap()).unwrap();
    assert_eq!((meta["dtype"].as_str(), meta["train_tokens"].as_u64(), meta["eot"].as_u64()), (Some("uint16"), Some(train.len() as u64), Some(0)));
    assert_eq!(meta["tokenizer"]["model"]["type"], "BPE");

    expect_error(&dir, &["prepare", "--data", "text.txt", "--tokenizer", "tok.json", "--out", "ds1"], "exists; pass --force");
    fs::write(dir.join("bad.jsonl"), "{\"text\": \"ok\"}\n{\"title\": \"no text\"}\n").unwrap();
    expect_error(&dir, &["prepare", "--data", "bad.jsonl", "--tokenizer", "tok.json", "--out", "bad"], "line 2 has no \"text\" string");
    expect_error(&dir, &["prepare", "--data", "text.txt", "--tokenizer", "tok.json", "--out", "x", "--val-fraction", "1"], "--val-fraction");
}

#[test]
fn train_on_a_dataset_resumes_exactly_and_reads_nanogpt_and_llmc_layouts() {
    let dir = workdir("dataset-train");
    tokenizer(&dir);
    assert_ok(&run(&dir, &["prepare", "--data", "text.txt", "--tokenizer", "tok.json", "--out", "ds"]));
    let common = ["--dataset", "ds", "--iters", "6", "--lr-decay-iters", "6", "--warmup", "2", "--log-interval", "1", "--eval-interval", "3"];
    let train_run = |extra: &[&str]| {
        let mut args = vec!["train", "--threads", "2"];
        args.extend(TINY);
        args.extend(QUIET);
        args.extend(extra);
        assert_ok(&run(&dir, &args));
    };
    train_run(&[&common[..], &["--out", "whole", "--metrics", "whole.jsonl"]].concat());
    let mut first = common.to_vec();
    first[3] = "4";
    train_run(&[&first[..], &["--out", "split", "--metrics", "split.jsonl"]].concat());
    let resume = ["train", "--resume", "split/ckpt.safetensors", "--iters", "6", "--metrics", "split.jsonl", "--log-interval", "1"];
    assert_ok(&run(&dir, &[&resume[..], QUIET].concat()));
    assert_eq!(train_losses(&dir.join("whole.jsonl")), train_losses(&dir.join("split.jsonl")));
    assert!(fs::read_to_string(dir.join("whole/run.toml")).unwrap().contains("dataset = \"ds\""));
    // eval --dataset measures the val split.
    let o = run(&dir, &["eval", "--checkpoint", "whole/ckpt.safetensors", "--dataset", "ds", "--block", "16"]);
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let val_tokens = fs::metadata(dir.join("ds/val.bin")).unwrap().len() as u64 / 2;
    assert_eq!(r["windows"].as_u64().unwrap(), (val_tokens - 1) / 16, "{r}");
    assert!(r["loss"].as_f64().unwrap().is_finite() && r["bpb"].as_f64().unwrap() > 0.0);

    // nanoGPT's prepare.py: the same two files without meta.json; the tokenizer is named.
    fs::create_dir_all(dir.join("nanogpt")).unwrap();
    for f in ["train.bin", "val.bin"] {
        fs::copy(dir.join("ds").join(f), dir.join("nanogpt").join(f)).unwrap();
    }
    let nano = ["--dataset", "nanogpt", "--iters", "2", "--out", "nano"];
    expect_error(&dir, &[&["train"][..], &nano].concat(), "does not record its tokenizer: name it with --tokenizer");
    train_run(&[&nano[..], &["--tokenizer", "tok.json"]].concat());

    // llm.c's shards: a header (magic, version 1, count), then uint16 ids; train and val by
    // the pattern, several train shards read as one stream.
    fs::create_dir_all(dir.join("llmc")).unwrap();
    let ids = fs::read(dir.join("ds/train.bin")).unwrap();
    let shard = |name: &str, body: &[u8]| {
        let mut header = [0i32; 256];
        header[..3].copy_from_slice(&[20240520, 1, (body.len() / 2) as i32]);
        let mut bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend_from_slice(body);
        fs::write(dir.join("llmc").join(name), bytes).unwrap();
    };
    let half = ids.len() / 4 * 2;
    shard("tiny_train_000001.bin", &ids[..half]);
    shard("tiny_train_000002.bin", &ids[half..]);
    shard("tiny_val_000000.bin", &fs::read(dir.join("ds/val.bin")).unwrap());
    train_run(&["--dataset", "llmc/tiny_train_*.bin", "--tokenizer", "tok.json", "--iters", "2", "--out", "llmc-run"]);
    let o = run(&dir, &["info", "--dataset", "llmc/tiny_train_*.bin", "--tokenizer", "tok.json"]);
    assert_ok(&o);
}

#[test]
fn bad_datasets_are_one_line_errors() {
    let dir = workdir("dataset-errors");
    tokenizer(&dir);
    fs::create_dir_all(dir.join("odd")).unwrap();
    fs::write(dir.join("odd/train.bin"), [1u8, 0, 2]).unwrap();
    fs::write(dir.join("odd/val.bin"), [1u8, 0]).unwrap();
    let train = |spec: &str| vec!["train".to_string(), "--dataset".into(), spec.into(), "--tokenizer".into(), "tok.json".into(), "--iters".into(), "1".into()];
    let expect = |spec: &str, needle: &str| expect_error(&dir, &train(spec).iter().map(String::as_str).collect::<Vec<_>>(), needle);
    expect("odd", "train.bin has 3 bytes, not a whole number of uint16 ids");
    fs::create_dir_all(dir.join("beyond")).unwrap();
    let ids: Vec<u8> = (0..500u16).flat_map(|i| (i % 300).to_le_bytes()).collect();
    fs::write(dir.join("beyond/train.bin"), &ids).unwrap();
    let mut bad = ids.clone();
    bad[2 * 123..2 * 124].copy_from_slice(&300u16.to_le_bytes());
    fs::write(dir.join("beyond/val.bin"), &bad).unwrap();
    expect("beyond", "the val split holds token id 300 at token 123, past the tokenizer's 300 tokens");
    fs::create_dir_all(dir.join("empty")).unwrap();
    fs::write(dir.join("empty/train.bin"), &ids).unwrap();
    fs::write(dir.join("empty/val.bin"), []).unwrap();
    expect("empty", "the val split is empty");
    expect("missing-dir", "is neither a directory nor a pattern");
    expect("nothing/*_train_*.bin", "cannot read nothing");
    fs::create_dir_all(dir.join("shards")).unwrap();
    fs::write(dir.join("shards/a_train_1.bin"), [0u8; 2000]).unwrap();
    fs::write(dir.join("shards/a_val_1.bin"), [0u8; 2000]).unwrap();
    expect("shards/a_train_*.bin", "is not an llm.c shard");
}

/// A dataset of several GB trains with a few hundred MB of anonymous memory: the files are
/// read through memory maps (file pages, which the kernel may drop), never copied.
#[test]
fn resident_memory_stays_bounded_on_a_dataset_larger_than_it() {
    let dir = workdir("dataset-large");
    tokenizer(&dir);
    let big = dir.join("big");
    fs::create_dir_all(&big).unwrap();
    // 2.5 GB of random ids below 300 (written, not sparse), and a small val split.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut block = vec![0u8; 1 << 24];
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(fs::File::create(big.join("train.bin")).unwrap());
        for _ in 0..150 {
            for c in block.chunks_exact_mut(2) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                c.copy_from_slice(&((state % 300) as u16).to_le_bytes());
            }
            f.write_all(&block).unwrap();
        }
        f.flush().unwrap();
    }
    fs::write(big.join("val.bin"), &block[..1 << 16]).unwrap();
    let size = fs::metadata(big.join("train.bin")).unwrap().len();
    assert!(size > 2_500_000_000, "{size}");
    let mut args = vec!["train", "--dataset", "big", "--tokenizer", "tok.json", "--iters", "30", "--threads", "2", "--out", "big-run", "--eval-iters", "2"];
    args.extend(TINY);
    let mut child = alpha_native().args(&args).current_dir(&dir).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    loop {
        if let Ok(status) = fs::read_to_string(&status_path) {
            let anon = status.lines().find_map(|l| l.strip_prefix("RssAnon:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            peak_kib = peak_kib.max(anon.unwrap_or(0));
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(peak_kib > 0 && peak_kib < 300 * 1024, "peak RssAnon {peak_kib} kB with a {size}-byte dataset");
    fs::remove_dir_all(&big).unwrap();
}

/// A stretch of text with no place to cut it longer than `prepare`'s 32 MiB blocks (one piece
/// of letters here) is tokenized whole, as `tokenizer encode` does: the merge across the
/// block's end ("t" + "h") is made, where a cut there would leave two tokens.
#[test]
fn prepare_never_cuts_a_piece_longer_than_its_blocks() {
    let dir = workdir("dataset-long-piece");
    tokenizer(&dir);
    fs::write(dir.join("sample.txt"), "QthQ\n").unwrap();
    let sample = encode(&dir, "sample.txt");
    let (q, th, newline) = (sample[0], sample[1], sample[3]);
    assert_eq!(sample, [q, th, q, newline], "the test needs Q to merge with nothing and t+h to merge");
    let block = 32 << 20;
    let text = ["Q".repeat(block - 1), "th".into(), "Q".repeat(10), "\n".into()].concat();
    fs::write(dir.join("long.txt"), &text).unwrap();
    assert_ok(&run(&dir, &["prepare", "--data", "long.txt", "--tokenizer", "tok.json", "--out", "ds"]));
    let ids = [ids_of(&fs::read(dir.join("ds/train.bin")).unwrap()), ids_of(&fs::read(dir.join("ds/val.bin")).unwrap())].concat();
    let want: Vec<u32> = [vec![q; block - 1], vec![th], vec![q; 10], vec![newline, 0]].concat();
    assert!(ids == want, "{} ids, {} wanted; around the block's end: {:?}", ids.len(), want.len(), &ids[block - 3..(block + 3).min(ids.len())]);
    fs::remove_dir_all(&dir).unwrap();
}

/// `prepare` refuses what `train` could not use or what is not text: no validation split, a
/// JSONL line holding an escaped lone surrogate (named by its line, and as what it is).
#[test]
fn prepare_refuses_an_empty_validation_split_and_lone_surrogates() {
    let dir = workdir("dataset-refusals");
    tokenizer(&dir);
    expect_error(&dir, &["prepare", "--data", "text.txt", "--tokenizer", "tok.json", "--out", "ds", "--val-fraction", "0"], "--val-fraction must be above 0");
    assert!(!dir.join("ds").exists());
    fs::write(dir.join("s.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"fine too\"}\n{\"text\": \"a\\ud800\"}\n").unwrap();
    expect_error(
        &dir,
        &["prepare", "--data", "s.jsonl", "--tokenizer", "tok.json", "--out", "ds"],
        "line 3 is not JSON: column 18: a \\u escape of a lone UTF-16 surrogate",
    );
}

/// Ctrl-C or SIGTERM stops `prepare` after the block it is tokenizing, a second signal at
/// once: either way its temporary file is gone and nothing is written to --out.
#[test]
fn prepare_stopped_by_a_signal_writes_nothing_and_leaves_no_temporary_file() {
    let dir = workdir("dataset-signal");
    tokenizer(&dir);
    let corpus = include_str!("../assets/shakespeare.txt");
    fs::write(dir.join("big.txt"), corpus.repeat(40)).unwrap();
    for (signals, code) in [(&["TERM"][..], 1), (&["TERM", "INT"][..], 130)] {
        let out = format!("ds-{}", signals.len());
        let child = alpha_native()
            .args(["prepare", "--data", "big.txt", "--tokenizer", "tok.json", "--out", &out])
            .current_dir(&dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(700));
        // Two signals are sent back to back, before the block in hand can end.
        let kill: Vec<String> = signals.iter().map(|signal| format!("kill -{signal} {}", child.id())).collect();
        assert!(std::process::Command::new("sh").args(["-c", &kill.join("; ")]).status().unwrap().success());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{err}");
        assert!(err.contains(&format!("nothing was written to {out}")), "{err}");
        let left: Vec<_> = fs::read_dir(dir.join(&out)).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
