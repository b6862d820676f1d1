//! Checkpoints: safetensors bytes a PyTorch user can load into a nanoGPT-style model, the
//! same on every frontend (native files, browser downloads).
//!
//! Tensors use nanoGPT's `state_dict` names and `nn.Linear` layout (`lm_head` is tied to
//! `transformer.wte.weight` and omitted). AdamW moments are stored as
//! `optimizer.exp_avg.<name>` / `optimizer.exp_avg_sq.<name>`. The header's `__metadata__`
//! holds JSON strings: `format`, `config` (a [`GptConfig`]), `tokenizer` (`{"type": "char",
//! "chars": ...}`, or `{"type": "bpe", "tokenizer": {...}}` holding a Hugging Face
//! `tokenizer.json`: a checkpoint needs no other file), and, for a resumable
//! checkpoint, `train` (step, RNG state and the run's settings), and `crc32`: a JSON object
//! giving every tensor's CRC-32 (IEEE) of its bytes, checked on every load. Files of format
//! `alpha-gpt/2` must carry it; those from before (`alpha-gpt/1`) and files without a format
//! (other tools') load without it, as unverified ([`Checkpoint::verified`]).
//!
//! Saving streams: [`write()`] reads the arenas once for the checksums (refusing any value that
//! is not finite), emits the header, then the tensors straight from the arenas in small
//! chunks, so nothing the size of the model is copied. Loading checks the header against the
//! config before it allocates: a config that implies other tensors than the file holds is an
//! error, so no header can make it allocate more than the file's own size.

use crate::plan::try_vec;
use crate::plan::{param_kinds, tensor_count, ParamInfo, Plan, Span};
use crate::settings::RunSettings;
use crate::tokenizer::{hf, CharTokenizer, Tokenizer};
use crate::train::LossScaleState;
use crate::GptConfig;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use safetensors::tensor::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Identifies the file layout in `__metadata__.format`: from version 2 on every file carries
/// its tensors' checksums, and a file of this format without them is refused.
pub const FORMAT: &str = "alpha-gpt/2";

/// The format before checksums were required (files with or without `crc32`).
const FORMAT_1: &str = "alpha-gpt/1";

/// The largest header the safetensors readers accept (100 MB): a checkpoint whose header would
/// be larger (a tokenizer of millions of long tokens) is refused before anything is written.
pub const MAX_HEADER_BYTES: usize = 100_000_000;

/// Room in the header for everything but the tokenizer: per tensor (name, dtype, shape,
/// offsets, checksum), and for the config and the training state.
const HEADER_BYTES_PER_TENSOR: usize = 320;
const HEADER_BYTES_OTHER: usize = 16 << 10;

/// `__metadata__.tokenizer`: the tokenizer as JSON.
fn tokenizer_json(tokenizer: &Tokenizer) -> String {
    match tokenizer {
        // Keys in this order, as files before BPE had them (the same bytes for the same run).
        Tokenizer::Char(t) => format!("{{\"type\":\"char\",\"chars\":{}}}", Value::String(t.chars().iter().collect())),
        Tokenizer::Bpe(t) => {
            let spec: Value = serde_json::from_str(&hf::to_tokenizer_json(t)).expect("the writer writes JSON");
            json!({"type": "bpe", "tokenizer": spec}).to_string()
        }
    }
}

/// The tokenizer of `__metadata__.tokenizer`.
fn tokenizer_from_json(text: &str) -> Result<Tokenizer, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    match value.get("type").and_then(Value::as_str) {
        Some("char") => {
            let chars: Vec<char> = value.get("chars").and_then(Value::as_str).ok_or("a char tokenizer needs its chars")?.chars().collect();
            CharTokenizer::new(chars).map(Tokenizer::from).map_err(|e| e.to_string())
        }
        Some("bpe") => {
            let spec = value.get("tokenizer").ok_or("a bpe tokenizer needs its tokenizer.json")?;
            hf::from_tokenizer_json(&spec.to_string()).map(Tokenizer::from).map_err(|e| e.to_string())
        }
        other => Err(format!("type {other:?} is not supported (\"char\" or \"bpe\")")),
    }
}

