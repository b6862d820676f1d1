//! `alpha-native bench`: steady-state training throughput (no evaluation, samples or
//! checkpoints), its phase breakdown, achieved GFLOP/s and MFU.
//!
//! FLOPs per token = 6 × parameters (forward and backward of every weight) + 12 × n_layer ×
//! T × C (attention scores and weighted sums). MFU = achieved FLOP/s ÷ the peak of this
//! machine, measured by a calibrated GEMM run (see [`crate::peak`]) or given.

use crate::peak::{peak, Peak};
use crate::step::{bench_train_config, timed_step, train_split, with_fresh_trainer, Phases};
use crate::trace::Trace;
use crate::train::{load_corpus, ModelArgs};
use alpha_core::model::init_params;
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_gpu::{block_on, Gpu, GpuTrainer};
use alpha_core::{GptConfig, Plan, Rng};
use clap::{Args, ValueEnum};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Where the model runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU kernels of alpha-core.
    Cpu,
    /// alpha-gpu's WGSL kernels through wgpu (Vulkan, Metal, DX12).
    Gpu,
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
    /// GPU adapter (--backend gpu): an index or part of a name, as `info` lists them.
    #[arg(long)]
    pub adapter: Option<String>,
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
    let (mut ms, phases, peak, device) = match args.backend {
        Backend::Cpu => {
            let (ms, phases) = run_cpu(args, plan, &ids, &pool)?;
            (ms, Some(phases), Some(peak(&pool, args.peak_gflops)?), serde_json::Value::Null)
        }
        Backend::Gpu => {
            if args.trace.is_some() || args.no_phases {
                return Err("--trace and --no-phases time CPU phases; the GPU backend has neither yet".into());
            }
            let (ms, device) = run_gpu(args, plan, &ids)?;
            let given = args.peak_gflops.map(|gflops| Peak { gflops, source: "given" });
            (ms, None, given, device)
        }
    };
    ms.sort_by(f64::total_cmp);
    let median = if ms.len() % 2 == 1 { ms[ms.len() / 2] } else { (ms[ms.len() / 2 - 1] + ms[ms.len() / 2]) / 2.0 };
    let tokens_per_step = plan.tokens() * args.grad_accum;
    let tokens_per_sec = tokens_per_step as f64 / median * 1e3;
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    let fpt = flops_per_token(&plan);
    let achieved = fpt * tokens_per_sec / 1e9;
    let report = json!({
        "backend": if args.backend == Backend::Gpu { "gpu" } else { "cpu" },
        "device": device,
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
        "phases_ms": phases.filter(|_| !args.no_phases).map(|p| p.json_ms(args.iters as f64)),
        "achieved_gflops": achieved,
        "peak_gflops": peak.as_ref().map(|p| p.gflops),
        "peak_source": peak.as_ref().map(|p| p.source),
        "mfu": peak.as_ref().map(|p| achieved / p.gflops),
    });
    if args.json {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

/// Steps on the CPU: each step's milliseconds and the summed phases.
fn run_cpu(args: &BenchArgs, plan: Plan, ids: &[u32], pool: &ThreadPool) -> Result<(Vec<f64>, Phases), String> {
    let mut trace = args.trace.as_deref().map(|p| Trace::new(p, args.trace_steps)).transpose()?;
    let result = with_fresh_trainer(plan, ids, args.grad_accum, |trainer, train| {
        let mut ms = Vec::with_capacity(args.iters);
        let mut phases = Phases::default();
        for i in 0..args.warmup + args.iters {
            let diverged = |e| format!("bench diverged at {e}");
            let step = if args.no_phases {
                let start = Instant::now();
                trainer.train_step(pool, train).map_err(diverged)?;
                Phases { total: start.elapsed().as_secs_f64(), ..Phases::default() }
            } else {
                let traced = trace.as_mut().filter(|_| i >= args.warmup);
                timed_step(trainer, pool, train, traced).map_err(diverged)?.phases
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
    Ok(result)
}

/// Steps on the GPU: each step's milliseconds (submit to results, so each timed step ends
/// with the one read of its loss that training does every log interval) and what ran.
fn run_gpu(args: &BenchArgs, plan: Plan, ids: &[u32]) -> Result<(Vec<f64>, serde_json::Value), String> {
    let train = train_split(&plan, ids)?;
    let gpu = block_on(Gpu::open(args.adapter.as_deref())).map_err(|e| e.to_string())?;
    let mut params = vec![0.0; plan.params_len()];
    init_params(&plan, &mut params, &mut Rng::new(1337));
    let cfg = bench_train_config(args.grad_accum);
    let mut trainer = block_on(GpuTrainer::new(gpu, plan, cfg, Rng::new(1), &params)).map_err(|e| e.to_string())?;
    let mut ms = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        let start = Instant::now();
        let lr = trainer.step(train);
        let stats = block_on(trainer.stats(lr)).map_err(|e| e.to_string())?;
        if stats.skipped > 0 {
            return Err(format!("bench diverged at step {}: loss {}, gradient norm {}", trainer.step, stats.last.loss, stats.last.grad_norm));
        }
        if i >= args.warmup {
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let a = &trainer.gpu().adapter;
    let device = json!({
        "adapter": a.name,
        "backend": a.backend,
        "device_type": a.device_type,
        "kernels_per_step": trainer.kernels_per_step(),
        "submits_per_step": 1,
        "device_memory_mib": trainer.device_bytes() as f64 / 1048576.0,
    });
    Ok((ms, device))
}

fn print_table(r: &serde_json::Value) {
    let c = &r["config"];
    let d = &r["device"];
    let on = match d["adapter"].as_str() {
        Some(a) => format!("gpu: {a} ({}), {} kernels and 1 submit per step", d["backend"].as_str().unwrap_or("?"), d["kernels_per_step"]),
        None => format!("cpu, threads: {}", r["threads"]),
    };
    println!(
        "bench: {} layers, {} heads, {} embd, block {}, batch {}x{} ({} tokens/step), {:.2}M params, {on}",
        c["n_layer"], c["n_head"], c["n_embd"], c["block_size"], r["batch"], r["grad_accum"], r["tokens_per_step"],
        r["params"].as_f64().unwrap_or(0.0) / 1e6
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
    let mfu = match r["peak_gflops"].as_f64() {
        Some(peak) => format!("peak {peak:.1} GFLOP/s ({}); MFU {:.1}%", r["peak_source"].as_str().unwrap_or("?"), 100.0 * f(&r["mfu"])),
        None => "MFU: give the device's peak with --peak-gflops".into(),
    };
    println!("  FLOPs/token   {:.2}M; achieved {:.1} GFLOP/s; {mfu}", f(&r["flops_per_token"]) / 1e6, f(&r["achieved_gflops"]));
}
