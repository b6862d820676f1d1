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
    /// and returns when all calls have returned. Splitting work into more tasks than threads
    /// lets a [`ThreadPool`] even out threads that run at different speeds.
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync));
}

/// A borrowed pool runs tasks as the pool does.
impl<P: Parallel + ?Sized> Parallel for &P {
    fn threads(&self) -> usize {
        (**self).threads()
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (**self).run(tasks, task)
    }
}

/// An owned pool of any kind runs tasks as the pool does.
#[cfg(feature = "alloc")]
impl<P: Parallel + ?Sized> Parallel for alloc::boxed::Box<P> {
    fn threads(&self) -> usize {
        (**self).threads()
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (**self).run(tasks, task)
    }
}

/// A shared pool runs tasks as the pool does (a pool an engine and a peak measurement share).
#[cfg(all(feature = "alloc", target_has_atomic = "ptr"))]
impl<P: Parallel + Send + ?Sized> Parallel for alloc::sync::Arc<P> {
    fn threads(&self) -> usize {
        (**self).threads()
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (**self).run(tasks, task)
    }
}

/// GFLOP/s of every thread of `par` running `work(thread, reps)` at once, `flops_per_rep` each
/// rep: the best of rounds of about 0.1 s (the reps a multiple of `unit`, at most 100,000
/// units; a round under 0.05 s only sets the reps for the next). The rounds go on until
/// [`SETTLED_ROUNDS`] in a row have not beaten the best by 1% (at most [`MAX_ROUNDS`] in
/// all): a first round slowed by a cold start (code not yet optimised, threads waking up)
/// or a machine still busy with something else (a browser loading the page, a finished
/// run's threads) would otherwise give a peak below the rate its own runs reach. `now` is
/// the caller's clock in seconds (the core has none).
pub fn best_rate(par: &dyn Parallel, unit: usize, flops_per_rep: f64, work: &(dyn Fn(usize, usize) + Sync), now: &dyn Fn() -> f64) -> f64 {
    const MAX_UNITS: usize = 100_000;
    let threads = par.threads();
    let (mut units, mut best, mut settled) = (1, 0f64, 0);
    for _ in 0..MAX_ROUNDS {
        let t = now();
        par.run(threads, &|i| work(i, units * unit));
        let seconds = (now() - t).max(1e-9);
        if seconds < 0.05 && units < MAX_UNITS {
            units = ((units as f64 * 0.1 / seconds) as usize).clamp(units + 1, MAX_UNITS);
            continue;
        }
        let rate = flops_per_rep * (units * unit * threads) as f64 / seconds / 1e9;
        settled = if rate > 1.01 * best { 0 } else { settled + 1 };
        best = best.max(rate);
        if settled == SETTLED_ROUNDS {
            break;
        }
    }
    best
}

/// [`best_rate`] stops once this many rounds in a row have not beaten its best by 1%.
pub const SETTLED_ROUNDS: usize = 5;

/// The most rounds [`best_rate`] runs (about 1.5 s).
pub const MAX_ROUNDS: usize = 15;

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

/// For tests: runs tasks as `.0` threads would be given them, last first, on the calling
/// thread, so that a kernel's split across threads is exercised without threads.
#[cfg(test)]
pub(crate) struct ReversedThreads(pub usize);