/// `__metadata__.train`: where a run stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps taken.
    pub step: u64,
    /// The batch generator's state, as a decimal string (exact in any JSON reader).
    pub rng_state: String,
    /// The run's settings.
    pub settings: RunSettings,
    /// The lowest validation loss so far, where the run keeps its best checkpoint only
    /// (`train --save best`): a resumed run saves again only below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_val_loss: Option<f64>,
    /// Dynamic loss scaling's state, where the run trains with f16 products on a GPU: a
    /// resumed run continues with the same scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScaleState>,
}

impl TrainState {
    /// The batch generator the run saved.
    pub fn rng(&self) -> Result<crate::Rng, CheckpointError> {
        let state = self.rng_state.parse().map_err(|_| CheckpointError::Invalid(format!("train.rng_state {:?} is not an integer", self.rng_state)))?;
        Ok(crate::Rng::from_state(state))
    }
}

/// Everything in a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Model shape.
    pub config: GptConfig,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Parameters in plan order.
    pub params: Vec<f32>,
    /// AdamW moments `(exp_avg, exp_avg_sq)` in plan order, with the training state.
    pub optimizer: Option<(Vec<f32>, Vec<f32>, TrainState)>,
    /// Whether every tensor read matched a checksum the file carries (false for files from
    /// before checksums and other tools' files: nothing verified their bytes).
    pub verified: bool,
}

/// Why bytes could not be loaded as a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointError {
    /// Not a checkpoint of this format, or one whose header contradicts itself.
    Invalid(String),
    /// A tensor's bytes do not match the checksum the header gives for them.
    Corrupt {
        /// The tensor.
        tensor: String,
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// The machine could not give the memory to hold the tensors.
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
}

impl core::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CheckpointError::Invalid(why) => write!(f, "not a valid Alpha checkpoint: {why}"),
            CheckpointError::Corrupt { tensor, stored, computed } => {
                write!(f, "corrupt: tensor {tensor} does not match its checksum (CRC-32 {computed:08x}, the header says {stored:08x})")
            }
            CheckpointError::OutOfMemory { bytes } => write!(f, "too large to load: {bytes} bytes of tensors could not be allocated"),
        }
    }
}

impl core::error::Error for CheckpointError {}

/// Why a checkpoint was not written.
#[derive(Clone, Debug, PartialEq)]
pub enum SaveError<E> {
    /// A parameter or optimizer moment is NaN or infinite: such a model is never saved.
    NonFinite {
        /// The tensor that holds it.
        tensor: String,
        /// Its index in the tensor (row-major).
        index: usize,
        /// The value.
        value: f32,
    },
    /// The arenas do not match the config (a caller's mistake).
    Shape(String),
    /// The header would be larger than safetensors readers accept ([`MAX_HEADER_BYTES`]).
    HeaderTooLarge {
        /// Its size.
        bytes: usize,
        /// The tokenizer's part of it.
        tokenizer_bytes: usize,
    },
    /// The sink failed.
    Write(E),
}

impl<E: core::fmt::Display> core::fmt::Display for SaveError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SaveError::NonFinite { tensor, index, value } => write!(f, "the model is not finite ({tensor}[{index}] is {value})"),
            SaveError::Shape(why) => f.write_str(why),
            SaveError::HeaderTooLarge { bytes, tokenizer_bytes } => write!(
                f,
                "a checkpoint's header would be {bytes} bytes ({tokenizer_bytes} of them the tokenizer), more than the {MAX_HEADER_BYTES} that safetensors readers accept: the tokenizer is too large to save with a model"
            ),
            SaveError::Write(e) => write!(f, "{e}"),
        }
    }
}

impl<E: core::fmt::Display + core::fmt::Debug> core::error::Error for SaveError<E> {}

fn shape_of(info: &ParamInfo) -> Vec<usize> {
    if info.ndim() == 2 {
        info.shape.to_vec()
    } else {
        vec![info.shape[0]]
    }
}

/// Floats of a save chunk: 16 KiB of bytes on the stack.
const CHUNK: usize = 4096;

