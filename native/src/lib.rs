#![doc = include_str!("../README.md")]
//!
//! ## Map
//!
//! The Alpha command line (`alpha-native train | sample | eval | bench | info | report |
//! export | prepare | tokenizer`) as a library: the commands ([`cmd`], one file each), the
//! arguments they share ([`args`]), the parts of a training run ([`run`]), and the services
//! beneath them (checkpoints, datasets, devices, files, ranks, reports, tokenizers).

pub mod args;
pub mod checkpoint;
pub mod cli;
pub mod cmd;
pub mod corpus;
pub mod dataset;
pub mod device;
pub mod engine;
pub mod fsutil;
pub mod hf_model;
pub mod hugepages;
pub mod interrupt;
pub mod memory;
pub mod peak;
pub mod ranks;
pub mod report;
pub mod run;
pub mod runfile;
pub mod serve;
pub mod step;
pub mod tokenizer;
pub mod trace;
