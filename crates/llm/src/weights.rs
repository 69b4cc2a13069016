//! The base model's weights, read from GGUF into the formats the kernels run fastest, and the
//! projections LoRA adapters may target. Owns no state of any request.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use modelmux_kernels::WeightArena;

use crate::error::Result;
use crate::gguf::{GgufFile, LlamaConfig};
use crate::matmul::Matrix;

/// How the base model's matrices are stored in memory, and so which kernel multiplies by
/// them. Measurements: `docs/perf/2026-12-02-llm-engine.md`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Every matrix, the vocabulary head included, in one of `modelmux-kernels`' formats
    /// (AVX-512 VNNI / AVX2 / scalar kernels): a matrix stored in a 4-bit type (Q4_0, Q4_1,
    /// Q4_K) keeps its weights in the 4-bit format (20 bytes per 32 weights: `d * q + m`
    /// blocks of 32, f16 `d` and `m`); any other as int8 blocks of 32 with an f16 scale (34
    /// bytes per 32 weights, like Q8_0), converted at load from any type candle can
    /// dequantize. q, k, v and gate, up are stacked into one matrix each (4-bit when all the
    /// parts are); a tied head's rows also serve the embedding lookup. The default and the
    /// fast path.
    #[default]
    Auto,
    /// Exactly as the file stores them, multiplied by candle's kernels (a baseline).
    AsStored,
    /// Every quantized matrix converted to Q8_0 and multiplied by candle's kernels (a tied
    /// vocabulary head stays as stored): this runtime's first fast path, kept as a baseline.
    Q8_0,
    /// Every matrix dequantized to f32, candle's f32 matmul (large and slow; the reference
    /// for tests).
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

    /// The targets a PEFT module adapts, in the order its output rows stack them: one for
    /// `q_proj` and the like, several for the fused modules of Phi-3 (`qkv_proj`,
    /// `gate_up_proj`), whose adapters apply to each part's columns.
    pub fn from_peft_module(name: &str) -> Option<&'static [Target]> {
        const FUSED: &[(&str, &[Target])] = &[
            ("qkv_proj", &[Target::Q, Target::K, Target::V]),
            ("gate_up_proj", &[Target::Gate, Target::Up]),
        ];
        if let Some((_, targets)) = FUSED.iter().find(|(n, _)| *n == name) {
            return Some(targets);
        }
        Target::ALL
            .iter()
            .position(|t| t.peft_name() == name)
            .map(|i| std::slice::from_ref(&Target::ALL[i]))
    }

    /// `(out, in)` of this projection in a model of shape `config`.
    pub fn dims(self, config: &LlamaConfig) -> (usize, usize) {
        let d = config.d_model;
        match self {
            Target::Q => (config.q_dim(), d),
            Target::O => (d, config.q_dim()),
            Target::K | Target::V => (config.kv_dim(), d),
            Target::Gate | Target::Up => (config.ffn_dim, d),
            Target::Down => (d, config.ffn_dim),
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One transformer block.
pub(crate) struct Block {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) ffn_norm: Vec<f32>,
    /// q, k and v stacked: `q_dim + 2 * kv_dim` outputs.
    pub(crate) qkv: Matrix,
    /// Biases of q, k and v, stacked as their outputs (Qwen2).
    pub(crate) qkv_bias: Option<Vec<f32>>,
    /// RMSNorm weights of each q head and each k head, `head_dim` each (Qwen3, Gemma 3).
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// RMSNorm weights of the attention's and the MLP's outputs (Gemma 2 and 3).
    pub(crate) post_norms: Option<(Vec<f32>, Vec<f32>)>,
    pub(crate) o: Matrix,
    /// gate and up stacked: `2 * ffn_dim` outputs.
    pub(crate) gate_up: Matrix,
    pub(crate) down: Matrix,
}

/// The weights of a Llama-family model.
pub struct LlamaWeights {
    pub(crate) config: LlamaConfig,
    /// The token embeddings: the table as stored, or `None` when they are read from the
    /// tied head's int8 copy (the same values, one copy in memory instead of two).
    pub(crate) embedding: Option<Arc<QTensor>>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) final_norm: Vec<f32>,
    pub(crate) lm_head: Matrix,
    pub(crate) format: WeightFormat,
    /// Per-frequency divisors of the rotary angles (`rope_freqs.weight`: Llama 3's
    /// `rope_scaling`), `head_dim / 2` of them.
    pub(crate) rope_factors: Option<Vec<f32>>,
    bytes: u64,
}