/// Calls `f` with the little-endian bytes of `xs`, at most [`CHUNK`] floats at a time.
fn le_chunks<E>(xs: &[f32], mut f: impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
    let mut buf = [0u8; 4 * CHUNK];
    for chunk in xs.chunks(CHUNK) {
        for (dst, x) in buf.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&x.to_le_bytes());
        }
        f(&buf[..4 * chunk.len()])?;
    }
    Ok(())
}

/// The CRC-32 of the little-endian bytes of `xs`.
fn crc32(xs: &[f32]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let _ = le_chunks::<core::convert::Infallible>(xs, |b| {
        h.update(b);
        Ok(())
    });
    h.finalize()
}

/// The tensor-name prefixes of the arenas in a file: the parameters, then (resumable
/// checkpoints) the two AdamW moments.
const ARENA_PREFIXES: [&str; 3] = ["", "optimizer.exp_avg.", "optimizer.exp_avg_sq."];

/// Writes a checkpoint to `sink`, in order: `params` (plan order) and, for a resumable one,
/// the AdamW moments with the training state. Reads every arena once for the checksums
/// before the header is written, then again to stream the tensors; a value that is not
/// finite stops it before anything is written.
pub fn write<E>(
    config: GptConfig,
    tokenizer: &Tokenizer,
    params: &[f32],
    optimizer: Option<(&[f32], &[f32], &TrainState)>,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), SaveError<E>> {
    write_within(config, tokenizer, params, optimizer, sink, MAX_HEADER_BYTES)
}

/// [`write()`] with headers of at most `max_header` bytes.
fn write_within<E>(
    config: GptConfig,
    tokenizer: &Tokenizer,
    params: &[f32],
    optimizer: Option<(&[f32], &[f32], &TrainState)>,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    max_header: usize,
) -> Result<(), SaveError<E>> {
    // Any batch shape gives the parameter layout.
    let plan = Plan::new(config, 1, 1).map_err(|e| SaveError::Shape(e.to_string()))?;
    let mut arenas = vec![(ARENA_PREFIXES[0], params)];
    if let Some((m, v, _)) = optimizer {
        arenas.extend([(ARENA_PREFIXES[1], m), (ARENA_PREFIXES[2], v)]);
    }
    for (prefix, arena) in &arenas {
        if arena.len() != plan.params_len() {
            return Err(SaveError::Shape(format!("the {prefix}arena has {} elements, the model has {}", arena.len(), plan.params_len())));
        }
    }
    let mut header = Map::new();
    let mut checksums = Map::new();
    let mut offset = 0usize;
    for (prefix, arena) in &arenas {
        for info in plan.params() {
            let data = &arena[info.span.range()];
            let name = format!("{prefix}{info}");
            if let Some(index) = data.iter().position(|x| !x.is_finite()) {
                return Err(SaveError::NonFinite { tensor: name, index, value: data[index] });
            }
            checksums.insert(name.clone(), crc32(data).into());
            let end = offset + 4 * data.len();
            header.insert(name, json!({"dtype": "F32", "shape": shape_of(&info), "data_offsets": [offset, end]}));
            offset = end;
        }
    }
    let mut meta = Map::new();
    meta.insert("format".into(), FORMAT.into());
    meta.insert("config".into(), to_json(&config).into());
    // A larger vocabulary is padding (`Plan::with_classes`).
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(SaveError::Shape(format!("the tokenizer has {} tokens, the model's vocabulary only {}", tokenizer.vocab_size(), config.vocab_size)));
    }
    meta.insert("tokenizer".into(), tokenizer_json(tokenizer).into());
    if let Some((_, _, state)) = optimizer {
        meta.insert("train".into(), to_json(state).into());
    }
    meta.insert("crc32".into(), to_json(&checksums).into());
    header.insert("__metadata__".into(), Value::Object(meta));
    let mut text = to_json(&header);
    if text.len() > max_header {
        let tokenizer_bytes = header["__metadata__"]["tokenizer"].to_string().len();
        return Err(SaveError::HeaderTooLarge { bytes: text.len(), tokenizer_bytes });
    }
    // safetensors pads the header with spaces so that the data starts 8-byte aligned.
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    sink(&(text.len() as u64).to_le_bytes()).map_err(SaveError::Write)?;
    sink(text.as_bytes()).map_err(SaveError::Write)?;
    for (_, arena) in &arenas {
        for info in plan.params() {
            le_chunks(&arena[info.span.range()], &mut *sink).map_err(SaveError::Write)?;
        }
    }
    Ok(())
}

