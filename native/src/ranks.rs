//! Data parallelism across processes: the MPI world of `mpirun -np N alpha-native train ...`
//! (a build with `--features mpi`), or a process on its own.
//!
//! Every rank holds the whole model and draws the same batch stream; rank r trains the
//! micro-batches r, r + N, ... of each step ([`Trainer::train_step_ranked`]), the gradients
//! are summed over the ranks, and every rank takes the same AdamW step. Rank 0 alone writes
//! (console, metrics, samples, checkpoints); the others only compute.
//!
//! ```text
//! cargo build --release -p alpha-native --features mpi
//! mpirun -np 2 target/release/alpha-native train --threads 1
//! ```
//!
//! [`Trainer::train_step_ranked`]: alpha_core::train::Trainer::train_step_ranked

use alpha_core::data::Tokens;
use alpha_core::train::{OneRank, Ranks};
use anyhow::{anyhow, Result};
use std::hash::{DefaultHasher, Hasher};

/// Environment variables an MPI launcher sets to the number of processes it started
/// (Open MPI's, then the PMI ones MPICH and Slurm set).
const LAUNCHER_SIZE: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"];

/// What a group of several processes needs from its transport (MPI's collectives).
trait Collectives: Ranks<f32> {
    /// Every rank's `mine`, in rank order.
    fn gather_all(&self, mine: &[u64]) -> Vec<u64>;
    /// Waits for every rank.
    fn barrier(&self);
    /// This process's place among the ranks on its machine.
    fn local_rank(&self) -> usize;
    /// Ends every rank's process with `code`.
    fn abort(&self, code: i32) -> !;
}

/// The processes that train one model together.
pub struct Group {
    /// The transport; none for a process on its own.
    world: Option<Box<dyn Collectives>>,
}

impl Group {
    /// A process training on its own.
    pub fn alone() -> Group {
        Group { world: None }
    }

    /// The group this process was launched in: its MPI world under `mpirun` (or another MPI
    /// launcher), else a group of one. An error when a launcher started several processes
    /// but this build has no MPI (each would train alone, into the same files).
    pub fn launched() -> Result<Group> {
        let launched = LAUNCHER_SIZE.iter().find_map(|v| std::env::var(v).ok()).and_then(|n| n.parse::<usize>().ok());
        match launched {
            None | Some(0..=1) => Ok(Group::alone()),
            #[cfg(feature = "mpi")]
            Some(_) => Ok(Group { world: Some(Box::new(mpi_world::World::init()?)) }),
            #[cfg(not(feature = "mpi"))]
            Some(n) => Err(anyhow!(
                "launched as one of {n} MPI processes, but this alpha-native was built without MPI: build it with `cargo build --release -p alpha-native --features mpi`"
            )),
        }
    }

    /// The group as [`Ranks`] (a process alone is [`OneRank`]).
    fn ranked(&self) -> &dyn Ranks<f32> {
        match &self.world {
            Some(w) => &**w,
            None => &OneRank,
        }
    }

    /// This process's place among the group's processes on its machine (0 alone).
    pub fn local_rank(&self) -> usize {
        self.world.as_ref().map_or(0, |w| w.local_rank())
    }

    /// Whether this is rank 0, the one that writes.
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Whether `flag` is set on any rank (a Ctrl-C seen by one stops all at the same step).
    pub fn any(&self, flag: bool) -> bool {
        self.sum_f64(f64::from(u8::from(flag))) > 0.0
    }

    /// Checks that every rank has the same `facts` (name, fingerprint) as rank 0: on a
    /// mismatch rank 0 returns an error naming the ranks and what differs, and the others
    /// wait to be stopped.
    pub fn agree(&self, facts: &[(&str, u64)]) -> Result<()> {
        let Some(world) = &self.world else { return Ok(()) };
        let mine: Vec<u64> = facts.iter().map(|f| f.1).collect();
        let differ = disagreements(facts, &world.gather_all(&mine));
        if differ.is_empty() {
            return Ok(());
        }
        if !self.is_root() {
            // Rank 0 reports and stops every rank ([`Group::fail`]).
            world.barrier();
        }
        Err(anyhow!("the ranks do not train the same run: {} differ from rank 0's; give every rank the same flags, files and build", differ.join(", ")))
    }

