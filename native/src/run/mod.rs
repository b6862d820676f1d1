//! The parts of a training run, which `alpha-native train` ([`crate::cmd::train`]) puts
//! together: its flags ([`args`]), its set-up ([`setup`]: the model, settings, data and engine
//! it resolves), what it writes ([`outputs`]), its checkpoints ([`checkpointer`]), its console
//! and metrics, and the loop over core's `Driver` ([`training`]).

pub mod args;
pub mod checkpointer;
pub mod console;
pub mod metrics;
pub mod outputs;
pub mod setup;
pub mod training;
