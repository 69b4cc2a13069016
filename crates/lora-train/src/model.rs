//! The frozen base model as candle tensors, and its forward pass with LoRA deltas: the same
//! computation as the engine's for the plain llama family, written with candle's
//! differentiable operations so that the adapters' gradients come from its autograd.
//!
//! The weights keep GGUF's layout: q and k rows permuted for the interleaved rotary layout
//! llama.cpp's converter writes, and rotary pairs `(2i, 2i + 1)` to match. Only the adapters'
//! B rows of q and k are put back in Hugging Face's order when they are saved
//! ([`crate::lora::LoraSet::save_peft`]).

use std::path::Path;

use candle_core::{D, DType, Device, Tensor};
use modelmux_llm::{GgufFile, LlamaConfig, RopeScaling};

use crate::lora::{LoraSet, Target};
use crate::{Error, Result};

/// One transformer layer's frozen weights, `[out, in]` as in GGUF.
struct Layer {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    ffn_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A llama-family base model with f32 weights, frozen.
pub struct BaseModel {
    config: LlamaConfig,
    embedding: Tensor,
    layers: Vec<Layer>,
    output_norm: Tensor,
    /// The output head (the embedding itself when the file ties them).
    output: Tensor,
}

impl BaseModel {
    /// Reads the GGUF file at `path`, every weight dequantized to f32. Families other than
    /// plain llama (biases, q/k norms, soft caps, windows, scaled RoPE) are refused: the
    /// trainer would compute another function than the engine serves.
    pub fn load(path: &Path) -> Result<Self> {
        let mut file = GgufFile::open(path)?;
        let config = file.llama_config()?;
        check_plain_llama(&config)?;
        if file.has_tensor("rope_freqs.weight") {
            return Err(Error::Invalid(
                "the trainer has no Llama 3 RoPE scaling (rope_freqs.weight)".into(),
            ));
        }
        let c = &config;
        let tied = !file.has_tensor("output.weight");
        let mut read = |name: &str, shape: &[usize]| -> Result<Tensor> {
            Ok(file.tensor(name, shape)?.dequantize(&Device::Cpu)?)
        };
        let embedding = read("token_embd.weight", &[c.vocab_size, c.d_model])?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let name = |t: &str| format!("blk.{i}.{t}.weight");
            layers.push(Layer {
                attn_norm: read(&name("attn_norm"), &[c.d_model])?,
                q: read(&name("attn_q"), &[c.q_dim(), c.d_model])?,
                k: read(&name("attn_k"), &[c.kv_dim(), c.d_model])?,
                v: read(&name("attn_v"), &[c.kv_dim(), c.d_model])?,
                o: read(&name("attn_output"), &[c.d_model, c.q_dim()])?,
                ffn_norm: read(&name("ffn_norm"), &[c.d_model])?,
                gate: read(&name("ffn_gate"), &[c.ffn_dim, c.d_model])?,
                up: read(&name("ffn_up"), &[c.ffn_dim, c.d_model])?,
                down: read(&name("ffn_down"), &[c.d_model, c.ffn_dim])?,
            });
        }
        let output_norm = read("output_norm.weight", &[c.d_model])?;
        let output = if tied {
            embedding.clone()
        } else {
            read("output.weight", &[c.vocab_size, c.d_model])?
        };
        Ok(Self {
            config,
            embedding,
            layers,
            output_norm,
            output,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The final hidden states (after the output norm) of a right-padded batch of token ids,
    /// `[batch, len]` → `[batch, len, d_model]`, with the adapters in `lora` added to the
    /// projections they target. Padding needs no mask: attention is causal and padding comes
    /// after every real token.
    pub fn hidden(&self, ids: &Tensor, lora: &LoraSet) -> Result<Tensor> {
        let c = &self.config;
        let (batch, len) = ids.dims2()?;
        let mut x = self
            .embedding
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((batch, len, c.d_model))?;
        let (cos, sin) = rotary_tables(c, len)?;
        let mask = causal_mask(len)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, c.rms_eps)?;
            let proj = |w: &Tensor, t: Target, input: &Tensor| -> Result<Tensor> {
                let base = input.broadcast_matmul(&w.t()?)?;
                match lora.delta(i, t, input)? {
                    Some(delta) => Ok((base + delta)?),
                    None => Ok(base),
                }
            };
            let heads = |t: Tensor, n: usize| -> Result<Tensor> {
                Ok(t.reshape((batch, len, n, c.head_dim))?.transpose(1, 2)?)
            };
            let q = heads(proj(&layer.q, Target::Q, &h)?, c.n_head)?;
            let k = heads(proj(&layer.k, Target::K, &h)?, c.n_kv_head)?;
            let v = heads(proj(&layer.v, Target::V, &h)?, c.n_kv_head)?;
            let q = rotate(&q, &cos, &sin)?;
            let k = repeat_kv(&rotate(&k, &cos, &sin)?, c.n_head / c.n_kv_head)?;
            let v = repeat_kv(&v, c.n_head / c.n_kv_head)?;
            let scores = (q.matmul(&k.t()?)? * f64::from(c.attention_scale))?;
            let weights = softmax_last(&scores.broadcast_add(&mask)?)?;
            let attended = weights
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((batch, len, c.q_dim()))?;
            x = (x + proj(&layer.o, Target::O, &attended)?)?;
            let h = rms_norm(&x, &layer.ffn_norm, c.rms_eps)?;
            let gate = proj(&layer.gate, Target::Gate, &h)?;
            let up = proj(&layer.up, Target::Up, &h)?;
            let mlp = (gate.silu()? * up)?;
            x = (x + proj(&layer.down, Target::Down, &mlp)?)?;
        }
        rms_norm(&x, &self.output_norm, c.rms_eps)
    }