#[cfg(test)]
impl Parallel for ReversedThreads {
    fn threads(&self) -> usize {
        self.0
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (0..tasks).rev().for_each(task);
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

/// Rank `rank`'s part of `len` values split over `ranks` (ZeRO-1's shards of the parameters,
/// gradients and AdamW moments): contiguous, in rank order, in whole blocks of
/// [`SHARD_ALIGN`] values (a GPU binds each shard from an aligned offset) but for the end.
pub fn shard(len: usize, ranks: usize, rank: usize) -> core::ops::Range<usize> {
    let blocks = split_range(len.div_ceil(SHARD_ALIGN), ranks, rank);
    (blocks.start * SHARD_ALIGN).min(len)..(blocks.end * SHARD_ALIGN).min(len)
}

/// Shards start at multiples of this many values (256 bytes of f32: wgpu's storage binding
/// offset alignment).
pub const SHARD_ALIGN: usize = 64;

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
pub use pool::{ThreadPool, WorkerLoop};

#[cfg(feature = "std")]
mod pool {
    use super::Parallel;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::thread::JoinHandle;

    type TaskPtr = *const (dyn Fn(usize) + Sync + 'static);

    /// How long an idle worker polls for the next job before it sleeps on the condvar
    /// (a training step dispatches ~100 jobs back to back; a futex wake-up per job costs
    /// more than the smaller jobs themselves): 50-100 µs. A round's `spin_loop` is a
    /// `pause` of ~25 ns on x86-64 but nothing in WebAssembly, where a round is ~1 ns.
    const SPIN_ROUNDS: u32 = if cfg!(target_arch = "wasm32") { 1 << 16 } else { 1 << 12 };

    struct Job {
        task: TaskPtr,
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
        /// Each thread's share of the current job's tasks still to start.
        shares: Box<[Share]>,
    }

    /// The tasks of one thread's share not yet started, `next..end` packed in one word: the
    /// owner takes from the front, a thread whose own share is done takes from the back.
    #[repr(align(64))]
    struct Share(AtomicU64);

    impl Share {
        fn set(&self, range: core::ops::Range<usize>) {
            self.0.store(((range.start as u64) << 32) | range.end as u64, Ordering::Relaxed);
        }

        /// Takes the first task left (`front`) or the last one.
        fn take(&self, front: bool) -> Option<usize> {
            let mut cur = self.0.load(Ordering::Relaxed);
            loop {
                let (next, end) = (cur >> 32, cur & u64::from(u32::MAX));
                if next >= end {
                    return None;
                }
                let (new, task) = if front { (cur + (1 << 32), next) } else { (cur - 1, end - 1) };
                match self.0.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Some(task as usize),
                    Err(now) => cur = now,
                }
            }
        }
    }

    /// A fixed set of worker threads created once; [`Parallel::run`] publishes a job, works on
    /// the calling thread too, and waits for all. Thread `i` (the caller is 0) owns the `i`-th
    /// contiguous share of the tasks and runs it from the front, so the rows a kernel's task
    /// owns stay in one core's cache from op to op (handing every task out through one atomic
    /// counter instead mixed them: attention scaled 1.45x on two threads, 2.0x with fixed
    /// shares). A thread done with its share takes the others' last tasks not yet started, so
    /// a thread slowed down by the machine (a busy sibling hyperthread, a preempted vCPU)
    /// delays the job by one task, not by its whole share. Idle workers poll briefly before
    /// sleeping. Dispatch performs no heap allocation.
    pub struct ThreadPool {
        shared: Arc<Shared>,
        /// The workers' threads where this pool started them (joined when it is dropped).
        workers: Vec<JoinHandle<()>>,
        threads: usize,
        run_lock: Mutex<()>,
    }

    /// The work of one worker of a pool (see [`ThreadPool::with_spawner`]): run it on a
    /// thread of its own; it returns when the pool is dropped.
    pub type WorkerLoop = Box<dyn FnOnce() + Send>;

    /// Locks `m` without ever sleeping on it (the calling thread may be one that must not
    /// block, as a browser's main thread): others hold it only for a few instructions.
    fn lock_spinning<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        loop {
            match m.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => core::hint::spin_loop(),
            }
        }
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
            let mut handles = Vec::new();
            let made = ThreadPool::with_spawner(threads, |i, work| {
                handles.push(std::thread::Builder::new().name(format!("alpha-worker-{i}")).spawn(work)?);
                Ok(())
            });
            match made {
                Ok(mut pool) => {
                    pool.workers = handles;
                    Ok(pool)
                }
                Err(e) => {
                    // The pool was dropped: the workers so far have been told to stop.
                    for h in handles {
                        let _ = h.join();
                    }
                    Err(e)
                }
            }
        }

