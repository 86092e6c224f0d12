//! The Qwen3.5 text model as Cua-S1 uses it: checkpoint and adapter loading, tokenizer, chat
//! template, prompts, the forward pass written once over the `instinct-kernels` backend, and the
//! letter readout.

pub mod chat;
pub mod config;
pub mod weights;
