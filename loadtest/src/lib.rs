//! instinct-loadtest: load generator and report for the instinct server (HTTP only).
//!
//! Workloads ([`workload`]) are built before the run; [`runner`] sends them open loop (a fixed
//! arrival schedule, latency from the intended send time) or closed loop (N clients);
//! [`report`] aggregates counts, throughput, goodput, percentiles and the server's own phase
//! timings (`Server-Timing` headers and `/metrics` deltas); [`svg`] draws the charts; [`samples`]
//! writes every request on the wall clock.

pub mod app;
pub mod cli;
pub mod client;
pub mod prometheus;
pub mod report;
pub mod runner;
pub mod samples;
pub mod schedule;
pub mod server_timing;
pub mod stats;
pub mod svg;
pub mod target;
pub mod workload;
