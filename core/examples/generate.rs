//! Load a trained model and generate: an Alpha checkpoint (`ckpt.safetensors`) or a Hugging Face
//! directory (`config.json`, `model.safetensors`, `tokenizer.json`: GPT-2, Llama, Qwen2), its
//! tokens streamed as they come, with temperature, top-k and top-p, the KV cache on.
//!
//! Run (a Llama-family model `transformers` wrote, from this repository's tests):
//! `cargo run --release -p alpha-core --example generate --features std,checkpoint -- tests/data/llama-fixture "ROMEO:" 20`

use alpha_core::model::{Sampler, SamplingConfig};
use alpha_core::parallel::ThreadPool;
use alpha_core::tokenizer::{TextStream, Tokenizer};
use alpha_core::{checkpoint, hf, GptConfig, Rng};
use std::error::Error;
use std::io::Write;
use std::path::Path;

/// A model's shape, tokenizer and parameters from `path`.
fn load(path: &Path) -> Result<(GptConfig, Tokenizer, Vec<f32>), Box<dyn Error>> {
    let ck = if path.is_dir() {
        // A Hugging Face directory: its files' contents through alpha_core::hf.
        let text = |name: &str| std::fs::read_to_string(path.join(name));
        let weights = std::fs::read(path.join("model.safetensors"))?;
        let tokenizer = text("tokenizer.json")?;
        hf::from_files(&text("config.json")?, hf::TokenizerFiles::Json(&tokenizer), &[("model.safetensors", &weights)])?
    } else {
        checkpoint::from_bytes(&std::fs::read(path)?)?
    };
    Ok((ck.config, ck.tokenizer, ck.params))
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, prompt, rest @ ..] = &args[..] else {
        return Err("usage: generate MODEL PROMPT [TOKENS]".into());
    };
    let tokens = rest.first().map_or(Ok(40), |n| n.parse())?;
    let (config, tokenizer, params) = load(Path::new(path))?;
    // The prompt as the tokenizer encodes a text (Llama 3's begins with its BOS).
    let ids = [tokenizer.special_tokens_around().0, &tokenizer.encode(prompt)?].concat();
    let window = config.block_size.min(256);
    let mut sampler = Sampler::<f32>::new(config, tokenizer.vocab_size(), window)?;
    let cfg = SamplingConfig { temperature: 0.8, top_k: 200, top_p: 0.95, stop: tokenizer.end_of_text(), ..SamplingConfig::new(tokens) };
    // Whole characters only: BPE may split one across tokens.
    let (mut text, mut out) = (TextStream::default(), std::io::stdout().lock());
    write!(out, "{prompt}")?;
    let pool = ThreadPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()));
    sampler.generate(&pool, &params, &ids, &cfg, &mut Rng::new(1337), |id| {
        let _ = write!(out, "{}", text.push(&tokenizer.token_bytes(id)));
        let _ = out.flush();
    });
    writeln!(out, "{}", text.finish())?;
    Ok(())
}
