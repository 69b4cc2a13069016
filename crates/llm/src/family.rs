//! What sets one model family apart from Llama, as data: the forward pass is one, and reads
//! these flags where the families differ. A family not listed here is refused at load.

/// How a family's rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i + 1)`: llama.cpp's converter permutes the q and k rows of Llama models
    /// into this order (so PEFT adapters' rows are permuted the same way at load).
    Interleaved,
    /// Pairs `(i, i + head_dim / 2)`, Hugging Face's `rotate_half`: rows stay in the
    /// checkpoint's order (Qwen).
    NeoX,
}

/// A model family this engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// `general.architecture`, also the prefix of the family's metadata keys.
    pub name: &'static str,
    /// How rotary embeddings pair dimensions.
    pub rope: RopeStyle,
    /// Biases on the q, k and v projections (`attn_{q,k,v}.bias`: Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of each head of q and k before the rotary embedding (`attn_{q,k}_norm`: Qwen3).
    pub qk_norm: bool,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "llama",
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        qk_norm: false,
    },
    Family {
        name: "qwen2",
        rope: RopeStyle::NeoX,
        qkv_bias: true,
        qk_norm: false,
    },
    // Fused q/k/v (`attn_qkv`) and gate/up (`ffn_up` of twice the width) are read wherever
    // a file has them; Phi-3's have both.
    Family {
        name: "phi3",
        rope: RopeStyle::NeoX,
        qkv_bias: false,
        qk_norm: false,
    },
    Family {
        name: "qwen3",
        rope: RopeStyle::NeoX,
        qkv_bias: false,
        qk_norm: true,
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
