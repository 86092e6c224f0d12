//! Prefix-state snapshots: what a sequence leaves behind at its end, so that another sequence can
//! continue from it without recomputing it (questions sharing a prompt prefix; a long prompt run
//! as consecutive chunks).
//!
//! # What a snapshot holds, and where
//!
//! A [`PrefixState`] is one token prefix's complete mixer state, per layer in model order, all
//! f32 (never rounded to bf16), each part a [`Values`] held where the backend that took it keeps
//! its buffers (device memory on a GPU, so resuming from a snapshot copies it on the device):
//!
//! - A Gated DeltaNet layer ([`LayerState::DeltaNet`]): the recurrent state after the prefix's
//!   last token, `[v_heads, k_dim, v_dim]` (`S[k][v]` per value head, the layout of
//!   [`instinct_kernels::DeltaState`]), and the conv window, `[kernel − 1, qkv_width]`, oldest row
//!   first: the last pre-conv rows of the in-projection's q|k|v block (zeros before the start
//!   of a prefix shorter than the window; the layout of [`instinct_kernels::ConvWindow`]).
//!   Constant size whatever the prefix's length.
//! - A gated attention layer ([`LayerState::Attention`]): the prefix's keys and values,
//!   `[tokens, kv_heads·head_dim]` each; k after its head norm and rope at the prefix's own
//!   positions, v as projected. Linear in the prefix's length.
//!
//! The MLPs keep nothing: a token's MLP reads only that token.
//!
//! # How one is made and used
//!
//! [`TextModel::forward_segments`](crate::forward::TextModel::forward_segments) runs a batch whose
//! sequences ([`Segment`](crate::forward::Segment)s) may each resume from a snapshot and may each
//! ask for the snapshot at their own end, taken in the same pass (no recompute): the delta-rule
//! kernels write their final states and conv windows out, and the attention layers write every
//! row's k and v. A resumed sequence's own tokens take the positions after the snapshot's
//! ([`PrefixState::next_position`]); its queries attend to the snapshot's keys, then its own.
//! Chaining (prefix → middle → tail) works the same way: the middle's snapshot holds the prefix's
//! keys followed by the middle's, and the middle's final states.
//!
//! # For the parts that come next
//!
//! - The backend ops: [`Backend::delta_net_core_carried`] (the conv window and the recurrent
//!   state, in and out, `[num_seqs, …]` packed over the batch; zeros in for a sequence with no
//!   prefix) and [`Backend::gated_attention_carried`] (each sequence's prefix k/v rows packed
//!   back to back with `num_seqs + 1` offsets in an index buffer, [`PrefixKv`]; every row's k
//!   and v out). The CPU and CUDA backends implement both (a backend that does not gets the
//!   trait's refusal, `prefix states are not implemented on … yet`). On CUDA the fused
//!   `gdr_prepare_conv` reads the carried windows (the conv kernel's window copy writes them
//!   out), and a resumed sequence attends through the flash kernel's prefix form, row for row the whole prompt's
//!   (kernels/tests/cuda_carried.rs, on an H200). The delta rule restarting its 64-token chunk
//!   grid at a segment's start is what still moves a resumed answer on the GPU (this crate's
//!   prefix_states on the GPU), so serving there takes reuse only when asked for.
//! - Staging: [`TextModel::forward_segments`] packs the states of the batch's prefixes into one
//!   buffer per layer and part by device-to-device copies, all of a pass's at once
//!   ([`Backend::copy_many`]: one launch on a GPU), and cuts the snapshots out of the pass's
//!   outputs the same way; nothing crosses to the host. A snapshot
//!   given as host values ([`Values::host`]) is uploaded first.
//! - The cache's budget: [`PrefixState::size_bytes`] is `4 · (Σ_DeltaNet (v_heads·k_dim·v_dim +
//!   (kernel − 1)·qkv_width) + tokens · Σ_attention 2·kv_heads·head_dim)`: a constant part plus
//!   a part per token. A snapshot is taken at a segment's end only; a radix tree that wants one
//!   at an inner boundary runs the prompt as two segments (the second resumed from the first).
//! - Batching: only a segment's own tokens count against
//!   [`BatchLimits`](crate::forward::BatchLimits); its prefix adds attention keys, not rows. The
//!   delta rule's 64-token chunk grid restarts at each segment, so a resumed answer equals the
//!   whole prompt's up to rounding (the tests hold it within 1e-5 per probability).
//!
//! [`Backend::copy_many`]: instinct_kernels::Backend::copy_many
//! [`Backend::delta_net_core_carried`]: instinct_kernels::Backend::delta_net_core_carried
//! [`Backend::gated_attention_carried`]: instinct_kernels::Backend::gated_attention_carried
//! [`PrefixKv`]: instinct_kernels::PrefixKv
//! [`TextModel::forward_segments`]: crate::forward::TextModel::forward_segments

use anyhow::{ensure, Result};

pub use crate::values::Values;

