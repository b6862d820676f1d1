//! `alpha-native train`: nanoGPT's training loop on the CPU or a GPU, with evaluation,
//! samples, atomic checkpoints, exact resume, JSON Lines metrics and a progress bar. The
//! run's parts are in [`crate::run`]; this puts them together.

use crate::corpus;
use crate::device::{Backend, PrecisionArg};
use crate::fsutil::{temp_path, write_atomic};
use crate::interrupt::Interrupt;
use crate::ranks::{fingerprint, fingerprint_text, fingerprint_tokens, Group};
use crate::run::args::TrainArgs;
use crate::run::checkpointer::Checkpointer;
use crate::run::console::Console;
use crate::run::outputs::Files;
use crate::run::setup::{self, Run};
use crate::run::training::{Throughput, Training};
use crate::runfile;
use alpha_core::engine::{Description, Driver, Engine, Splits};
use alpha_core::parallel::ThreadPool;
use alpha_core::train::Ranks;
use alpha_core::Plan;
use alpha_gpu::block_on;
use anyhow::{anyhow, Error, Result};
use serde_json::{json, Value};

/// Runs `train`. `explicit(flag)` tells whether a flag (clap id, e.g. `"min_lr"`) was given on
/// the command line, which decides what a resumed run takes from its checkpoint.
pub fn run(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool) -> Result<()> {
    let group = Group::launched()?;
    if group.ranks() == 1 {
        return run_in(args, explicit, &group);
    }
    // One rank's error stops them all (the others would wait for it forever).
    run_in(args, explicit, &group).unwrap_or_else(|e| group.fail(&format!("{e:#}")));
    Ok(())
}

/// [`run`] as one rank of `group`: rank 0 writes everything (console, metrics, samples,
/// checkpoints, the run file, the trace); every rank trains its share of each step.
fn run_in(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool, group: &Group) -> Result<()> {
    let root = group.is_root();
    let mut run = setup::resolve(args, explicit)?;
    let pool = args.device.pool()?;
    let inputs = setup::inputs(args, &mut run, &pool)?;
    let streams = inputs.data.streams();
    let splits = inputs.data.splits(&streams, run.config.block_size, &corpus::label(&run.settings.data))?;
    args.device.check()?;
    if args.trace.is_some() && group.ranks() > 1 && args.device.backend == crate::device::Backend::Gpu {
        return Err(anyhow!("--trace times one process's GPU kernels; GPU ranks split each step in two submissions: trace a run of one process"));
    }
    crate::memory::check(&inputs.plan, args.device.backend)?;
    let s = run.settings.clone();
    let files = Files::new(args, explicit, &s);
    let mut outputs = files.open(args, root)?;
    let (start, carried) = setup::start(&mut run, &inputs.plan)?;
    let start_step = start.step;
    let started = setup::open_engine(args, explicit, &pool, inputs.plan, &s, (start, &carried), group)?;
    let peak = if root { Some(crate::engine::peak(&started.opened, &pool, args.peak_gflops)?) } else { None };
    let (mut engine, gpu, cuda) = (started.opened.engine, started.opened.gpu, started.opened.cuda);
    let resolved = runfile::resolved(args, &s, gpu.as_ref(), cuda.as_ref());
    if group.ranks() > 1 {
        agree(group, &mut *engine, &resolved, splits)?;
    }
    if root {
        write_atomic(&files.run_file, resolved.as_bytes()).map_err(|e| anyhow!("cannot write {}: {e}", files.run_file.display()))?;
    }
    let interrupt = interrupt(root, &files)?;
    let console = Console::new(s.iters, start_step, root);
    let description = engine.describe();
    console.line(&introduction(args, &run, &inputs.plan, start_step, &description, group.ranks()));
    if !run.changed.is_empty() {
        console.line(&format!("the flags change the checkpoint's settings: {}", run.changed.join(", ")));
    }
    if let Some(gpu) = &gpu {
        console.line(&started.device.precision_line(gpu, started.precision_from_checkpoint));
    }
    if let Some(cuda) = &cuda {
        console.line(&cuda.precision_line);
    }
    if started.device.backend == Backend::Cpu && started.device.precision != PrecisionArg::F32 {
        console.line(&started.device.cpu_operands()?.1);
    }
    let plan = &inputs.plan;
    // MFU and HFU over each logged window, against the peak of every rank's device together.
    let throughput = Throughput::new(plan, started.config.grad_accum, peak, group.ranks());
    let device = crate::engine::device_json(&description);
    outputs.metrics.write(start_record(&run, plan, start_step, &description, &throughput, &pool))?;
    let resumed_at = args.resume.as_ref().map(|_| start_step);
    let checkpointer = Checkpointer::new(files.checkpoint.clone(), plan, &s, &inputs.tokenizer, root, interrupt.clone(), resumed_at)?;
    let best_val_loss = carried.best_val_loss.filter(|_| s.save == alpha_core::settings::SavePolicy::Best);
    let mut training = Training {
        engine: &mut *engine,
        tokenizer: &inputs.tokenizer,
        console: &console,
        metrics: &mut outputs.metrics,
        checkpointer,
        throughput,
        device,
        save: s.save,
        iters: s.iters,
        best_val_loss,
        root,
    };
    let mut driver = Driver::new(s.cadence(), start_step, s.seed, s.eval_iters);
    if !root {
        // Rank 0 samples; sampling leaves the training state as it was.
        driver = driver.without_samples();
    }
    let stopped = training.run(driver, splits, outputs.trace.take(), group, &|| interrupt.requested())?;
    training.end(stopped);
    Ok(())
}