/// `tensor` in the format candle's kernels run for `format` (not `Auto`).
fn convert(tensor: QTensor, format: WeightFormat) -> Result<QTensor> {
    let dtype = tensor.dtype();
    let target = match format {
        WeightFormat::Auto | WeightFormat::AsStored => return Ok(tensor),
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

/// The tensors `parts` (name, `(out, in)`) stacked into one matrix in `format`.
fn matrix(
    file: &mut GgufFile,
    parts: &[(String, (usize, usize))],
    format: WeightFormat,
    arena: &mut WeightArena,
) -> Result<Matrix> {
    let mut tensors = Vec::with_capacity(parts.len());
    for (name, (out_dim, in_dim)) in parts {
        tensors.push(file.tensor(name, &[*out_dim, *in_dim])?);
    }
    stacked(tensors.into_iter().map(Arc::new).collect(), format, arena)
}

/// The kernels' formats go into `arena`, in the order made.
fn stacked(
    tensors: Vec<Arc<QTensor>>,
    format: WeightFormat,
    arena: &mut WeightArena,
) -> Result<Matrix> {
    if format == WeightFormat::Auto {
        let refs: Vec<&QTensor> = tensors.iter().map(|t| &**t).collect();
        if let Some(m) = Matrix::int4(&refs, arena)? {
            return Ok(m);
        }
        if let Some(m) = Matrix::int8(&refs, arena)? {
            return Ok(m);
        }
    }
    let mut converted = Vec::with_capacity(tensors.len());
    for t in tensors {
        converted.push(match Arc::try_unwrap(t) {
            Ok(t) => Arc::new(convert(t, format)?),
            Err(shared) => shared,
        });
    }
    Matrix::candle(converted)
}

impl LlamaWeights {
    /// Reads a Llama-family model from the GGUF file at `path`. CPU- and IO-bound: call it
    /// on a blocking thread.
    pub fn load(path: impl AsRef<Path>, format: WeightFormat) -> Result<Self> {
        let mut file = GgufFile::open(path)?;
        let config = file.llama_config()?;
        Self::from_gguf(&mut file, config, format)
    }

    /// Reads the model of `file` (whose `config` is given), then gives the transient buffers
    /// the file was read through back to the OS ([`modelmux_kernels::release_free_heap`]).
    pub(crate) fn from_gguf(
        file: &mut GgufFile,
        config: LlamaConfig,
        format: WeightFormat,
    ) -> Result<Self> {
        let weights = Self::read_gguf(file, config, format);
        modelmux_kernels::release_free_heap();
        weights
    }

    fn read_gguf(file: &mut GgufFile, config: LlamaConfig, format: WeightFormat) -> Result<Self> {
        let d = config.d_model;
        let embedding = file.tensor("token_embd.weight", &[config.vocab_size, d])?;
        let mut bytes = embedding.storage_size_in_bytes() as u64;
        let mut blocks = Vec::with_capacity(config.n_layer);
        // The matrices in the order a step reads them: each layer's q/k/v, o, gate/up and
        // down, then the head.
        let mut arena = WeightArena::new();
        for layer in 0..config.n_layer {
            let (block, block_bytes) = read_block(file, &config, layer, format, &mut arena)?;
            bytes += block_bytes;
            blocks.push(block);
        }
        let final_norm = vector(file, "output_norm.weight", d)?;
        bytes += 4 * d as u64;
        let embedding = Arc::new(embedding);
        // Tied embeddings (SmolLM2, TinyLlama-style small models) have no output.weight: the
        // head is the embedding table, converted for the int8 kernel, or shared as stored.
        let lm_head = if file.has_tensor("output.weight") {
            let parts = [("output.weight".into(), (config.vocab_size, d))];
            let m = matrix(file, &parts, format, &mut arena)?;
            bytes += m.size_bytes();
            m
        } else if format == WeightFormat::F32 {
            let m = Matrix::f32(embedding.dequantize(&Device::Cpu)?)?;
            bytes += m.size_bytes();
            m
        } else if format == WeightFormat::Auto {
            let m = stacked(vec![embedding.clone()], format, &mut arena)?;
            bytes += m.size_bytes();
            m
        } else {
            Matrix::candle(vec![embedding.clone()])?
        };
        let tied = !file.has_tensor("output.weight");
        let rope_factors = if file.has_tensor("rope_freqs.weight") {
            let factors = vector(file, "rope_freqs.weight", config.head_dim / 2)?;
            if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(file.error(format!(
                    "rope_freqs.weight holds {bad}: rotary frequency divisors must be positive"
                )));
            }
            Some(factors)
        } else {
            None
        };
        let unread = file.unread_tensors();
        if !unread.is_empty() {
            let shown: Vec<&str> = unread.iter().take(8).copied().collect();
            return Err(file.error(format!(
                "{} tensor(s) this engine does not use: {}{} (running the model without them would give wrong answers)",
                unread.len(),
                shown.join(", "),
                if unread.len() > shown.len() { ", ..." } else { "" }
            )));
        }
        let embedding = if tied && lm_head.in_kernel_format() {
            bytes -= embedding.storage_size_in_bytes() as u64;
            None
        } else {
            Some(embedding)
        };
        Ok(Self {
            config,
            embedding,
            blocks,
            final_norm,
            lm_head,
            format,
            rope_factors,
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
        let Some(table) = &self.embedding else {
            let d = self.config.d_model;
            let mut x = vec![0.0; tokens.len() * d];
            for (&t, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
                self.lm_head.dequantize_row(t as usize, row);
            }
            return Ok(x);
        };
        let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
        Ok(table.embedding(&ids)?.flatten_all()?.to_vec1()?)
    }
}

/// Block `layer`'s norms and matrices (q/k/v, o, gate/up and down, stacked as a step reads
/// them; fused ones as stored), and the bytes they take.
fn read_block(
    file: &mut GgufFile,
    config: &LlamaConfig,
    layer: usize,
    format: WeightFormat,
    arena: &mut WeightArena,
) -> Result<(Block, u64)> {
    let d = config.d_model;
    let mut bytes = 0u64;
    let part = |layer: usize, t: Target| (t.gguf_name(layer), t.dims(config));
    let attn_norm = vector(file, &format!("blk.{layer}.attn_norm.weight"), d)?;
    let ffn_norm = vector(file, &format!("blk.{layer}.ffn_norm.weight"), d)?;
    bytes += 8 * d as u64;
    let qkv = [Target::Q, Target::K, Target::V].map(|t| part(layer, t));
    let family = config.family;
    let qkv_bias = if family.qkv_bias {
        let mut bias = Vec::with_capacity(config.q_dim() + 2 * config.kv_dim());
        for (name, (rows, _)) in &qkv {
            let name = name.replace(".weight", ".bias");
            bias.extend(vector(file, &name, *rows)?);
        }
        bytes += 4 * bias.len() as u64;
        Some(bias)
    } else {
        None
    };
    let qk_norm = if family.qk_norm {
        let q = vector(
            file,
            &format!("blk.{layer}.attn_q_norm.weight"),
            config.head_dim,
        )?;
        let k = vector(
            file,
            &format!("blk.{layer}.attn_k_norm.weight"),
            config.head_dim,
        )?;
        bytes += 8 * config.head_dim as u64;
        Some((q, k))
    } else {
        None
    };
    let post_norms = if family.post_norms {
        let attn = vector(file, &format!("blk.{layer}.post_attention_norm.weight"), d)?;
        let ffn = vector(file, &format!("blk.{layer}.post_ffw_norm.weight"), d)?;
        bytes += 8 * d as u64;
        Some((attn, ffn))
    } else {
        None
    };
    // Fused projections (Phi-3) are already stacked as the engine stacks them:
    // q, k, v rows, and gate rows then up rows.
    let fused_qkv = format!("blk.{layer}.attn_qkv.weight");
    let qkv = if file.has_tensor(&fused_qkv) {
        let rows = config.q_dim() + 2 * config.kv_dim();
        matrix(file, &[(fused_qkv, (rows, d))], format, arena)?
    } else {
        matrix(file, &qkv, format, arena)?
    };
    let o = matrix(file, &[part(layer, Target::O)], format, arena)?;
    let gate_up = if file.has_tensor(&Target::Gate.gguf_name(layer)) {
        let parts = [part(layer, Target::Gate), part(layer, Target::Up)];
        matrix(file, &parts, format, arena)?
    } else {
        let parts = [(Target::Up.gguf_name(layer), (2 * config.ffn_dim, d))];
        matrix(file, &parts, format, arena)?
    };
    let down = matrix(file, &[part(layer, Target::Down)], format, arena)?;
    let block = Block {
        attn_norm,
        ffn_norm,
        qkv,
        qkv_bias,
        qk_norm,
        post_norms,
        o,
        gate_up,
        down,
    };
    bytes += [&block.qkv, &block.o, &block.gate_up, &block.down]
        .iter()
        .map(|m| m.size_bytes())
        .sum::<u64>();
    Ok((block, bytes))
}
