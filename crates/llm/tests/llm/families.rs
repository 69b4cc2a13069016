//! Each model family the engine runs, on a tiny random-weight GGUF of that family written
//! here, against the numpy reference (`scripts/llm/reference.py`, written from each family's
//! published definition), with and without a PEFT adapter; Llama 3's RoPE scaling
//! (`rope_freqs.weight`) against the reference computing it from Hugging Face's definition;
//! and what the engine refuses rather than run wrongly (tensors it would not read, metadata
//! that changes the computation). f32 weights throughout.

use crate::common;

use std::path::{Path, PathBuf};

use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::Value;
use common::family_files::{
    Spec, dir, f32_tensor, write_adapter, write_adapter_for, write_family, write_family_file,
    write_spec,
};
use common::tiny::{ROTARY_PAIRS, write_with};
use common::{env_path, last_logits_of, reference_py};
use modelmux_llm::{
    AdapterPrecision, KvCache, LlamaModel, LlamaWeights, LoraAdapter, Segment, WeightFormat,
};

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
    engine_logits_with(path, None)
}

/// The engine's logits for the prompt, with the PEFT adapter in `adapter` (a directory).
fn engine_logits_with(path: &Path, adapter: Option<&Path>) -> Vec<f32> {
    let weights = LlamaWeights::load(path, WeightFormat::F32).unwrap();
    let model = LlamaModel::new(weights, 256);
    let adapter = adapter.map(|dir| {
        LoraAdapter::from_peft_in(
            "family-adapter",
            &std::fs::read(dir.join("adapter_config.json")).unwrap(),
            &std::fs::read(dir.join("adapter_model.safetensors")).unwrap(),
            model.config(),
            AdapterPrecision::Exact,
        )
        .unwrap()
    });
    let tokens = prompt();
    let mut cache = KvCache::new(model.config(), model.kv_dtype(), tokens.len(), None);
    let mut logits = model
        .forward(&mut [Segment {
            tokens: &tokens,
            cache: &mut cache,
            adapter: adapter.as_ref(),
            want_logits: true,
            all_logits: false,
        }])
        .unwrap();
    logits.pop().flatten().unwrap()
}

/// The numpy reference's logits for `path` (`scripts/llm/reference.py`), with Llama 3's
/// scaling computed from its definition when `llama3`.
fn reference_logits(path: &Path, llama3: bool) -> Vec<f32> {
    reference_logits_with(path, llama3, None)
}