/// Whether a checkpoint of `config` with `tokenizer` fits in a safetensors header: checked
/// when a run starts, so that no run trains for hours toward a checkpoint it cannot write
/// ([`write()`] checks the exact header again). The tokenizer is measured exactly, the rest
/// bounded from above.
pub fn check_header_room(config: GptConfig, tokenizer: &Tokenizer) -> Result<(), SaveError<core::convert::Infallible>> {
    header_room(config, tokenizer, MAX_HEADER_BYTES)
}

/// [`check_header_room`] for headers of at most `max_header` bytes.
fn header_room(config: GptConfig, tokenizer: &Tokenizer, max_header: usize) -> Result<(), SaveError<core::convert::Infallible>> {
    let tokenizer_bytes = Value::String(tokenizer_json(tokenizer)).to_string().len();
    let tensors = ARENA_PREFIXES.len().saturating_mul(tensor_count(&config));
    let bytes = tokenizer_bytes.saturating_add(tensors.saturating_mul(HEADER_BYTES_PER_TENSOR)).saturating_add(HEADER_BYTES_OTHER);
    if bytes > max_header {
        return Err(SaveError::HeaderTooLarge { bytes, tokenizer_bytes });
    }
    Ok(())
}

/// The safetensors bytes of a checkpoint (see [`write()`]).
pub fn to_bytes(
    config: GptConfig,
    tokenizer: &Tokenizer,
    params: &[f32],
    optimizer: Option<(&[f32], &[f32], &TrainState)>,
) -> Result<Vec<u8>, SaveError<core::convert::Infallible>> {
    let mut bytes = Vec::new();
    write(config, tokenizer, params, optimizer, &mut |b: &[u8]| {
        bytes.extend_from_slice(b);
        Ok(())
    })?;
    Ok(bytes)
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("plain structs always serialise")
}

/// Reads and validates checkpoint bytes: the config must imply exactly the file's tensors,
/// each with its shape; the tokenizer must match the vocabulary size; every tensor must match
/// its checksum where the file has them. Nothing is allocated for the tensors before all of
/// that holds.
pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    read(bytes, true)
}

/// [`from_bytes`] for evaluating, sampling, exporting or fine-tuning: the whole file is
/// validated but for the AdamW moments' checksums, and only the weights are read (a third of
/// a training checkpoint; from a memory map the moments' pages are never touched). The
/// checkpoint comes back without its training state.
pub fn weights_from_bytes(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    read(bytes, false)
}