/// What a [`PrefixState`] of a model costs in bytes: a fixed part (the DeltaNet states and conv
/// windows) and a part per token (the attention keys and values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotCost {
    pub fixed: usize,
    pub per_token: usize,
}

impl SnapshotCost {
    /// Bytes of a snapshot of `tokens` tokens ([`PrefixState::size_bytes`]).
    pub fn bytes(&self, tokens: usize) -> usize {
        self.fixed + self.per_token * tokens
    }
}

/// One layer's part of a [`PrefixState`] (see the module docs for the layouts).
#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    DeltaNet {
        /// `[v_heads, k_dim, v_dim]`.
        state: Values,
        /// `[kernel − 1, qkv_width]`, oldest row first.
        conv_window: Values,
    },
    Attention {
        /// `[tokens, kv_heads·head_dim]`, normed and roped.
        k: Values,
        /// `[tokens, kv_heads·head_dim]`.
        v: Values,
    },
}

impl LayerState {
    /// f32 values held.
    fn values(&self) -> usize {
        match self {
            Self::DeltaNet { state, conv_window } => state.len() + conv_window.len(),
            Self::Attention { k, v } => k.len() + v.len(),
        }
    }
}

/// The state a token prefix leaves in every layer: enough to run what follows it as if the
/// prefix had been run in the same sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefixState {
    tokens: usize,
    next_position: u32,
    layers: Vec<LayerState>,
}

impl PrefixState {
    pub(crate) fn new(tokens: usize, next_position: u32, layers: Vec<LayerState>) -> Self {
        Self {
            tokens,
            next_position,
            layers,
        }
    }

    /// Tokens of the prefix (over every chained segment).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// The rope position the next token takes when a segment resuming from here gives no
    /// positions: `tokens` for text, one past the largest position for an M-RoPE prompt (as the
    /// text after an image continues).
    pub fn next_position(&self) -> u32 {
        self.next_position
    }

    /// Per layer, in model order.
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Bytes of the f32 values the snapshot holds (what a cache's byte budget counts; the few
    /// words of bookkeeping around them are not included).
    pub fn size_bytes(&self) -> usize {
        4 * self.layers.iter().map(LayerState::values).sum::<usize>()
    }

    /// Fails unless this snapshot fits a model whose layers hold, per DeltaNet layer, `delta`
    /// state and window values and, per attention layer, `kv_width` values per token and row.
    pub(crate) fn check_shape(&self, kinds: &[LayerShape]) -> Result<()> {
        ensure!(
            self.layers.len() == kinds.len(),
            "the prefix state has {} layers, the model {}",
            self.layers.len(),
            kinds.len()
        );
        for (i, (layer, shape)) in self.layers.iter().zip(kinds).enumerate() {
            let fits = match (layer, *shape) {
                (
                    LayerState::DeltaNet { state, conv_window },
                    LayerShape::DeltaNet {
                        state_len,
                        window_len,
                    },
                ) => state.len() == state_len && conv_window.len() == window_len,
                (LayerState::Attention { k, v }, LayerShape::Attention { kv_width }) => {
                    k.len() == self.tokens * kv_width && v.len() == k.len()
                }
                _ => false,
            };
            ensure!(
                fits,
                "layer {i} of the prefix state does not fit the model's {shape:?}"
            );
        }
        Ok(())
    }
}

/// What one layer of a model keeps in a snapshot, by size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayerShape {
    DeltaNet { state_len: usize, window_len: usize },
    Attention { kv_width: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<LayerShape> {
        vec![
            LayerShape::DeltaNet {
                state_len: 8,
                window_len: 6,
            },
            LayerShape::Attention { kv_width: 4 },
        ]
    }

    fn state(tokens: usize, k_len: usize) -> PrefixState {
        let layers = vec![
            LayerState::DeltaNet {
                state: Values::host(vec![0.5; 8]),
                conv_window: Values::host(vec![0.25; 6]),
            },
            LayerState::Attention {
                k: Values::host(vec![1.0; k_len]),
                v: Values::host(vec![2.0; k_len]),
            },
        ];
        PrefixState::new(tokens, tokens as u32, layers)
    }

    #[test]
    fn a_state_of_another_shape_is_refused() {
        assert!(state(3, 12).check_shape(&shapes()).is_ok());
        assert_eq!(state(3, 12).size_bytes(), 4 * (8 + 6 + 2 * 12));
        // Keys for 2 tokens in a state that says 3.
        let err = state(3, 8).check_shape(&shapes()).unwrap_err();
        assert!(err.to_string().contains("layer 1"), "{err}");
        // Fewer layers than the model.
        let err = state(3, 12).check_shape(&shapes()[..1]).unwrap_err();
        assert!(err.to_string().contains("2 layers, the model 1"), "{err}");
        // Kinds in another order.
        let swapped = [shapes()[1], shapes()[0]];
        assert!(state(3, 12).check_shape(&swapped).is_err());
    }
}