fn reference_logits_with(path: &Path, llama3: bool, adapter: Option<&Path>) -> Vec<f32> {
    let scaling = format!("{FACTOR},{LOW_FREQ_FACTOR},{HIGH_FREQ_FACTOR},{ORIGINAL_CONTEXT}");
    let mut extra: Vec<&std::ffi::OsStr> = Vec::new();
    if let Some(dir) = adapter {
        extra.push(std::ffi::OsStr::new("--adapter"));
        extra.push(dir.as_os_str());
    }
    if llama3 {
        extra.push(std::ffi::OsStr::new("--llama3"));
        extra.push(std::ffi::OsStr::new(&scaling));
    }
    last_logits_of(&reference_py(path, &prompt(), &extra))
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
        // A head size the tensors do not have.
        ("llama.attention.key_length", Value::U32(32), "head size 32"),
        ("llama.attention.value_length", Value::U32(8), "value heads"),
        (
            "llama.rope.scaling.type",
            Value::String("longrope".into()),
            "longrope",
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

/// Engine against reference for one family, base and adapted.
fn check_family(arch: &str, head_dim: usize, bias: bool, qk_norm: bool) {
    check_family_fused(arch, head_dim, bias, qk_norm, false);
}

fn check_family_fused(arch: &str, head_dim: usize, bias: bool, qk_norm: bool, fused: bool) {
    check_spec(&Spec {
        bias,
        qk_norm,
        fused,
        ..Spec::new(arch, head_dim)
    });
}

/// Engine against reference for the model `spec` describes, base and adapted; returns the
/// base model's file.
fn check_spec(spec: &Spec<'_>) -> PathBuf {
    const BOUND: f32 = 2e-3;
    let (arch, head_dim) = (spec.arch, spec.head_dim);
    let path = write_spec(spec);
    let adapter = write_adapter_for(
        &format!("{arch}-{head_dim}-{}-adapter", spec.layers),
        head_dim,
        spec.fused,
        spec.layers,
    );
    let base_want = reference_logits(&path, false);
    let base_got = engine_logits(&path);
    let adapted_want = reference_logits_with(&path, false, Some(&adapter));
    let adapted_got = engine_logits_with(&path, Some(&adapter));
    let (base_error, adapted_error) = (
        max_difference(&base_got, &base_want),
        max_difference(&adapted_got, &adapted_want),
    );
    let adapter_effect = max_difference(&base_want, &adapted_want);
    eprintln!(
        "{arch} (head {head_dim}): base {base_error:.2e}, adapted {adapted_error:.2e}, adapter moves logits by {adapter_effect:.3}"
    );
    assert!(
        base_error < BOUND,
        "{arch}: base max |engine - reference| = {base_error}"
    );
    assert!(
        adapted_error < BOUND,
        "{arch}: adapted max |engine - reference| = {adapted_error}"
    );
    assert!(
        adapter_effect > 20.0 * BOUND,
        "{arch}: the adapter changes too little to tell"
    );
    path
}

/// Gemma 2: GELU gating, post-norms, scaled embeddings, soft-capped scores and logits, and
/// a sliding window (layer 0 of 2) shorter than the prompt; caps small enough to bend.
#[test]
fn gemma2_with_soft_caps_and_a_sliding_window_matches_the_reference() {
    let spec = Spec {
        gemma: true,
        keys: vec![
            ("attn_logit_softcapping", Value::F32(0.5)),
            ("final_logit_softcapping", Value::F32(3.0)),
            ("attention.sliding_window", Value::U32(8)),
        ],
        ..Spec::new("gemma2", 16)
    };
    let path = check_spec(&spec);
    let logits = engine_logits(&path);
    assert!(logits.iter().all(|l| l.abs() < 3.0), "final soft cap");
    // Each of these changes the answer: an engine that ignored one would fail above.
    for (name, key) in [
        ("no attention cap", "attn_logit_softcapping"),
        ("no window", "attention.sliding_window"),
    ] {
        let without = Spec {
            keys: spec
                .keys
                .iter()
                .filter(|(k, _)| *k != key)
                .cloned()
                .collect(),
            gemma: true,
            ..Spec::new("gemma2", 16)
        };
        let changed = max_difference(&reference_logits(&write_spec(&without), false), &logits);
        eprintln!("gemma2 {name}: logits move by {changed:.3}");
        assert!(changed > 0.04, "{name}: moves the logits by only {changed}");
    }
}

/// Gemma 3: q/k norms, heads of 256 (q wider than d_model), six layers of which the sixth
/// is global (the default pattern) with linear RoPE scaling and base 10^6, the others local
/// at base 10 000 with a window of 8.
#[test]
fn gemma3_with_local_and_global_layers_matches_the_reference() {
    check_spec(&Spec {
        gemma: true,
        qk_norm: true,
        layers: 6,
        keys: vec![
            ("attention.sliding_window", Value::U32(8)),
            ("rope.freq_base", Value::F32(1_000_000.0)),
            ("rope.scaling.type", Value::String("linear".into())),
            ("rope.scaling.factor", Value::F32(8.0)),
        ],
        ..Spec::new("gemma3", 256)
    });
    // A pattern from the file: every other layer global.
    check_spec(&Spec {
        gemma: true,
        qk_norm: true,
        keys: vec![
            ("attention.sliding_window", Value::U32(8)),
            ("attention.sliding_window_pattern", Value::U32(2)),
            ("final_logit_softcapping", Value::F32(4.0)),
        ],
        ..Spec::new("gemma3", 32)
    });
}

/// Mistral 3 as llama.cpp writes it is computed as Llama (q/k rows permuted by the
/// converter, interleaved rotary).
#[test]
fn mistral3_without_yarn_is_computed_as_llama() {
    check_family("mistral3", 16, false, false);
}

/// Ministral 3 as converted: YaRN (factor 4 over an original context of 32, so that the
/// prompt of 96 crosses it and every band of the ramp is used) with `yarn_log_multiplier`,
/// and Llama 4's attention temperature, whose factor steps at positions 32 and 64.
#[test]
fn mistral3_with_yarn_and_attention_temperature_matches_the_reference() {
    let yarn = |extra: Vec<(&'static str, Value)>| {
        let mut keys = vec![
            ("rope.scaling.type", Value::String("yarn".into())),
            ("rope.scaling.factor", Value::F32(4.0)),
            ("rope.scaling.original_context_length", Value::U32(32)),
            ("rope.scaling.yarn_beta_fast", Value::F32(32.0)),
            ("rope.scaling.yarn_beta_slow", Value::F32(1.0)),
        ];
        keys.extend(extra);
        Spec {
            keys,
            ..Spec::new("mistral3", 16)
        }
    };
    let plain = check_spec(&yarn(Vec::new()));
    let tempered = check_spec(&yarn(vec![
        ("rope.scaling.yarn_log_multiplier", Value::F32(0.5)),
        ("attention.temperature_scale", Value::F32(0.5)),
    ]));
    let unscaled = reference_logits(&write_family("mistral3", 16, false, false, false), false);
    let moved = max_difference(&reference_logits(&plain, false), &unscaled);
    let tempered_moved = max_difference(
        &reference_logits(&tempered, false),
        &reference_logits(&plain, false),
    );
    eprintln!(
        "yarn moves the logits by {moved:.3}; the temperature and log multiplier by {tempered_moved:.3}"
    );
    assert!(moved > 0.04 && tempered_moved > 0.04);
    // Not implemented: refused by name.
    let longrope = write_spec(&Spec {
        keys: vec![("rope.scaling.type", Value::String("longrope".into()))],
        ..Spec::new("mistral3", 16)
    });
    assert!(load_error(&longrope).contains("longrope"));
}

#[test]
fn qwen2_with_qkv_biases_matches_the_reference() {
    check_family("qwen2", 16, true, false);
}

#[test]
fn qwen3_with_qk_norms_and_wider_heads_matches_the_reference() {
    // Heads of 32 with d_model 64 and 4 heads: q has 128 rows, more than d_model (as Qwen3's).
    check_family("qwen3", 32, false, true);
}

#[test]
fn phi3_with_fused_projections_and_a_fused_adapter_matches_the_reference() {
    check_family_fused("phi3", 16, false, false, true);
}

#[test]
fn llama_with_an_adapter_on_every_attention_projection_matches_the_reference() {
    check_family("llama", 16, false, false);
}

#[test]
fn a_family_the_engine_does_not_run_is_refused_by_name() {
    let path = dir().join("gemma9.gguf");
    write_family_file(
        &path,
        "gemma9",
        vec![(
            "general.architecture".to_owned(),
            Value::String("gemma9".into()),
        )],
        vec![("token_embd.weight".into(), f32_tensor(vec![0.0; 64]))],
    );
    let err = load_error(&path);
    assert!(
        err.contains("'gemma9' is not supported") && err.contains("qwen3"),
        "{err}"
    );
}

/// An adapter whose `base_model_name_or_path` names another family is refused even when its
/// shapes fit (here a "Qwen" adapter on a llama of the same shape); one naming the base's
/// family, or nothing known, loads.
#[test]
fn an_adapter_for_another_family_is_refused_by_its_base_model_name() {
    let path = write_family("llama", 16, false, false, false);
    let dir = write_adapter("llama-adapter-named", 16, false);
    let weights = LlamaWeights::load(&path, WeightFormat::F32).unwrap();
    let config = weights.config().clone();
    let mut peft: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("adapter_config.json")).unwrap()).unwrap();
    let tensors = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let load = |base: &str, peft: &mut serde_json::Value| {
        peft["base_model_name_or_path"] = base.into();
        LoraAdapter::from_peft("named", peft.to_string().as_bytes(), &tensors, &config)
    };
    let Err(err) = load("Qwen/Qwen2.5-0.5B-Instruct", &mut peft) else {
        panic!("a qwen2 adapter loaded on a llama base")
    };
    let message = err.to_string();
    assert!(
        message.contains("Qwen/Qwen2.5-0.5B-Instruct")
            && message.contains("qwen2")
            && message.contains("llama model"),
        "{message}"
    );
    load("HuggingFaceTB/SmolLM2-135M-Instruct", &mut peft).unwrap();
    load("/data/my-own-base", &mut peft).unwrap();
}
