//! The CPU engine on every core (the WebAssembly threads build: shared memory, atomics): the
//! core's [`ThreadPool`] with Web Workers for threads. Each worker instantiates this module on
//! the shared memory (`workers.js`) and runs one worker loop of the pool; the page's thread
//! is the pool's caller, which never blocks (it spins while the workers finish a job, as it
//! must: a browser's main thread may not wait on memory).

use alpha_core::parallel::{ThreadPool, WorkerLoop};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen(module = "/src/workers.js")]
extern "C" {
    #[wasm_bindgen(js_name = startWorkers, catch)]
    fn start_workers(module: JsValue, memory: JsValue, entries: Vec<u32>) -> Result<js_sys::Promise, JsValue>;
}

/// Runs a pool's worker loop on the calling worker: `entry` is the loop [`pool`] handed to
/// `startWorkers` for it. Returns when the pool is dropped.
#[wasm_bindgen]
pub fn worker_entry(entry: u32) {
    // SAFETY: `entry` is a `Box<WorkerLoop>` that `pool` leaked for exactly one worker.
    let work = unsafe { Box::from_raw(entry as usize as *mut WorkerLoop) };
    work()
}

/// A pool of `threads` threads: this one and `threads - 1` Web Workers, all started.
pub async fn pool(threads: usize) -> Result<ThreadPool, String> {
    let mut entries = Vec::new();
    let pool = ThreadPool::with_spawner(threads, |_, work| {
        entries.push(Box::into_raw(Box::new(work)) as usize as u32);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    let started = start_workers(wasm_bindgen::module(), wasm_bindgen::memory(), entries).map_err(|e| format!("cannot start workers: {e:?}"))?;
    JsFuture::from(started).await.map_err(|e| format!("cannot start workers: {e:?}"))?;
    Ok(pool)
}