    /// The logits of hidden states `[n, d_model]` → `[n, vocab]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(hidden.matmul(&self.output.t()?)?)
    }
}

fn check_plain_llama(c: &LlamaConfig) -> Result<()> {
    let f = &c.family;
    let plain = f.name == "llama"
        && !f.qkv_bias
        && !f.qk_norm
        && !f.post_norms
        && !f.scaled_embeddings
        && c.attention_softcap.is_none()
        && c.final_softcap.is_none()
        && c.sliding_window.is_none()
        && c.attention_temperature.is_none()
        && c.rope_scaling == RopeScaling::Linear(1.0)
        && c.n_head.is_multiple_of(c.n_kv_head);
    if plain {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "the trainer computes the plain llama family only; this model is `{}` with \
             features it does not implement",
            f.name
        )))
    }
}

/// RMS norm over the last dimension, times `weight`.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let mean_square = x.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x.broadcast_div(&(mean_square + f64::from(eps))?.sqrt()?)?;
    Ok(normed.broadcast_mul(weight)?)
}

/// Softmax over the last dimension (the maximum taken out first, outside the gradient).
fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?)
}

/// `cos` and `sin` of every position's rotary angles, `[len, head_dim / 2, 1]`.
fn rotary_tables(c: &LlamaConfig, len: usize) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let mut cos = Vec::with_capacity(len * half);
    let mut sin = Vec::with_capacity(len * half);
    for p in 0..len {
        for i in 0..half {
            let freq = f64::from(c.rope_base).powf(-2.0 * i as f64 / c.head_dim as f64);
            let angle = p as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let table = |v: Vec<f32>| Tensor::from_vec(v, (len, half, 1), &Device::Cpu);
    Ok((table(cos)?, table(sin)?))
}

/// Rotates pairs `(2i, 2i + 1)` of `[batch, heads, len, head_dim]` by their angles.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, h, len, hd) = x.dims4()?;
    let pairs = x.reshape((b, h, len, hd / 2, 2))?;
    let even = pairs.narrow(4, 0, 1)?;
    let odd = pairs.narrow(4, 1, 1)?;
    let new_even = (even.broadcast_mul(cos)? - odd.broadcast_mul(sin)?)?;
    let new_odd = (even.broadcast_mul(sin)? + odd.broadcast_mul(cos)?)?;
    Ok(Tensor::cat(&[new_even, new_odd], 4)?.reshape((b, h, len, hd))?)
}

/// Each KV head repeated for the query heads that share it.
fn repeat_kv(x: &Tensor, times: usize) -> Result<Tensor> {
    if times == 1 {
        return Ok(x.clone());
    }
    let (b, kv, len, hd) = x.dims4()?;
    Ok(x.unsqueeze(2)?
        .broadcast_as((b, kv, times, len, hd))?
        .contiguous()?
        .reshape((b, kv * times, len, hd))?)
}

/// 0 on and below the diagonal, -inf above it: `[len, len]`.
fn causal_mask(len: usize) -> Result<Tensor> {
    let data: Vec<f32> = (0..len * len)
        .map(|i| {
            if i % len > i / len {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(data, (len, len), &Device::Cpu)?.to_dtype(DType::F32)?)
}
