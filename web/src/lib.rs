#![doc = include_str!("../README.md")]

mod engine;
mod options;
#[cfg(target_feature = "atomics")]
mod threads;

use alpha_core::checkpoint::{self, TrainState};
use alpha_core::engine::{estimate_loss, Driver, Engine, Event, Splits};
use alpha_core::rng::{derive_seed, stream};
use alpha_core::run::PRESETS;
use alpha_core::settings::RunSettings;
use alpha_core::tape::Phase;
use alpha_core::tokenizer::bpe::END_OF_TEXT;
use alpha_core::tokenizer::train::WordCounts;
use alpha_core::tokenizer::{self, hf, CharTokenizer, TextStream, Tokenizer};
use alpha_core::train::RunState;
use alpha_core::{data, GptConfig, Plan, Rng};
use options::{camel, Options, TokenizerChoice};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;

/// Installs a panic hook that prints Rust panics to the browser console.
#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
}

/// What `stats()` returns.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Stats {
    backend: &'static str,
    adapter: Option<String>,
    /// The CPU engine's GEMM kernel, which names the WebAssembly build that runs
    /// (`wasm-simd128` or `wasm-relaxed-simd`); none on WebGPU.
    kernel: Option<&'static str>,
    /// Why the page runs on the CPU although WebGPU was allowed, if it does.
    fallback: Option<String>,
    /// The products' arithmetic: "f16" (mixed precision, on WebGPU with shader-f16) or "f32".
    precision: &'static str,
    /// On WebGPU in f32, why not f16.
    precision_fallback: Option<String>,
    /// The CPU engine's threads (1 on WebGPU and in builds without WebAssembly threads).
    threads: usize,
    step: u64,
    /// The step the run trains to (its `iters`).
    iters: u64,
    params: usize,
    vocab: usize,
    /// `"char"` or `"bpe"`.
    tokenizer: &'static str,
    tokens_per_step: usize,
    tokens_per_sec: Option<f64>,
    config: GptConfig,
}

/// A model being trained in the page.
#[wasm_bindgen]
pub struct Trainer {
    config: GptConfig,
    settings: RunSettings,
    tok: Tokenizer,
    tokens: Vec<u32>,
    eval_iters: usize,
    engine: Box<dyn Engine>,
    fallback: Option<String>,
    tokens_per_sec: Option<f64>,
    /// Where the engine computes, for `measurePeak`.
    peak: engine::Peak,
    /// The peak MFU is taken against, GFLOP/s, once measured or set.
    peak_gflops: Option<f64>,
    /// The run's loop (`next`).
    driver: Driver,
    /// The step of the last checkpoint `next` saved, and its bytes.
    saved: Option<(u64, Vec<u8>)>,
}

/// What `next()` resolves to: the action it carried out, as `alpha-native train`'s metrics
/// record it.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "camelCase", rename_all_fields = "camelCase")]
enum Record {
    /// Both splits' mean loss at `step`.
    Eval { step: u64, train: f64, val: f64 },
    /// A sample at `step`.
    Sample { step: u64, text: String },
    /// Step `step` trained: its loss, how long each phase of it took, its tokens per second
    /// and its MFU (against the peak `measurePeak` or `setPeak` gave, if one did).
    Train { step: u64, loss: f64, ms: PhaseMs, tokens_per_sec: f64, mfu: Option<f64> },
    /// A checkpoint of `step` steps was saved (`lastSaved()` has it).
    Save { step: u64 },
    /// The run is at its end.
    Done { step: u64 },
}

/// Milliseconds a step spent in each of its phases (`alpha_core::tape::Phase`, indexed by
/// it; the ones that do not run on the engine's backend stay 0), an object keyed by the
/// phases' names: the `ms` of `alpha-native train`'s records.
#[derive(Clone, Copy, Default)]
struct PhaseMs([f64; Phase::ALL.len()]);