/// Ctrl-C and SIGTERM (on every rank under mpirun): the run stops at the end of its step and
/// saves; a second signal stops it at once, the checkpoint on disk a whole one (rank 0 removes
/// the temporary files of `files` it was writing).
fn interrupt(root: bool, files: &Files) -> Result<Interrupt> {
    let first = "stopping: the run saves at the end of this step (a second Ctrl-C or SIGTERM stops it at once)";
    let interrupt = Interrupt::install(root.then(|| first.to_string()))?;
    if root {
        for file in [&files.checkpoint, &files.run_file] {
            interrupt.remove_on_stop(temp_path(file).expect("the outputs have file names"));
        }
    }
    Ok(interrupt)
}

/// The ranks of a data-parallel run agree on their settings (the run file each resolved),
/// data and starting weights, or stop saying which differ.
fn agree(group: &Group, engine: &mut dyn Engine, resolved: &str, splits: Splits<'_>) -> Result<()> {
    let (train_ids, val_ids) = (fingerprint_tokens(splits.train), fingerprint_tokens(splits.val));
    let params = fingerprint(&block_on(engine.state()).map_err(Error::msg)?.0, f32::to_bits);
    group.agree(&[("settings", fingerprint_text(resolved)), ("training data", train_ids), ("validation data", val_ids), ("starting weights", params)])
}

/// The metrics' first record: the run's model, settings, device, machine, memory and FLOPs.
fn start_record(run: &Run, plan: &Plan, start_step: u64, description: &Description, throughput: &Throughput, pool: &ThreadPool) -> Value {
    let peak = throughput.peak.as_ref();
    json!({"type": "start", "step": start_step, "params": plan.num_params(),
        "config": run.config, "settings": run.settings, "device": crate::engine::device_json(description), "ranks": throughput.ranks,
        "backend": description.backend,
        "precision": description.precision, "machine": crate::peak::machine_json(pool), "recompute": plan.recompute(),
        "memory_mib": crate::memory::plan_json(plan), "flops_per_token": throughput.model_flops, "hardware_flops_per_token": throughput.hardware_flops,
        "peak_gflops": peak.map(|p| p.gflops), "peak_source": peak.map(|p| p.source)})
}

/// The run's first line: how it starts, the model, the batch, where it trains and on what.
fn introduction(args: &TrainArgs, run: &Run, plan: &Plan, start_step: u64, description: &Description, ranks: usize) -> String {
    let (c, s) = (&run.config, &run.settings);
    let what = match (&args.init_from, start_step) {
        (_, 1..) => format!("resuming at step {start_step}"),
        (Some(from), _) => format!("fine-tuning {}", from.display()),
        (None, _) => "training from scratch".into(),
    };
    let on = match ranks {
        1 => description.summary.clone(),
        n => format!("{n} MPI ranks of {} each", description.summary),
    };
    let params = plan.num_params();
    format!(
        "{what}: {params} parameters ({:.2}M), vocab {}, {} layers, {} heads, {} embd, block {}, batch {}x{}, on {on}, data {}",
        params as f64 / 1e6,
        c.vocab_size,
        c.n_layer,
        c.n_head,
        c.n_embd,
        c.block_size,
        s.batch,
        s.grad_accum,
        s.data
    )
}
