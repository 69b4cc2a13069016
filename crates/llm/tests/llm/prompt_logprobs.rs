//! Prompt log probabilities (`echo` with `logprobs` on completions): each prompt token's log
//! probability given the tokens before it, computed over a prompt prefilled in chunks, equals
//! the numpy reference's (`scripts/llm/reference.py --prompt-logprobs`, the log-softmax of its
//! logits at every position). On the tiny random llama with f32 weights.

use crate::common;

use std::sync::Arc;

use common::reference_py;
use common::tiny::tiny;
use modelmux_llm::{
    Engine, EngineConfig, GenerationEvent, GenerationRequest, LlamaModel, LlamaWeights,
    SamplingParams, WeightFormat,
};
use serde_json::Value;

fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| 100 + (i * 53) % 4000).collect()
}

fn reference(top: usize) -> Vec<Value> {
    let top = top.to_string();
    let doc = reference_py(
        &tiny().path,
        &prompt(),
        &[
            std::ffi::OsStr::new("--prompt-logprobs"),
            std::ffi::OsStr::new(&top),
        ],
    );
    doc["prompt_logprobs"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_over_chunked_prefill_equal_the_reference() {
    const TOP: usize = 3;
    let t = tiny();
    let weights = LlamaWeights::load(&t.path, WeightFormat::F32).unwrap();
    let model = Arc::new(LlamaModel::new(weights, 512));
    // 8 rows a step: the 40-token prompt is prefilled in 5 chunks.
    let engine = Engine::start(
        model,
        t.tokenizer.clone(),
        EngineConfig {
            max_model_len: 512,
            max_batch_tokens: 8,
            max_num_seqs: 4,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut stream = engine
        .submit(GenerationRequest {
            prompt: prompt(),
            params: SamplingParams {
                prompt_logprobs: Some(TOP),
                ..SamplingParams::greedy(2)
            },
            adapter: None,
            constraint: None,
        })
        .unwrap();
    let Some(GenerationEvent::Token {
        prompt_logprobs: Some(got),
        ..
    }) = stream.next().await
    else {
        panic!("no prompt log probabilities with the first token")
    };
    // Later tokens carry none.
    if let Some(GenerationEvent::Token {
        prompt_logprobs, ..
    }) = stream.next().await
    {
        assert!(prompt_logprobs.is_none());
    }
    let want = reference(TOP);
    assert_eq!(got.len(), prompt().len() - 1);
    assert_eq!(want.len(), got.len());
    const BOUND: f64 = 1e-3;
    for (t, (g, w)) in got.iter().zip(&want).enumerate() {
        let lp = w["logprob"].as_f64().unwrap();
        assert!(
            (g.logprob as f64 - lp).abs() < BOUND,
            "position {}: {} vs {lp}",
            t + 1,
            g.logprob
        );
        let top: Vec<(u32, f64)> = w["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap()))
            .collect();
        assert_eq!(g.top.len(), TOP);
        for (k, ((gid, glp), (wid, wlp))) in g.top.iter().zip(&top).enumerate() {
            assert!(
                (*glp as f64 - wlp).abs() < BOUND,
                "position {} rank {k}",
                t + 1
            );
            // The same tokens but for near-ties within the bound.
            assert!(
                gid == wid || (glp - *wlp as f32).abs() < 2e-3,
                "position {} rank {k}",
                t + 1
            );
        }
    }
}
