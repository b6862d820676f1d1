//! Train on a text with every core, evaluate, save: a Llama-family model (RMSNorm, rotary
//! positions, SwiGLU, two query heads per key/value head) on a text's characters, 90% for
//! training and 10% for validation, then a checkpoint `alpha-native sample` and the
//! `generate` example read.
//!
//! Run: `cargo run --release -p alpha-core --example train --features std,checkpoint -- data/shakespeare.txt out.safetensors 300`

use alpha_core::checkpoint;
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::ThreadPool;
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::train::{OwnedMemory, TrainConfig};
use alpha_core::{Arch, GptConfig, Llama, Plan, Rng};
use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [text, out, rest @ ..] = &args[..] else {
        return Err("usage: train TEXT OUT.safetensors [STEPS]".into());
    };
    let steps: u64 = rest.first().map_or(Ok(300), |n| n.parse())?;
    let text = std::fs::read_to_string(text)?;
    let tokenizer = CharTokenizer::from_text(&text)?;
    let ids = tokenizer.encode_to_vec(&text)?;
    let (train, val) = ids.split_at(ids.len() * 9 / 10);

    let llama = Llama { n_kv_head: 2, intermediate_size: 192, norm_eps: 1e-5, rope_theta: 10000.0, rope_scaling: None, qkv_bias: false, tied: true };
    let config = GptConfig { arch: Arch::Llama(llama), ..GptConfig::gpt2(tokenizer.vocab_size(), 64, 4, 4, 64) };
    let plan = Plan::new(config, 12, 64)?;
    let cfg = TrainConfig {
        schedule: LrSchedule { max_lr: 2e-3, min_lr: 2e-4, warmup_iters: 30, decay_iters: steps },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum: 1,
    };
    // Every buffer the run needs, allocated once: the steps allocate nothing.
    let mut mem = OwnedMemory::<f32>::new(&plan)?;
    alpha_core::model::init_params(&plan, &mut mem.params, &mut Rng::new(1337));
    let pool = ThreadPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut trainer = mem.trainer(plan, cfg, Rng::new(1))?;
    for step in 1..=steps {
        let stats = trainer.train_step(&pool, train)?;
        if step % 50 == 0 || step == steps {
            let val_loss = trainer.evaluate(&pool, val, 10, &mut Rng::new(2));
            println!("step {step}: train loss {:.4}, val loss {val_loss:.4}", stats.loss);
        }
    }
    // The weights (no optimizer state: a checkpoint to sample from, not to resume).
    let bytes = checkpoint::to_bytes(config, &Tokenizer::from(tokenizer), trainer.mem.params, None)?;
    std::fs::write(out, bytes)?;
    println!("saved {out}");
    Ok(())
}
