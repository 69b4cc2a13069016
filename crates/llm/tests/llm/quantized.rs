//! The GGUF weight types models ship in, read by the engine exactly as llama.cpp's own
//! dequantization reads them: a tiny random llama (d 256, so K-quant blocks fit) is written
//! with its matrices in each type, and the engine's logits with f32 arithmetic
//! (`WeightFormat::F32`: the weights dequantized once) equal `scripts/llm/reference.py`'s,
//! whose weights are dequantized by the `gguf` package (llama.cpp's Python reference of its
//! formats). A wrong block layout moves the logits by far more than the bound.

use crate::common;

use std::path::PathBuf;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::{env_path, last_logits_of, reference_py};
use modelmux_llm::{KvCache, LlamaModel, LlamaWeights, Segment, WeightFormat};
use rand::{Rng, SeedableRng};

const D: usize = 256;
const FFN: usize = 512;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

fn tensor(
    rng: &mut rand_chacha::ChaCha8Rng,
    shape: &[usize],
    scale: f32,
    dtype: GgmlDType,
) -> QTensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    let t = Tensor::from_vec(data, shape, &Device::Cpu).unwrap();
    QTensor::quantize(&t, dtype).unwrap()
}

/// The tiny llama with every matrix of its blocks in `dtype` (embeddings in Q8_0, norms f32).
fn write(dtype: GgmlDType) -> PathBuf {
    let mut metadata = common::tiny::tokenizer_metadata(&env_path("MODELMUX_TEST_GGUF"));
    let u32v = |v: usize| Value::U32(v as u32);
    for (k, v) in [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", u32v(2)),
        ("llama.context_length", u32v(512)),
        ("llama.embedding_length", u32v(D)),
        ("llama.feed_forward_length", u32v(FFN)),
        ("llama.attention.head_count", u32v(HEADS)),
        ("llama.attention.head_count_kv", u32v(KV_HEADS)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ] {
        metadata.push((k.to_owned(), v));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let kv = D / HEADS * KV_HEADS;
    let vocab = 49152;
    let ones = |n: usize| {
        QTensor::quantize(
            &Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    let mut tensors = vec![
        (
            "token_embd.weight".to_owned(),
            tensor(&mut rng, &[vocab, D], 1.0, GgmlDType::Q8_0),
        ),
        ("output_norm.weight".to_owned(), ones(D)),
    ];
    for l in 0..2 {
        let p = |n: &str| format!("blk.{l}.{n}");
        tensors.push((p("attn_norm.weight"), ones(D)));
        tensors.push((p("ffn_norm.weight"), ones(D)));
        for (name, shape) in [
            ("attn_q.weight", [D, D]),
            ("attn_k.weight", [kv, D]),
            ("attn_v.weight", [kv, D]),
            ("attn_output.weight", [D, D]),
            ("ffn_gate.weight", [FFN, D]),
            ("ffn_up.weight", [FFN, D]),
            ("ffn_down.weight", [D, FFN]),
        ] {
            tensors.push((p(name), tensor(&mut rng, &shape, 0.1, dtype)));
        }
    }
    let dir = common::scratch("modelmux-quantized");
    let path = dir.join(format!("{dtype:?}.gguf"));
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(
        &mut std::fs::File::create(&path).unwrap(),
        &metadata,
        &tensors,
    )
    .unwrap();
    path
}

fn prompt() -> Vec<u32> {
    (0..48u32).map(|i| 300 + (i * 71) % 5000).collect()
}

fn engine_logits(path: &PathBuf, format: WeightFormat) -> Vec<f32> {
    let model = LlamaModel::new(LlamaWeights::load(path, format).unwrap(), 128);
    let tokens = prompt();
    let mut cache = KvCache::new(model.config(), model.kv_dtype(), tokens.len(), None);
    let mut out = model
        .forward(&mut [Segment {
            tokens: &tokens,
            cache: &mut cache,
            adapter: None,
            want_logits: true,
            all_logits: false,
        }])
        .unwrap();
    out.pop().flatten().unwrap()
}

fn reference_logits(path: &std::path::Path) -> Vec<f32> {
    last_logits_of(&reference_py(path, &prompt(), &[]))
}

#[test]
fn every_weight_type_dequantizes_as_llama_cpp_defines_it() {
    let mut failures = Vec::new();
    // The Q8_0 file's weights in memory.
    let mut q8_bytes = None;
    for dtype in [
        GgmlDType::F16,
        GgmlDType::BF16,
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        let path = write(dtype);
        let want = reference_logits(&path);
        let max_diff = |got: Vec<f32>| {
            got.iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        let error = max_diff(engine_logits(&path, WeightFormat::F32));
        // As the engine runs by default: the 4-bit types in the 4-bit kernel's format as
        // stored, the others converted for the int8 kernel.
        let fast = max_diff(engine_logits(&path, WeightFormat::Auto));
        let four_bit = matches!(dtype, GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q4K);
        let kernel = if four_bit { "4-bit" } else { "int8" };
        eprintln!(
            "{dtype:?}: max |engine - reference| {error:.2e} (f32), {fast:.2e} ({kernel} kernel)"
        );
        // f32 arithmetic on identical weights: only the order of the sums differs.
        if error >= 1e-3 {
            failures.push(format!("{dtype:?}: {error}"));
        }
        // The kernels round the activations (and the int8 one the weights again): measured
        // 0.44-0.68 on every type (as on SmolLM2, whose quantized bounds in `reference.rs` are
        // 0.6-2.6); this bounds the kernels' error, the f32 bound above checks the values.
        if fast >= 1.5 {
            failures.push(format!("{dtype:?} on the {kernel} kernel: {fast}"));
        }
        // And that it reached one at all: a type left in f32 under the default format would
        // give the f32 logits (an error near 1e-4), not the kernels' rounding.
        if fast < 0.01 {
            failures.push(format!(
                "{dtype:?}: {fast} from the reference, as in f32: it did not reach the {kernel} kernel"
            ));
        }
        // The 4-bit types stay 4-bit: their matrices (1.18 M weights) take 20 bytes per 32
        // instead of 34, 516 KB less than as Q8_0; the rest of the model is the same.
        let bytes = LlamaWeights::load(&path, WeightFormat::Auto)
            .unwrap()
            .size_bytes();
        if dtype == GgmlDType::Q8_0 {
            q8_bytes = Some(bytes);
        }
        if four_bit {
            let q8 = q8_bytes.expect("Q8_0 runs before the 4-bit types");
            if bytes + 500_000 > q8 {
                failures.push(format!(
                    "{dtype:?} takes {bytes} bytes, Q8_0 {q8}: not 4-bit"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// A file with a tensor in a type the engine has no kernel for (IQ2_XXS, as llama.cpp's
/// imatrix quantizations write) is refused naming the type, not its number.
#[test]
fn a_type_without_a_kernel_is_refused_by_name() {
    let path = write(GgmlDType::Q8_0);
    let mut bytes = std::fs::read(&path).unwrap();
    // The first tensor's info: its name (u64 length + bytes), dimensions (u32 count + u64
    // each), then its type (u32), which becomes 16 (IQ2_XXS).
    let name = b"token_embd.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the tensor's name");
    let dims_at = at + name.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let type_at = dims_at + 4 + 8 * n_dims;
    assert_eq!(
        u32::from_le_bytes(bytes[type_at..type_at + 4].try_into().unwrap()),
        8,
        "Q8_0 where the type should be"
    );
    bytes[type_at..type_at + 4].copy_from_slice(&16u32.to_le_bytes());
    let patched = path.with_file_name("iq2_xxs.gguf");
    std::fs::write(&patched, bytes).unwrap();
    let err = match LlamaWeights::load(&patched, WeightFormat::default()) {
        Ok(_) => panic!("an IQ2_XXS tensor loaded"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("IQ2_XXS") && err.contains("not supported"),
        "{err}"
    );
}
