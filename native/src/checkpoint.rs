//! Checkpoint files: [`alpha_core::checkpoint`]'s safetensors bytes, written atomically.

use crate::fsutil::write_atomic;
pub use alpha_core::checkpoint::{Checkpoint, TrainSettings, TrainState, FORMAT};
use alpha_core::GptConfig;
use std::path::Path;

/// Writes a checkpoint atomically (temporary file, fsync, rename, fsync of the directory).
pub fn save(path: &Path, config: GptConfig, chars: &[char], params: &[f32], optimizer: Option<(&[f32], &[f32], &TrainState)>) -> Result<(), String> {
    let bytes = alpha_core::checkpoint::to_bytes(config, chars, params, optimizer)?;
    write_atomic(path, &bytes).map_err(|e| format!("cannot write checkpoint {}: {e}", path.display()))
}

/// Reads and validates a checkpoint file (see [`alpha_core::checkpoint::from_bytes`]).
pub fn load(path: &Path) -> Result<Checkpoint, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read checkpoint {}: {e}", path.display()))?;
    alpha_core::checkpoint::from_bytes(&bytes).map_err(|e| format!("checkpoint {} is {e}", path.display()))
}
