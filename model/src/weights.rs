//! Host-side weights of the text model after loading and adapter merge, in f32. This is the hand-off
//! between the checkpoint loader (`checkpoint`, `lora`) and the forward pass (`forward`), which
//! uploads them to its backend.

/// A dense row-major tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape {shape:?}"
        );
        Self { shape, data }
    }
}

/// Gated DeltaNet layer (`layers.i.linear_attn.*`). Linear weights are `[out, in]`.
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    /// `[2·Hk·Dk + Hv·Dv, hidden]`: rows q, then k, then v.
    pub in_proj_qkv: HostTensor,
    /// `[Hv·Dv, hidden]`: the output gate z.
    pub in_proj_z: HostTensor,
    /// `[Hv, hidden]`: β logits.
    pub in_proj_b: HostTensor,
    /// `[Hv, hidden]`: decay input.
    pub in_proj_a: HostTensor,
    /// `[channels, kernel]` (the checkpoint's `[channels, 1, kernel]` squeezed).
    pub conv1d: HostTensor,
    /// `[Hv]`
    pub dt_bias: HostTensor,
    /// `[Hv]`
    pub a_log: HostTensor,
    /// `[Dv]`: gated RMSNorm weight, plain (not 1 + w).
    pub norm: HostTensor,
    /// `[hidden, Hv·Dv]`
    pub out_proj: HostTensor,
}

/// Gated full-attention layer (`layers.i.self_attn.*`).
#[derive(Clone, Debug)]
pub struct AttentionWeights {
    /// `[2·Hq·D, hidden]`: per head, D query rows then D gate rows.
    pub q_proj: HostTensor,
    /// `[Hkv·D, hidden]`
    pub k_proj: HostTensor,
    /// `[Hkv·D, hidden]`
    pub v_proj: HostTensor,
    /// `[hidden, Hq·D]`
    pub o_proj: HostTensor,
    /// `[D]`, zero-centred (applied as 1 + w).
    pub q_norm: HostTensor,
    /// `[D]`, zero-centred.
    pub k_norm: HostTensor,
}

/// The token mixer of one decoder layer.
#[derive(Clone, Debug)]
pub enum MixerWeights {
    Linear(DeltaNetWeights),
    Full(AttentionWeights),
}

/// SwiGLU MLP.
#[derive(Clone, Debug)]
pub struct MlpWeights {
    /// `[intermediate, hidden]`
    pub gate_proj: HostTensor,
    /// `[intermediate, hidden]`
    pub up_proj: HostTensor,
    /// `[hidden, intermediate]`
    pub down_proj: HostTensor,
}

/// One decoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[hidden]`, zero-centred.
    pub input_layernorm: HostTensor,
    /// `[hidden]`, zero-centred.
    pub post_attention_layernorm: HostTensor,
    pub mixer: MixerWeights,
    pub mlp: MlpWeights,
}

/// All weights the text forward pass needs.
#[derive(Clone, Debug)]
pub struct TextWeights {
    /// `[vocab, hidden]`; also the LM head (tied).
    pub embed_tokens: HostTensor,
    /// `[hidden]`, zero-centred.
    pub norm: HostTensor,
    pub layers: Vec<LayerWeights>,
}

impl TextWeights {
    /// Number of values over all tensors.
    pub fn element_count(&self) -> usize {
        let mut n = self.embed_tokens.data.len() + self.norm.data.len();
        for l in &self.layers {
            n += l.input_layernorm.data.len() + l.post_attention_layernorm.data.len();
            n += l.mlp.gate_proj.data.len() + l.mlp.up_proj.data.len() + l.mlp.down_proj.data.len();
            n += match &l.mixer {
                MixerWeights::Linear(d) => [
                    &d.in_proj_qkv,
                    &d.in_proj_z,
                    &d.in_proj_b,
                    &d.in_proj_a,
                    &d.conv1d,
                    &d.dt_bias,
                    &d.a_log,
                    &d.norm,
                    &d.out_proj,
                ]
                .iter()
                .map(|t| t.data.len())
                .sum::<usize>(),
                MixerWeights::Full(a) => [
                    &a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &a.q_norm, &a.k_norm,
                ]
                .iter()
                .map(|t| t.data.len())
                .sum::<usize>(),
            };
        }
        n
    }
}