fn read(bytes: &[u8], with_state: bool) -> Result<Checkpoint, CheckpointError> {
    let bad = CheckpointError::Invalid;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("{e} (truncated or corrupt file?)")))?;
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().as_ref().ok_or_else(|| bad("no __metadata__ in the header".into()))?;
    let field = |key: &str| meta.get(key).ok_or_else(|| bad(format!("__metadata__ has no \"{key}\"")));
    // From format 2 on a file carries its checksums; earlier and foreign files may not.
    let checksums_required = match meta.get("format").map(String::as_str) {
        Some(FORMAT) => true,
        Some(FORMAT_1) | None => false,
        Some(other) => return Err(bad(format!("format {other:?} is not supported ({FORMAT:?}, or {FORMAT_1:?} from before checksums were required)"))),
    };
    if checksums_required && !meta.contains_key("crc32") {
        return Err(bad(format!("it has no crc32 (every tensor's checksum), which a file of format {FORMAT:?} carries: the header was altered")));
    }
    let config: GptConfig = serde_json::from_str(field("config")?).map_err(|e| bad(format!("config: {e}")))?;
    config.validate().map_err(|e| bad(format!("config: {e}")))?;
    let tokenizer = tokenizer_from_json(field("tokenizer")?).map_err(|e| bad(format!("tokenizer: {e}")))?;
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(bad(format!("the tokenizer has {} tokens but vocab_size is only {}", tokenizer.vocab_size(), config.vocab_size)));
    }
    let state = match meta.get("train") {
        None => None,
        Some(train) => {
            let mut state: TrainState = serde_json::from_str(train).map_err(|e| bad(format!("train: {e}")))?;
            // The model is the file's (older files store no shape in their settings).
            state.settings = state.settings.with_model(config);
            state.rng()?;
            state.settings.validate(|f| format!("train.settings.{f}")).map_err(bad)?;
            Some(state)
        }
    };
    let prefixes = &ARENA_PREFIXES[..if state.is_some() { 3 } else { 1 }];
    // The tensors the config implies, counted before any is looked up (a config may claim
    // millions of layers; the file's own count is bounded by its size).
    let expected = prefixes.len().saturating_mul(tensor_count(&config));
    // A GPT-2 file may name its tied head too (nanoGPT's state_dict does).
    let tied_head = usize::from(config.arch.is_gpt2() && tensors.tensor("lm_head.weight").is_ok());
    if tensors.len() != expected + tied_head {
        let names = tensors.names();
        let unknown = names.iter().find(|n| !(is_known(&config, prefixes, n) || tied_head == 1 && **n == "lm_head.weight"));
        return Err(bad(match unknown {
            Some(n) => format!("unexpected tensor {n}"),
            None => format!("{} tensors, but its config implies {}", tensors.len(), expected + tied_head),
        }));
    }
    // Within the address space: the config passed `validate`, and its tensors are the file's.
    let plan = Plan::new(config, 1, 1).map_err(|e| bad(format!("config: {e}")))?;
    let checksums: Option<BTreeMap<String, u32>> = match meta.get("crc32") {
        None => None,
        Some(c) => Some(serde_json::from_str(c).map_err(|e| bad(format!("crc32: {e}")))?),
    };
    for (i, prefix) in prefixes.iter().enumerate() {
        for info in plan.params() {
            let name = format!("{prefix}{info}");
            let t = tensors.tensor(&name).map_err(|_| bad(format!("tensor {name} is missing")))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape_of(&info).as_slice() {
                return Err(bad(format!("tensor {name} is {:?} {:?}, expected F32 {:?}", t.dtype(), t.shape(), shape_of(&info))));
            }
            if let Some(sums) = checksums.as_ref().filter(|_| i == 0 || with_state) {
                let stored = *sums.get(&name).ok_or_else(|| bad(format!("crc32 has no checksum for tensor {name}")))?;
                let computed = crc32fast::hash(t.data());
                if computed != stored {
                    return Err(CheckpointError::Corrupt { tensor: name, stored, computed });
                }
            }
        }
    }
    if let Some(extra) = checksums.iter().flat_map(|c| c.keys()).find(|n| tensors.tensor(n).is_err()) {
        return Err(bad(format!("crc32 names tensor {extra}, which the file does not have")));
    }
    let read_arena = |prefix: &str| -> Result<Vec<f32>, CheckpointError> {
        let mut arena = try_vec("parameters", plan.params_len(), 0f32).map_err(|_| CheckpointError::OutOfMemory { bytes: 4 * plan.params_len() })?;
        for info in plan.params() {
            let t = tensors.tensor(&format!("{prefix}{info}")).map_err(|e| bad(e.to_string()))?;
            for (dst, src) in arena[info.span.range()].iter_mut().zip(t.data().chunks_exact(4)) {
                *dst = f32::from_le_bytes(src.try_into().expect("chunks of 4"));
            }
        }
        Ok(arena)
    };
    let params = read_arena(prefixes[0])?;
    let optimizer = match state.filter(|_| with_state) {
        None => None,
        Some(state) => Some((read_arena(prefixes[1])?, read_arena(prefixes[2])?, state)),
    };
    Ok(Checkpoint { config, tokenizer, params, optimizer, verified: checksums.is_some() })
}

