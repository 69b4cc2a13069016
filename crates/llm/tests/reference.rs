//! The engine against an independent reference: `scripts/llm/reference.py` (numpy, written
//! like Hugging Face's Llama: weights dequantized by the `gguf` package, q/k un-permuted,
//! NeoX rotary, adapters merged into the weights as W + scale * B @ A) computes logits and
//! greedy continuations of fixed prompts; the engine (GGUF layout, interleaved rotary,
//! adapters unmerged and applied per row, weights and activations quantized as it runs them)
//! must agree.
//!
//! Needs `MODELMUX_TEST_GGUF` (SmolLM2-135M-Instruct), `MODELMUX_TEST_ADAPTERS` (the
//! adapters `scripts/llm/make_adapters.py` writes) and `MODELMUX_TEST_LLM_REFERENCE` (the
//! reference's output); `./scripts/test` provides all three. Without them these tests fail.

mod common;

use common::{Reference, runtime};
use modelmux_llm::{AdapterLease, GenerationRequest, KvCache, SamplingParams, Segment};

#[test]
fn base_and_adapter_logits_match_the_reference() {
    let reference = Reference::load();
    let rt = runtime();
    for case in &reference.cases {
        let model = rt.model();
        let adapter = case.adapter.as_ref().map(|id| rt.adapter(id));
        let mut cache = KvCache::new(model.config(), case.prompt_ids.len(), None);
        let logits = model
            .forward(&mut [Segment {
                tokens: &case.prompt_ids,
                cache: &mut cache,
                adapter: adapter.as_deref(),
                want_logits: true,
            }])
            .unwrap()
            .remove(0)
            .unwrap();
        let max_diff = logits
            .iter()
            .zip(&case.last_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let scale = case
            .last_logits
            .iter()
            .map(|v| v.abs())
            .fold(0.0f32, f32::max);
        println!(
            "{}: max |diff| {max_diff:.4} (logits up to {scale:.1})",
            case.name
        );
        assert!(max_diff < 0.5, "{}: max |diff| {max_diff}", case.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_continuations_match_the_reference() {
    let reference = Reference::load();
    let rt = runtime();
    let engine = rt.engine(modelmux_llm::EngineConfig::default());
    for case in &reference.cases {
        let adapter = case
            .adapter
            .as_ref()
            .map(|id| AdapterLease::new(rt.adapter(id)));
        let mut params = SamplingParams::greedy(case.greedy.len());
        params.ignore_eos = true;
        let out = engine
            .submit(GenerationRequest {
                prompt: case.prompt_ids.clone(),
                params,
                adapter,
            })
            .unwrap()
            .collect()
            .await
            .unwrap();
        println!("{}: {:?} vs {:?}", case.name, out.tokens, case.greedy);
        assert_eq!(out.tokens, case.greedy, "{}", case.name);
    }
}

#[test]
fn the_reference_chat_prompt_tokenizes_to_its_ids() {
    let rt = runtime();
    let text =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let ids = rt.tokenizer.encode(text, true).unwrap();
    assert_eq!(ids, Reference::load().cases[0].prompt_ids);
}
