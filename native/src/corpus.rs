//! Training and evaluation text: the embedded default corpus and user files.

use anyhow::{anyhow, Result};
use std::borrow::Cow;
use std::path::Path;

/// What `--data` is recorded as when the embedded corpus is used.
pub const EMBEDDED: &str = "<embedded shakespeare>";

/// 42 Shakespeare plays from Project Gutenberg (public domain), 5.06 MB of ASCII.
pub static SHAKESPEARE: &str = include_str!("../assets/shakespeare.txt");

/// Reads a UTF-8 text file (a regular file: see [`crate::fsutil::open_regular`]); `what` names it in errors ("data file", "text file").
pub fn read_text(path: &Path, what: &str) -> Result<String> {
    let bytes = crate::fsutil::read_regular(path).map_err(|e| anyhow!("cannot read {what} {}: {e}", path.display()))?;
    if bytes.is_empty() {
        return Err(anyhow!("{what} {} is empty", path.display()));
    }
    String::from_utf8(bytes).map_err(|e| anyhow!("{what} {} is not valid UTF-8 (invalid byte at offset {})", path.display(), e.utf8_error().valid_up_to()))
}

/// How errors name the text `data`: the embedded corpus, or `data file PATH`.
pub fn label(data: &str) -> String {
    if data == EMBEDDED {
        data.to_string()
    } else {
        format!("data file {data}")
    }
}

/// The training text named by `data`: [`EMBEDDED`] or a path.
pub fn training_text(data: &str) -> Result<Cow<'static, str>> {
    if data == EMBEDDED {
        Ok(Cow::Borrowed(SHAKESPEARE))
    } else {
        read_text(Path::new(data), "data file").map(Cow::Owned)
    }
}
