//! Whether a run fits in this machine's memory, checked before anything is allocated: an
//! allocation the system refuses aborts the process without a word, and one it grants on
//! overcommit gets the process killed halfway through the first step.

use crate::device::Backend;
use alpha_core::Plan;
use anyhow::{anyhow, Result};

/// Bytes of host memory a run of `plan` needs, split as (model state, activations and batch).
/// Model state: the parameters, their gradients and both AdamW moments, plus up to three
/// more copies of the parameters' size while a run starts or writes a checkpoint; on a GPU
/// the device holds the working copies, the host the run state and checkpoint copies.
/// Activations (with the backward's scratch) and the batch live on the device on a GPU.
fn host_bytes(plan: &Plan, backend: Backend) -> (u128, u128) {
    let (p, activations, batch) = arena_bytes(plan);
    match backend {
        Backend::Cpu | Backend::Auto => (7 * p, activations + batch),
        Backend::Gpu | Backend::Cuda => (4 * p, 0),
    }
}

/// Bytes of the arenas a CPU run of `plan` allocates, as (parameters, activations with the
/// backward's scratch, the batch's input and target tokens); the gradients and both AdamW
/// moments are each the parameters' size.
pub fn arena_bytes(plan: &Plan) -> (u128, u128, u128) {
    let four_bytes = |n: usize| n as u128 * 4;
    (four_bytes(plan.params_len()), four_bytes(plan.acts_len()), four_bytes(2 * plan.tokens()))
}

/// The arenas of a run of `plan` in MiB, as JSON (params, grads, adam_m, adam_v,
/// activations, batch, total): the memory plan reports show.
pub fn plan_json(plan: &Plan) -> serde_json::Value {
    let (p, activations, batch) = arena_bytes(plan);
    let mib = |bytes: u128| bytes as f64 / (1024.0 * 1024.0);
    serde_json::json!({
        "params": mib(p), "grads": mib(p), "adam_m": mib(p), "adam_v": mib(p),
        "activations": mib(activations), "batch": mib(batch), "total": mib(4 * p + activations + batch),
    })
}

/// Bytes the system can still give this process: available memory plus free swap, from
/// Linux's `/proc/meminfo`; `None` elsewhere (or where it cannot be read).
fn available_bytes() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| info.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u128>().ok());
    Some((kib("MemAvailable:")? + kib("SwapFree:").unwrap_or(0)) * 1024)
}

/// An error saying what a run of `plan` needs and what the machine has, when the first is
/// larger; `Ok` where the available memory is unknown.
pub fn check(plan: &Plan, backend: Backend) -> Result<()> {
    match available_bytes() {
        Some(available) => check_against(plan, backend, available),
        None => Ok(()),
    }
}

fn check_against(plan: &Plan, backend: Backend, available: u128) -> Result<()> {
    let (state, activations) = host_bytes(plan, backend);
    let need = state + activations;
    if need <= available {
        return Ok(());
    }
    let detail = match backend {
        Backend::Cpu | Backend::Auto => {
            format!("model state {}, activations {} for a batch of {} x {} tokens", size(state), size(activations), plan.batch, plan.seq)
        }
        Backend::Gpu | Backend::Cuda => "the run state and checkpoint copies of the model".to_string(),
    };
    Err(anyhow!("this run needs {} of memory ({detail}) but this machine has {} available; use a smaller batch, block or model", size(need), size(available)))
}

/// The largest batch in `1..=max` for which `fits` holds (`fits` true up to some batch and
/// false above it), or 0 when not even one sequence fits: doubling, then bisection.
pub fn largest_batch(max: usize, fits: impl Fn(usize) -> bool) -> usize {
    if !fits(1) {
        return 0;
    }
    let mut low = 1;
    while low < max && fits((2 * low).min(max)) {
        low = (2 * low).min(max);
    }
    // fits(low), and low == max or !fits(min(2 * low, max)).
    let mut high = (2 * low).min(max);
    if low == high {
        return low;
    }
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid) {
            low = mid;
        } else {
            high = mid;
        }
    }
    low
}

/// `bytes` in the largest binary unit that keeps it at least 1 (one decimal).
fn size(bytes: u128) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alpha_core::GptConfig;

    fn plan(batch: usize) -> Plan {
        let config = GptConfig::gpt2(65, 64, 2, 2, 32);
        Plan::new(config, batch, 64).unwrap()
    }

    #[test]
    fn a_run_larger_than_the_memory_is_refused_with_both_sizes() {
        let p = plan(4);
        let (state, acts) = host_bytes(&p, Backend::Cpu);
        assert!(state > 0 && acts > 0);
        assert!(check_against(&p, Backend::Cpu, state + acts).is_ok());
        let err = check_against(&p, Backend::Cpu, state + acts - 1).unwrap_err().to_string();
        assert!(err.contains(&format!("needs {}", size(state + acts))) && err.contains("for a batch of 4 x 64 tokens"), "{err}");
        // On a GPU the activations are on the device.
        assert_eq!(host_bytes(&p, Backend::Gpu).1, 0);
        assert!(host_bytes(&plan(400), Backend::Cpu).1 > 50 * acts);
    }

    #[test]
    fn the_largest_batch_is_found_at_every_edge() {
        for limit in [0, 1, 2, 3, 7, 64, 65, 1000, 1 << 24] {
            assert_eq!(largest_batch(1 << 24, |b| b <= limit), limit);
        }
        assert_eq!(largest_batch(100, |_| true), 100);
        // Against real plans: the batch found fits, one more does not.
        let (state, acts) = host_bytes(&plan(4), Backend::Cpu);
        let fits = |b| check_against(&plan(b), Backend::Cpu, state + acts).is_ok();
        assert_eq!(largest_batch(1 << 24, fits), 4);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size(1000), "1000 bytes");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(u128::MAX), format!("{:.1} EiB", u128::MAX as f64 / (1u128 << 60) as f64));
    }

    #[test]
    fn this_machine_reports_its_memory() {
        if cfg!(target_os = "linux") {
            assert!(available_bytes().is_some_and(|b| b > 0));
        }
    }
}
