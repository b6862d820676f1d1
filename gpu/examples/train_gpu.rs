//! Train on a text on a GPU, evaluate, sample, save: alpha-core's `train` example through
//! wgpu (Vulkan, Metal or DX12; lavapipe where there is no GPU). The model trains through
//! alpha-core's one training interface, `Engine`, which the CPU's engine implements too:
//! swap `GpuEngine` for `CpuEngine` and nothing else changes.
//!
//! Run: `cargo run --release -p alpha-gpu --example train_gpu -- data/shakespeare.txt out.safetensors 300`

use alpha_core::checkpoint;
use alpha_core::engine::Engine;
use alpha_core::model::SamplingConfig;
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::train::{OneRank, RunState, TrainConfig};
use alpha_core::{Arch, GptConfig, Llama, Plan, Rng};
use alpha_gpu::{block_on, Gpu, GpuEngine, GpuTrainer};
use std::error::Error;
use std::io::Write;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [text, out, rest @ ..] = &args[..] else {
        return Err("usage: train_gpu TEXT OUT.safetensors [STEPS]".into());
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
    // The default adapter, f32 products; the step is one submission, the loss read back only
    // when a report is asked for.
    let gpu = block_on(Gpu::open(None))?;
    println!("training on {} ({})", gpu.adapter.name, gpu.adapter.backend);
    let start = RunState::fresh(&plan, 1337)?;
    let trainer = block_on(GpuTrainer::resume(gpu, plan, cfg, &start))?;
    let mut engine = GpuEngine::new(trainer, &OneRank)?;
    for step in 1..=steps {
        let report = step % 50 == 0 || step == steps;
        let done = block_on(engine.step(train.into(), report, &mut ()))?;
        if let Some(stats) = done.stats.filter(|_| report) {
            let val_loss = block_on(engine.evaluate(val.into(), 10, &mut Rng::new(2)))?;
            println!("step {step}: train loss {:.4}, val loss {val_loss:.4}", stats.loss);
        }
    }

    let prompt = tokenizer.encode_to_vec("ROMEO:")?;
    print!("ROMEO:");
    let mut emit = |id| print!("{}", tokenizer.decode(id).unwrap_or('?'));
    block_on(engine.sample(&prompt, &SamplingConfig::new(100), &mut Rng::new(3), &mut emit))?;
    println!();
    std::io::stdout().flush()?;

    // The weights read back from the device (no optimizer state: a checkpoint to sample
    // from, not to resume).
    let (params, _, _) = block_on(engine.state())?;
    let bytes = checkpoint::to_bytes(config, &Tokenizer::from(tokenizer), &params, None)?;
    std::fs::write(out, bytes)?;
    println!("saved {out}");
    Ok(())
}
