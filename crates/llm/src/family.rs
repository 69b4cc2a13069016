//! What sets one model family apart from Llama, as data: the forward pass is one, and reads
//! these flags where the families differ. A family not listed here is refused at load.

/// How a family's rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i + 1)`: llama.cpp's converter permutes the q and k rows of Llama models
    /// into this order (so PEFT adapters' rows are permuted the same way at load).
    Interleaved,
    /// Pairs `(i, i + head_dim / 2)`, Hugging Face's `rotate_half`: rows stay in the
    /// checkpoint's order (Qwen, Phi-3, Gemma).
    NeoX,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (Llama, Qwen, Phi-3, Mistral).
    Silu,
    /// GELU with the tanh approximation (Hugging Face's `gelu_pytorch_tanh`: Gemma).
    GeluTanh,
}

/// A model family this engine runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Family {
    /// `general.architecture`, also the prefix of the family's metadata keys.
    pub name: &'static str,
    /// The family whose adapters fit this one (`mistral3` is computed as `llama` is):
    /// an adapter trained on a model of another lineage is refused.
    pub lineage: &'static str,
    /// How rotary embeddings pair dimensions.
    pub rope: RopeStyle,
    /// Biases on the q, k and v projections (`attn_{q,k,v}.bias`: Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of each head of q and k before the rotary embedding (`attn_{q,k}_norm`:
    /// Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorms of the attention's and the MLP's outputs before they join the residual
    /// stream (`post_attention_norm`, `post_ffw_norm`: Gemma 2 and 3).
    pub post_norms: bool,
    /// Token embeddings multiplied by `sqrt(d_model)` (Gemma).
    pub scaled_embeddings: bool,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Sliding-window layers, when the file gives `attention.sliding_window`: of every
    /// `n` layers the last attends to all positions and the others to the window (Gemma 2:
    /// 2, Gemma 3: 6), unless `attention.sliding_window_pattern` says otherwise.
    pub window_pattern: Option<usize>,
    /// The base of the sliding-window layers' rotary embeddings when the file gives no
    /// `rope.freq_base_swa`: `None` for the global base (Gemma 2), or a fixed one (Gemma 3's
    /// 10 000). Linear RoPE scaling applies to the global layers only when this is `Some`.
    pub window_rope_base: Option<f32>,
    /// Metadata keys (after `{arch}.`) this family reads beyond the common ones.
    pub keys: &'static [&'static str],
    /// Gemma's largest sizes scale queries by `1 / sqrt(d_model / n_head)` instead of
    /// `1 / sqrt(head_dim)` (`query_pre_attn_scalar`, which GGUF does not carry): the
    /// layer count that marks that size, as llama.cpp recognises it.
    pub wide_query_scale_layers: Option<usize>,
}

const LLAMA: Family = Family {
    name: "llama",
    lineage: "llama",
    rope: RopeStyle::Interleaved,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    scaled_embeddings: false,
    activation: Activation::Silu,
    window_pattern: None,
    window_rope_base: None,
    keys: &[],
    wide_query_scale_layers: None,
};

const GEMMA_KEYS: &[&str] = &[
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.freq_base_swa",
    "final_logit_softcapping",
];

const FAMILIES: &[Family] = &[
    LLAMA,
    // Mistral 3 (Ministral 3, Mistral Small 3.x) as llama.cpp writes it: Llama's computation
    // with YaRN and Llama 4's attention temperature.
    Family {
        name: "mistral3",
        keys: &["attention.temperature_scale"],
        ..LLAMA
    },
    Family {
        name: "qwen2",
        lineage: "qwen2",
        rope: RopeStyle::NeoX,
        qkv_bias: true,
        ..LLAMA
    },
    // Fused q/k/v (`attn_qkv`) and gate/up (`ffn_up` of twice the width) are read wherever
    // a file has them; Phi-3's have both.
    Family {
        name: "phi3",
        lineage: "phi3",
        rope: RopeStyle::NeoX,
        ..LLAMA
    },
    Family {
        name: "qwen3",
        lineage: "qwen3",
        rope: RopeStyle::NeoX,
        qk_norm: true,
        ..LLAMA
    },
    Family {
        name: "gemma2",
        lineage: "gemma2",
        rope: RopeStyle::NeoX,
        post_norms: true,
        scaled_embeddings: true,
        activation: Activation::GeluTanh,
        window_pattern: Some(2),
        window_rope_base: None,
        keys: &[
            "attention.sliding_window",
            "attention.sliding_window_pattern",
            "rope.freq_base_swa",
            "final_logit_softcapping",
            "attn_logit_softcapping",
        ],
        wide_query_scale_layers: Some(46),
        ..LLAMA
    },
    Family {
        name: "gemma3",
        lineage: "gemma3",
        rope: RopeStyle::NeoX,
        qk_norm: true,
        post_norms: true,
        scaled_embeddings: true,
        activation: Activation::GeluTanh,
        window_pattern: Some(6),
        window_rope_base: Some(10_000.0),
        keys: GEMMA_KEYS,
        wide_query_scale_layers: Some(62),
        ..LLAMA
    },
];

impl Family {
    /// The family written `architecture` in GGUF, if this engine runs it.
    pub fn of(architecture: &str) -> Option<Family> {
        FAMILIES.iter().copied().find(|f| f.name == architecture)
    }

    /// The architectures this engine runs, for error messages.
    pub fn names() -> String {
        FAMILIES
            .iter()
            .map(|f| f.name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}