    /// Stops every rank after this one's error, which it prints (prefixed with its rank
    /// when it is not rank 0). A process on its own just exits.
    pub fn fail(&self, msg: &str) -> ! {
        let line = match self.rank() {
            0 => format!("error: {msg}\n"),
            r => format!("error: rank {r}: {msg}\n"),
        };
        // In one write: mpirun forwards a rank's output as it reads it and prints its abort
        // notice between two reads, which cut a line `eprintln!` wrote in pieces (a CI run
        // read "error: ", the notice, then the message).
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        match &self.world {
            Some(w) => w.abort(1),
            None => std::process::exit(1),
        }
    }
}

impl Ranks<f32> for Group {
    fn rank(&self) -> usize {
        self.ranked().rank()
    }
    fn ranks(&self) -> usize {
        self.ranked().ranks()
    }
    fn sum(&self, values: &mut [f32]) {
        self.ranked().sum(values)
    }
    fn sum_f64(&self, value: f64) -> f64 {
        self.ranked().sum_f64(value)
    }
    unsafe fn start_sum(&self, values: &mut [f32]) {
        // SAFETY: the caller's.
        unsafe { self.ranked().start_sum(values) }
    }
    fn finish_sums(&self) {
        self.ranked().finish_sums()
    }
    fn sum_shard(&self, values: &mut [f32]) {
        self.ranked().sum_shard(values)
    }
    fn gather_shards(&self, values: &mut [f32]) {
        self.ranked().gather_shards(values)
    }
    fn collect_shards(&self, mine: &[f32], all: &mut [f32]) {
        self.ranked().collect_shards(mine, all)
    }
}

/// What differs from rank 0's `facts` in every rank's fingerprints `all` (rank by rank, in
/// the order of `facts`): "rank R's NAME" for each.
fn disagreements(facts: &[(&str, u64)], all: &[u64]) -> Vec<String> {
    let (root, others) = all.split_at(facts.len());
    let mut differ = Vec::new();
    for (rank, theirs) in others.chunks(facts.len()).enumerate() {
        for ((name, _), (a, b)) in facts.iter().zip(root.iter().zip(theirs)) {
            if a != b {
                differ.push(format!("rank {}'s {name}", rank + 1));
            }
        }
    }
    differ
}

/// Values read from each end of a long array for a fingerprint: enough to tell two datasets
/// or models apart without reading gigabytes.
const FINGERPRINT_ENDS: usize = 1 << 20;

/// A fingerprint of `values` (as 32-bit words by `bits`) for [`Group::agree`]: their count
/// and the first and last million of them.
pub fn fingerprint<T: Copy>(values: &[T], bits: impl Fn(T) -> u32) -> u64 {
    let n = values.len();
    let (head, tail) = if n <= 2 * FINGERPRINT_ENDS { (values, &[][..]) } else { (&values[..FINGERPRINT_ENDS], &values[n - FINGERPRINT_ENDS..]) };
    let mut h = DefaultHasher::new();
    h.write_usize(n);
    for &v in head.iter().chain(tail) {
        h.write_u32(bits(v));
    }
    h.finish()
}

/// [`fingerprint`] of a split's token ids (in memory or in a dataset's files).
pub fn fingerprint_tokens(tokens: Tokens<'_>) -> u64 {
    let n = tokens.len();
    let mut ends = vec![0u32; n.min(2 * FINGERPRINT_ENDS)];
    let half = ends.len() / 2;
    let (head, tail) = ends.split_at_mut(half);
    tokens.read(0, head);
    tokens.read(n - tail.len(), tail);
    let mut h = DefaultHasher::new();
    h.write_u64(fingerprint(&ends, |t| t));
    h.write_usize(n);
    h.finish()
}

/// A fingerprint of a text (a run's resolved settings).
pub fn fingerprint_text(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(text.as_bytes());
    h.finish()
}

#[cfg(feature = "mpi")]
mod mpi_world {
    use super::Collectives;
    use alpha_core::parallel::shard;
    use alpha_core::train::Ranks;
    use anyhow::{anyhow, Result};
    use mpi::collective::SystemOperation;
    use mpi::datatype::PartitionMut;
    use mpi::environment::Universe;
    use mpi::ffi;
    use mpi::raw::AsRaw;
    use mpi::topology::{Communicator, SimpleCommunicator};
    use mpi::traits::*;
    use std::cell::RefCell;

    /// Values per collective call: gradients and parameters go through one send buffer of
    /// this many (4 MiB; MPI's in-place forms are not in rsmpi's safe API), large enough for
    /// full link speed, small beside the model.
    const BUCKET: usize = 1 << 20;

    /// The MPI world (initialised once, finalised when dropped).
    pub struct World {
        _universe: Universe,
        world: SimpleCommunicator,
        rank: usize,
        ranks: usize,
        local_rank: usize,
        /// The send buffer and the receive buffer of the shard collectives.
        buffers: RefCell<(Vec<f32>, Vec<f32>)>,
        /// The sums [`Ranks::start_sum`] started.
        sums: RefCell<Overlapped>,
    }

