//! Checkpoint files: [`alpha_core::checkpoint`]'s safetensors bytes, streamed atomically to
//! disk.

use crate::fsutil::write_atomic_with;
pub use alpha_core::checkpoint::{check_header_room, Checkpoint, SaveError, TrainState, FORMAT};
use alpha_core::tokenizer::Tokenizer;
use alpha_core::GptConfig;
use anyhow::{anyhow, Result};
use std::io;
use std::path::Path;

/// Writes a checkpoint atomically (temporary file, fsync, rename, fsync of the directory),
/// streaming the tensors from the arenas. A model that is not finite is not written (the
/// file on disk, if any, stays as it was): that error is [`SaveError::NonFinite`].
pub fn save(
    path: &Path,
    config: GptConfig,
    tokenizer: &Tokenizer,
    params: &[f32],
    optimizer: Option<(&[f32], &[f32], &TrainState)>,
) -> Result<(), SaveError<String>> {
    let mut refused = None;
    let written = write_atomic_with(path, |w| {
        alpha_core::checkpoint::write(config, tokenizer, params, optimizer, &mut |b: &[u8]| w.write_all(b)).map_err(|e| match e {
            SaveError::Write(e) => e,
            other => {
                let msg = other.to_string();
                refused = Some(other);
                io::Error::other(msg)
            }
        })
    });
    match (written, refused) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(SaveError::NonFinite { tensor, index, value })) => Err(SaveError::NonFinite { tensor, index, value }),
        (Err(e), _) => Err(SaveError::Write(format!("cannot write checkpoint {}: {e}", path.display()))),
    }
}

/// Reads and validates a checkpoint: an Alpha checkpoint file (see
/// [`alpha_core::checkpoint::from_bytes`]; one without checksums, from before Alpha required
/// them, loads with a notice on stderr), a Hugging Face GPT-2 directory, or the name of one in
/// the local Hugging Face cache (`gpt2`, `openai-community/gpt2-medium`; see
/// [`hf_model`](crate::hf_model)).
pub fn load(path: &Path) -> Result<Checkpoint> {
    load_parts(path, true)
}

/// [`load`] without the training state (see
/// [`alpha_core::checkpoint::weights_from_bytes`]): for eval, sample, export and fine-tuning;
/// a training run's directory (`train --out DIR`) stands for its checkpoint.
pub fn load_weights(path: &Path) -> Result<Checkpoint> {
    load_parts(path, false)
}

fn load_parts(path: &Path, with_state: bool) -> Result<Checkpoint> {
    if crate::hf_model::is_model_dir(path) {
        return crate::hf_model::load(path);
    }
    if path.is_dir() {
        // A training run's directory (`train --out DIR`), for the commands that read weights.
        let inside = path.join(crate::run::outputs::CHECKPOINT_FILE);
        if !with_state && inside.is_file() {
            return load_parts(&inside, with_state);
        }
        return Err(anyhow!(
            "{} is a directory without config.json or {}: neither a Hugging Face model directory nor an Alpha run's",
            path.display(),
            crate::run::outputs::CHECKPOINT_FILE
        ));
    }
    let name = path.to_string_lossy();
    if !path.exists() && (crate::hf_model::GPT2_NAMES.contains(&name.as_ref()) || name.matches('/').count() == 1 && !name.ends_with(".safetensors")) {
        return crate::hf_model::load(&crate::hf_model::find_cached(&name)?);
    }
    // Read through a memory map: the parameters are copied once, into their arena, not first
    // into a buffer the size of the file (at gpt2-xl size, 18 GB with the AdamW moments). The
    // header's sizes are checked against the file's before any tensor is read.
    let file = crate::fsutil::open_regular(path).map_err(|e| anyhow!("cannot read checkpoint {}: {e}", path.display()))?;
    // SAFETY: read-only; a file changed while it loads can only change the values read, which
    // the checksums then refuse.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| anyhow!("cannot read checkpoint {}: {e}", path.display()))?;
    let read = if with_state { alpha_core::checkpoint::from_bytes } else { alpha_core::checkpoint::weights_from_bytes };
    let ck = read(&bytes).map_err(|e| anyhow!("checkpoint {} is {e}", path.display()))?;
    if !ck.verified {
        eprintln!("note: {} carries no checksums (written before Alpha required them, or by another tool): nothing verifies its bytes", path.display());
    }
    Ok(ck)
}
