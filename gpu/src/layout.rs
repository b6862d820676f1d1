//! Where each parameter lives on the device: the same tensors as the plan's params arena,
//! reordered so every 2-D weight comes first (AdamW decays one leading range) and each
//! starting at a multiple of [`PARAM_ALIGN`] elements (every tensor can be bound on its own,
//! its f16 copy's too). Gradients and AdamW moments use the same layout. Uploads and
//! downloads convert from and to the host arena, so checkpoints are the same on every
//! backend.
//!
//! Unstable: public for Alpha's tools and tests; it changes with any release (see the crate's
//! Stability section).

use alpha_core::plan::{Plan, Span, ACT_ALIGN};

/// Every tensor of the layout starts at a multiple of this many elements: 256 bytes of its
/// f16 copy (WebGPU's storage-buffer offset alignment), 512 of f32.
pub const PARAM_ALIGN: usize = 2 * ACT_ALIGN;

/// The device layout of one plan's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLayout {
    /// (host span, device span) of every parameter tensor, in device order.
    tensors: Vec<(Span, Span)>,
    len: usize,
    decay_end: usize,
}

impl DeviceLayout {
    /// The layout of `plan`'s parameters.
    pub fn new(plan: &Plan) -> DeviceLayout {
        let mut next = 0;
        let mut tensors = Vec::new();
        let mut decay_end = 0;
        for matrices in [true, false] {
            for info in plan.params().filter(|i| i.kind.is_matrix() == matrices) {
                tensors.push((info.span, Span { offset: next, len: info.span.len }));
                next = (next + info.span.len).next_multiple_of(PARAM_ALIGN);
            }
            if matrices {
                decay_end = next;
            }
        }
        DeviceLayout { tensors, len: next.max(PARAM_ALIGN), decay_end }
    }

    /// Elements of each device arena (params, grads, moments), a multiple of [`PARAM_ALIGN`].
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a model has parameters.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device elements before this index are 2-D weights (weight-decayed).
    pub fn decay_end(&self) -> usize {
        self.decay_end
    }

    /// The device span of the parameter at host span `host`.
    pub fn device(&self, host: Span) -> Span {
        self.tensors.iter().find(|(h, _)| *h == host).map(|&(_, d)| d).expect("a span of the plan's parameters")
    }

    /// A host arena in device layout (padding zero).
    pub fn to_device(&self, host: &[f32]) -> Vec<f32> {
        let mut dev = vec![0.0; self.len];
        for (h, d) in &self.tensors {
            dev[d.range()].copy_from_slice(&host[h.range()]);
        }
        dev
    }

    /// A device arena back in host layout.
    pub fn to_host(&self, dev: &[f32], host: &mut [f32]) {
        for (h, d) in &self.tensors {
            host[h.range()].copy_from_slice(&dev[d.range()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alpha_core::GptConfig;

    #[test]
    fn tensors_are_aligned_disjoint_and_round_trip() {
        let plan = Plan::new(GptConfig::gpt2(13, 7, 2, 2, 6), 2, 5).unwrap();
        let l = DeviceLayout::new(&plan);
        let host: Vec<f32> = (0..plan.params_len()).map(|i| i as f32).collect();
        let dev = l.to_device(&host);
        let mut back = vec![0.0; host.len()];
        l.to_host(&dev, &mut back);
        assert_eq!(back, host);
        let mut spans: Vec<Span> = l.tensors.iter().map(|t| t.1).collect();
        spans.sort_by_key(|s| s.offset);
        for w in spans.windows(2) {
            assert!(w[0].end() <= w[1].offset);
        }
        for info in plan.params() {
            let d = l.device(info.span);
            assert_eq!(d.offset % PARAM_ALIGN, 0);
            assert_eq!(d.end() <= l.decay_end(), info.kind.is_matrix(), "{info}");
        }
    }
}
