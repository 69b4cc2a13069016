//! The trainer computes what the engine serves: on the tiny random llama the llm tests write,
//! the trainer's logits (candle, f32) equal the engine's (f32 weights) for every position,
//! without an adapter and with a saved PEFT adapter on all seven projections (which checks
//! the q/k row order, the scale and the file format); and training lowers the loss.

#[allow(missing_docs)]
#[path = "../../llm/tests/llm/common/mod.rs"]
mod common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use modelmux_llm::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterPrecision, KvCache, LlamaModel, LlamaWeights,
    LoraAdapter, Segment, WeightFormat,
};
use modelmux_lora_train::data::{Example, batch};
use modelmux_lora_train::lora::{LoraSet, LoraShape, Target};
use modelmux_lora_train::model::BaseModel;
use modelmux_lora_train::train::{TrainOptions, loss, train};
use rand::{Rng, SeedableRng};

/// The tiny model's file, written once per test binary.
fn tiny_path() -> PathBuf {
    common::tiny::tiny().path.clone()
}

const TOKENS: [u32; 12] = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198];

/// The engine's logits after every token of `TOKENS`, f32 weights.
fn engine_logits(adapter: Option<&LoraAdapter>) -> Vec<Vec<f32>> {
    let weights = LlamaWeights::load(tiny_path(), WeightFormat::F32).unwrap();
    let model = LlamaModel::new(weights, 64);
    let mut cache = KvCache::new(model.config(), model.kv_dtype(), TOKENS.len(), None);
    let flat = model
        .forward(&mut [Segment {
            tokens: &TOKENS,
            cache: &mut cache,
            adapter,
            want_logits: true,
            all_logits: true,
        }])
        .unwrap()
        .remove(0)
        .unwrap();
    let vocab = model.config().vocab_size;
    flat.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// The trainer's logits after every token of `TOKENS`.
fn trainer_logits(model: &BaseModel, lora: &LoraSet) -> Vec<Vec<f32>> {
    let ids = Tensor::from_vec(TOKENS.to_vec(), (1, TOKENS.len()), &Device::Cpu).unwrap();
    let hidden = model.hidden(&ids, lora).unwrap();
    let d = model.config().d_model;
    let logits = model
        .logits(&hidden.reshape((TOKENS.len(), d)).unwrap())
        .unwrap();
    logits.to_vec2().unwrap()
}

fn max_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Adapters on every projection with random B (a fresh set starts at B = 0, a no-op).
fn random_adapters(model: &BaseModel) -> LoraSet {
    let shape = LoraShape {
        rank: 4,
        alpha: 8.0,
        targets: Target::ALL.to_vec(),
    };
    let lora = LoraSet::new(shape, model.config(), 3).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for var in lora.vars() {
        let dims = var.as_tensor().dims().to_vec();
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| rng.random_range(-0.3..0.3)).collect();
        var.set(&Tensor::from_vec(data, dims, &Device::Cpu).unwrap())
            .unwrap();
    }
    lora
}

#[test]
fn the_trainers_logits_equal_the_engines_with_and_without_a_saved_adapter() {
    let model = BaseModel::load(&tiny_path()).unwrap();
    let base = max_difference(
        &trainer_logits(&model, &LoraSet::none()),
        &engine_logits(None),
    );
    assert!(base < 1e-3, "base model: max |trainer - engine| = {base}");

    let lora = random_adapters(&model);
    let dir = tempfile::tempdir().unwrap();
    lora.save_peft(
        dir.path(),
        model.config(),
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    .unwrap();
    // f32 weights, so the adapter's matrices f32 as well (as the runtime stores them then).
    let adapter = LoraAdapter::from_peft_in(
        "trained",
        &std::fs::read(dir.path().join(ADAPTER_CONFIG_FILE)).unwrap(),
        &std::fs::read(dir.path().join(ADAPTER_WEIGHTS_FILE)).unwrap(),
        model.config(),
        AdapterPrecision::Exact,
    )
    .unwrap();
    // The file holds f16: the trainer computes with A and B rounded the same way.
    for var in lora.vars() {
        let rounded = var.as_tensor().to_dtype(DType::F16).unwrap();
        var.set(&rounded.to_dtype(DType::F32).unwrap()).unwrap();
    }
    let trained = trainer_logits(&model, &lora);
    let served = engine_logits(Some(&adapter));
    let moved = max_difference(&trained, &engine_logits(None));
    let adapted = max_difference(&trained, &served);
    assert!(
        adapted < 1e-3 && moved > 1000.0 * adapted,
        "adapted: max |trainer - engine| = {adapted}; the adapter moves the logits by {moved}"
    );
}

#[test]
fn training_lowers_the_loss_on_a_repeated_answer() {
    let model = BaseModel::load(&tiny_path()).unwrap();
    let shape = LoraShape {
        rank: 4,
        alpha: 8.0,
        targets: vec![Target::Q, Target::V, Target::Down],
    };
    let lora = LoraSet::new(shape, model.config(), 1).unwrap();
    let examples: Vec<Example> = (0..4)
        .map(|i| Example {
            prompt: TOKENS[..4 + i].to_vec(),
            answer: vec![4649, 47, 2],
        })
        .collect();
    let refs: Vec<&Example> = examples.iter().collect();
    let before = loss(&model, &lora, &batch(&refs).unwrap())
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let options = TrainOptions {
        steps: 30,
        batch_size: 4,
        learning_rate: 1e-2,
        warmup: 3,
        seed: 1,
    };
    let losses = train(&model, &lora, &examples, &options, &mut std::io::sink()).unwrap();
    assert!(
        (losses[0] - before).abs() < 1e-4,
        "{} vs {before}",
        losses[0]
    );
    let last = *losses.last().unwrap();
    assert!(
        last < 0.2 * before,
        "the loss went from {before} to {last} in 30 steps: {losses:?}"
    );
}
