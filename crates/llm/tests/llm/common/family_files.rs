//! Tiny random-weight models of each family and PEFT adapters for them, written as GGUF and
//! safetensors files for `tests/families.rs` (and anything else that needs a small model of
//! a family other than the tiny llama).

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::SeedableRng;

use super::env_path;
use super::tiny::{ones, random};

/// Where the files go.
pub fn dir() -> PathBuf {
    super::scratch("modelmux-families")
}

/// A vector as an f32 tensor.
pub fn f32_tensor(values: Vec<f32>) -> QTensor {
    let n = values.len();
    let t = Tensor::from_vec(values, n, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

/// A tiny model of a family: d 64, 4 query heads and 2 KV heads of `head_dim`, with the
/// family's extra tensors and keys.
pub struct Spec<'a> {
    pub arch: &'a str,
    pub head_dim: usize,
    pub layers: usize,
    /// Random q/k/v biases (Qwen2).
    pub bias: bool,
    /// Random-around-1 q/k norms (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Phi-3's fused `attn_qkv` and gate/up `ffn_up`.
    pub fused: bool,
    /// Gemma's post-attention and post-MLP norms, and norms that are not all ones.
    pub gemma: bool,
    /// More `{arch}.*` keys (names after the prefix).
    pub keys: Vec<(&'a str, Value)>,
}

impl<'a> Spec<'a> {
    pub fn new(arch: &'a str, head_dim: usize) -> Self {
        Spec {
            arch,
            head_dim,
            layers: 2,
            bias: false,
            qk_norm: false,
            fused: false,
            gemma: false,
            keys: Vec::new(),
        }
    }
}

/// Norm weights around 1 (as Gemma's converter stores them: 1 + Hugging Face's weight).
pub fn around_one(n: usize, seed: usize) -> QTensor {
    f32_tensor(
        (0..n)
            .map(|i| 0.5 + ((i + seed) * 7 % 11) as f32 / 10.0)
            .collect(),
    )
}

pub fn write_family(
    arch: &str,
    head_dim: usize,
    bias: bool,
    qk_norm: bool,
    fused: bool,
) -> PathBuf {
    write_spec(&Spec {
        bias,
        qk_norm,
        fused,
        ..Spec::new(arch, head_dim)
    })
}

pub fn write_spec(spec: &Spec<'_>) -> PathBuf {
    const D: usize = 64;
    const FFN: usize = 128;
    const HEADS: usize = 4;
    const KV_HEADS: usize = 2;
    let Spec {
        arch,
        head_dim,
        layers,
        bias,
        qk_norm,
        fused,
        gemma,
        ..
    } = *spec;
    let (q_dim, kv_dim) = (HEADS * head_dim, KV_HEADS * head_dim);
    let u32v = |v: usize| Value::U32(v as u32);
    let key = |k: &str| format!("{arch}.{k}");
    let mut metadata = vec![
        (
            "general.architecture".to_owned(),
            Value::String(arch.into()),
        ),
        (key("block_count"), u32v(layers)),
        (key("context_length"), u32v(512)),
        (key("embedding_length"), u32v(D)),
        (key("feed_forward_length"), u32v(FFN)),
        (key("attention.head_count"), u32v(HEADS)),
        (key("attention.head_count_kv"), u32v(KV_HEADS)),
        (key("rope.freq_base"), Value::F32(10000.0)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
    ];
    if head_dim != D / HEADS {
        metadata.push((key("attention.key_length"), u32v(head_dim)));
        metadata.push((key("attention.value_length"), u32v(head_dim)));
    }
    for (k, v) in &spec.keys {
        metadata.retain(|(name, _)| *name != key(k));
        metadata.push((key(k), v.clone()));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(arch.len() as u64 * 31 + head_dim as u64);
    let vocab = 49152;
    let norm = |n: usize, seed: usize| if gemma { around_one(n, seed) } else { ones(n) };
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            random(&mut rng, &[vocab, D], if gemma { 0.2 } else { 1.0 }),
        ),
        ("output_norm.weight".into(), norm(D, 1)),
    ];
    for l in 0..layers {
        let p = |n: &str| format!("blk.{l}.{n}");
        tensors.push((p("attn_norm.weight"), norm(D, 2 + l)));
        tensors.push((p("ffn_norm.weight"), norm(D, 3 + l)));
        if gemma {
            tensors.push((p("post_attention_norm.weight"), around_one(D, 4 + l)));
            tensors.push((p("post_ffw_norm.weight"), around_one(D, 5 + l)));
        }
        if fused {
            let rows = q_dim + 2 * kv_dim;
            tensors.push((p("attn_qkv.weight"), random(&mut rng, &[rows, D], 0.2)));
        } else {
            tensors.push((p("attn_q.weight"), random(&mut rng, &[q_dim, D], 0.2)));
            tensors.push((p("attn_k.weight"), random(&mut rng, &[kv_dim, D], 0.2)));
            tensors.push((p("attn_v.weight"), random(&mut rng, &[kv_dim, D], 0.2)));
        }
        tensors.push((p("attn_output.weight"), random(&mut rng, &[D, q_dim], 0.2)));
        if fused {
            tensors.push((p("ffn_up.weight"), random(&mut rng, &[2 * FFN, D], 0.2)));
        } else {
            tensors.push((p("ffn_gate.weight"), random(&mut rng, &[FFN, D], 0.2)));
            tensors.push((p("ffn_up.weight"), random(&mut rng, &[FFN, D], 0.2)));
        }
        tensors.push((p("ffn_down.weight"), random(&mut rng, &[D, FFN], 0.2)));
        if bias {
            tensors.push((p("attn_q.bias"), random(&mut rng, &[q_dim], 0.5)));
            tensors.push((p("attn_k.bias"), random(&mut rng, &[kv_dim], 0.5)));
            tensors.push((p("attn_v.bias"), random(&mut rng, &[kv_dim], 0.5)));
        }
        if qk_norm {
            for n in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                let values: Vec<f32> = (0..head_dim)
                    .map(|i| 0.5 + (i * 7 % 11) as f32 / 10.0)
                    .collect();
                tensors.push((p(n), f32_tensor(values)));
            }
        }
    }
    let keys: Vec<&str> = spec.keys.iter().map(|(k, _)| *k).collect();
    let path = dir().join(format!(
        "{arch}-{head_dim}-{fused}-{layers}-{}.gguf",
        keys.join("-").replace('.', "_")
    ));
    // The tokenizer's metadata from SmolLM2; the model's keys and tensors replace the tiny
    // llama's (whose `llama.*` keys are dropped for another family).
    write_family_file(&path, arch, metadata, tensors);
    path
}

pub fn write_family_file(
    path: &Path,
    arch: &str,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, QTensor)>,
) {
    use candle_core::quantized::gguf_file;
    let mut all = super::tiny::tokenizer_metadata(&env_path("MODELMUX_TEST_GGUF"));
    all.extend(metadata);
    assert!(
        all.iter()
            .all(|(k, _)| !k.starts_with("llama.") || arch == "llama")
    );
    let metadata: Vec<(&str, &Value)> = all.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    // Tests running at once may write the same file (same spec): each writes its own copy and
    // renames it into place, so a reader never sees one half written (a reference.py run
    // once failed reading a file another test was rewriting).
    static COPIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let copy = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = path.with_extension(format!("gguf.partial-{copy}"));
    let mut out = std::fs::File::create(&partial).unwrap();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    drop(out);
    std::fs::rename(&partial, path).unwrap();
}

