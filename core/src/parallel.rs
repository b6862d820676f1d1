//! Data parallelism for the kernels: a [`Parallel`] runs `tasks` independent closures.
//!
//! Kernels split their work into tasks that write disjoint memory and reduce in a fixed
//! order, so results do not depend on the number of threads. [`Serial`] is the no_std
//! executor; with `std`, [`ThreadPool`] keeps its workers alive for the whole run and
//! dispatches without allocating.

/// Runs a batch of independent tasks.
pub trait Parallel: Sync {
    /// How many tasks can run at once (used to size splits).
    fn threads(&self) -> usize;
    /// Calls `task(i)` once for every `i` in `0..tasks`, in any order, possibly concurrently,
    /// and returns when all calls have returned.
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync));
}

/// Runs every task on the calling thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serial;

impl Parallel for Serial {
    fn threads(&self) -> usize {
        1
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (0..tasks).for_each(task);
    }
}

/// Splits `0..n` into `parts` near-equal contiguous ranges and returns range `i`.
#[inline]
pub fn split_range(n: usize, parts: usize, i: usize) -> core::ops::Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// A raw pointer that may be shared between tasks that write disjoint ranges through it.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);
// SAFETY: tasks using a SharedMut write disjoint index ranges (each kernel documents its split).
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The raw pointer (a method, so closures capture the whole `Sync` wrapper).
    #[inline(always)]
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
    }

    /// A mutable slice `[start, start+len)` of the underlying buffer.
    ///
    /// # Safety
    /// The range must be in bounds and no other live slice may overlap it.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice<'b>(&self, start: usize, len: usize) -> &'b mut [T] {
        // SAFETY: the caller guarantees bounds and exclusivity.
        unsafe { core::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

#[cfg(feature = "std")]
pub use pool::ThreadPool;

#[cfg(feature = "std")]
mod pool {
    use super::Parallel;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::thread::JoinHandle;

    type TaskPtr = *const (dyn Fn(usize) + Sync + 'static);

    struct Job {
        task: TaskPtr,
        tasks: usize,
    }
    // SAFETY: the pointee is Sync and outlives the job (run() waits for every worker).
    unsafe impl Send for Job {}

    struct State {
        job: Option<Job>,
        generation: u64,
        busy_workers: usize,
        shutdown: bool,
    }

    struct Shared {
        state: Mutex<State>,
        start: Condvar,
        done: Condvar,
        next_task: AtomicUsize,
    }

    /// A fixed set of worker threads created once; [`Parallel::run`] wakes them, shares the
    /// tasks through an atomic counter, works on the calling thread too, and waits for all.
    /// Dispatch performs no heap allocation.
    pub struct ThreadPool {
        shared: Arc<Shared>,
        workers: Vec<JoinHandle<()>>,
        run_lock: Mutex<()>,
    }

    impl ThreadPool {
        /// A pool running tasks on `threads` threads in total (the caller plus `threads - 1`
        /// workers). `threads` of 0 is treated as 1.
        pub fn new(threads: usize) -> Self {
            let shared = Arc::new(Shared {
                state: Mutex::new(State { job: None, generation: 0, busy_workers: 0, shutdown: false }),
                start: Condvar::new(),
                done: Condvar::new(),
                next_task: AtomicUsize::new(0),
            });
            let workers = (1..threads.max(1))
                .map(|i| {
                    let shared = Arc::clone(&shared);
                    std::thread::Builder::new()
                        .name(format!("alpha-worker-{i}"))
                        .spawn(move || worker(&shared))
                        .expect("spawning a worker thread")
                })
                .collect();
            ThreadPool { shared, workers, run_lock: Mutex::new(()) }
        }
    }

    fn drain(shared: &Shared, task: &(dyn Fn(usize) + Sync), tasks: usize) {
        loop {
            let i = shared.next_task.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            task(i);
        }
    }

    fn worker(shared: &Shared) {
        let mut seen = 0u64;
        loop {
            let (task, tasks) = {
                let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                while !st.shutdown && st.generation == seen {
                    st = shared.start.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.shutdown {
                    return;
                }
                seen = st.generation;
                let job = st.job.as_ref().expect("a new generation carries a job");
                (job.task, job.tasks)
            };
            // SAFETY: run() keeps the closure alive until busy_workers drops to zero.
            drain(shared, unsafe { &*task }, tasks);
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.busy_workers -= 1;
            if st.busy_workers == 0 {
                shared.done.notify_one();
            }
        }
    }

    impl Parallel for ThreadPool {
        fn threads(&self) -> usize {
            self.workers.len() + 1
        }

        fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
            if self.workers.is_empty() || tasks <= 1 {
                (0..tasks).for_each(task);
                return;
            }
            let _one_job_at_a_time = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: only the lifetime is erased; we wait below until no worker uses it.
            let ptr: TaskPtr = unsafe { core::mem::transmute::<&(dyn Fn(usize) + Sync), TaskPtr>(task) };
            self.shared.next_task.store(0, Ordering::Relaxed);
            {
                let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
                st.job = Some(Job { task: ptr, tasks });
                st.generation += 1;
                st.busy_workers = self.workers.len();
                self.shared.start.notify_all();
            }
            // A panicking task must not let run() return while workers still hold the pointer.
            struct WaitOnDrop<'a>(&'a Shared);
            impl Drop for WaitOnDrop<'_> {
                fn drop(&mut self) {
                    let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
                    while st.busy_workers > 0 {
                        st = self.0.done.wait(st).unwrap_or_else(|e| e.into_inner());
                    }
                    st.job = None;
                }
            }
            let _wait = WaitOnDrop(&self.shared);
            drain(&self.shared, task, tasks);
        }
    }

    impl Drop for ThreadPool {
        fn drop(&mut self) {
            self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).shutdown = true;
            self.shared.start.notify_all();
            for w in self.workers.drain(..) {
                let _ = w.join();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn runs_every_task_once() {
            let pool = ThreadPool::new(3);
            for tasks in [0usize, 1, 2, 7, 100] {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_range;

    #[test]
    fn split_range_covers_everything_once() {
        for n in [0usize, 1, 5, 64, 101] {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split_range(n, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
