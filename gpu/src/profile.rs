//! Timestamp queries around every kernel of a step (`--trace`): each dispatch runs in a
//! compute pass of its own whose start and end are stamped, the stamps are resolved into a
//! buffer at the end of the step's command buffer and read back after it.
//!
//! Unstable: public for Alpha's tools and tests; it changes with any release (see the crate's
//! Stability section).

use crate::context::{Gpu, GpuError};
use crate::kernels::Work;
use crate::readback::read;
use alpha_core::tape::KernelTime;

/// A dispatch as traces name it: its pass, tape op, kernel and work.
pub(crate) type DispatchName = (&'static str, &'static str, &'static str, Work);

/// Hands out consecutive pairs of timestamp queries across query sets.
pub(crate) struct QueryCursor<'q> {
    sets: &'q [wgpu::QuerySet],
    next: u32,
}

impl<'q> QueryCursor<'q> {
    /// The start and end query of the next dispatch.
    pub fn next_pair(&mut self) -> (&'q wgpu::QuerySet, u32) {
        let q = self.next;
        self.next += 2;
        (&self.sets[(q / wgpu::QUERY_SET_MAX_QUERIES) as usize], q % wgpu::QUERY_SET_MAX_QUERIES)
    }
}

/// The query sets and resolve buffer for one step's dispatches.
pub(crate) struct Profiler {
    sets: Vec<wgpu::QuerySet>,
    resolved: wgpu::Buffer,
    /// Every dispatch, in encoding order.
    names: Vec<DispatchName>,
    period_ns: f64,
}

impl Profiler {
    /// Queries for the dispatches `names`; an error if the device has no timestamp queries.
    pub fn new(gpu: &Gpu, names: Vec<DispatchName>) -> Result<Profiler, GpuError> {
        if !gpu.features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            return Err(GpuError(format!("{} has no timestamp queries, so GPU kernels cannot be traced", gpu.adapter.name)));
        }
        let queries = 2 * names.len() as u32;
        let per_set = wgpu::QUERY_SET_MAX_QUERIES;
        let sets = (0..queries.div_ceil(per_set))
            .map(|i| {
                gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("kernel timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (queries - i * per_set).min(per_set),
                })
            })
            .collect();
        let resolved = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("resolved timestamps"),
            size: u64::from(queries.max(2)) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok(Profiler { sets, resolved, names, period_ns: f64::from(gpu.queue.get_timestamp_period()) })
    }

    /// Query pairs for the step's dispatches, from the first.
    pub fn cursor(&self) -> QueryCursor<'_> {
        QueryCursor { sets: &self.sets, next: 0 }
    }

    /// Copies every stamp into the resolve buffer (after the step's last dispatch).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        let per_set = wgpu::QUERY_SET_MAX_QUERIES;
        let queries = 2 * self.names.len() as u32;
        for (i, set) in self.sets.iter().enumerate() {
            let first = i as u32 * per_set;
            enc.resolve_query_set(set, 0..(queries - first).min(per_set), &self.resolved, u64::from(first) * 8);
        }
    }

    /// The kernels' times of the last step that was encoded with [`Profiler::cursor`].
    pub async fn read(&self, gpu: &Gpu) -> Result<Vec<KernelTime>, GpuError> {
        let words: Vec<u32> = read(gpu, &self.resolved, 0, 4 * self.names.len()).await?;
        let ticks: Vec<u64> = words.chunks_exact(2).map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32)).collect();
        let origin = ticks.iter().step_by(2).copied().min().unwrap_or(0);
        let ns = |t: u64| t.saturating_sub(origin) as f64 * self.period_ns;
        Ok(self
            .names
            .iter()
            .zip(ticks.chunks_exact(2))
            .map(|(&(pass, op, kernel, work), t)| KernelTime { pass, op, kernel, start_ns: ns(t[0]), end_ns: ns(t[1]), flops: work.flops, bytes: work.bytes })
            .collect())
    }
}
