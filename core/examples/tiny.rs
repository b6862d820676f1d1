//! Embedding alpha-core: a tiny GPT in memory the caller owns, trained on a string for a
//! few steps, then sampled. No CLI, no files, single-threaded (`Serial`).
//!
//! Run: `cargo run -p alpha-core --example tiny --features alloc`

use alpha_core::model::{generate, init_params, SamplingConfig, SamplingMemory};
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::tape::{self, Op};
use alpha_core::tokenizer::CharTokenizer;
use alpha_core::train::{Memory, TrainConfig, Trainer};
use alpha_core::{GptConfig, Plan, Rng, Serial};

fn main() {
    let text = "to be, or not to be, that is the question. ".repeat(20);
    let tok = CharTokenizer::from_text(&text).expect("non-empty text");
    let ids = tok.encode_to_vec(&text).expect("the text's own characters");
    let config = GptConfig::gpt2(tok.vocab_size(), 16, 2, 2, 32);

    // The plan says how much memory the model needs; the caller provides it.
    let plan = Plan::new(config, 4, 16).expect("valid config");
    let mut ops = vec![Op::BLANK; tape::tape_len(&plan)];
    let tape = tape::record(&plan, &mut ops).expect("tape buffer of tape_len");
    let (p, a) = (plan.params_len(), plan.acts_len());
    let (mut params, mut grads, mut m, mut v) = (vec![0f32; p], vec![0f32; p], vec![0f32; p], vec![0f32; p]);
    let (mut acts, mut batch) = (vec![0f32; a], vec![0u32; 2 * plan.tokens()]);
    init_params(&plan, &mut params, &mut Rng::new(42));

    let cfg = TrainConfig {
        schedule: LrSchedule { max_lr: 1e-2, min_lr: 1e-3, warmup_iters: 5, decay_iters: 60 },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum: 1,
    };
    let mem = Memory { params: &mut params, grads: &mut grads, adam_m: &mut m, adam_v: &mut v, acts: &mut acts, batch: &mut batch };
    let mut trainer = Trainer::new(plan, tape, mem, cfg, Rng::new(7)).expect("memory matches the plan");
    for step in 0..60 {
        let stats = trainer.train_step(&Serial, &ids).expect("finite loss");
        if step % 10 == 0 || step == 59 {
            println!("step {step:2}: loss {:.3}", stats.loss);
        }
    }

    // Sampling uses a batch-1 plan over the same parameters.
    let sample_plan = Plan::new(config, 1, 16).expect("valid config");
    let mut sample_ops = vec![Op::BLANK; tape::tape_len(&sample_plan)];
    let sample_tape = tape::record(&sample_plan, &mut sample_ops).expect("tape buffer");
    let mut sample_acts = vec![0f32; sample_plan.acts_len()];
    let mut window = vec![0u32; 16];
    let prompt = tok.encode_to_vec("to be").expect("known characters");
    let mut out = String::from("to be");
    let sampling = SamplingConfig { temperature: 0.5, top_k: 0, ..SamplingConfig::new(40) };
    let params = &*trainer.mem.params;
    let mem = SamplingMemory { plan: &sample_plan, tape: sample_tape, acts: &mut sample_acts, window: &mut window, decoding: None };
    generate(&Serial, mem, params, &prompt, &sampling, &mut Rng::new(1), |id| out.push(tok.decode(id).expect("ids come from the vocabulary")));
    println!("sample: {out:?}");
}
