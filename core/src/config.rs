//! Model configuration and its validation.

use core::fmt;

/// The shape of a GPT-2 style model (nanoGPT's `GPTConfig` names, without dropout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GptConfig {
    /// Number of token ids.
    pub vocab_size: usize,
    /// Longest sequence the model can attend over (rows of the position embedding).
    pub block_size: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block; must divide `n_embd`.
    pub n_head: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
}

/// Why a configuration or a requested shape cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A size that must be positive is zero.
    Zero(&'static str),
    /// `n_head` does not divide `n_embd`.
    HeadsDoNotDivide {
        /// Requested heads.
        n_head: usize,
        /// Requested embedding width.
        n_embd: usize,
    },
    /// A sequence longer than the model's block size was requested.
    SequenceTooLong {
        /// Requested sequence length.
        seq: usize,
        /// The model's block size.
        block_size: usize,
    },
    /// A size is larger than [`MAX_DIM`] (or, for gradient accumulation, [`MAX_GRAD_ACCUM`]).
    OutOfRange {
        /// Which size.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The largest allowed.
        max: usize,
    },
    /// The arenas would not fit in the address space.
    TooLarge {
        /// Bytes the arenas would take (at most; see [`crate::Plan::new`]).
        bytes: u128,
    },
    /// The allocator refused memory the plan needs.
    OutOfMemory {
        /// What it was for.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
    /// A probability outside `[0, 1)`.
    Probability(&'static str),
    /// The caller's buffer is smaller than the plan needs.
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Elements needed.
        needed: usize,
        /// Elements given.
        given: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::Zero(what) => write!(f, "{what} must be at least 1"),
            ConfigError::HeadsDoNotDivide { n_head, n_embd } => {
                write!(f, "the number of heads ({n_head}) must divide the embedding width ({n_embd})")
            }
            ConfigError::SequenceTooLong { seq, block_size } => {
                write!(f, "sequence length {seq} is larger than the model's block size {block_size}")
            }
            ConfigError::OutOfRange { what, value, max } => write!(f, "{what} is {value}, more than the largest allowed ({max})"),
            ConfigError::TooLarge { bytes } => {
                write!(f, "the model's memory plan needs about {bytes} bytes, more than this machine's address space holds")
            }
            ConfigError::OutOfMemory { what, bytes } => write!(f, "cannot allocate {bytes} bytes for the {what}: not enough memory"),
            ConfigError::Probability(what) => write!(f, "{what} must be at least 0 and below 1"),
            ConfigError::BufferTooSmall { what, needed, given } => {
                write!(f, "the {what} buffer holds {given} elements but the plan needs {needed}")
            }
        }
    }
}

impl core::error::Error for ConfigError {}

/// The largest value of every size of a model and a batch (vocabulary, block, layers, heads,
/// width, batch, sequence): 2^24. Each is far beyond any model that trains on one machine,
/// and with every size bounded the memory plan's sums and products can be checked exactly
/// (see [`crate::Plan::new`]) before anything is allocated.
pub const MAX_DIM: usize = 1 << 24;

/// The most micro-batches one optimizer step may accumulate: 2^16.
pub const MAX_GRAD_ACCUM: usize = 1 << 16;

/// An error unless `1 <= value <= max`.
pub fn check_size(what: &'static str, value: usize, max: usize) -> Result<(), ConfigError> {
    match value {
        0 => Err(ConfigError::Zero(what)),
        v if v > max => Err(ConfigError::OutOfRange { what, value, max }),
        _ => Ok(()),
    }
}

impl GptConfig {
    /// Checks that every size is between 1 and [`MAX_DIM`] and the heads divide the width.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (value, name) in
            [(self.vocab_size, "vocab_size"), (self.block_size, "block_size"), (self.n_layer, "n_layer"), (self.n_head, "n_head"), (self.n_embd, "n_embd")]
        {
            check_size(name, value, MAX_DIM)?;
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ConfigError::HeadsDoNotDivide { n_head: self.n_head, n_embd: self.n_embd });
        }
        Ok(())
    }

    /// Width of one attention head.
    pub fn head_size(&self) -> usize {
        self.n_embd / self.n_head
    }
}
