//! The options object `Trainer.create` takes: alpha-core's [`RunSettings`] in camelCase
//! (`alpha-native train`'s flags), every field optional, the defaults
//! `alpha_core::settings::DEFAULT`'s; and the page's own: `backend`, `threads`, `vocabSize`,
//! `tokenizerJson`.

use alpha_core::settings::{RunSettings, DEFAULT};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use wasm_bindgen::prelude::*;

/// Where to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// WebGPU when the browser has a usable adapter, else the CPU.
    Auto,
    /// WebGPU only (an error without it).
    Webgpu,
    /// The CPU kernels in WebAssembly.
    Cpu,
}

/// Settings of a run the page has no use for (it writes no files, its text is given): not
/// options of the page.
const NOT_IN_THE_PAGE: [&str; 5] = ["data", "dataset", "save", "keep", "async_checkpoint"];

/// What the page's text is recorded as in a checkpoint's settings.
const BROWSER_TEXT: &str = "<browser text>";

/// The most CPU threads the page uses.
const MAX_THREADS: usize = 64;

/// `navigator.hardwareConcurrency` (1 where the browser does not say).
fn hardware_concurrency() -> usize {
    let navigator = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
    let cores = js_sys::Reflect::get(&navigator, &JsValue::from_str("hardwareConcurrency")).ok().and_then(|v| v.as_f64());
    cores.map_or(1, |c| (c as usize).max(1))
}

/// Validated options.
pub struct Options {
    /// The run's settings (model, optimizer, schedule, intervals, dropout, recompute).
    pub settings: RunSettings,
    /// The settings the object gave (snake_case): a loaded checkpoint keeps the others.
    given: Vec<String>,
    /// Where to train.
    pub backend: BackendChoice,
    /// CPU threads (the threads build; others run one). Default: the browser's
    /// `navigator.hardwareConcurrency`.
    pub threads: usize,
    /// How the text becomes tokens.
    pub tokenizer: TokenizerChoice,
}

/// How `Trainer.create` tokenizes its text.
pub enum TokenizerChoice {
    /// One token per character of the text.
    Chars,
    /// Byte-level BPE of this many tokens, learned from the text (`vocabSize`).
    Learn(usize),
    /// A Hugging Face tokenizer.json's text (`tokenizerJson`).
    Json(String),
}

/// `snake_case` as the options object spells it.
pub fn camel(field: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for ch in field.chars() {
        match ch {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// `camelCase` as the settings spell it.
fn snake(field: &str) -> String {
    let mut out = String::new();
    for ch in field.chars() {
        if ch.is_ascii_uppercase() {
            out.push('_');
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

fn error(msg: impl core::fmt::Display) -> JsError {
    JsError::new(&msg.to_string())
}

/// Every setting at its default, by its snake_case name.
fn default_settings() -> Map<String, Value> {
    let Ok(Value::Object(all)) = serde_json::to_value(DEFAULT) else { unreachable!("settings serialise to an object") };
    all
}

/// Whether the page offers setting `field` (snake_case, a key of [`default_settings`]) as
/// an option.
fn offered(field: &str) -> bool {
    !NOT_IN_THE_PAGE.contains(&field)
}

/// Takes the page's own option `key` out of `object`.
fn take<T: serde::de::DeserializeOwned>(object: &mut Map<String, Value>, key: &str) -> Result<Option<T>, JsError> {
    object.remove(key).filter(|v| !v.is_null()).map(|v| serde_json::from_value(v).map_err(|e| error(format!("{key}: {e}")))).transpose()
}

impl Options {
    /// Reads and checks an options object (`undefined` and `null` mean all defaults).
    pub fn from_js(value: JsValue) -> Result<Options, JsError> {
        let mut object: Map<String, Value> = if value.is_undefined() || value.is_null() {
            Map::new()
        } else {
            serde_wasm_bindgen::from_value(value).map_err(|e| error(format!("options: {e}")))?
        };
        let backend = take(&mut object, "backend")?.unwrap_or(BackendChoice::Auto);
        let threads = match take::<usize>(&mut object, "threads")? {
            Some(0) => return Err(error("threads must be at least 1")),
            Some(n) => n.min(MAX_THREADS),
            None => hardware_concurrency().min(MAX_THREADS),
        };
        let tokenizer = match (take(&mut object, "vocabSize")?, take(&mut object, "tokenizerJson")?) {
            (Some(_), Some(_)) => return Err(error("give vocabSize (learn a tokenizer) or tokenizerJson (use one), not both")),
            (Some(n), None) => TokenizerChoice::Learn(n),
            (None, Some(json)) => TokenizerChoice::Json(json),
            (None, None) => TokenizerChoice::Chars,
        };
        let mut settings = default_settings();
        let mut given = Vec::new();
        // An option given as undefined or null is not given.
        for (key, value) in object.into_iter().filter(|(_, v)| !v.is_null()) {
            let field = snake(&key);
            if !settings.contains_key(&field) || !offered(&field) {
                return Err(error(format!("options: unknown option `{key}`")));
            }
            settings.insert(field.clone(), value);
            given.push(field);
        }
        // The learning rate decays over the whole run unless told otherwise.
        if !given.iter().any(|g| g == "lr_decay_iters") {
            settings.insert("lr_decay_iters".into(), settings["iters"].clone());
        }
        let settings: RunSettings = serde_json::from_value(Value::Object(settings)).map_err(|e| error(format!("options: {e}")))?;
        let settings = RunSettings { data: BROWSER_TEXT.into(), ..settings };
        // The page's evaluate() draws evalIters batches whatever the interval.
        if settings.eval_iters == 0 {
            return Err(error("evalIters must be at least 1"));
        }
        settings.validate(camel).map_err(error)?;
        Ok(Options { settings, given, backend, threads, tokenizer })
    }

    /// Whether the object gave `field` (snake_case).
    pub fn gave(&self, field: &str) -> bool {
        self.given.iter().any(|g| g == field)
    }

    /// Every option at its default (the run's length too; `null` where the default is
    /// chosen at the start: threads, tokenizer) as a JS object: a preset's base.
    pub fn defaults_object() -> Result<JsValue, JsError> {
        let mut object = Map::new();
        // Without lrDecayIters: the decay follows the run's length.
        for (key, value) in default_settings().into_iter().filter(|(k, _)| offered(k) && k != "lr_decay_iters") {
            object.insert(camel(&key), value);
        }
        object.insert("backend".into(), Value::String("auto".into()));
        // The page's own options without a fixed default (null: not given).
        for key in ["threads", "vocabSize", "tokenizerJson"] {
            object.insert(key.into(), Value::Null);
        }
        object.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).map_err(error)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_convert_both_ways() {
        for (snake, camel) in [("min_lr", "minLr"), ("grad_accum", "gradAccum"), ("lr", "lr"), ("lr_decay_iters", "lrDecayIters")] {
            assert_eq!(super::camel(snake), camel);
            assert_eq!(super::snake(camel), snake);
        }
    }
}
