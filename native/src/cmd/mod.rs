//! The commands of `alpha-native`, one file each: its flags and how it runs. What they share
//! lives beside them ([`crate::args`], [`crate::run`] for `train`, the services).

pub mod bench;
pub mod eval;
pub mod export;
pub mod info;
pub mod prepare;
pub mod report;
pub mod sample;
pub mod tokenizer;
pub mod train;