/// Whether `name` is a tensor of a model of `config` under one of `prefixes`, read from the
/// name itself (no walk over the config's tensors, whose number the file does not bound).
fn is_known(config: &GptConfig, prefixes: &[&str], name: &str) -> bool {
    let Some(base) = prefixes.iter().rev().find_map(|p| name.strip_prefix(p)) else { return false };
    let [before, block, after] = param_kinds(config);
    let named = |kind, layer| ParamInfo { kind, layer, span: Span::default(), shape: [0, 0] }.to_string();
    if before.iter().chain(after).any(|&k| named(k, None) == base) {
        return true;
    }
    // Block tensors: the name of layer 0's with the layer number replaced.
    block.iter().any(|&k| {
        let zero = named(k, Some(0));
        let (head, tail) = zero.split_once(".0.").expect("block tensor names hold their layer");
        let Some((layer, rest)) = base.strip_prefix(head).and_then(|r| r.strip_prefix('.')).and_then(|r| r.split_once('.')) else { return false };
        rest == tail && layer.parse::<usize>().is_ok_and(|l| l < config.n_layer && l.to_string() == layer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn abc() -> Tokenizer {
        Tokenizer::from(CharTokenizer::new(vec!['a', 'b', 'c']).unwrap())
    }

    fn tiny() -> (GptConfig, Vec<f32>) {
        let config = GptConfig::gpt2(3, 4, 1, 1, 2);
        let n = Plan::new(config, 1, 1).unwrap().params_len();
        (config, (0..n).map(|i| i as f32 * 0.5 - 3.0).collect())
    }

    #[test]
    fn bytes_round_trip_and_bad_bytes_are_errors() {
        let (config, params) = tiny();
        let bytes = to_bytes(config, &abc(), &params, None).unwrap();
        let back = from_bytes(&bytes).unwrap();
        assert_eq!((back.config, back.tokenizer, back.params), (config, abc(), params.clone()));
        assert!(back.optimizer.is_none());
        assert!(to_bytes(config, &abc(), &params[1..], None).unwrap_err().to_string().contains("arena has"));
        let err = from_bytes(&bytes[..bytes.len() / 2]).unwrap_err();
        assert!(err.to_string().starts_with("not a valid Alpha checkpoint: "), "{err}");
    }

    /// The writer's bytes are what the safetensors crate itself reads, header alignment and
    /// metadata included.
    #[test]
    fn the_streamed_file_is_plain_safetensors() {
        let (config, params) = tiny();
        let bytes = to_bytes(config, &abc(), &params, None).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert!(n.is_multiple_of(8));
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let wte = st.tensor("transformer.wte.weight").unwrap();
        assert_eq!((wte.dtype(), wte.shape()), (Dtype::F32, &[3, 2][..]));
        assert_eq!(wte.data(), &bytes[8 + n..8 + n + 24]);
        let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
        let sums: BTreeMap<String, u32> = serde_json::from_str(&header.metadata().as_ref().unwrap()["crc32"]).unwrap();
        assert_eq!(sums.len(), st.len());
        assert_eq!(sums["transformer.wte.weight"], crc32fast::hash(wte.data()));
    }

    /// Every single-byte change of tensor data is caught by its tensor's checksum.
    #[test]
    fn every_flipped_byte_of_tensor_data_is_an_error_naming_the_tensor() {
        let (config, params) = tiny();
        let bytes = to_bytes(config, &abc(), &params, None).unwrap();
        let data_start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for i in data_start..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            match from_bytes(&b) {
                Err(CheckpointError::Corrupt { tensor, .. }) => assert!(tensor.starts_with("transformer."), "{tensor}"),
                other => panic!("byte {i} flipped: {other:?}"),
            }
        }
    }

    #[test]
    fn non_finite_values_are_never_written() {
        let (config, mut params) = tiny();
        let mut written = 0;
        let mut count = |b: &[u8]| -> Result<(), core::convert::Infallible> {
            written += b.len();
            Ok(())
        };
        params[7] = f32::NAN;
        let err = write(config, &abc(), &params, None, &mut count).unwrap_err();
        assert!(matches!(&err, SaveError::NonFinite { tensor, index: 1, value } if tensor == "transformer.wpe.weight" && value.is_nan()), "{err:?}");
        params[7] = 0.5;
        let mut v = params.clone();
        v[0] = f32::INFINITY;
        let state = TrainState { step: 3, rng_state: "1".into(), settings: settings(), best_val_loss: None, loss_scale: None };
        let err = write(config, &abc(), &params, Some((&params, &v, &state)), &mut count).unwrap_err();
        assert_eq!(err.to_string(), "the model is not finite (optimizer.exp_avg_sq.transformer.wte.weight[0] is inf)");
        assert_eq!(written, 0, "nothing is written before every value is checked");
    }

    fn settings() -> RunSettings {
        RunSettings { batch: 1, iters: 5, lr_decay_iters: 5, warmup: 0, seed: 1, ..RunSettings::defaults("x") }
    }

    /// No header is written that the reader's limit refuses: the limit is the safetensors
    /// reader's own, checked exactly by the writer (nothing written) and from above when a
    /// run starts (the bound covers every save of the model).
    #[test]
    fn headers_past_the_readers_limit_are_never_written() {
        let mut bytes = vec![b' '; 8 + MAX_HEADER_BYTES + 8];
        bytes[..8].copy_from_slice(&((MAX_HEADER_BYTES + 8) as u64).to_le_bytes());
        assert!(matches!(SafeTensors::read_metadata(&bytes), Err(safetensors::SafeTensorError::HeaderTooLarge)));
        bytes[..8].copy_from_slice(&(MAX_HEADER_BYTES as u64).to_le_bytes());
        assert!(!matches!(SafeTensors::read_metadata(&bytes[..8 + MAX_HEADER_BYTES]), Err(safetensors::SafeTensorError::HeaderTooLarge)));
        drop(bytes);

        let (config, params) = tiny();
        let state = TrainState { step: 3, rng_state: "1".into(), settings: settings(), best_val_loss: None, loss_scale: None };
        let mut written = 0;
        let mut count = |b: &[u8]| -> Result<(), core::convert::Infallible> {
            written += b.len();
            Ok(())
        };
        let exact = to_bytes(config, &abc(), &params, Some((&params, &params, &state))).unwrap();
        let header = u64::from_le_bytes(exact[..8].try_into().unwrap()) as usize;
        // One byte less room than the header needs: refused, nothing written.
        let err = write_within(config, &abc(), &params, Some((&params, &params, &state)), &mut count, header - 8).unwrap_err();
        assert!(matches!(err, SaveError::HeaderTooLarge { .. }) && written == 0, "{err:?}");
        // The bound at the start covers the header written: it refuses a limit the header
        // passes.
        assert!(matches!(header_room(config, &abc(), header - 8), Err(SaveError::HeaderTooLarge { .. })));
        assert!(check_header_room(config, &abc()).is_ok());
    }

    /// From format 2 on the checksums are part of the format: a header without them (here
    /// "crc32" spelled otherwise) is refused; a file of format 1 without them, or one without
    /// a format (another tool's), loads, marked unverified.
    #[test]
    fn checksums_are_required_from_format_2() {
        let (config, params) = tiny();
        let bytes = to_bytes(config, &abc(), &params, None).unwrap();
        assert!(from_bytes(&bytes).unwrap().verified);
        let edit = |from: &str, to: &str| {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header = core::str::from_utf8(&bytes[8..8 + n]).unwrap().replacen(from, to, 1);
            let mut out = (header.len() as u64).to_le_bytes().to_vec();
            out.extend(header.as_bytes());
            out.extend(&bytes[8 + n..]);
            out
        };
        let renamed = edit("\"crc32\"", "\"brc32\"");
        let err = from_bytes(&renamed).unwrap_err().to_string();
        assert!(err.contains("has no crc32"), "{err}");
        let mut old = edit("alpha-gpt/2", "alpha-gpt/1");
        old = {
            let n = u64::from_le_bytes(old[..8].try_into().unwrap()) as usize;
            let header = core::str::from_utf8(&old[8..8 + n]).unwrap().replacen("\"crc32\"", "\"brc32\"", 1);
            [&(header.len() as u64).to_le_bytes()[..], header.as_bytes(), &old[8 + n..]].concat()
        };
        let loaded = from_bytes(&old).unwrap();
        assert_eq!((loaded.params, loaded.verified), (params.clone(), false));
        let foreign = edit("\"format\":\"alpha-gpt/2\",", "");
        assert!(from_bytes(&foreign).unwrap().verified, "a file without a format but with checksums is checked");
        assert!(from_bytes(&edit("alpha-gpt/2", "alpha-gpt/3")).unwrap_err().to_string().contains("not supported"));
    }
}
