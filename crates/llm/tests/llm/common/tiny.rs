//! A tiny random-weight llama (2 layers, d = 64), written by the tests as a GGUF file with
//! SmolLM2's tokenizer, and a random LoRA adapter for it: for tests of the engine's mechanics
//! (cancellation, the KV budget, queues, bad requests), which need a model but not language,
//! and then run in milliseconds per step however busy the machine is.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use modelmux_llm::{GgufFile, LlamaModel, LlamaWeights, LoraAdapter, TextTokenizer, WeightFormat};
use rand::{Rng, SeedableRng};

const D: usize = 64;
const FFN: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const CONTEXT: usize = 512;

pub fn random(rng: &mut rand_chacha::ChaCha8Rng, shape: &[usize], scale: f32) -> QTensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    let t = Tensor::from_vec(data, shape, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

pub fn ones(n: usize) -> QTensor {
    let t = Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

/// The `tokenizer.*` metadata of the GGUF file at `from`: what a test model needs to carry
/// SmolLM2's tokenizer.
pub fn tokenizer_metadata(from: &Path) -> Vec<(String, Value)> {
    let mut source = std::fs::File::open(from).unwrap();
    let content = Content::read(&mut source).unwrap();
    content
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect()
}

/// Writes the tiny model to `path`, with the tokenizer of the GGUF file at `tokenizer_from`.
fn write(path: &Path, tokenizer_from: &Path) {
    write_with(path, tokenizer_from, Vec::new(), Vec::new());
}

/// The number of rotary frequencies of the tiny model (half its head size).
pub const ROTARY_PAIRS: usize = D / HEADS / 2;

/// Writes the tiny model to `path` with `metadata` and `tensors` added (a tensor or key of the
/// same name replaced).
pub fn write_with(
    path: &Path,
    tokenizer_from: &Path,
    extra_metadata: Vec<(String, Value)>,
    extra_tensors: Vec<(String, QTensor)>,
) {
    let mut metadata = tokenizer_metadata(tokenizer_from);
    let vocab = match &metadata
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .expect("the tokenizer's tokens")
        .1
    {
        Value::Array(tokens) => tokens.len(),
        other => panic!("tokens: {other:?}"),
    };
    let u32v = |v: usize| Value::U32(v as u32);
    for (k, v) in [
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny-random-llama".into())),
        ("llama.block_count", u32v(LAYERS)),
        ("llama.context_length", u32v(CONTEXT)),
        ("llama.embedding_length", u32v(D)),
        ("llama.feed_forward_length", u32v(FFN)),
        ("llama.attention.head_count", u32v(HEADS)),
        ("llama.attention.head_count_kv", u32v(KV_HEADS)),
        ("llama.rope.dimension_count", u32v(D / HEADS)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", u32v(vocab)),
    ] {
        metadata.push((k.to_owned(), v));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let kv = D / HEADS * KV_HEADS;
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            random(&mut rng, &[vocab, D], 1.0),
        ),
        ("output_norm.weight".into(), ones(D)),
    ];
    for l in 0..LAYERS {
        let p = |n: &str| format!("blk.{l}.{n}");
        tensors.push((p("attn_norm.weight"), ones(D)));
        tensors.push((p("ffn_norm.weight"), ones(D)));
        tensors.push((p("attn_q.weight"), random(&mut rng, &[D, D], 0.2)));
        tensors.push((p("attn_k.weight"), random(&mut rng, &[kv, D], 0.2)));
        tensors.push((p("attn_v.weight"), random(&mut rng, &[kv, D], 0.2)));
        tensors.push((p("attn_output.weight"), random(&mut rng, &[D, D], 0.2)));
        tensors.push((p("ffn_gate.weight"), random(&mut rng, &[FFN, D], 0.2)));
        tensors.push((p("ffn_up.weight"), random(&mut rng, &[FFN, D], 0.2)));
        tensors.push((p("ffn_down.weight"), random(&mut rng, &[D, FFN], 0.2)));
    }
    for (k, v) in extra_metadata {
        metadata.retain(|(key, _)| *key != k);
        metadata.push((k, v));
    }
    for (k, t) in extra_tensors {
        tensors.retain(|(key, _)| *key != k);
        tensors.push((k, t));
    }
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
}

/// A random rank-4 PEFT adapter on q, v and down for the tiny model.
/// A fresh random adapter for `model`, owned by its caller alone (so a test can count its
/// references while other tests run).
pub fn adapter(model: &LlamaModel) -> LoraAdapter {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let kv = D / HEADS * KV_HEADS;
    let weights = lora_safetensors(
        &mut rng,
        LAYERS,
        &[
            ("q_proj", "self_attn", D, D),
            ("v_proj", "self_attn", D, kv),
            ("down_proj", "mlp", FFN, D),
        ],
    );
    let config = serde_json::json!({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": false, "use_dora": false,
        "target_modules": ["q_proj", "v_proj", "down_proj"], "bias": "none",
        "modules_to_save": null, "rank_pattern": {}, "alpha_pattern": {},
    });
    LoraAdapter::from_peft(
        "tiny-adapter",
        config.to_string().as_bytes(),
        &weights,
        model.config(),
    )
    .unwrap()
}

/// A PEFT adapter's `adapter_model.safetensors`: rank-4 A and B in ±0.3 (f32) for each
/// `(module, parent, in, out)` of `modules` in each of `layers` blocks.
pub fn lora_safetensors(
    rng: &mut rand_chacha::ChaCha8Rng,
    layers: usize,
    modules: &[(&str, &str, usize, usize)],
) -> Vec<u8> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for l in 0..layers {
        for &(module, parent, inp, out) in modules {
            for (ab, shape) in [("A", [4, inp]), ("B", [out, 4])] {
                let data: Vec<u8> = (0..shape[0] * shape[1])
                    .flat_map(|_| rng.random_range(-0.3f32..0.3).to_le_bytes())
                    .collect();
                let key =
                    format!("base_model.model.model.layers.{l}.{parent}.{module}.lora_{ab}.weight");
                tensors.push((key, shape.to_vec(), data));
            }
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(k, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (k.clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// The tiny model (shared by the tests of one binary), its tokenizer and an adapter for it.
pub struct Tiny {
    pub model: Arc<LlamaModel>,
    pub tokenizer: Arc<TextTokenizer>,
    pub adapter: Arc<LoraAdapter>,
    pub path: PathBuf,
}

pub fn tiny() -> &'static Tiny {
    static TINY: OnceLock<Tiny> = OnceLock::new();
    TINY.get_or_init(|| {
        let dir = super::scratch("modelmux-tiny-llama");
        let path = dir.join("tiny.gguf");
        write(&path, &super::env_path("MODELMUX_TEST_GGUF"));
        let tokenizer = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let weights = LlamaWeights::load(&path, WeightFormat::default()).unwrap();
        let model = LlamaModel::new(weights, CONTEXT);
        let adapter = Arc::new(adapter(&model));
        Tiny {
            model: Arc::new(model),
            tokenizer: Arc::new(tokenizer),
            adapter,
            path,
        }
    })
}
