//! # alpha-native
//!
//! The Alpha command line (`alpha-native train | sample | eval | bench | info | report | export | prepare | tokenizer`) as a library: the commands,
//! the checkpoint format and the file helpers they share.

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod corpus;
pub mod dataset;
pub mod device;
pub mod engine;
pub mod eval;
pub mod export;
pub mod fsutil;
pub mod hf_model;
pub mod hugepages;
pub mod info;
pub mod interrupt;
pub mod memory;
pub mod peak;
pub mod ranks;
pub mod report;
pub mod runfile;
pub mod sample;
pub mod serve;
pub mod step;
pub mod tokenizer;
pub mod trace;
pub mod train;