impl Serialize for PhaseMs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut fields = s.serialize_struct("PhaseMs", Phase::ALL.len())?;
        for phase in Phase::ALL {
            fields.serialize_field(phase.name(), &self.0[phase as usize])?;
        }
        fields.end()
    }
}

/// Times the phases a step tells it of, on the page's clock.
#[derive(Default)]
struct PhaseClock {
    began: f64,
    ms: PhaseMs,
}

impl alpha_core::tape::Observer for PhaseClock {
    fn phase_begin(&mut self, _phase: Phase) {
        self.began = now_ms();
    }

    fn phase_end(&mut self, phase: Phase) {
        self.ms.0[phase as usize] += now_ms() - self.began;
    }
}

/// Tokens `generate` draws between the page's turns: each chunk begins with a forward of the
/// window (the KV cache is the chunk's), about four tokens' cost, so a chunk of 16 costs a
/// quarter more than one long call and streams at the page's pace.
const GENERATE_CHUNK: usize = 16;

/// The most tokens one `generate` call draws.
const MAX_GENERATE_TOKENS: usize = 100_000;

/// `generate`'s options: `{ tokens, temperature, topK, topP, seed }`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct GenerateOptions {
    tokens: usize,
    temperature: f64,
    top_k: usize,
    top_p: f64,
    seed: Option<u64>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        let d = alpha_core::model::SamplingConfig::new(200);
        GenerateOptions { tokens: d.tokens, temperature: d.temperature, top_k: d.top_k, top_p: d.top_p, seed: None }
    }
}

impl GenerateOptions {
    /// Reads and checks the options object (`undefined` and `null`: the defaults), with the
    /// CLI's ranges.
    fn from_js(value: JsValue) -> Result<GenerateOptions, JsError> {
        let o: GenerateOptions = if value.is_undefined() || value.is_null() {
            GenerateOptions::default()
        } else {
            serde_wasm_bindgen::from_value(value).map_err(|e| js_error(format!("generate options: {e}")))?
        };
        if !(o.temperature.is_finite() && o.temperature >= 0.0) {
            return Err(js_error(format!("temperature must be a non-negative number, got {}", o.temperature)));
        }
        if !(o.top_p > 0.0 && o.top_p <= 1.0) {
            return Err(js_error(format!("topP must be above 0 and at most 1, got {}", o.top_p)));
        }
        if o.tokens == 0 || o.tokens > MAX_GENERATE_TOKENS {
            return Err(js_error(format!("tokens must be 1 to {MAX_GENERATE_TOKENS}, got {}", o.tokens)));
        }
        Ok(o)
    }
}

/// Gives the browser its thread back until its next task (a paint, an input event): a
/// `setTimeout(0)` awaited.
async fn yield_to_browser() {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        set_timeout(&resolve, 0);
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(callback: &js_sys::Function, ms: i32) -> JsValue;
    /// `performance.now()`: milliseconds, finer than `Date.now()`'s, in a page and a worker.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn now_ms() -> f64;
}

fn js_error(msg: impl core::fmt::Display) -> JsError {
    JsError::new(&msg.to_string())
}

/// The text's token ids with `tok`, and a check that its validation split holds a block.
fn tokenize(tok: &Tokenizer, text: &str, block: usize) -> Result<Vec<u32>, JsError> {
    let tokens = tok.encode(text).map_err(|e| js_error(format!("the text: {e}")))?;
    let (_, val) = data::split(&tokens);
    if val.len() <= block {
        return Err(js_error(format!(
            "the text is too short: {} tokens, but a block of {block} needs at least {} so that the 10% validation split holds {} tokens",
            tokens.len(),
            (block + 1) * 10,
            block + 1
        )));
    }
    Ok(tokens)
}

