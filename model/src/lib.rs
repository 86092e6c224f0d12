//! The Qwen3.5 text model as Cua-S1 uses it: checkpoint and adapter loading, tokenizer, chat
//! template, prompts, the forward pass written once over the `instinct-kernels` backend, and the
//! letter readout. A batch's sequences may resume from prefix-state snapshots and leave their own
//! ([`prefix`], [`forward::TextModel::forward_segments`], [`decider::Decider::decide_segments`]).

pub mod chat;
pub mod checkout;
pub mod checkpoint;
pub mod config;
pub mod decider;
pub mod demo;
pub mod forward;
pub mod image;
pub mod lora;
pub mod mrope;
pub mod prefix;
pub mod prefix_cache;
pub mod prompt;
pub mod pyjson;
pub mod readout;
pub mod source;
pub mod tensor_store;
pub mod tokenizer;
pub mod values;
pub mod vision;
pub mod weights;
