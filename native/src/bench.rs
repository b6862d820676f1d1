//! `alpha-native bench`: steady-state training throughput (no evaluation, samples or
//! checkpoints), its phase breakdown, achieved GFLOP/s and MFU.
//!
//! FLOPs per token = 6 × parameters (forward and backward of every weight) + 12 × n_layer ×
//! T × C (attention scores and weighted sums). MFU = achieved FLOP/s ÷ the peak of this
//! machine, measured by a calibrated GEMM run (see [`crate::peak`]) or given.

use crate::peak::{peak, Peak};
use crate::step::{timed_step, with_fresh_trainer, Phases};
use crate::trace::Trace;
use crate::train::{load_corpus, ModelArgs};
use alpha_core::parallel::Parallel;
use alpha_core::{GptConfig, Plan};
use clap::{Args, ValueEnum};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Where the model runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU kernels of alpha-core.
    Cpu,
}

/// Flags of `alpha-native bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model shape and data.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Worker threads. Default: one per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed steps.
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// The machine's peak GFLOP/s for MFU. Default: measured once and cached.
    #[arg(long)]
    pub peak_gflops: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace (open in Perfetto) of the first --trace-steps steps to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Steps recorded by --trace.
    #[arg(long, default_value_t = 5)]
    pub trace_steps: u64,
    /// Time whole steps only, without the per-phase clocks (to measure what they cost).
    #[arg(long, conflicts_with = "trace")]
    pub no_phases: bool,
}

/// Training FLOPs per token of `plan`'s model at its sequence length.
pub fn flops_per_token(plan: &Plan) -> f64 {
    let c = &plan.config;
    6.0 * plan.num_params() as f64 + 12.0 * (c.n_layer * plan.seq * c.n_embd) as f64
}

/// Runs `bench`.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let m = &args.model;
    let (tok, ids) = load_corpus(&m.data_name())?;
    let config: GptConfig = m.config(tok.vocab_size());
    let plan = Plan::new(config, m.batch, m.block).map_err(|e| e.to_string())?;
    let pool = crate::thread_pool(args.threads)?;
    let peak = peak(&pool, args.peak_gflops)?;
    let mut trace = args.trace.as_deref().map(|p| Trace::new(p, args.trace_steps)).transpose()?;
    let (mut ms, phases) = with_fresh_trainer(plan, &ids, args.grad_accum, |trainer, train| {
        let mut ms = Vec::with_capacity(args.iters);
        let mut phases = Phases::default();
        for i in 0..args.warmup + args.iters {
            let diverged = |e| format!("bench diverged at {e}");
            let step = if args.no_phases {
                let start = Instant::now();
                trainer.train_step(&pool, train).map_err(diverged)?;
                Phases { total: start.elapsed().as_secs_f64(), ..Phases::default() }
            } else {
                let traced = trace.as_mut().filter(|_| i >= args.warmup);
                timed_step(trainer, &pool, train, traced).map_err(diverged)?.phases
            };
            if i >= args.warmup {
                ms.push(step.total * 1e3);
                phases.add(&step);
            }
        }
        Ok((ms, phases))
    })?;
    if let Some(t) = trace.as_mut() {
        t.finish()?;
    }
    ms.sort_by(f64::total_cmp);
    let median = if ms.len() % 2 == 1 { ms[ms.len() / 2] } else { (ms[ms.len() / 2 - 1] + ms[ms.len() / 2]) / 2.0 };
    let tokens_per_step = plan.tokens() * args.grad_accum;
    let tokens_per_sec = tokens_per_step as f64 / median * 1e3;
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    let fpt = flops_per_token(&plan);
    let achieved = fpt * tokens_per_sec / 1e9;
    let report = json!({
        "backend": "cpu",
        "threads": pool.threads(),
        "config": config,
        "batch": m.batch,
        "grad_accum": args.grad_accum,
        "tokens_per_step": tokens_per_step,
        "params": plan.num_params(),
        "flops_per_token": fpt,
        "iters": args.iters,
        "warmup": args.warmup,
        "ms_per_iter": {"median": median, "mean": mean, "min": ms[0], "max": ms[ms.len() - 1]},
        "tokens_per_sec": tokens_per_sec,
        "phases_ms": if args.no_phases { serde_json::Value::Null } else { phases.json_ms(args.iters as f64) },
        "achieved_gflops": achieved,
        "peak_gflops": peak.gflops,
        "peak_source": peak.source,
        "mfu": achieved / peak.gflops,
    });
    if args.json {
        println!("{report}");
    } else {
        print_table(&report, &peak);
    }
    Ok(())
}

fn print_table(r: &serde_json::Value, peak: &Peak) {
    let c = &r["config"];
    println!(
        "bench: {} layers, {} heads, {} embd, block {}, batch {}x{} ({} tokens/step), {:.2}M params, cpu, threads: {}",
        c["n_layer"], c["n_head"], c["n_embd"], c["block_size"], r["batch"], r["grad_accum"], r["tokens_per_step"],
        r["params"].as_f64().unwrap_or(0.0) / 1e6, r["threads"]
    );
    let m = &r["ms_per_iter"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "  ms/iter       median {:.2}  mean {:.2}  min {:.2}  max {:.2}  ({} steps after {} warm-up)",
        f(&m["median"]), f(&m["mean"]), f(&m["min"]), f(&m["max"]), r["iters"], r["warmup"]
    );
    println!("  tokens/s      {:.0}", f(&r["tokens_per_sec"]));
    let phases: Vec<String> = r["phases_ms"].as_object().into_iter().flatten().filter(|(_, v)| f(v) > 0.0).map(|(k, v)| format!("{k} {:.2}", f(v))).collect();
    if !phases.is_empty() {
        println!("  phases (ms)   {}", phases.join("  "));
    }
    println!(
        "  FLOPs/token   {:.2}M; achieved {:.1} GFLOP/s; peak {:.1} GFLOP/s ({}); MFU {:.1}%",
        f(&r["flops_per_token"]) / 1e6, f(&r["achieved_gflops"]), peak.gflops, peak.source, 100.0 * f(&r["mfu"])
    );
}
