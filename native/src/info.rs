//! `alpha-native info`: the machine and what a configuration will need, before a long run.

use crate::bench::flops_per_token;
use crate::peak::{cpu_model, peak, simd_features};
use crate::step::{timed_step, with_fresh_trainer};
use crate::train::{load_corpus, ModelArgs};
use alpha_core::gemm::f32_kernel_name;
use alpha_core::parallel::Parallel;
use alpha_core::Plan;
use clap::Args;
use serde_json::json;

/// Flags of `alpha-native info`.
#[derive(Args, Debug, Clone)]
pub struct InfoArgs {
    /// Model shape and data.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Steps of the planned run (for the whole-run estimate).
    #[arg(long, default_value_t = 2000)]
    pub iters: u64,
    /// Evaluation interval of the planned run (0: none).
    #[arg(long, default_value_t = 250)]
    pub eval_interval: u64,
    /// Batches per split and evaluation of the planned run.
    #[arg(long, default_value_t = 20)]
    pub eval_iters: u64,
    /// Steps timed for the estimate (after one warm-up step); 0 skips it.
    #[arg(long, default_value_t = 3)]
    pub measure_steps: usize,
    /// Worker threads. Default: one per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// The machine's peak GFLOP/s. Default: measured once and cached.
    #[arg(long)]
    pub peak_gflops: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `info`.
pub fn run(args: &InfoArgs) -> Result<(), String> {
    let m = &args.model;
    let (tok, ids) = load_corpus(&m.data_name())?;
    let config = m.config(tok.vocab_size());
    let plan = Plan::new(config, m.batch, m.block).map_err(|e| e.to_string())?;
    let pool = crate::thread_pool(args.threads)?;
    let peak = peak(&pool, args.peak_gflops)?;
    let mib = |elements: usize| (elements * 4) as f64 / (1024.0 * 1024.0);
    let p = plan.params_len();
    let memory = json!({
        "params": mib(p), "grads": mib(p), "adam_m": mib(p), "adam_v": mib(p),
        "activations": mib(plan.acts_len()), "batch": mib(2 * plan.tokens()),
        "total": mib(4 * p + plan.acts_len() + 2 * plan.tokens()),
    });
    let mut estimate = serde_json::Value::Null;
    if args.measure_steps > 0 {
        let (step_s, forward_s) = with_fresh_trainer(plan, &ids, 1, |trainer, train| {
            let (mut step_s, mut forward_s) = (0.0, 0.0);
            for i in 0..=args.measure_steps {
                let s = timed_step(trainer, &pool, train, None).map_err(|e| format!("diverged at {e}"))?;
                if i > 0 {
                    step_s += s.phases.total;
                    forward_s += s.phases.forward;
                }
            }
            Ok((step_s, forward_s))
        })?;
        let (ms_step, ms_forward) = (step_s * 1e3 / args.measure_steps as f64, forward_s * 1e3 / args.measure_steps as f64);
        let evals = args.iters.checked_div(args.eval_interval).map_or(0, |e| e + 1);
        let eval_ms = (evals * 2 * args.eval_iters) as f64 * ms_forward;
        estimate = json!({
            "measured_steps": args.measure_steps, "ms_per_iter": ms_step,
            "training_s": ms_step * args.iters as f64 / 1e3, "evaluation_s": eval_ms / 1e3,
            "run_s": (ms_step * args.iters as f64 + eval_ms) / 1e3,
        });
    }
    let report = json!({
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "threads": pool.threads(),
        "simd": simd_features(),
        "gemm_kernel": f32_kernel_name(),
        "peak_gflops": peak.gflops,
        "peak_source": peak.source,
        "config": config,
        "batch": m.batch,
        "params": plan.num_params(),
        "flops_per_token": flops_per_token(&plan),
        "memory_mib": memory,
        "estimate": estimate,
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    println!("CPU        {} ({} cores; threads used: {})", report["cpu"].as_str().unwrap_or("?"), report["cores"], report["threads"]);
    println!("SIMD       {} (GEMM kernel: {})", simd_features().join(" "), f32_kernel_name());
    println!("peak       {:.1} GFLOP/s ({})", peak.gflops, peak.source);
    println!(
        "model      {} layers, {} heads, {} embd, block {}, vocab {}: {} parameters ({:.2}M), {:.2}M FLOPs/token",
        config.n_layer, config.n_head, config.n_embd, config.block_size, config.vocab_size, plan.num_params(),
        plan.num_params() as f64 / 1e6, flops_per_token(&plan) / 1e6
    );
    let mm = &report["memory_mib"];
    println!(
        "memory     params {:.2} MiB, grads {:.2}, AdamW m {:.2}, v {:.2}, activations {:.2} (batch {}), total {:.2} MiB",
        f(&mm["params"]), f(&mm["grads"]), f(&mm["adam_m"]), f(&mm["adam_v"]), f(&mm["activations"]), m.batch, f(&mm["total"])
    );
    if !estimate.is_null() {
        println!(
            "estimate   {:.1} ms/iter (measured over {} steps); {} iters: {:.0} s training + {:.0} s evaluation = {:.1} min",
            f(&estimate["ms_per_iter"]), args.measure_steps, args.iters, f(&estimate["training_s"]), f(&estimate["evaluation_s"]),
            f(&estimate["run_s"]) / 60.0
        );
    }
    Ok(())
}