#[wasm_bindgen]
impl Trainer {
    /// A new model for `options` (see docs/guide.md, "In the browser", for the fields and defaults) trained on
    /// `text`: GPT-2 initialisation from `options.seed`, the vocabulary of `text`.
    pub async fn create(options: JsValue, text: String) -> Result<Trainer, JsError> {
        let opts = Options::from_js(options)?;
        let tok: Tokenizer = match &opts.tokenizer {
            TokenizerChoice::Chars => CharTokenizer::from_text(&text).map_err(|e| js_error(format!("the text: {e}")))?.into(),
            TokenizerChoice::Learn(size) => {
                let mut words = WordCounts::new();
                words.add(&alpha_core::Serial, &text, &[END_OF_TEXT]).map_err(|e| js_error(e.to_string()))?;
                tokenizer::train::train(&words, *size, &[END_OF_TEXT], &mut |_, _| {}).map_err(|e| js_error(format!("vocabSize: {e}")))?.into()
            }
            TokenizerChoice::Json(json) => hf::from_tokenizer_json(json).map_err(|e| js_error(format!("tokenizerJson: {e}")))?.into(),
        };
        let config = opts.settings.config(tok.vocab_size());
        let settings = opts.settings.clone();
        let plan = settings.plan(config).map_err(js_error)?;
        let tokens = tokenize(&tok, &text, settings.block)?;
        let start = RunState::fresh(&plan, settings.seed).map_err(js_error)?;
        Trainer::build(&opts, settings, tok, tokens, plan, start).await
    }

