//! The CUDA C++ kernel sources, embedded in the binary and compiled by NVRTC at start-up.

/// Helpers every kernel file uses; prepended to each source.
const PRELUDE: &str = include_str!("../../cuda/prelude.cuh");

/// One kernel file: compiled as one NVRTC program, loaded as one module.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// File name under `kernels/cuda/` (also the NVRTC program name, shown in compile errors).
    pub file: &'static str,
    code: &'static str,
    /// The `extern "C"` kernels the file defines.
    pub functions: &'static [&'static str],
}

impl KernelSource {
    /// A kernel file `file` with text `code` defining the kernels `functions`.
    pub const fn new(
        file: &'static str,
        code: &'static str,
        functions: &'static [&'static str],
    ) -> Self {
        Self {
            file,
            code,
            functions,
        }
    }

    /// The text NVRTC compiles: the prelude, then the file, with line numbers reset so errors point
    /// into the file itself.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.file, self.code)
    }
}

/// Every kernel file.
pub const KERNEL_SOURCES: &[KernelSource] = &[
    KernelSource {
        file: "norms.cu",
        code: include_str!("../../cuda/norms.cu"),
        functions: &[
            "rms_norm_h4",
            "rms_norm_h8",
            "rms_norm_h12",
            "rms_norm_h16",
            "rms_norm_bf16_h4",
            "rms_norm_bf16_h8",
            "rms_norm_bf16_h12",
            "rms_norm_bf16_h16",
            "add_rms_norm_h4",
            "add_rms_norm_h8",
            "add_rms_norm_h12",
            "add_rms_norm_h16",
            "add_rms_norm_bf16_h4",
            "add_rms_norm_bf16_h8",
            "add_rms_norm_bf16_h12",
            "add_rms_norm_bf16_h16",
            "gated_rms_norm",
            "gated_rms_norm_zbf16",
            "gated_rms_norm_bf16_h4",
            "gated_rms_norm_bf16_h8",
            "gated_rms_norm_bf16_h16",
            "gated_rms_norm_bf16_zbf16_h4",
            "gated_rms_norm_bf16_zbf16_h8",
            "gated_rms_norm_bf16_zbf16_h16",
            "head_rms_norm",
            "l2_norm_h4",
            "l2_norm_h8",
            "l2_norm_h16",
        ],
    },
    KernelSource {
        file: "elementwise.cu",
        code: include_str!("../../cuda/elementwise.cu"),
        functions: &[
            "embedding",
            "swiglu",
            "delta_gates",
            "delta_gates_bf16x",
            "gather_last",
            "scatter_rows",
            "copy_parts",
            "f32_to_bf16",
            "swiglu_bf16",
            "swiglu_from_bf16",
            "swiglu_bf16_from_bf16",
        ],
    },
    KernelSource {
        file: "rope.cu",
        code: include_str!("../../cuda/rope.cu"),
        functions: &["rope", "qk_norm_rope", "attention_prologue"],
    },
    KernelSource {
        file: "conv.cu",
        code: include_str!("../../cuda/conv.cu"),
        functions: &[
            "conv1d_silu",
            "conv1d_silu_bf16x",
            "conv1d_window_out",
            "conv1d_window_out_bf16x",
        ],
    },
    KernelSource {
        file: "gemm.cu",
        code: include_str!("../../cuda/gemm.cu"),
        functions: &["gemm_xwt", "gemm_xwt_bf16x"],
    },
    KernelSource {
        file: "attention.cu",
        code: include_str!("../../cuda/attention.cu"),
        functions: &["attention_gated", "attention_gated_prefix", "copy_columns"],
    },
    KernelSource {
        file: "flash_bidir_wgmma.cu",
        code: include_str!("../../cuda/flash_bidir_wgmma.cu"),
        functions: &["flash_bidir_wgmma_d64"],
    },
    KernelSource {
        file: "flash_attention.cu",
        code: include_str!("../../cuda/flash_attention.cu"),
        functions: &[
            "flash_bf16_inputs",
            "flash_attention_d64",
            "flash_attention_d128",
            "flash_attention_d256",
            "flash_attention_narrow_d64",
            "flash_attention_narrow_d128",
            "flash_attention_narrow_d256",
            "flash_attention_last_d64",
            "flash_attention_last_d128",
            "flash_attention_last_d256",
            "flash_attention_last_split_d64",
            "flash_attention_last_split_d128",
            "flash_attention_last_split_d256",
            "flash_last_combine",
            "flash_attention_prefix_d64",
            "flash_attention_prefix_d128",
            "flash_attention_prefix_d256",
            "flash_attention_prefix_last_d64",
            "flash_attention_prefix_last_d128",
            "flash_attention_prefix_last_d256",
            "flash_attention_prefix_last_split_d64",
            "flash_attention_prefix_last_split_d128",
            "flash_attention_prefix_last_split_d256",
            "flash_attention_bidir_d64",
            "flash_attention_bidir_d128",
            "flash_attention_bidir_d256",
            "flash_attention_bidir_wide_d64",
            "flash_attention_bidir_wide_d128",
            "flash_attention_bidir_wide_d256",
            "flash_bidir_inputs",
            "flash_bidir_inputs_rope",
            "flash_prefix_rows",
        ],
    },
    KernelSource {
        file: "delta.cu",
        code: include_str!("../../cuda/delta.cu"),
        functions: &["gated_delta_rule_recurrent"],
    },
    KernelSource {
        file: "delta_chunked.cu",
        code: include_str!("../../cuda/delta_chunked.cu"),
        functions: &[
            "gdr_prepare",
            "gdr_prepare_conv",
            "gdr_state_pass_v32",
            "gdr_state_pass_v64",
        ],
    },
    KernelSource {
        file: "vision.cu",
        code: include_str!("../../cuda/vision.cu"),
        functions: &[
            "layer_norm_h4",
            "layer_norm_h8",
            "layer_norm_h16",
            "layer_norm_bf16_h4",
            "layer_norm_bf16_h8",
            "layer_norm_bf16_h16",
            "add_bias",
            "add_in_place",
            "gelu_tanh",
            "gelu_erf",
            "bias_gelu_tanh_f32",
            "bias_gelu_tanh_bf16",
            "bias_gelu_erf_f32",
            "bias_gelu_erf_bf16",
            "add_bias_residual",
            "rope_axial",
            "attention_bidirectional_e2",
            "attention_bidirectional_e4",
            "attention_bidirectional_e8",
            "patch_rows_bf16",
            "patch_rows_f32",
        ],
    },
];
