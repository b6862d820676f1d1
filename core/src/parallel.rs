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
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::thread::JoinHandle;

    type TaskPtr = *const (dyn Fn(usize) + Sync + 'static);

    /// How long an idle worker polls for the next job before it sleeps on the condvar
    /// (a training step dispatches ~100 jobs back to back; a futex wake-up per job costs
    /// more than the smaller jobs themselves).
    const SPIN_ROUNDS: u32 = 1 << 12;

    struct Job {
        task: TaskPtr,
        tasks: usize,
    }
    // SAFETY: the pointee is Sync and outlives the job (run() waits for every worker).
    unsafe impl Send for Job {}

    struct Shared {
        job: Mutex<Option<Job>>,
        wake: Condvar,
        /// Bumped once per job; odd values are never used, `u64::MAX` means shut down.
        generation: AtomicU64,
        /// Workers still working on the current job.
        busy: AtomicUsize,
        /// Whether a task of the current job panicked on a worker.
        worker_panicked: AtomicBool,
    }

    /// A fixed set of worker threads created once; [`Parallel::run`] publishes a job, works on
    /// the calling thread too, and waits for all. Thread `i` (the caller is 0) always runs the
    /// `i`-th contiguous share of the tasks, so the rows a kernel's task owns stay in one
    /// core's cache from op to op (handing tasks out through an atomic counter instead mixed
    /// them: attention scaled 1.45x on two threads, 2.0x with fixed shares). Idle workers poll
    /// briefly before sleeping. Dispatch performs no heap allocation.
    pub struct ThreadPool {
        shared: Arc<Shared>,
        workers: Vec<JoinHandle<()>>,
        run_lock: Mutex<()>,
    }

    const SHUTDOWN: u64 = u64::MAX;

    impl ThreadPool {
        /// A pool running tasks on `threads` threads in total (the caller plus `threads - 1`
        /// workers). `threads` of 0 is treated as 1.
        ///
        /// # Panics
        /// If the operating system refuses a thread (see [`ThreadPool::try_new`]).
        pub fn new(threads: usize) -> Self {
            Self::try_new(threads).expect("spawning a worker thread")
        }

        /// [`ThreadPool::new`], or the operating system's error when it refuses a thread
        /// (the workers already started are stopped).
        pub fn try_new(threads: usize) -> std::io::Result<Self> {
            let shared = Arc::new(Shared {
                job: Mutex::new(None),
                wake: Condvar::new(),
                generation: AtomicU64::new(0),
                busy: AtomicUsize::new(0),
                worker_panicked: AtomicBool::new(false),
            });
            let mut pool = ThreadPool { shared, workers: Vec::new(), run_lock: Mutex::new(()) };
            for i in 1..threads.max(1) {
                let shared = Arc::clone(&pool.shared);
                // On an error `pool` is dropped, which stops and joins the workers so far.
                pool.workers.push(std::thread::Builder::new().name(format!("alpha-worker-{i}")).spawn(move || worker(&shared, i, threads))?);
            }
            Ok(pool)
        }
    }

    /// Runs thread `me`'s share of the tasks: the same contiguous range every time.
    fn drain(task: &(dyn Fn(usize) + Sync), tasks: usize, me: usize, threads: usize) {
        super::split_range(tasks, threads, me).for_each(task);
    }

    /// Waits until the generation differs from `seen`: polls, then sleeps.
    fn next_generation(shared: &Shared, seen: u64) -> u64 {
        for _ in 0..SPIN_ROUNDS {
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                return g;
            }
            core::hint::spin_loop();
        }
        let mut job = shared.job.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                return g;
            }
            job = shared.wake.wait(job).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn worker(shared: &Shared, me: usize, threads: usize) {
        let mut seen = 0u64;
        loop {
            seen = next_generation(shared, seen);
            if seen == SHUTDOWN {
                return;
            }
            let (task, tasks) = {
                let job = shared.job.lock().unwrap_or_else(|e| e.into_inner());
                let job = job.as_ref().expect("a new generation carries a job");
                (job.task, job.tasks)
            };
            // SAFETY: run() keeps the closure alive until `busy` drops to zero.
            let work = std::panic::AssertUnwindSafe(|| drain(unsafe { &*task }, tasks, me, threads));
            // A panicking task is reported to run() (which re-raises it on the caller's
            // thread); the worker stays for later jobs.
            if std::panic::catch_unwind(work).is_err() {
                shared.worker_panicked.store(true, Ordering::Release);
            }
            shared.busy.fetch_sub(1, Ordering::AcqRel);
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
            let shared = &*self.shared;
            shared.busy.store(self.workers.len(), Ordering::Relaxed);
            {
                let mut job = shared.job.lock().unwrap_or_else(|e| e.into_inner());
                *job = Some(Job { task: ptr, tasks });
                shared.generation.fetch_add(2, Ordering::AcqRel);
            }
            shared.wake.notify_all();
            // A panicking task must not let run() return while workers still hold the pointer.
            struct WaitOnDrop<'a>(&'a Shared);
            impl Drop for WaitOnDrop<'_> {
                fn drop(&mut self) {
                    let mut spins = 0u32;
                    while self.0.busy.load(Ordering::Acquire) > 0 {
                        spins += 1;
                        if spins < SPIN_ROUNDS {
                            core::hint::spin_loop();
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
            }
            {
                let _wait = WaitOnDrop(shared);
                drain(task, tasks, 0, self.threads());
            }
            if shared.worker_panicked.swap(false, Ordering::AcqRel) {
                panic!("a task panicked on a worker thread (its message is above)");
            }
        }
    }

    impl Drop for ThreadPool {
        fn drop(&mut self) {
            {
                let _job = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
                self.shared.generation.store(SHUTDOWN, Ordering::Release);
            }
            self.shared.wake.notify_all();
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

        /// Each thread gets the same contiguous share of the tasks every run, the first
        /// share on the calling thread.
        #[test]
        fn shares_are_fixed_per_thread() {
            let pool = ThreadPool::new(3);
            let runners = || {
                let ids: Vec<Mutex<Option<std::thread::ThreadId>>> = (0..7).map(|_| Mutex::new(None)).collect();
                pool.run(7, &|i| *ids[i].lock().unwrap() = Some(std::thread::current().id()));
                ids.into_iter().map(|m| m.into_inner().unwrap().unwrap()).collect::<Vec<_>>()
            };
            let first = runners();
            for _ in 0..20 {
                assert_eq!(runners(), first);
            }
            assert!(first[..3].iter().all(|&t| t == std::thread::current().id()));
            assert!(first[3] == first[4] && first[5] == first[6] && first[3] != first[5] && first[3] != first[0]);
        }

        /// A task panicking on a worker makes run() panic on the caller's thread (instead of
        /// waiting forever for that worker), and the pool keeps working.
        #[test]
        fn a_worker_panic_reaches_the_caller() {
            let pool = ThreadPool::new(2);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.run(2, &|i| assert_ne!(i, 1, "task 1 fails"))));
            assert!(result.is_err());
            let hits = AtomicUsize::new(0);
            pool.run(2, &|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 2);
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