    /// The memory a run of `options` with a vocabulary of `vocab` tokens plans, before anything
    /// is allocated (as `alpha-native info` computes it): `{ params, paramsBytes,
    /// activationsBytes, batchBytes, totalBytes }`, the parameters' arena counted once
    /// (gradients and both AdamW moments are each as large); rejects, in one line, where the
    /// settings are not a model or the plan does not fit in the page's memory.
    pub fn plan(options: JsValue, vocab: usize) -> Result<JsValue, JsError> {
        let opts = Options::from_js(options)?;
        let plan = opts.settings.plan(opts.settings.config(vocab)).map_err(js_error)?;
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Memory {
            params: usize,
            params_bytes: f64,
            activations_bytes: f64,
            batch_bytes: f64,
            total_bytes: f64,
        }
        let bytes = |floats: usize| 4.0 * floats as f64;
        let (params, p, a, b) = (plan.num_params(), plan.params_len(), plan.acts_len(), 2 * plan.tokens());
        let memory = Memory { params, params_bytes: bytes(p), activations_bytes: bytes(a), batch_bytes: bytes(b), total_bytes: bytes(4 * p + a + b) };
        memory.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).map_err(js_error)
    }

    /// The presets (`alpha_core::run::PRESETS`, the repository's `config/*.toml`): an array of
    /// `{ name, description, options }`, each `options` a whole options object (the defaults
    /// with the preset's keys over them).
    pub fn presets() -> Result<js_sys::Array, JsError> {
        let out = js_sys::Array::new();
        for p in PRESETS {
            let options = Options::defaults_object()?;
            let table: toml::Table = p.toml.parse().map_err(|e: toml::de::Error| js_error(format!("preset {}: {}", p.name, e.message())))?;
            for (key, value) in table {
                let value = match value {
                    toml::Value::Integer(i) => JsValue::from_f64(i as f64),
                    toml::Value::Float(f) => JsValue::from_f64(f),
                    toml::Value::Boolean(b) => JsValue::from_bool(b),
                    toml::Value::String(s) => JsValue::from_str(&s),
                    other => return Err(js_error(format!("preset {}: `{key}` is a {}", p.name, other.type_str()))),
                };
                js_sys::Reflect::set(&options, &JsValue::from_str(&camel(&key)), &value).map_err(|_| js_error("cannot build a preset"))?;
            }
            let description = p.description();
            let entry = js_sys::Object::new();
            for (k, v) in [("name", JsValue::from_str(p.name)), ("description", JsValue::from_str(&description)), ("options", options)] {
                js_sys::Reflect::set(&entry, &JsValue::from_str(k), &v).map_err(|_| js_error("cannot build a preset"))?;
            }
            out.push(&entry);
        }
        Ok(out)
    }

    /// Continues the run saved in checkpoint `bytes` (from `save()` or `alpha-native train`)
    /// on `text`, which must use the checkpoint's characters. `options` may set `backend`,
    /// `evalIters`, `iters` and `recompute`; the model and the other settings come from the
    /// checkpoint. A checkpoint of weights only starts a fresh optimizer with `options`'
    /// settings, `block` (at most the model's context) cropping its context.
    pub async fn load(bytes: Vec<u8>, text: String, options: JsValue) -> Result<Trainer, JsError> {
        let ck = checkpoint::from_bytes(&bytes).map_err(js_error)?;
        Trainer::from_checkpoint(ck, text, options).await
    }

    /// A Hugging Face model (`GPT2LMHeadModel`, `LlamaForCausalLM`, `Qwen2ForCausalLM`, or
    /// one `alpha-native export` wrote) from its directory's files: `config.json`'s and
    /// `tokenizer.json`'s text and `model.safetensors`' bytes, read by alpha-core's
    /// `hf::from_files`; to sample from, or to fine-tune on `text` (as `load` a checkpoint of
    /// weights: a fresh optimizer with `options`' settings).
    /// `weights` is `model.safetensors`' bytes (a `Uint8Array`), or, for a sharded model, an
    /// array of `[name, bytes]`, one per shard.
    #[wasm_bindgen(js_name = loadHuggingFace)]
    pub async fn load_hugging_face(config_json: String, tokenizer_json: String, weights: JsValue, text: String, options: JsValue) -> Result<Trainer, JsError> {
        let files: Vec<(String, Vec<u8>)> = if let Some(bytes) = weights.dyn_ref::<js_sys::Uint8Array>() {
            vec![("model.safetensors".into(), bytes.to_vec())]
        } else if let Some(shards) = weights.dyn_ref::<js_sys::Array>() {
            let shard = |s: JsValue| -> Option<(String, Vec<u8>)> {
                let pair = s.dyn_into::<js_sys::Array>().ok()?;
                Some((pair.get(0).as_string()?, pair.get(1).dyn_into::<js_sys::Uint8Array>().ok()?.to_vec()))
            };
            shards.iter().map(|s| shard(s).ok_or_else(|| js_error("weights: each shard is a [name, Uint8Array] pair"))).collect::<Result<_, _>>()?
        } else {
            return Err(js_error("weights: model.safetensors' bytes (a Uint8Array) or an array of [name, bytes] shards"));
        };
        let weights: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        let tokenizer = alpha_core::hf::TokenizerFiles::Json(&tokenizer_json);
        let ck = alpha_core::hf::from_files(&config_json, tokenizer, &weights).map_err(js_error)?;
        drop(files);
        Trainer::from_checkpoint(ck, text, options).await
    }

    /// The model as a Hugging Face directory's files (`alpha_core::hf::model_files`:
    /// config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    /// generation_config.json), an array of `[name, Uint8Array]`; `transformers` loads it as
    /// the same model.
    #[wasm_bindgen(js_name = exportHuggingFace)]
    pub async fn export_hugging_face(&self) -> Result<js_sys::Array, JsError> {
        let (params, _, _) = self.engine.state().await.map_err(js_error)?;
        let ck = checkpoint::Checkpoint { config: self.config, tokenizer: self.tok.clone(), params: params.into_owned(), optimizer: None, verified: false };
        let files = alpha_core::hf::model_files(&ck).map_err(js_error)?;
        Ok(files.iter().map(|(name, bytes)| js_sys::Array::of2(&JsValue::from_str(name), &js_sys::Uint8Array::from(&bytes[..]))).collect())
    }

    async fn from_checkpoint(mut ck: checkpoint::Checkpoint, text: String, options: JsValue) -> Result<Trainer, JsError> {
        let opts = Options::from_js(options)?;
        // Weights to fine-tune on shorter windows than the model's context: its position
        // table cropped (nanoGPT's crop_block_size, `train --init-from --block`).
        let block = opts.settings.block;
        if ck.optimizer.is_none() && opts.gave("block") && block != ck.config.block_size {
            if block > ck.config.block_size {
                return Err(js_error(format!("block {block} is larger than the model's context of {} tokens", ck.config.block_size)));
            }
            let to = GptConfig { block_size: block, ..ck.config };
            ck.params = alpha_core::plan::resize_tables(&ck.params, ck.config, to).map_err(js_error)?;
            ck.config = to;
        }
        let tok = ck.tokenizer;
        let (moments, step, rng, mut settings, loss_scale) = match ck.optimizer {
            Some((m, v, state)) => (Some((m, v)), state.step, state.rng().map_err(js_error)?, state.settings, state.loss_scale),
            // Weights only: a fresh optimizer with this page's settings.
            None => (None, 0, Rng::new(derive_seed(opts.settings.seed, stream::BATCHES, 0)), opts.settings.clone().with_model(ck.config), None),
        };
        if opts.gave("iters") {
            settings.iters = opts.settings.iters;
        }
        settings.recompute = opts.settings.recompute;
        let plan = settings.plan(ck.config).map_err(js_error)?;
        let tokens = tokenize(&tok, &text, ck.config.block_size)?;
        let start = RunState { params: ck.params, moments, step, rng };
        let mut trainer = Trainer::build(&opts, settings, tok, tokens, plan, start).await?;
        if let Some(state) = loss_scale {
            trainer.engine.set_loss_scale(state);
        }
        Ok(trainer)
    }

    async fn build(opts: &Options, settings: RunSettings, tok: Tokenizer, tokens: Vec<u32>, plan: Plan, start: RunState<f32>) -> Result<Trainer, JsError> {
        let cfg = settings.train_config();
        let eval_iters = opts.settings.eval_iters;
        let cadence = alpha_core::run::Cadence { iters: settings.iters, ..opts.settings.cadence() };
        let driver = Driver::new(cadence, start.step, settings.seed, eval_iters).reporting_every_step();
        let (engine, peak, fallback) = engine::open(opts.backend, plan, cfg, start, opts.threads).await.map_err(js_error)?;
        Ok(Trainer {
            config: plan.config,
            settings,
            tok,
            tokens,
            eval_iters,
            engine,
            fallback,
            tokens_per_sec: None,
            peak,
            peak_gflops: None,
            driver,
            saved: None,
        })
    }

    /// Carries out the run's next action (`alpha_core::run::RunLoop`, the loop of `alpha-native
    /// train`: evaluate, sample, train a step, save, at the options' intervals) and resolves to
    /// its record: `{ type: "eval", step, train, val }`, `{ type: "sample", step, text }`,
    /// `{ type: "train", step, loss }`, `{ type: "save", step }` (a checkpoint, kept for
    /// `lastSaved()`; one at the end too) or, once the run is at its end, `{ type: "done",
    /// step }`. Rejects as `step` and `save` do.
    pub async fn next(&mut self) -> Result<JsValue, JsError> {
        let at = self.engine.step_count();
        if self.driver.run_loop().taken() != at {
            // Steps taken with step(): the loop goes on from there.
            let (cadence, seed) = (self.driver.run_loop().cadence(), self.settings.seed);
            self.driver = Driver::new(cadence, at, seed, self.eval_iters).reporting_every_step();
        }
        let started = now_ms();
        let (train, val) = data::split(&self.tokens);
        let splits = Splits { train: train.into(), val: val.into() };
        let mut clock = PhaseClock::default();
        let event = self.driver.next(&mut *self.engine, splits, self.tok.sample_start(), &mut clock, &mut || false).await;
        let record = match event.map_err(|e| js_error(format!("training diverged at {e}")))? {
            Event::Evaluated { step, train_loss, val_loss } => Record::Eval { step, train: train_loss, val: val_loss },
            Event::Sampled { step, ids } => Record::Sample { step, text: self.tok.decode_lossy(&ids) },
            Event::Trained { step, report, .. } => {
                let seconds = ((now_ms() - started) / 1e3).max(1e-6);
                let tokens_per_sec = self.tokens_per_step() as f64 / seconds;
                self.tokens_per_sec = Some(tokens_per_sec);
                let mfu = self.peak_gflops.map(|peak| tokens_per_sec * self.engine.plan().flops_per_token() / (peak * 1e9));
                Record::Train { step, loss: report.stats.map_or(f64::NAN, |s| s.loss), ms: clock.ms, tokens_per_sec, mfu }
            }
            Event::Save { step } => {
                self.saved = Some((step, self.save().await?));
                Record::Save { step }
            }
            Event::Finished { step, .. } if self.saved.as_ref().map(|s| s.0) != Some(step) => {
                self.saved = Some((step, self.save().await?));
                Record::Save { step }
            }
            Event::Finished { step, .. } => Record::Done { step },
        };
        serde_wasm_bindgen::to_value(&record).map_err(js_error)
    }

    /// The last checkpoint `next()` saved (`Uint8Array`), if any: what is left when a later
    /// step diverges.
    #[wasm_bindgen(js_name = lastSaved)]
    pub fn last_saved(&self) -> Option<Vec<u8>> {
        self.saved.as_ref().map(|(_, bytes)| bytes.clone())
    }

    /// `n` optimizer steps; resolves to their losses (a `Float32Array`). Rejects if a loss or
    /// gradient norm is not finite (that step's update is not applied).
    pub async fn step(&mut self, n: u32) -> Result<Vec<f32>, JsError> {
        let (train, _) = data::split(&self.tokens);
        let started = now_ms();
        let mut losses = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let report = self.engine.step(train.into(), true, &mut ()).await.map_err(|e| js_error(format!("training diverged at {e}")))?;
            losses.push(report.stats.map_or(f32::NAN, |s| s.loss as f32));
        }
        let seconds = (now_ms() - started) / 1e3;
        if n > 0 && seconds > 0.0 {
            self.tokens_per_sec = Some(f64::from(n) * self.tokens_per_step() as f64 / seconds);
        }
        Ok(losses)
    }

    /// nanoGPT's `estimate_loss`: the mean loss of `evalIters` batches of each split, drawn
    /// with the run's evaluation seeds for this step; resolves to `{ train, val }`.
    pub async fn evaluate(&mut self) -> Result<JsValue, JsError> {
        let (train, val) = self.evaluate_splits().await?;
        #[derive(Serialize)]
        struct Losses {
            train: f64,
            val: f64,
        }
        serde_wasm_bindgen::to_value(&Losses { train, val }).map_err(js_error)
    }

    /// `count` characters continuing `prompt` (empty: a newline) at `temperature` (0:
    /// greedy), top-k 200, with the run's sample seed for this step.
    pub async fn sample(&mut self, prompt: String, count: u32, temperature: f64) -> Result<String, JsError> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(js_error(format!("the temperature must be a non-negative number, got {temperature}")));
        }
        let prompt = if prompt.is_empty() { "\n".to_string() } else { prompt };
        let (ids, seed) = (self.prompt_ids(&prompt)?, self.sample_seed());
        let cfg = alpha_core::model::SamplingConfig { temperature, ..alpha_core::model::SamplingConfig::new(count as usize) };
        let mut generated = Vec::with_capacity(cfg.tokens);
        self.engine.sample(&ids, &cfg, &mut Rng::new(seed), &mut |id| generated.push(id)).await.map_err(js_error)?;
        Ok(self.tok.decode_lossy(&generated))
    }

    /// Streams up to `options.tokens` tokens continuing `prompt` (the options: `{ tokens,
    /// temperature, topK, topP, seed }`, by default 200 tokens at temperature 0.8, top-k 200,
    /// the whole nucleus, the run's sample seed): calls `onText(piece)` with each token's
    /// text as it comes (bytes of a character split over tokens wait for the rest) and stops
    /// early where `onText` returns `false` or the model writes the tokenizer's end of text.
    /// Between chunks of tokens the page gets its thread back (to paint, and for a Stop
    /// button). Resolves to the whole continuation.
    pub async fn generate(&mut self, prompt: String, options: JsValue, on_text: &js_sys::Function) -> Result<String, JsError> {
        let o = GenerateOptions::from_js(options)?;
        let mut context = self.prompt_ids(&prompt)?;
        let seed = o.seed.unwrap_or_else(|| self.sample_seed());
        let mut rng = Rng::new(seed);
        let cfg = alpha_core::model::SamplingConfig { temperature: o.temperature, top_k: o.top_k, top_p: o.top_p, tokens: 0, stop: self.tok.end_of_text() };
        // Whole characters only: BPE may split one across tokens.
        let (mut left, mut stream, mut text) = (o.tokens, TextStream::default(), String::new());
        let mut stopped = false;
        while left > 0 && !stopped {
            let chunk = left.min(GENERATE_CHUNK);
            let mut drawn = Vec::with_capacity(chunk);
            self.engine
                .sample(&context, &alpha_core::model::SamplingConfig { tokens: chunk, ..cfg }, &mut rng, &mut |id| drawn.push(id))
                .await
                .map_err(js_error)?;
            for &id in &drawn {
                let piece = stream.push(&self.tok.token_bytes(id));
                if !piece.is_empty() {
                    text.push_str(&piece);
                    stopped |=
                        on_text.call1(&JsValue::NULL, &JsValue::from_str(&piece)).map_err(|e| js_error(format!("onText threw: {e:?}")))? == JsValue::FALSE;
                }
            }
            // Fewer than asked: the end of text.
            stopped |= drawn.len() < chunk;
            left -= drawn.len();
            context.extend_from_slice(&drawn);
            if left > 0 && !stopped {
                yield_to_browser().await;
            }
        }
        let rest = stream.finish();
        if !rest.is_empty() {
            on_text.call1(&JsValue::NULL, &JsValue::from_str(&rest)).map_err(|e| js_error(format!("onText threw: {e:?}")))?;
            text.push_str(&rest);
        }
        Ok(text)
    }

    /// Where it runs and how fast: `{ backend: "webgpu" | "cpu", adapter, kernel, threads,
    /// fallback, precision: "f16" | "f32", precisionFallback, step, iters, params, vocab,
    /// tokenizer, tokensPerStep, tokensPerSec, config }`
    /// (`tokenizer`: `"char"` or `"bpe"`; `kernel`:
    /// the CPU's GEMM kernel; `threads`: the CPU engine's; `iters`: the run's length;
    /// `tokensPerSec` of the last step).
    pub fn stats(&self) -> Result<JsValue, JsError> {
        let plan = self.engine.plan();
        let d = self.engine.describe();
        let adapter = d.device.as_ref().map(|dev| dev.adapter.clone());
        let on_gpu = d.backend == "gpu";
        let stats = Stats {
            backend: if on_gpu { "webgpu" } else { "cpu" },
            kernel: (!on_gpu).then(alpha_core::gemm::f32_kernel_name),
            fallback: self.fallback.clone(),
            precision: d.precision,
            // On WebGPU in f32: the adapter lacks shader-f16.
            precision_fallback: adapter.as_ref().filter(|_| d.precision == "f32").map(|a| format!("{a} lacks shader-f16")),
            adapter,
            threads: d.threads,
            step: self.engine.step_count(),
            iters: self.settings.iters,
            params: plan.num_params(),
            vocab: self.config.vocab_size,
            tokenizer: self.tok.kind(),
            tokens_per_step: self.tokens_per_step(),
            tokens_per_sec: self.tokens_per_sec,
            config: self.config,
        };
        serde_wasm_bindgen::to_value(&stats).map_err(js_error)
    }

    /// Measures the peak GFLOP/s the records' MFU is taken against, as `alpha-native info`
    /// does: the CPU's GEMM on the engine's threads, or WebGPU's f32 FMA limit on its device
    /// (up to about 1.5 s). Resolves to it and keeps it.
    #[wasm_bindgen(js_name = measurePeak)]
    pub async fn measure_peak(&mut self) -> Result<f64, JsError> {
        let gflops = self.peak.measure().await.map_err(|e| js_error(format!("measuring the peak: {e}")))?;
        self.peak_gflops = Some(gflops);
        Ok(gflops)
    }

    /// Sets the peak GFLOP/s MFU is taken against (one `measurePeak` gave on this machine
    /// before, which the page keeps). A positive number.
    #[wasm_bindgen(js_name = setPeak)]
    pub fn set_peak(&mut self, gflops: f64) -> Result<(), JsError> {
        if !(gflops.is_finite() && gflops > 0.0) {
            return Err(js_error(format!("the peak must be a positive number of GFLOP/s, got {gflops}")));
        }
        self.peak_gflops = Some(gflops);
        Ok(())
    }

    /// Sets the run's length, the step it trains to (as `alpha-native train --resume
    /// --iters N` does; the learning-rate schedule keeps its `lrDecayIters`). At least 1.
    #[wasm_bindgen(js_name = setIters)]
    pub fn set_iters(&mut self, iters: f64) -> Result<(), JsError> {
        if !(iters.is_finite() && iters >= 1.0 && iters.fract() == 0.0 && iters <= u64::MAX as f64) {
            return Err(js_error(format!("iters must be a whole number of at least 1, got {iters}")));
        }
        self.settings.iters = iters as u64;
        self.driver.run_loop_mut().set_iters(self.settings.iters);
        Ok(())
    }

    /// The run as a safetensors checkpoint (`Uint8Array`): weights, AdamW moments, step and
    /// batch generator, the format `alpha-native` reads and writes. Rejects a model that is
    /// not finite (nothing is saved).
    pub async fn save(&self) -> Result<Vec<u8>, JsError> {
        let (params, m, v) = self.engine.state().await.map_err(js_error)?;
        let step = self.engine.step_count();
        let loss_scale = self.engine.loss_scale().await.map_err(js_error)?;
        let state = TrainState { step, rng_state: self.engine.rng().state().to_string(), settings: self.settings.clone(), best_val_loss: None, loss_scale };
        checkpoint::to_bytes(self.config, &self.tok, &params, Some((&m, &v, &state))).map_err(|e| js_error(format!("not saving step {step}: {e}")))
    }
}

impl Trainer {
    /// nanoGPT's `estimate_loss` at the current step: the train and val splits' mean losses.
    async fn evaluate_splits(&mut self) -> Result<(f64, f64), JsError> {
        let step = self.engine.step_count();
        let (train, val) = data::split(&self.tokens);
        let splits = Splits { train: train.into(), val: val.into() };
        estimate_loss(&mut *self.engine, splits, self.settings.seed, step, self.eval_iters).await.map_err(js_error)
    }

    /// A prompt's token ids as `alpha-native sample` makes them: the tokens the tokenizer puts
    /// before a text (Llama 3's BOS), then the prompt's.
    fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>, JsError> {
        let ids = self.tok.encode(prompt).map_err(|e| js_error(format!("the prompt: {e}")))?;
        Ok([self.tok.special_tokens_around().0, &ids].concat())
    }

    /// The run's seed for a sample at this step (the CLI's).
    fn sample_seed(&self) -> u64 {
        derive_seed(self.settings.seed, stream::SAMPLES, self.engine.step_count())
    }

    fn tokens_per_step(&self) -> usize {
        self.engine.plan().tokens() * self.settings.grad_accum
    }
}