    /// Sums started and not finished: the values handed over and not yet sent (contiguous,
    /// growing downwards as the backward finishes blocks), the requests in flight and their
    /// send buffers (MPI's in-place form is not reachable through rsmpi), and spare buffers
    /// kept for the next step.
    #[derive(Default)]
    struct Overlapped {
        waiting: Option<(*mut f32, usize)>,
        requests: Vec<ffi::MPI_Request>,
        sending: Vec<Vec<f32>>,
        spare: Vec<Vec<f32>>,
    }

    impl World {
        /// Initialises MPI (only the main thread calls it).
        pub fn init() -> Result<World> {
            let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or_else(|| anyhow!("MPI was initialised twice"))?;
            let world = universe.world();
            let (rank, ranks) = (world.rank() as usize, world.size() as usize);
            // The ranks that share this machine's memory, in rank order.
            let local_rank = world.split_shared(world.rank()).rank() as usize;
            let (buffers, sums) = (RefCell::new((Vec::new(), Vec::new())), RefCell::default());
            Ok(World { _universe: universe, world, rank, ranks, local_rank, buffers, sums })
        }

        /// Starts summing the `len` values at `low` in pieces of at most [`BUCKET`], from the
        /// top down (the order every rank follows).
        fn launch(&self, sums: &mut Overlapped, low: *mut f32, len: usize) {
            let mut end = len;
            while end > 0 {
                let start = end.saturating_sub(BUCKET);
                let mut send = sums.spare.pop().unwrap_or_default();
                send.clear();
                // SAFETY: `low..low + len` was handed over by `start_sum`'s caller, untouched
                // until `finish_sums`.
                let values = unsafe { std::slice::from_raw_parts_mut(low.add(start), end - start) };
                send.extend_from_slice(values);
                let mut request = std::mem::MaybeUninit::uninit();
                // SAFETY: both buffers outlive the request (the send buffer is kept in
                // `sending`, the values are the caller's until `finish_sums` waits for it).
                unsafe {
                    ffi::MPI_Iallreduce(
                        send.as_ptr().cast(),
                        values.as_mut_ptr().cast(),
                        values.len() as i32,
                        ffi::RSMPI_FLOAT,
                        ffi::RSMPI_SUM,
                        self.world.as_raw(),
                        request.as_mut_ptr(),
                    );
                    sums.requests.push(request.assume_init());
                }
                sums.sending.push(send);
                end = start;
            }
        }

        /// The rounds of a shard collective over `len` values: in round k each rank's part
        /// is values `k*c..(k+1)*c` of its shard (cut at its end), `c` values per rank.
        fn rounds(&self, len: usize) -> (usize, usize) {
            let per_rank = (BUCKET / self.ranks).max(1);
            (shard(len, self.ranks, 0).len().div_ceil(per_rank), per_rank)
        }

        /// Rank `r`'s part of round `k` of a shard collective over `len` values.
        fn part(&self, len: usize, r: usize, k: usize, per_rank: usize) -> std::ops::Range<usize> {
            let s = shard(len, self.ranks, r);
            let start = (s.start + k * per_rank).min(s.end);
            start..(start + per_rank).min(s.end)
        }
    }

    impl Ranks<f32> for World {
        fn rank(&self) -> usize {
            self.rank
        }

        fn ranks(&self) -> usize {
            self.ranks
        }

        fn sum(&self, values: &mut [f32]) {
            let (send, _) = &mut *self.buffers.borrow_mut();
            for piece in values.chunks_mut(BUCKET) {
                send.clear();
                send.extend_from_slice(piece);
                self.world.all_reduce_into(&send[..], piece, SystemOperation::sum());
            }
        }

        fn sum_f64(&self, value: f64) -> f64 {
            let mut total = 0.0;
            self.world.all_reduce_into(&value, &mut total, SystemOperation::sum());
            total
        }

