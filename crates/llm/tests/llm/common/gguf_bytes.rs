//! A one-block llama of a few kilobytes as GGUF bytes, with any metadata changed: for the
//! tests of what a file may not claim (`gguf_limits.rs`) and the GGUF fuzz test
//! (`fuzz_gguf.rs`, which includes this file).
#![allow(dead_code, unreachable_pub)]

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use modelmux_llm::{LlamaWeights, WeightFormat};

fn tensor(shape: &[usize]) -> QTensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| (i % 7) as f32 / 7.0 + 0.1).collect();
    let t = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

/// A one-block llama (width 8, 2 heads of 4, 1 KV head, MLP 16, 16 tokens) with the metadata
/// `changed` replaced or added (a key given twice is written twice), as bytes.
pub fn tiny_bytes<K: AsRef<str>>(changed: &[(K, Value)]) -> Vec<u8> {
    let mut metadata: Vec<(String, Value)> = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(1)),
        ("llama.context_length", Value::U32(64)),
        ("llama.embedding_length", Value::U32(8)),
        ("llama.feed_forward_length", Value::U32(16)),
        ("llama.attention.head_count", Value::U32(2)),
        ("llama.attention.head_count_kv", Value::U32(1)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    metadata.retain(|(k, _)| !changed.iter().any(|(key, _)| key.as_ref() == k));
    metadata.extend(
        changed
            .iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.clone())),
    );
    let shapes: [(&str, &[usize]); 11] = [
        ("token_embd.weight", &[16, 8]),
        ("blk.0.attn_norm.weight", &[8]),
        ("blk.0.ffn_norm.weight", &[8]),
        ("blk.0.attn_q.weight", &[8, 8]),
        ("blk.0.attn_k.weight", &[4, 8]),
        ("blk.0.attn_v.weight", &[4, 8]),
        ("blk.0.attn_output.weight", &[8, 8]),
        ("blk.0.ffn_gate.weight", &[16, 8]),
        ("blk.0.ffn_up.weight", &[16, 8]),
        ("blk.0.ffn_down.weight", &[8, 16]),
        ("output_norm.weight", &[8]),
    ];
    let tensors: Vec<(String, QTensor)> = shapes
        .iter()
        .map(|(name, shape)| (name.to_string(), tensor(shape)))
        .collect();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    out.into_inner()
}

/// Loads `bytes` as the weights' loader does: the error's message, or `None` if it loads.
pub fn load_error(bytes: &[u8]) -> Option<String> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bytes).unwrap();
    LlamaWeights::load(file.path(), WeightFormat::AsStored)
        .err()
        .map(|e| e.to_string())
}
