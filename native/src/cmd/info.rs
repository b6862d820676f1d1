//! `alpha-native info`: the machine and what a configuration will need, before a long run.

use crate::args::ModelArgs;
use crate::device::{Backend, DeviceArgs};
use crate::engine::Placement;
use crate::peak::{fma_limit, gpu_peak, machine_json, measured_bf16_peak, measured_peak, simd_features};
use crate::step::{bench_train_config, fresh_start, timed_step, train_split};
use alpha_core::config::MAX_DIM;
use alpha_core::engine::StepError;
use alpha_core::gemm::f32_kernel_name;
use alpha_core::parallel::ThreadPool;
use alpha_core::{GptConfig, Plan, Rng};
use alpha_gpu::driver_stats::KernelStatistics;
use alpha_gpu::peak::Real;
use alpha_gpu::{block_on, AdapterSummary, Gpu, GpuTrainer};
use anyhow::{anyhow, Error, Result};
use clap::Args;
use serde_json::{json, Value};
use std::time::Instant;

/// Flags of `alpha-native info`.
#[derive(Args, Debug, Clone)]
pub struct InfoArgs {
    /// Model shape and data.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Steps of the planned run (for the whole-run estimate; 0 or more).
    #[arg(long, default_value_t = 2000)]
    pub iters: u64,
    /// Evaluation interval of the planned run (0: none).
    #[arg(long, default_value_t = 250)]
    pub eval_interval: u64,
    /// Batches per split and evaluation of the planned run (0 or more).
    #[arg(long, default_value_t = 20)]
    pub eval_iters: u64,
    /// Steps timed for the estimate (after one warm-up step), 0 to 1000; 0 skips it.
    #[arg(long, default_value_t = 3)]
    pub measure_steps: usize,
    /// Where the estimate is measured.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// The device's peak GFLOP/s (positive): the CPU's, and with --backend gpu the GPU's f32
    /// FMA limit too. Default: measured (the cache keeps the highest measurement).
    #[arg(long)]
    pub peak_gflops: Option<f64>,
    /// Plan a data-parallel run of this many MPI ranks (`mpirun -np N train`): the gradient
    /// traffic per step, its time at --link-gbps, how much of it the backward can hide, and
    /// the memory per rank with and without --zero 1 (1 to 65536).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub ranks: u32,
    /// The link between ranks in Gbit/s for --ranks (100: a common cluster network; shared
    /// memory within a machine is faster).
    #[arg(long, default_value_t = 100.0)]
    pub link_gbps: f64,
    /// With --backend gpu on Vulkan: compile every kernel the run would (at its precision,
    /// on the tensor cores the tensor-core GEMM) and print what the driver's compiler reports
    /// of each (VK_KHR_pipeline_executable_properties; NVIDIA: registers per thread and local
    /// memory, the occupancy and spills `nvcc -Xptxas -v` shows for CUDA).
    #[arg(long)]
    pub kernels: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The most steps `--measure-steps` may time.
const MAX_MEASURE_STEPS: usize = 1000;

/// Runs `info`.
pub fn run(args: &InfoArgs) -> Result<()> {
    check(args)?;
    let m = &args.model;
    let (tok, ids) = m.sample_tokens(&alpha_core::Serial)?;
    let config = m.config(tok.vocab_size());
    let plan = m.plan(config, tok.vocab_size(), m.batch)?;
    args.device.check()?;
    let pool = args.device.pool()?;
    // A run that cannot fit is described, not measured.
    let fits = crate::memory::check(&plan, args.device.backend);
    let gpu = match args.device.backend {
        Backend::Gpu => Some(args.device.open_gpu()?),
        Backend::Cpu | Backend::Cuda | Backend::Auto => None,
    };
    let cuda = if args.device.backend == Backend::Cuda { Some(cuda_json(&args.device, &plan)?) } else { None };
    let kernels = match &gpu {
        Some(g) if args.kernels => Some(driver_statistics(g, config.n_embd / config.n_head)?),
        _ => None,
    };
    let (estimate, device) = if args.measure_steps > 0 && fits.is_ok() { measure(args, &pool, plan, &ids)? } else { (Value::Null, Value::Null) };
    let (p, activations, batch) = crate::memory::arena_bytes(&plan);
    let total = 4 * p + activations + batch;
    let data_parallel = (args.ranks > 1).then(|| data_parallel_plan(&plan, args.ranks as usize, args.link_gbps, estimate["ms_backward"].as_f64(), total));
    let peak = measured_peak(&pool, args.peak_gflops)?;
    let bandwidth = crate::peak::memory_bandwidth(&pool);
    let adapters = block_on(alpha_gpu::context::adapters());
    let largest = |recompute| largest_batch(config, recompute, args.device.backend, gpu.as_ref());
    let mut report = json!({
        "data_parallel": data_parallel,
        "peak_gflops": peak.gflops,
        "peak_source": peak.source,
        "peak_bf16_gflops": measured_bf16_peak(&pool),
        "bf16_kernel": alpha_core::gemm::bf16::bf16_kernel_name(),
        "fma_limit_gflops": fma_limit(&pool),
        "memory_bandwidth_gbs": bandwidth,
        // Sampling one token with the KV cache reads every weight once: this is its floor.
        "weights_read_ms": (plan.num_params() * 4) as f64 / bandwidth / 1e6,
        "config": config,
        "batch": m.batch,
        "params": plan.num_params(),
        "flops_per_token": plan.flops_per_token(),
        "recompute": plan.recompute(),
        "memory_mib": memory_json(&plan),
        "memory_error": fits.as_ref().err().map(|e| format!("{e:#}")),
        "largest_batch": {"without_recompute": largest(false), "with_recompute": largest(true)},
        "backend": args.device.backend.name(),
        "cuda": cuda,
        "device": device,
        "estimate": estimate,
        "gpu_adapters": adapters.iter().map(adapter_json).collect::<Vec<_>>(),
        "gpu_peak_gflops": gpu.as_ref().map(|g| gpu_peaks(g, args.peak_gflops)).transpose()?,
        "gpu_kernels": kernels.as_ref().map(|k| k.iter().map(|s| json!({"kernel": s.kernel, "statistics": s.statistics})).collect::<Vec<_>>()),
    });
    // The machine's keys (cpu, cores, threads, simd, gemm_kernel) beside the rest.
    if let (Some(r), Value::Object(machine)) = (report.as_object_mut(), machine_json(&pool)) {
        r.extend(machine);
    }
    if args.json {
        println!("{report}");
        return Ok(());
    }
    print_machine(&report);
    print_plan(&report, gpu.as_ref());
    print_gpu(&report, gpu.as_ref(), kernels.as_deref());
    print_cuda(&report["cuda"]);
    print_estimate(args, &report);
    print_adapters(&adapters);
    Ok(())
}

/// Refuses flags out of their ranges.
fn check(args: &InfoArgs) -> Result<()> {
    if args.measure_steps > MAX_MEASURE_STEPS {
        return Err(anyhow!("--measure-steps {} is more than {MAX_MEASURE_STEPS}", args.measure_steps));
    }
    if !(args.link_gbps.is_finite() && args.link_gbps > 0.0) {
        return Err(anyhow!("--link-gbps must be a positive number of Gbit/s, not {}", args.link_gbps));
    }
    if args.kernels && args.device.backend != Backend::Gpu {
        return Err(anyhow!("--kernels needs --backend gpu"));
    }
    Ok(())
}

/// The plan's memory in MiB, with the activations both without and with recompute.
fn memory_json(plan: &Plan) -> Value {
    let mib = |bytes: u128| bytes as f64 / (1024.0 * 1024.0);
    let (_, activations, _) = crate::memory::arena_bytes(plan);
    // The other choice of --recompute, for comparison.
    let (_, other_activations, _) = crate::memory::arena_bytes(&plan.with_recompute(!plan.recompute()));
    let (plain, recomputed) = if plan.recompute() { (other_activations, activations) } else { (activations, other_activations) };
    let mut memory = crate::memory::plan_json(plan);
    memory["activations_plain"] = json!(mib(plain));
    memory["activations_recompute"] = json!(mib(recomputed));
    memory
}

/// The GPU's FMA limits, f32 and (where it has shader-f16) f16, and where the f16 products
/// run on the tensor cores theirs: the MFU denominators.
fn gpu_peaks(g: &Gpu, given: Option<f64>) -> Result<Value> {
    let f16 = g.adapter.features.contains(&"shader-f16");
    let measure = |real, given| gpu_peak(g, real, given, true).map(|p| p.gflops);
    let tensor = if g.tensor_cores() { Some(measure(Real::Tensor, None)?) } else { None };
    Ok(json!({"f32": measure(Real::F32, given)?, "f16": if f16 { Some(measure(Real::F16, None)?) } else { None }, "tensor": tensor}))
}

/// Times `--measure-steps` steps of `plan` on `ids` and as many evaluation batches: the run's
/// estimate and the device, as JSON.
fn measure(args: &InfoArgs, pool: &ThreadPool, plan: Plan, ids: &[u32]) -> Result<(Value, Value)> {
    let train = train_split(&plan, ids)?;
    let mut engine = crate::engine::open(&args.device, pool, plan, bench_train_config(1), fresh_start(&plan)?, Placement::alone())?.engine;
    let device = crate::engine::device_json(&engine.describe());
    let n = args.measure_steps;
    let failed = |e| match e {
        StepError::Diverged(e) => anyhow!("diverged at {e}"),
        StepError::Device(e) => anyhow!(e),
    };
    timed_step(&mut *engine, train.into(), true, None, true).map_err(failed)?;
    let t = Instant::now();
    let mut backward = 0.0;
    for _ in 0..n {
        backward += timed_step(&mut *engine, train.into(), true, None, true).map_err(failed)?.1.backward;
    }
    let ms_step = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    // The GPU's steps are one submission: their backward is not timed apart.
    let ms_backward = (args.device.backend == Backend::Cpu).then_some(backward * 1e3 / n as f64);
    let t = Instant::now();
    block_on(engine.evaluate(train.into(), n, &mut Rng::new(2))).map_err(Error::msg)?;
    let ms_eval_batch = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    // In f64: the planned run's counts may be as large as u64 allows.
    let evals = args.iters.checked_div(args.eval_interval).map_or(0.0, |e| e as f64 + 1.0);
    let eval_ms = evals * 2.0 * args.eval_iters as f64 * ms_eval_batch;
    let estimate = json!({
        "measured_steps": n, "ms_per_iter": ms_step, "ms_backward": ms_backward, "ms_per_eval_batch": ms_eval_batch,
        "training_s": ms_step * args.iters as f64 / 1e3, "evaluation_s": eval_ms / 1e3,
        "run_s": (ms_step * args.iters as f64 + eval_ms) / 1e3,
    });
    Ok((estimate, device))
}

/// A number of the report (NaN where it has none).
fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The text's lines on the machine: CPU, SIMD, peaks, memory bandwidth.
fn print_machine(report: &Value) {
    println!("CPU        {} ({} cores; threads used: {})", report["cpu"].as_str().unwrap_or("?"), report["cores"], report["threads"]);
    let masked: Vec<_> = alpha_core::simd::masked_names().collect();
    let masked = if masked.is_empty() { String::new() } else { format!("; ALPHA_CPU_MASK hides {}", masked.join(" ")) };
    println!("SIMD       {} (GEMM kernel: {}{masked})", simd_features().join(" "), f32_kernel_name());
    println!("peak       {:.1} GFLOP/s ({})", num(&report["peak_gflops"]), report["peak_source"].as_str().unwrap_or("?"));
    match report["peak_bf16_gflops"].as_f64() {
        Some(bf16) => {
            println!("peak bf16  {bf16:.1} GFLOP/s (products of bf16 operands summed in f32, {} kernel)", report["bf16_kernel"].as_str().unwrap_or("?"))
        }
        None => println!("peak bf16  none: this CPU has no bf16 products (AVX512-BF16)"),
    }
    if let Some(fma) = report["fma_limit_gflops"].as_f64() {
        println!("FMA limit  {fma:.1} GFLOP/s (independent vector FMAs on registers: no GEMM passes it at the same clock)");
    }
    println!(
        "memory     {:.1} GB/s read, all threads: {:.2} ms to read the weights once (a sampled token's floor with the KV cache)",
        num(&report["memory_bandwidth_gbs"]),
        num(&report["weights_read_ms"])
    );
}

/// The text's lines on the configuration: the model, its memory, what fits.
fn print_plan(report: &Value, gpu: Option<&Gpu>) {
    let c = &report["config"];
    let params = report["params"].as_u64().unwrap_or(0);
    println!(
        "model      {} layers, {} heads, {} embd, block {}, vocab {}: {params} parameters ({:.2}M), {:.2}M FLOPs/token",
        c["n_layer"],
        c["n_head"],
        c["n_embd"],
        c["block_size"],
        c["vocab_size"],
        params as f64 / 1e6,
        num(&report["flops_per_token"]) / 1e6
    );
    let mm = &report["memory_mib"];
    println!(
        "memory     params {:.2} MiB, grads {:.2}, AdamW m {:.2}, v {:.2}, activations {:.2} (batch {}; {:.2} without --recompute, {:.2} with), total {:.2} MiB",
        num(&mm["params"]),
        num(&mm["grads"]),
        num(&mm["adam_m"]),
        num(&mm["adam_v"]),
        num(&mm["activations"]),
        report["batch"],
        num(&mm["activations_plain"]),
        num(&mm["activations_recompute"]),
        num(&mm["total"])
    );
    let limit = if gpu.is_some() { "this machine's memory and the adapter's limits" } else { "this machine's memory" };
    let largest = &report["largest_batch"];
    println!("fits       batch up to {} of {} tokens, {} with --recompute ({limit})", largest["without_recompute"], c["block_size"], largest["with_recompute"]);
    if let Some(e) = report["memory_error"].as_str() {
        println!("estimate   not measured: {e}");
    }
}

/// The text's lines on the measured steps (their device, the run's estimate) and the ranks.
fn print_estimate(args: &InfoArgs, report: &Value) {
    let device = &report["device"];
    if !device.is_null() {
        let buffers = device["activation_buffers"].as_u64().unwrap_or(1);
        let split = if buffers > 1 { format!(" (the activations in {buffers} buffers: the arena is past the device's largest)") } else { String::new() };
        println!(
            "GPU run    {} ({}): {:.2} MiB of device memory{split}, {} kernels and 1 submit per step",
            device["adapter"].as_str().unwrap_or("?"),
            device["backend"].as_str().unwrap_or("?"),
            num(&device["device_memory_mib"]),
            device["kernels_per_step"]
        );
    }
    let estimate = &report["estimate"];
    if !estimate.is_null() {
        println!(
            "estimate   {:.1} ms/iter on the {} (measured over {} steps); {} iters: {:.0} s training + {:.0} s evaluation = {:.1} min",
            num(&estimate["ms_per_iter"]),
            report["backend"].as_str().unwrap_or("?"),
            args.measure_steps,
            args.iters,
            num(&estimate["training_s"]),
            num(&estimate["evaluation_s"]),
            num(&estimate["run_s"]) / 60.0
        );
    }
    let dp = &report["data_parallel"];
    if !dp.is_null() {
        let hidden = match dp["exposed_ms"].as_f64() {
            Some(exposed) => format!("{exposed:.1} ms of it left after the backward hides what it can"),
            None => "how much the backward hides needs a measured step (--measure-steps)".into(),
        };
        println!(
            "{} ranks   ring all-reduce of {:.1} MiB of gradients: {:.1} MiB sent per rank per step, {:.1} ms at {} Gbit/s ({hidden}); memory per rank {:.1} MiB, {:.1} MiB with --zero 1",
            dp["ranks"],
            num(&dp["gradient_mib"]),
            num(&dp["sent_mib_per_rank"]),
            num(&dp["allreduce_ms"]),
            args.link_gbps,
            num(&dp["memory_mib_per_rank"]),
            num(&dp["memory_mib_per_rank_zero1"])
        );
    }
}

/// The text's lines on the GPU used: its peaks, its kernels' statistics.
fn print_gpu(report: &Value, gpu: Option<&Gpu>, kernels: Option<&[KernelStatistics]>) {
    let peaks = &report["gpu_peak_gflops"];
    if let Some(g) = gpu {
        let f16 = match peaks["f16"].as_f64() {
            Some(h) => format!(", f16 {h:.1}"),
            None => " (no shader-f16)".into(),
        };
        let tensor = peaks["tensor"].as_f64().map_or(String::new(), |t| format!(", tensor cores (f16 products, f32 sums) {t:.1}"));
        println!("GPU peak   {}: f32 {:.1}{f16}{tensor} GFLOP/s (independent FMAs on registers: the MFU denominators)", g.adapter.name, num(&peaks["f32"]));
    }
    if let Some(kernels) = kernels {
        println!("kernels    as the driver compiled them (VK_KHR_pipeline_executable_properties):");
        let width = kernels.iter().map(|k| k.kernel.len()).max().unwrap_or(0);
        for k in kernels {
            let stats: Vec<String> = k.statistics.iter().map(|(name, value)| format!("{name} {value}")).collect();
            println!("  {:<width$}  {}", k.kernel, stats.join("; "));
        }
    }
}

/// The text's lines on every adapter found.
fn print_adapters(adapters: &[AdapterSummary]) {
    if adapters.is_empty() {
        println!("GPUs       none found (on Linux, a Vulkan driver is needed: mesa-vulkan-drivers gives lavapipe)");
    }
    for a in adapters {
        println!(
            "GPU {:<6} {} ({}, {}; {}); features: {}; max buffer {:.0} MiB, max storage binding {:.0} MiB; cooperative matrices: {}; tensor cores: {}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            if a.features.is_empty() { "none we use".to_string() } else { a.features.join(", ") },
            a.max_buffer as f64 / 1048576.0,
            a.max_storage_binding as f64 / 1048576.0,
            if a.cooperative_matrices.is_empty() { "none".to_string() } else { a.cooperative_matrices.join(", ") },
            a.no_tensor_cores.as_ref().map_or("yes (f16 products)".to_string(), |why| format!("no ({why})"))
        );
    }
}

/// The communication and memory of a data-parallel run of `plan` on `ranks` ranks joined by
/// a `link_gbps` link, as JSON. A ring all-reduce sends (and receives) 2(N-1)/N of the
/// gradient bytes per rank. The blocks' gradients are summed while the rest of the backward
/// runs: block l's are final once its backward is done, so all but the last-finished block's
/// can hide behind the backward of the blocks below it (about (L-1)/L of `backward_ms`, the
/// measured backward of a step); the token and position tables (final only at the end of the
/// backward, the tied LM head's gradient included) and the first block are always exposed.
/// `total_bytes`: one process's memory; ZeRO-1 keeps 1/N of the AdamW moments per rank.
fn data_parallel_plan(plan: &Plan, ranks: usize, link_gbps: f64, backward_ms: Option<f64>, total_bytes: u128) -> serde_json::Value {
    let mib = |bytes: f64| bytes / (1024.0 * 1024.0);
    let n = ranks as f64;
    let ring = 2.0 * (n - 1.0) / n;
    let ms = |elements: usize| ring * elements as f64 * 4.0 * 8.0 / (link_gbps * 1e9) * 1e3;
    let c = &plan.config;
    let tables = (c.vocab_size + c.block_size) * c.n_embd;
    let block = (plan.params_len() - tables) / c.n_layer.max(1);
    let hideable = plan.params_len() - tables - block;
    let exposed = backward_ms.map(|b| ms(tables + block) + (ms(hideable) - b * (c.n_layer as f64 - 1.0) / c.n_layer as f64).max(0.0));
    let moments = 2 * plan.params_len() as u128 * 4;
    json!({
        "ranks": ranks,
        "link_gbps": link_gbps,
        "gradient_mib": mib(plan.params_len() as f64 * 4.0),
        "sent_mib_per_rank": mib(ring * plan.params_len() as f64 * 4.0),
        "allreduce_ms": ms(plan.params_len()),
        "backward_ms": backward_ms,
        "exposed_ms": exposed,
        "memory_mib_per_rank": mib(total_bytes as f64),
        "memory_mib_per_rank_zero1": mib((total_bytes - moments + moments.div_ceil(ranks as u128)) as f64),
    })
}

/// What the Vulkan driver of `gpu` makes of each kernel a run on it compiles, attention's for
/// heads of `head_size` (`--kernels`).
fn driver_statistics(gpu: &Gpu, head_size: usize) -> Result<Vec<KernelStatistics>> {
    if gpu.adapter.backend != "Vulkan" {
        return Err(anyhow!("--kernels reads Vulkan drivers' statistics; {} runs on {}", gpu.adapter.name, gpu.adapter.backend));
    }
    let f16 = gpu.precision == alpha_gpu::Precision::F16;
    alpha_gpu::driver_stats::kernel_statistics(&gpu.adapter.name, head_size, f16, gpu.tensor_cores()).map_err(|e| anyhow!("--kernels: {e}"))
}

fn adapter_json(a: &AdapterSummary) -> serde_json::Value {
    json!({
        "index": a.index, "name": a.name, "backend": a.backend, "device_type": a.device_type, "driver": a.driver,
        "features": a.features, "max_buffer_bytes": a.max_buffer, "max_storage_binding_bytes": a.max_storage_binding,
        "cooperative_matrices": a.cooperative_matrices, "no_tensor_cores": a.no_tensor_cores,
    })
}

/// The CUDA device `device` opens: its name, architecture and memory, its measured product
/// peaks (f32, TF32, bf16 where it has them: square cuBLASLt products) and copy bandwidth, and
/// whether `plan`'s training fits its free memory.
#[cfg(feature = "cuda")]
fn cuda_json(device: &DeviceArgs, plan: &Plan) -> Result<Value> {
    use alpha_cuda::{peak, Arithmetic, CudaEngine};
    let (dev, arithmetic, _) = device.open_cuda_local(0)?;
    let i = &dev.info;
    let gflops = |a| peak::product_gflops(&dev, a, 8192);
    let needed = CudaEngine::memory_needed(plan, arithmetic, 1);
    let (free, total) = dev.memory()?;
    Ok(json!({
        "device": i.ordinal,
        "name": i.name,
        "arch": i.arch(),
        "multiprocessors": i.multiprocessors,
        "driver_version": i.driver_version,
        "memory_total_mib": total as f64 / 1048576.0,
        "memory_free_mib": free as f64 / 1048576.0,
        "peak_f32_gflops": gflops(Arithmetic::F32)?,
        "peak_tf32_gflops": gflops(Arithmetic::Tf32)?,
        "peak_bf16_gflops": if i.has_bf16() { Some(gflops(Arithmetic::Bf16)?) } else { None },
        "bandwidth_gbs": peak::bandwidth_gbs(&dev, 1 << 30)?,
        "precision": alpha_cuda::engine::precision_name(arithmetic),
        "training_needs_mib": needed as f64 / 1048576.0,
        "fits": needed <= free as u64,
    }))
}

#[cfg(not(feature = "cuda"))]
fn cuda_json(device: &DeviceArgs, _plan: &Plan) -> Result<Value> {
    match device.open_cuda_local(0)? {}
}

/// The CUDA device's lines of `info --backend cuda`.
fn print_cuda(c: &Value) {
    if c.is_null() {
        return;
    }
    println!(
        "CUDA device {}: {} ({}, {} SMs, driver {})",
        c["device"],
        c["name"].as_str().unwrap_or("?"),
        c["arch"].as_str().unwrap_or("?"),
        c["multiprocessors"],
        c["driver_version"]
    );
    println!("  memory: {:.0} MiB free of {:.0} MiB", c["memory_free_mib"].as_f64().unwrap_or(0.0), c["memory_total_mib"].as_f64().unwrap_or(0.0));
    let tflops = |k: &str| c[k].as_f64().map_or("-".to_string(), |g| format!("{:.1}", g / 1e3));
    println!(
        "  products (cuBLASLt, 8192^3): f32 {} TFLOP/s, TF32 {}, bf16 {}",
        tflops("peak_f32_gflops"),
        tflops("peak_tf32_gflops"),
        tflops("peak_bf16_gflops")
    );
    println!("  memory bandwidth (a copy): {:.0} GB/s", c["bandwidth_gbs"].as_f64().unwrap_or(0.0));
    let fits = if c["fits"].as_bool() == Some(true) { "fits" } else { "does not fit" };
    println!(
        "  this run in {} needs {:.0} MiB on the device: it {fits}",
        c["precision"].as_str().unwrap_or("?"),
        c["training_needs_mib"].as_f64().unwrap_or(0.0)
    );
}

/// The largest batch of whole blocks a training run of `config` fits on `backend` (with
/// `gpu`, within its limits too), with or without recompute.
fn largest_batch(config: GptConfig, recompute: bool, backend: Backend, gpu: Option<&Gpu>) -> usize {
    crate::memory::largest_batch(MAX_DIM, |batch| {
        let Ok(plan) = Plan::new(config, batch, config.block_size) else { return false };
        let plan = plan.with_recompute(recompute);
        crate::memory::check(&plan, backend).is_ok() && gpu.is_none_or(|g| GpuTrainer::check_fits(g, &plan).is_ok())
    })
}