        /// A pool of `threads` threads in total whose `threads - 1` workers the caller starts:
        /// `spawn(i, work)` must run `work` on a thread of its own (where `std::thread` has
        /// none, a browser's Web Worker). Jobs wait for every worker, so the first must not
        /// run before they have started. Where `spawn` fails, the pool is dropped (its workers
        /// so far stop) and its error returned.
        pub fn with_spawner(threads: usize, mut spawn: impl FnMut(usize, WorkerLoop) -> std::io::Result<()>) -> std::io::Result<Self> {
            let threads = threads.max(1);
            let shared = Arc::new(Shared {
                job: Mutex::new(None),
                wake: Condvar::new(),
                generation: AtomicU64::new(0),
                busy: AtomicUsize::new(0),
                worker_panicked: AtomicBool::new(false),
                shares: (0..threads).map(|_| Share(AtomicU64::new(0))).collect(),
            });
            let mut pool = ThreadPool { shared, workers: Vec::new(), threads: 1, run_lock: Mutex::new(()) };
            for i in 1..threads {
                let shared = Arc::clone(&pool.shared);
                spawn(i, Box::new(move || worker(&shared, i)))?;
                pool.threads += 1;
            }
            Ok(pool)
        }
    }

    /// Runs thread `me`'s share of the tasks from the front, then the other shares' tasks
    /// not yet started from the back, until none is left.
    fn drain(shared: &Shared, task: &(dyn Fn(usize) + Sync), me: usize) {
        let threads = shared.shares.len();
        while let Some(i) = shared.shares[me].take(true) {
            task(i);
        }
        for other in (1..threads).map(|d| (me + d) % threads) {
            while let Some(i) = shared.shares[other].take(false) {
                task(i);
            }
        }
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

    fn worker(shared: &Shared, me: usize) {
        let mut seen = 0u64;
        loop {
            seen = next_generation(shared, seen);
            if seen == SHUTDOWN {
                return;
            }
            let task = {
                let job = shared.job.lock().unwrap_or_else(|e| e.into_inner());
                job.as_ref().expect("a new generation carries a job").task
            };
            // SAFETY: run() keeps the closure alive until `busy` drops to zero.
            let work = std::panic::AssertUnwindSafe(|| drain(shared, unsafe { &*task }, me));
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
            self.threads
        }

        fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
            if self.threads == 1 || tasks <= 1 {
                (0..tasks).for_each(task);
                return;
            }
            let _one_job_at_a_time = lock_spinning(&self.run_lock);
            // SAFETY: only the lifetime is erased; we wait below until no worker uses it.
            let ptr: TaskPtr = unsafe { core::mem::transmute::<&(dyn Fn(usize) + Sync), TaskPtr>(task) };
            let shared = &*self.shared;
            shared.busy.store(self.threads - 1, Ordering::Relaxed);
            assert!(u32::try_from(tasks).is_ok(), "ThreadPool::run: at most 2^32 - 1 tasks");
            for (i, share) in shared.shares.iter().enumerate() {
                share.set(super::split_range(tasks, shared.shares.len(), i));
            }
            {
                let mut job = lock_spinning(&shared.job);
                *job = Some(Job { task: ptr });
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
                drain(shared, task, 0);
            }
            if shared.worker_panicked.swap(false, Ordering::AcqRel) {
                panic!("a task panicked on a worker thread (its message is above)");
            }
        }
    }

    impl Drop for ThreadPool {
        fn drop(&mut self) {
            {
                let _job = lock_spinning(&self.shared.job);
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

        /// Workers started by the caller's own means (here threads it spawns itself, as the
        /// page starts Web Workers) run jobs as the pool's own do.
        #[test]
        fn workers_started_by_the_caller_run_jobs() {
            let mut started = Vec::new();
            let pool = ThreadPool::with_spawner(3, |_, work| {
                started.push(std::thread::spawn(work));
                Ok(())
            })
            .unwrap();
            assert_eq!(pool.threads(), 3);
            let hits: Vec<AtomicUsize> = (0..50).map(|_| AtomicUsize::new(0)).collect();
            let threads_seen = Mutex::new(std::collections::HashSet::new());
            pool.run(50, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
                threads_seen.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_millis(1));
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            assert!(threads_seen.lock().unwrap().len() > 1, "only the caller worked");
            drop(pool);
            for t in started {
                t.join().unwrap();
            }
            let failing = ThreadPool::with_spawner(2, |_, _| Err(std::io::Error::other("no threads here")));
            assert!(failing.is_err());
        }

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

        /// A thread done with its share runs the tasks of another share not yet started: the
        /// worker's first task waits for its share's last one, which only the caller can run
        /// meanwhile (with fixed shares this never finished).
        #[test]
        fn idle_threads_take_tasks_not_started() {
            let pool = ThreadPool::new(2);
            let last_ran = AtomicBool::new(false);
            let start = std::time::Instant::now();
            pool.run(4, &|i| match i {
                2 => {
                    while !last_ran.load(Ordering::Acquire) {
                        assert!(start.elapsed().as_secs() < 10, "task 3 never ran while task 2 waited for it");
                        core::hint::spin_loop();
                    }
                }
                3 => last_ran.store(true, Ordering::Release),
                _ => {}
            });
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
    use super::{best_rate, split_range, Serial, MAX_ROUNDS, SETTLED_ROUNDS};
    use core::sync::atomic::{AtomicU64, Ordering};

    /// A machine that runs at 1 GFLOP/s (a rep is 1,000 FLOPs, 1 µs) but for its first round
    /// (`cold_ns` a rep: code not yet optimised) and the `slow_rounds` rounds after it, at
    /// half speed (busy with something else): best_rate reports the full speed, stopping
    /// SETTLED_ROUNDS rounds after it first reached it. Time is counted in nanoseconds of a
    /// clock only the work advances.
    #[test]
    fn best_rate_waits_out_a_cold_or_busy_start() {
        fn measure(cold_ns: u64, slow_rounds: u64) -> (f64, usize) {
            let clock = AtomicU64::new(0);
            let rounds = AtomicU64::new(0);
            let work = |_: usize, reps: usize| {
                let round = rounds.fetch_add(1, Ordering::Relaxed);
                let ns_per_rep = match round {
                    0 => cold_ns,
                    r if r <= slow_rounds => 2_000,
                    _ => 1_000,
                };
                clock.fetch_add(reps as u64 * ns_per_rep, Ordering::Relaxed);
            };
            let gflops = best_rate(&Serial, 1, 1000.0, &work, &|| clock.load(Ordering::Relaxed) as f64 * 1e-9);
            (gflops, rounds.load(Ordering::Relaxed) as usize)
        }
        // The first round, one rep, only sets the reps of the next; the others take 0.1 s.
        for slow_rounds in [0, 1, 3, SETTLED_ROUNDS] {
            let (gflops, rounds) = measure(1_000, slow_rounds as u64);
            assert!((gflops - 1.0).abs() < 1e-9, "{slow_rounds} slow rounds: {gflops} GFLOP/s");
            assert_eq!(rounds, 1 + slow_rounds + 1 + SETTLED_ROUNDS, "{slow_rounds} slow rounds");
        }
        // A first round of 60 ms (a cold start) counts, but the rounds after it are not timed
        // at its one rep: one more sets the reps, and the full speed is then measured.
        let (gflops, rounds) = measure(60_000_000, 0);
        assert!((gflops - 1.0).abs() < 1e-9, "a cold start: {gflops} GFLOP/s");
        assert_eq!(rounds, 1 + 1 + 1 + SETTLED_ROUNDS);
        // A machine that keeps getting faster is measured MAX_ROUNDS rounds.
        let clock = AtomicU64::new(0);
        let rounds = AtomicU64::new(0);
        let work = |_: usize, reps: usize| {
            let round = rounds.fetch_add(1, Ordering::Relaxed);
            clock.fetch_add(reps as u64 * (1_000_000 / (round + 1)), Ordering::Relaxed);
        };
        best_rate(&Serial, 1, 1000.0, &work, &|| clock.load(Ordering::Relaxed) as f64 * 1e-9);
        assert_eq!(rounds.load(Ordering::Relaxed) as usize, MAX_ROUNDS);
    }

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
