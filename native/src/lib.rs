//! # alpha-native
//!
//! The Alpha command line (`alpha-native train | sample | eval | bench | info`) as a library: the commands,
//! the checkpoint format and the file helpers they share.

pub mod bench;
pub mod checkpoint;
pub mod corpus;
pub mod engine;
pub mod eval;
pub mod fsutil;
pub mod hugepages;
pub mod info;
pub mod memory;
pub mod peak;
pub mod sample;
pub mod step;
pub mod trace;
pub mod train;

use alpha_core::parallel::ThreadPool;

/// The most threads `--threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// A thread pool of `threads` threads (`None`: one per available core).
pub fn thread_pool(threads: Option<usize>) -> Result<ThreadPool, String> {
    let n = match threads {
        Some(0) => return Err("--threads must be at least 1".into()),
        Some(n) if n > MAX_THREADS => return Err(format!("--threads {n} is more than {MAX_THREADS}")),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    ThreadPool::try_new(n).map_err(|e| format!("cannot start {n} threads: {e}"))
}
