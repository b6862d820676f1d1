//! The crate's one error type.

/// What went wrong on the CUDA path, as one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaError(pub String);

impl CudaError {
    pub(crate) fn new(message: String) -> CudaError {
        CudaError(message)
    }
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CudaError {}
