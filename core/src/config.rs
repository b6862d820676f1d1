//! Model configuration and its validation.

use core::fmt;

/// The shape of a GPT-style model: GPT-2 (nanoGPT's `GPTConfig` names, without dropout) or,
/// with [`Arch::Llama`], a Llama-family model (RMSNorm, rotary positions, SwiGLU, grouped
/// query attention), whose heads, width and layers are named as GPT-2's.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// The block's family; GPT-2 unless the config says otherwise (a GPT-2 config's JSON
    /// has no `arch`, as before the Llama family existed).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Arch::is_gpt2"))]
    pub arch: Arch,
}

/// The family of a model's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "type", rename_all = "lowercase"))]
pub enum Arch {
    /// GPT-2: learned positions, LayerNorm with biases, GELU MLP of width 4C, biases on
    /// every linear layer, the head tied to the token embedding.
    #[default]
    Gpt2,
    /// Llama (and Qwen2, SmolLM2, TinyLlama): Hugging Face's `LlamaForCausalLM`.
    Llama(Llama),
}

impl Arch {
    /// Whether this is [`Arch::Gpt2`].
    pub fn is_gpt2(&self) -> bool {
        matches!(self, Arch::Gpt2)
    }
}

/// The Llama family's settings (Hugging Face's `LlamaConfig` names where they exist):
/// RMSNorm, rotary position embeddings (rotate-half), a SwiGLU MLP, grouped-query attention,
/// optional q/k/v biases (Qwen2), no other biases.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Llama {
    /// Key/value heads (`num_key_value_heads`); divides `n_head` (each serves
    /// `n_head / n_kv_head` query heads).
    pub n_kv_head: usize,
    /// The SwiGLU MLP's width (`intermediate_size`).
    pub intermediate_size: usize,
    /// RMSNorm's epsilon (`rms_norm_eps`).
    pub norm_eps: f64,
    /// Rotary embeddings' base (`rope_theta`).
    pub rope_theta: f64,
    /// Llama 3's frequency scaling (`rope_scaling` of type `llama3`), or none.
    pub rope_scaling: Option<RopeScaling>,
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// The LM head is the token embedding (`tie_word_embeddings`).
    pub tied: bool,
}

/// Llama 3's `rope_scaling` (`rope_type = "llama3"`): long wavelengths' frequencies divided
/// by `factor`, short ones kept, those between blended.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RopeScaling {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_position_embeddings: usize,
}

/// Why a configuration or a requested shape cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A size that must be positive is zero.
    Zero(&'static str),
    /// `n_kv_head` does not divide `n_head`.
    KvHeadsDoNotDivide {
        /// Requested heads.
        n_head: usize,
        /// Requested key/value heads.
        n_kv_head: usize,
    },
    /// A Llama setting outside its domain (a positive finite number, an even head size).
    Setting(&'static str),
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
            ConfigError::KvHeadsDoNotDivide { n_head, n_kv_head } => {
                write!(f, "the number of key/value heads ({n_kv_head}) must divide the number of heads ({n_head})")
            }
            ConfigError::Setting(what) => write!(f, "{what}"),
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
        if let Arch::Llama(l) = &self.arch {
            check_size("n_kv_head", l.n_kv_head, MAX_DIM)?;
            check_size("intermediate_size", l.intermediate_size, MAX_DIM)?;
            if !self.n_head.is_multiple_of(l.n_kv_head) {
                return Err(ConfigError::KvHeadsDoNotDivide { n_head: self.n_head, n_kv_head: l.n_kv_head });
            }
            if !self.head_size().is_multiple_of(2) {
                return Err(ConfigError::Setting("rotary embeddings need an even head size (n_embd / n_head)"));
            }
            let positive = |x: f64| x.is_finite() && x > 0.0;
            if !positive(l.norm_eps) {
                return Err(ConfigError::Setting("norm_eps must be a positive number"));
            }
            if !positive(l.rope_theta) {
                return Err(ConfigError::Setting("rope_theta must be a positive number"));
            }
            if let Some(r) = l.rope_scaling {
                if !(positive(r.factor) && positive(r.low_freq_factor) && positive(r.high_freq_factor) && r.high_freq_factor > r.low_freq_factor) {
                    return Err(ConfigError::Setting("rope_scaling needs positive factors and high_freq_factor > low_freq_factor"));
                }
                check_size("rope_scaling.original_max_position_embeddings", r.original_max_position_embeddings, MAX_DIM)?;
            }
        }
        Ok(())
    }

    /// A GPT-2 config (the five sizes nanoGPT names).
    pub const fn gpt2(vocab_size: usize, block_size: usize, n_layer: usize, n_head: usize, n_embd: usize) -> Self {
        GptConfig { vocab_size, block_size, n_layer, n_head, n_embd, arch: Arch::Gpt2 }
    }

    /// Width of one attention head.
    pub fn head_size(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// The Llama settings, `None` for GPT-2.
    pub fn llama(&self) -> Option<&Llama> {
        match &self.arch {
            Arch::Llama(l) => Some(l),
            Arch::Gpt2 => None,
        }
    }

    /// Key/value heads: `n_head` for GPT-2.
    pub fn kv_heads(&self) -> usize {
        self.llama().map_or(self.n_head, |l| l.n_kv_head)
    }

    /// Width of a row of the fused q, k, v projection: `(n_head + 2 * kv_heads) * head_size`
    /// (GPT-2's `3C`).
    pub fn qkv_width(&self) -> usize {
        (self.n_head + 2 * self.kv_heads()) * self.head_size()
    }

    /// The MLP's hidden width: GPT-2's `4C`, Llama's `intermediate_size`.
    pub fn hidden(&self) -> usize {
        self.llama().map_or(4 * self.n_embd, |l| l.intermediate_size)
    }

    /// Width of the MLP's first product: the hidden width, twice for SwiGLU's gate and up.
    pub fn fc_width(&self) -> usize {
        if self.llama().is_some() {
            2 * self.hidden()
        } else {
            self.hidden()
        }
    }

    /// Whether the LM head is the token embedding (always for GPT-2).
    pub fn tied(&self) -> bool {
        self.llama().is_none_or(|l| l.tied)
    }
}
