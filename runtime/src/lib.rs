//! The instinct server: HTTP API, request validation, configuration and subcommands.

pub mod bench;
pub mod budget;
pub mod check;
pub mod cli;
pub mod conn;
pub mod contract;
pub mod engine;
pub mod framing;
pub mod image_cache;
pub mod metrics;
pub mod openapi;
pub mod prefix_reuse;
pub mod problem;
pub mod screenshot;
pub mod serve;
pub mod server;
pub mod tower_batcher;
