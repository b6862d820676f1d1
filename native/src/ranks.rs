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
use alpha_core::train::Ranks;
use std::hash::{DefaultHasher, Hasher};

/// Environment variables an MPI launcher sets to the number of processes it started
/// (Open MPI's, then the PMI ones MPICH and Slurm set).
const LAUNCHER_SIZE: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"];

/// The processes that train one model together.
pub struct Group {
    rank: usize,
    ranks: usize,
    #[cfg(feature = "mpi")]
    mpi: Option<mpi_world::World>,
}

impl Group {
    /// A process training on its own.
    pub fn alone() -> Group {
        Group {
            rank: 0,
            ranks: 1,
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// The group this process was launched in: its MPI world under `mpirun` (or another MPI
    /// launcher), else a group of one. An error when a launcher started several processes
    /// but this build has no MPI (each would train alone, into the same files).
    pub fn launched() -> Result<Group, String> {
        let launched = LAUNCHER_SIZE.iter().find_map(|v| std::env::var(v).ok()).and_then(|n| n.parse::<usize>().ok());
        match launched {
            None | Some(0..=1) => Ok(Group::alone()),
            #[cfg(feature = "mpi")]
            Some(_) => mpi_world::World::init().map(|w| Group { rank: w.rank, ranks: w.ranks, mpi: Some(w) }),
            #[cfg(not(feature = "mpi"))]
            Some(n) => Err(format!(
                "launched as one of {n} MPI processes, but this alpha-native was built without MPI: build it with `cargo build --release -p alpha-native --features mpi`"
            )),
        }
    }

    /// Whether this is rank 0, the one that writes.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Whether `flag` is set on any rank (a Ctrl-C seen by one stops all at the same step).
    pub fn any(&self, flag: bool) -> bool {
        match self.ranks {
            1 => flag,
            _ => self.sum_f64(f64::from(u8::from(flag))) > 0.0,
        }
    }

    /// Checks that every rank has the same `facts` (name, fingerprint) as rank 0: on a
    /// mismatch rank 0 returns an error naming the ranks and what differs, and the others
    /// wait to be stopped.
    pub fn agree(&self, facts: &[(&str, u64)]) -> Result<(), String> {
        let mine: Vec<u64> = facts.iter().map(|f| f.1).collect();
        let differ = disagreements(facts, &self.gather_all(&mine));
        if differ.is_empty() {
            return Ok(());
        }
        if !self.is_root() {
            self.wait_for_abort();
        }
        Err(format!("the ranks do not train the same run: {} differ from rank 0's; give every rank the same flags, files and build", differ.join(", ")))
    }

    /// Every rank's `mine`, in rank order.
    fn gather_all(&self, mine: &[u64]) -> Vec<u64> {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.mpi {
            return w.gather_all(mine);
        }
        mine.to_vec()
    }

    /// Blocks until rank 0 stops the run ([`Group::fail`]).
    fn wait_for_abort(&self) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.mpi {
            w.barrier();
        }
        unreachable!("only ranks other than 0 wait, and rank 0 aborts them")
    }

    /// Stops every rank after this one's error, which it prints (prefixed with its rank
    /// when it is not rank 0). A process on its own just exits.
    pub fn fail(&self, msg: &str) -> ! {
        match self.rank {
            0 => eprintln!("error: {msg}"),
            r => eprintln!("error: rank {r}: {msg}"),
        }
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.mpi {
            w.abort(1);
        }
        std::process::exit(1)
    }
}

impl Ranks<f32> for Group {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn sum(&self, values: &mut [f32]) {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.mpi {
            w.sum(values);
        }
        #[cfg(not(feature = "mpi"))]
        let _ = values;
    }

    fn sum_f64(&self, value: f64) -> f64 {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.mpi {
            return w.sum_f64(value);
        }
        value
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
/// and the first and last [`FINGERPRINT_ENDS`] of them.
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
    use mpi::collective::SystemOperation;
    use mpi::environment::Universe;
    use mpi::topology::{Communicator, SimpleCommunicator};
    use mpi::traits::*;
    use std::cell::RefCell;

    /// Gradients are summed in pieces of this many values through one send buffer (MPI's
    /// in-place reduction is not in rsmpi's safe API): 4 MiB, large enough for full link
    /// speed, small enough not to matter beside the model.
    const BUCKET: usize = 1 << 20;

    /// The MPI world (initialised once, finalised when dropped).
    pub struct World {
        _universe: Universe,
        world: SimpleCommunicator,
        send: RefCell<Vec<f32>>,
        pub rank: usize,
        pub ranks: usize,
    }

    impl World {
        /// Initialises MPI (only the main thread calls it).
        pub fn init() -> Result<World, String> {
            let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or("MPI was initialised twice")?;
            let world = universe.world();
            let (rank, ranks) = (world.rank() as usize, world.size() as usize);
            Ok(World { _universe: universe, world, send: RefCell::new(Vec::new()), rank, ranks })
        }

        /// Sums `values` over the ranks, in place, a bucket at a time.
        pub fn sum(&self, values: &mut [f32]) {
            let mut send = self.send.borrow_mut();
            for piece in values.chunks_mut(BUCKET) {
                send.clear();
                send.extend_from_slice(piece);
                self.world.all_reduce_into(&send[..], piece, SystemOperation::sum());
            }
        }

        pub fn sum_f64(&self, value: f64) -> f64 {
            let mut total = 0.0;
            self.world.all_reduce_into(&value, &mut total, SystemOperation::sum());
            total
        }

        /// Every rank's `mine`, in rank order.
        pub fn gather_all(&self, mine: &[u64]) -> Vec<u64> {
            let mut all = vec![0u64; mine.len() * self.ranks];
            self.world.all_gather_into(mine, &mut all[..]);
            all
        }

        pub fn barrier(&self) {
            self.world.barrier();
        }

        pub fn abort(&self, code: i32) -> ! {
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
