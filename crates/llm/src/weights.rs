//! The base model's weights, read from GGUF into the formats the kernels run fastest, and the
//! projections LoRA adapters may target. Owns no state of any request.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, LlamaConfig};

/// How the base model's matrices are stored in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// As the file stores them, except for formats whose CPU kernel is much slower than
    /// Q8_0's (Q4_1, Q5_0, Q5_1), which are converted to Q8_0. The default; see
    /// `docs/ARCHITECTURE.md` for the measurements behind it.
    #[default]
    Auto,
    /// Exactly as the file stores them.
    AsStored,
    /// Every quantized matrix converted to Q8_0.
    Q8_0,
    /// Every matrix dequantized to f32 (large; a reference for tests and benchmarks).
    F32,
}

/// One projection of a transformer block, as PEFT names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `self_attn.q_proj`
    Q,
    /// `self_attn.k_proj`
    K,
    /// `self_attn.v_proj`
    V,
    /// `self_attn.o_proj`
    O,
    /// `mlp.gate_proj`
    Gate,
    /// `mlp.up_proj`
    Up,
    /// `mlp.down_proj`
    Down,
}

impl Target {
    /// Every target, in the order a block runs them.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// PEFT's module name (`q_proj`, ...).
    pub fn peft_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The module's parent in a Hugging Face Llama block (`self_attn` or `mlp`).
    pub fn peft_parent(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            _ => "mlp",
        }
    }

    /// The GGUF tensor name in block `layer`.
    pub fn gguf_name(self, layer: usize) -> String {
        let name = match self {
            Target::Q => "attn_q",
            Target::K => "attn_k",
            Target::V => "attn_v",
            Target::O => "attn_output",
            Target::Gate => "ffn_gate",
            Target::Up => "ffn_up",
            Target::Down => "ffn_down",
        };
        format!("blk.{layer}.{name}.weight")
    }

    /// The target with PEFT name `name`.
    pub fn from_peft_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.peft_name() == name)
    }

    /// `(out, in)` of this projection in a model of shape `config`.
    pub fn dims(self, config: &LlamaConfig) -> (usize, usize) {
        let d = config.d_model;
        match self {
            Target::Q | Target::O => (d, d),
            Target::K | Target::V => (config.kv_dim(), d),
            Target::Gate | Target::Up => (config.ffn_dim, d),
            Target::Down => (d, config.ffn_dim),
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A weight matrix `[out, in]` and the kernel that multiplies by it.
pub(crate) struct Matrix {
    matmul: QMatMul,
    out_dim: usize,
    in_dim: usize,
}

impl Matrix {
    /// `rows x in` activations times this matrix transposed: `rows x out`.
    pub(crate) fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        debug_assert_eq!(x.len(), rows * self.in_dim);
        let x = Tensor::from_slice(x, (rows, self.in_dim), &Device::Cpu)?;
        let y = self.matmul.forward(&x)?;
        debug_assert_eq!(y.dims(), [rows, self.out_dim]);
        Ok(y.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// One transformer block.
pub(crate) struct Block {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) ffn_norm: Vec<f32>,
    /// Indexed by [`Target::index`].
    pub(crate) projections: [Matrix; 7],
}

/// The weights of a Llama-family model.
pub struct LlamaWeights {
    pub(crate) config: LlamaConfig,
    pub(crate) embedding: Arc<QTensor>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) final_norm: Vec<f32>,
    pub(crate) lm_head: Matrix,
    bytes: u64,
}

fn convert(tensor: QTensor, format: WeightFormat) -> Result<QTensor> {
    let dtype = tensor.dtype();
    let target = match format {
        WeightFormat::AsStored => return Ok(tensor),
        WeightFormat::Auto => match dtype {
            GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 => GgmlDType::Q8_0,
            _ => return Ok(tensor),
        },
        WeightFormat::Q8_0 => match dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 | GgmlDType::Q8_0 => {
                return Ok(tensor);
            }
            _ => GgmlDType::Q8_0,
        },
        WeightFormat::F32 => GgmlDType::F32,
    };
    if dtype == target {
        return Ok(tensor);
    }
    let (_, columns) = tensor.shape().dims2()?;
    if columns % target.block_size() != 0 {
        return Ok(tensor);
    }
    let values = tensor.dequantize(&Device::Cpu)?;
    Ok(QTensor::quantize(&values, target)?)
}

fn vector(file: &mut GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = file.tensor(name, &[len])?;
    Ok(t.dequantize(&Device::Cpu)?.to_vec1::<f32>()?)
}

fn matrix(
    file: &mut GgufFile,
    name: &str,
    (out_dim, in_dim): (usize, usize),
    format: WeightFormat,
) -> Result<(Matrix, u64)> {
    let t = convert(file.tensor(name, &[out_dim, in_dim])?, format)?;
    let bytes = t.storage_size_in_bytes() as u64;
    let matmul = QMatMul::from_arc(Arc::new(t))?;
    Ok((
        Matrix {
            matmul,
            out_dim,
            in_dim,
        },
        bytes,
    ))
}

impl LlamaWeights {
    /// Reads a Llama-family model from the GGUF file at `path`. CPU- and IO-bound: call it
    /// on a blocking thread.
    pub fn load(path: impl AsRef<Path>, format: WeightFormat) -> Result<Self> {
        let mut file = GgufFile::open(path)?;
        let config = file.llama_config()?;
        Self::from_gguf(&mut file, config, format)
    }

    pub(crate) fn from_gguf(
        file: &mut GgufFile,
        config: LlamaConfig,
        format: WeightFormat,
    ) -> Result<Self> {
        let d = config.d_model;
        let embedding = file.tensor("token_embd.weight", &[config.vocab_size, d])?;
        let mut bytes = embedding.storage_size_in_bytes() as u64;
        let mut blocks = Vec::with_capacity(config.n_layer);
        for layer in 0..config.n_layer {
            let attn_norm = vector(file, &format!("blk.{layer}.attn_norm.weight"), d)?;
            let ffn_norm = vector(file, &format!("blk.{layer}.ffn_norm.weight"), d)?;
            bytes += 8 * d as u64;
            let mut projections = Vec::with_capacity(7);
            for target in Target::ALL {
                let (m, b) = matrix(file, &target.gguf_name(layer), target.dims(&config), format)?;
                bytes += b;
                projections.push(m);
            }
            let projections: [Matrix; 7] = projections
                .try_into()
                .map_err(|_| LlmError::Internal("seven projections".into()))?;
            blocks.push(Block {
                attn_norm,
                ffn_norm,
                projections,
            });
        }
        let final_norm = vector(file, "output_norm.weight", d)?;
        bytes += 4 * d as u64;
        let embedding = Arc::new(embedding);
        // Tied embeddings (SmolLM2, TinyLlama-style small models) have no output.weight: the
        // head is the embedding table, shared, not copied.
        let lm_head = if file.has_tensor("output.weight") {
            let (m, b) = matrix(file, "output.weight", (config.vocab_size, d), format)?;
            bytes += b;
            m
        } else if format == WeightFormat::F32 {
            let head = embedding.dequantize(&Device::Cpu)?;
            bytes += (head.elem_count() * 4) as u64;
            Matrix {
                matmul: QMatMul::Tensor(head),
                out_dim: config.vocab_size,
                in_dim: d,
            }
        } else {
            Matrix {
                matmul: QMatMul::from_arc(embedding.clone())?,
                out_dim: config.vocab_size,
                in_dim: d,
            }
        };
        Ok(Self {
            config,
            embedding,
            blocks,
            final_norm,
            lm_head,
            bytes,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Bytes the weights occupy in memory.
    pub fn size_bytes(&self) -> u64 {
        self.bytes
    }

    /// The embeddings of `tokens`, `tokens.len() x d_model`.
    pub(crate) fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
        Ok(self.embedding.embedding(&ids)?.flatten_all()?.to_vec1()?)
    }
}
