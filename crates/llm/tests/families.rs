//! What a GGUF file may ask of the engine: Llama 3's RoPE scaling (`rope_freqs.weight`)
//! against the numpy reference computing it from the published definition, and what the
//! engine refuses rather than run wrongly (tensors it would not read, metadata that changes
//! the computation). On the tiny random-weight llama, with f32 weights.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::env_path;
use common::tiny::{ROTARY_PAIRS, write_with};
use modelmux_llm::{KvCache, LlamaModel, LlamaWeights, Segment, WeightFormat};

/// Llama 3.1's rope_scaling with a short original context, so that the tiny model's eight
/// frequencies fall in all three bands (kept, interpolated, divided by the factor).
const FACTOR: f64 = 8.0;
const LOW_FREQ_FACTOR: f64 = 1.0;
const HIGH_FREQ_FACTOR: f64 = 4.0;
const ORIGINAL_CONTEXT: f64 = 64.0;
const BASE: f64 = 10_000.0;

/// The factors as llama.cpp's converter (`convert_hf_to_gguf.py`, LlamaModel) writes them
/// into `rope_freqs.weight` for rope_type "llama3".
fn llama3_rope_factors() -> Vec<f32> {
    let dim = (2 * ROTARY_PAIRS) as f64;
    let low_wavelen = ORIGINAL_CONTEXT / LOW_FREQ_FACTOR;
    let high_wavelen = ORIGINAL_CONTEXT / HIGH_FREQ_FACTOR;
    (0..ROTARY_PAIRS)
        .map(|i| {
            let freq = 1.0 / BASE.powf(2.0 * i as f64 / dim);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let factor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                FACTOR
            } else {
                let smooth = (ORIGINAL_CONTEXT / wavelen - LOW_FREQ_FACTOR)
                    / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR);
                1.0 / ((1.0 - smooth) / FACTOR + smooth)
            };
            factor as f32
        })
        .collect()
}

fn f32_tensor(values: Vec<f32>) -> QTensor {
    let n = values.len();
    let t = Tensor::from_vec(values, n, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("modelmux-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(name: &str, metadata: Vec<(String, Value)>, tensors: Vec<(String, QTensor)>) -> PathBuf {
    let path = dir().join(name);
    write_with(&path, &env_path("MODELMUX_TEST_GGUF"), metadata, tensors);
    path
}

/// A prompt long enough that the slow frequencies turn measurably.
fn prompt() -> Vec<u32> {
    (0..96u32).map(|i| 200 + (i * 37) % 3000).collect()
}

fn engine_logits(path: &Path) -> Vec<f32> {
    let weights = LlamaWeights::load(path, WeightFormat::F32).unwrap();
    let model = LlamaModel::new(weights, 256);
    let tokens = prompt();
    let mut cache = KvCache::new(model.config(), tokens.len(), None);
    let mut logits = model
        .forward(&mut [Segment {
            tokens: &tokens,
            cache: &mut cache,
            adapter: None,
            want_logits: true,
        }])
        .unwrap();
    logits.pop().flatten().unwrap()
}

/// The numpy reference's logits for `path` (`scripts/llm/reference.py`), with Llama 3's
/// scaling computed from its definition when `llama3`.
fn reference_logits(path: &Path, llama3: bool) -> Vec<f32> {
    let out = dir().join(format!(
        "{}-{llama3}.json",
        path.file_stem().unwrap().to_string_lossy()
    ));
    let ids: Vec<String> = prompt().iter().map(u32::to_string).collect();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/llm/reference.py"
    );
    let mut command = std::process::Command::new(env_path("MODELMUX_TEST_PYTHON"));
    command
        .arg(script)
        .arg("--gguf")
        .arg(path)
        .arg("--prompt-ids")
        .arg(ids.join(","))
        .arg("--out")
        .arg(&out);
    if llama3 {
        command.arg("--llama3").arg(format!(
            "{FACTOR},{LOW_FREQ_FACTOR},{HIGH_FREQ_FACTOR},{ORIGINAL_CONTEXT}"
        ));
    }
    let status = command.status().unwrap();
    assert!(status.success(), "reference.py failed");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    doc["last_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn llama3_rope_scaling_matches_the_published_definition() {
    let factors = llama3_rope_factors();
    // The three bands are all there: kept, interpolated and divided.
    assert_eq!(factors[0], 1.0);
    assert_eq!(*factors.last().unwrap(), FACTOR as f32);
    assert!(
        factors.iter().any(|&f| f > 1.0 && f < FACTOR as f32),
        "{factors:?}"
    );

    let plain = write("plain.gguf", Vec::new(), Vec::new());
    let scaled = write(
        "llama3.gguf",
        Vec::new(),
        vec![("rope_freqs.weight".into(), f32_tensor(factors))],
    );
    let want = reference_logits(&plain, true);
    let got = engine_logits(&scaled);
    let error = max_difference(&got, &want);
    // f32 throughout on both sides; the logits are of order 1 to 10.
    const BOUND: f32 = 2e-3;
    assert!(error < BOUND, "max |engine - reference| = {error}");
    // An engine that ignored the factors would be far outside the bound.
    let unscaled = reference_logits(&plain, false);
    let ignored = max_difference(&unscaled, &want);
    eprintln!("max |engine - reference| {error:.2e}; scaled vs unscaled reference {ignored:.3}");
    assert!(
        ignored > 20.0 * BOUND,
        "the scaling changes the logits by only {ignored}: the test would not notice it ignored"
    );
    assert!(max_difference(&engine_logits(&plain), &unscaled) < BOUND);
}

fn load_error(path: &Path) -> String {
    match LlamaWeights::load(path, WeightFormat::F32) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tensors_the_engine_would_not_read_are_refused_by_name() {
    let path = write(
        "bias.gguf",
        Vec::new(),
        vec![(
            "blk.0.attn_q.bias".into(),
            f32_tensor(vec![0.5; 2 * ROTARY_PAIRS * 4]),
        )],
    );
    let err = load_error(&path);
    assert!(err.contains("blk.0.attn_q.bias"), "{err}");
    assert!(err.contains("does not use"), "{err}");
    let bad = write(
        "bad-factors.gguf",
        Vec::new(),
        vec![(
            "rope_freqs.weight".into(),
            f32_tensor(vec![0.0; ROTARY_PAIRS]),
        )],
    );
    assert!(load_error(&bad).contains("rope_freqs.weight"));
}

#[test]
fn metadata_that_changes_the_computation_is_refused_by_name() {
    for (key, value, says) in [
        (
            "llama.attn_logit_softcapping",
            Value::F32(50.0),
            "llama.attn_logit_softcapping",
        ),
        (
            "llama.attention.sliding_window",
            Value::U32(32),
            "llama.attention.sliding_window",
        ),
        ("llama.attention.key_length", Value::U32(32), "head size"),
        (
            "llama.rope.scaling.type",
            Value::String("yarn".into()),
            "yarn",
        ),
    ] {
        let name = format!("{}.gguf", key.replace('.', "-"));
        let path = write(&name, vec![(key.into(), value)], Vec::new());
        let err = load_error(&path);
        assert!(err.contains(says), "{key}: {err}");
    }
    // Keys that restate the shape are fine when they agree with it.
    let agreeing = write(
        "key-length.gguf",
        vec![(
            "llama.attention.key_length".into(),
            Value::U32((2 * ROTARY_PAIRS) as u32),
        )],
        Vec::new(),
    );
    LlamaWeights::load(&agreeing, WeightFormat::F32).unwrap();
}