/// A random rank-4 PEFT adapter on q, k, v, o and down for a tiny family model, in `dir`.
/// With `fused`, on Phi-3's modules instead: qkv_proj, o_proj and gate_up_proj.
pub fn write_adapter(name: &str, head_dim: usize, fused: bool) -> PathBuf {
    write_adapter_for(name, head_dim, fused, 2)
}

/// [`write_adapter`] for a model of `layers` blocks.
pub fn write_adapter_for(name: &str, head_dim: usize, fused: bool, layers: usize) -> PathBuf {
    let (d, ffn, q_dim, kv_dim) = (64, 128, 4 * head_dim, 2 * head_dim);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99 + head_dim as u64);
    let modules: &[(&str, &str, usize, usize)] = if fused {
        &[
            ("qkv_proj", "self_attn", d, q_dim + 2 * kv_dim),
            ("o_proj", "self_attn", q_dim, d),
            ("gate_up_proj", "mlp", d, 2 * ffn),
        ]
    } else {
        &[
            ("q_proj", "self_attn", d, q_dim),
            ("k_proj", "self_attn", d, kv_dim),
            ("v_proj", "self_attn", d, kv_dim),
            ("o_proj", "self_attn", q_dim, d),
            ("down_proj", "mlp", ffn, d),
        ]
    };
    let weights = super::tiny::lora_safetensors(&mut rng, layers, modules);
    let out = dir().join(name);
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("adapter_model.safetensors"), weights).unwrap();
    let targets: Vec<&str> = modules.iter().map(|m| m.0).collect();
    let config = serde_json::json!({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": false, "use_dora": false,
        "target_modules": targets, "bias": "none",
    });
    std::fs::write(out.join("adapter_config.json"), config.to_string()).unwrap();
    out
}