        unsafe fn start_sum(&self, values: &mut [f32]) {
            let sums = &mut *self.sums.borrow_mut();
            let (low, len) = (values.as_mut_ptr(), values.len());
            sums.waiting = match sums.waiting {
                // Just below what waits: one piece.
                Some((w, n)) if low.wrapping_add(len) == w => Some((low, len + n)),
                Some((w, n)) => {
                    self.launch(sums, w, n);
                    Some((low, len))
                }
                None => Some((low, len)),
            };
            if let Some((w, n)) = sums.waiting.filter(|&(_, n)| n >= BUCKET) {
                self.launch(sums, w, n);
                sums.waiting = None;
            }
            // Open MPI moves a non-blocking collective along only inside MPI calls.
            let mut done = 0;
            // SAFETY: the requests are live ones this rank started.
            unsafe { ffi::MPI_Testall(sums.requests.len() as i32, sums.requests.as_mut_ptr(), &mut done, ffi::RSMPI_STATUSES_IGNORE) };
        }

        fn finish_sums(&self) {
            let sums = &mut *self.sums.borrow_mut();
            if let Some((w, n)) = sums.waiting.take() {
                self.launch(sums, w, n);
            }
            // SAFETY: as in `start_sum`.
            unsafe { ffi::MPI_Waitall(sums.requests.len() as i32, sums.requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) };
            sums.requests.clear();
            let Overlapped { sending, spare, .. } = sums;
            spare.append(sending);
        }

        fn sum_shard(&self, values: &mut [f32]) {
            let (send, recv) = &mut *self.buffers.borrow_mut();
            let (rounds, c) = self.rounds(values.len());
            for k in 0..rounds {
                send.clear();
                for r in 0..self.ranks {
                    let part = &values[self.part(values.len(), r, k, c)];
                    send.extend_from_slice(part);
                    send.resize((r + 1) * c, 0.0);
                }
                recv.resize(c, 0.0);
                self.world.reduce_scatter_block_into(&send[..], &mut recv[..], SystemOperation::sum());
                let mine = self.part(values.len(), self.rank, k, c);
                values[mine.clone()].copy_from_slice(&recv[..mine.len()]);
            }
        }

        fn gather_shards(&self, values: &mut [f32]) {
            let (send, recv) = &mut *self.buffers.borrow_mut();
            let (rounds, c) = self.rounds(values.len());
            for k in 0..rounds {
                send.clear();
                send.extend_from_slice(&values[self.part(values.len(), self.rank, k, c)]);
                send.resize(c, 0.0);
                recv.resize(c * self.ranks, 0.0);
                self.world.all_gather_into(&send[..], &mut recv[..]);
                for r in 0..self.ranks {
                    let part = self.part(values.len(), r, k, c);
                    values[part.clone()].copy_from_slice(&recv[r * c..r * c + part.len()]);
                }
            }
        }

        fn collect_shards(&self, mine: &[f32], all: &mut [f32]) {
            let root = self.world.process_at_rank(0);
            if self.rank != 0 {
                root.gather_varcount_into(mine);
                return;
            }
            let counts: Vec<i32> = (0..self.ranks).map(|r| shard(all.len(), self.ranks, r).len() as i32).collect();
            let displs: Vec<i32> = (0..self.ranks).map(|r| shard(all.len(), self.ranks, r).start as i32).collect();
            let mut partition = PartitionMut::new(all, counts, displs);
            root.gather_varcount_into_root(mine, &mut partition);
        }
    }

    impl Collectives for World {
        fn gather_all(&self, mine: &[u64]) -> Vec<u64> {
            let mut all = vec![0u64; mine.len() * self.ranks];
            self.world.all_gather_into(mine, &mut all[..]);
            all
        }

        fn barrier(&self) {
            self.world.barrier();
        }

        fn local_rank(&self) -> usize {
            self.local_rank
        }

        fn abort(&self, code: i32) -> ! {
            self.world.abort(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disagreements_name_the_rank_and_the_fact() {
        let facts = [("settings", 1), ("training data", 2)];
        assert!(disagreements(&facts, &[1, 2, 1, 2, 1, 2]).is_empty());
        assert_eq!(disagreements(&facts, &[1, 2, 1, 2, 1, 3]), ["rank 2's training data"]);
        assert_eq!(disagreements(&facts, &[1, 2, 0, 0]), ["rank 1's settings", "rank 1's training data"]);
    }

    #[test]
    fn fingerprints_tell_tokens_apart_in_memory_and_in_files() {
        let ids: Vec<u32> = (0..3_000_000).map(|i| i % 50_257).collect();
        let mut other = ids.clone();
        other[5] += 1;
        assert_ne!(fingerprint_tokens((&ids[..]).into()), fingerprint_tokens((&other[..]).into()));
        assert_ne!(fingerprint_tokens((&ids[..]).into()), fingerprint_tokens((&ids[1..]).into()));
        assert_eq!(fingerprint_tokens((&ids[..]).into()), fingerprint_tokens((&ids.clone()[..]).into()));
    }
}
