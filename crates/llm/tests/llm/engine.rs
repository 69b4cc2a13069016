//! The engine with SmolLM2: continuous batching that mixes adapters, base rows, prefill
//! chunks and decodes without changing any sequence's tokens; sampling; stops; the KV budget
//! (its first sequence must run for seconds, which the tiny model does not). Every test checks
//! that the KV accounting returns to zero. Replicas over one model share their steps' passes. (Cancellation, queues and bad requests, which need
//! no language, run on a tiny random model in `mechanics.rs`.)

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{runtime, settled};
use modelmux_llm::{
    AdapterLease, Engine, EngineConfig, ErrorKind, FinishReason, Generation, GenerationRequest,
    LlamaModel, LlamaWeights, SamplingParams, WeightFormat,
};

/// "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
const CHAT: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

fn request(prompt: &[u32], params: SamplingParams, adapter: Option<&str>) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        params,
        adapter: adapter.map(|id| AdapterLease::new(runtime().adapter(id))),
        constraint: None,
    }
}

async fn generate(engine: &Engine, request: GenerationRequest) -> Generation {
    engine.submit(request).unwrap().collect().await.unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(n)
    }
}

/// A long prompt so that its prefill takes several steps alongside the others' decodes.
fn long_prompt() -> Vec<u32> {
    runtime()
        .tokenizer
        .encode("The history of the city begins with a small fishing village on the river. Over the centuries, merchants, monks and soldiers came and went, and each left something behind: a bridge, a market square, a cathedral, a wall. Today", false)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_four_adapters_and_the_base_gives_each_sequence_its_solo_tokens() {
    const TOKENS: usize = 12;
    let rt = runtime();
    let long = long_prompt();
    let cases: Vec<(Vec<u32>, Option<&str>)> = vec![
        (CHAT.to_vec(), None),
        (CHAT.to_vec(), Some("pirate")),
        (long.clone(), Some("tutor")),
        (CHAT.to_vec(), Some("poet")),
        (long.clone(), None),
        (CHAT.to_vec(), Some("chef")),
    ];
    let solo_engine = rt.engine(EngineConfig::default());
    let mut solo = Vec::new();
    for (prompt, adapter) in &cases {
        solo.push(
            generate(&solo_engine, request(prompt, greedy(TOKENS), *adapter))
                .await
                .tokens,
        );
    }
    // Small steps: prompts are prefilled in chunks of a few tokens while the others decode.
    const ROWS: usize = 8;
    let engine = rt.engine(EngineConfig {
        max_batch_tokens: ROWS,
        max_num_seqs: 8,
        ..EngineConfig::default()
    });
    // Paused while they are submitted, so they start together: an idle engine starts the
    // first request at once, before the others arrive.
    engine.pause();
    let streams: Vec<_> = cases
        .iter()
        .map(|(prompt, adapter)| {
            engine
                .submit(request(prompt, greedy(TOKENS), *adapter))
                .unwrap()
        })
        .collect();
    engine.resume();
    for (i, stream) in streams.into_iter().enumerate() {
        let out = stream.collect().await.unwrap();
        assert_eq!(out.tokens, solo[i], "sequence {i} ({:?})", cases[i].1);
    }
    settled(&engine).await;
    // Proof that they ran in the same steps, not one after another: a sequence takes part in
    // at least ceil(prompt / ROWS) steps of prefill (the last one gives its first token) and
    // one step per later token, so if no step carried rows of two sequences there would be at
    // least `alone` steps (86 here). A step that carries k sequences saves k - 1 <= 5 of them,
    // so `steps <= alone / 2` means at least alone / 2 / 5 (9) steps carried several
    // sequences. Measured: 37 steps.
    let alone: u64 = cases
        .iter()
        .map(|(prompt, _)| (prompt.len().div_ceil(ROWS) + TOKENS - 1) as u64)
        .sum();
    let steps = engine.snapshot().steps;
    assert!(
        steps <= alone / 2,
        "{steps} steps: one sequence after another takes {alone}, so few or none were shared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_repeats_alone_and_in_a_batch() {
    let engine = runtime().engine(EngineConfig::default());
    let params = |seed| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
        seed: Some(seed),
        max_tokens: 16,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let alone = generate(&engine, request(&CHAT, params(42), None))
        .await
        .tokens;
    let a = engine.submit(request(&CHAT, params(42), None)).unwrap();
    let b = engine
        .submit(request(&CHAT, params(43), Some("pirate")))
        .unwrap();
    let c = engine
        .submit(request(&long_prompt(), params(7), None))
        .unwrap();
    assert_eq!(a.collect().await.unwrap().tokens, alone);
    let other = b.collect().await.unwrap().tokens;
    c.collect().await.unwrap();
    assert_ne!(other, alone);
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_stop_tokens_and_eos_end_a_sequence() {
    let engine = runtime().engine(EngineConfig::default());
    // Greedy answer: "The capital of France is Paris.<|im_end|>"
    let full = generate(&engine, request(&CHAT, SamplingParams::greedy(32), None)).await;
    assert_eq!(full.text, "The capital of France is Paris.");
    assert_eq!(
        full.finish_reason,
        FinishReason::Stop,
        "EOS (<|im_end|>) ends it"
    );
    let stopped = generate(
        &engine,
        request(
            &CHAT,
            SamplingParams {
                stop: vec!["is Par".into()],
                ..SamplingParams::greedy(32)
            },
            None,
        ),
    )
    .await;
    assert_eq!(stopped.text, "The capital of France ");
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    let paris = full.tokens[5];
    let by_token = generate(
        &engine,
        request(
            &CHAT,
            SamplingParams {
                stop_token_ids: vec![paris],
                ..SamplingParams::greedy(32)
            },
            None,
        ),
    )
    .await;
    assert_eq!(by_token.text, "The capital of France is");
    assert_eq!(by_token.usage.completion_tokens, 6);
    let short = generate(&engine, request(&CHAT, SamplingParams::greedy(3), None)).await;
    assert_eq!(
        (short.text.as_str(), short.finish_reason),
        ("The capital of", FinishReason::Length)
    );
    assert_eq!(short.usage.prompt_tokens, CHAT.len());
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_kv_budget_requests_wait_then_are_refused_as_overloaded() {
    let rt = runtime();
    let per_token = rt
        .model()
        .config()
        .kv_bytes_per_token(rt.model().kv_dtype());
    // The budget holds one sequence of max_model_len (an engine refuses to start otherwise).
    let engine = rt.engine(EngineConfig {
        kv_cache_bytes: per_token * 300,
        max_model_len: 300,
        queue_timeout: Duration::from_millis(300),
        ..EngineConfig::default()
    });
    // The first reserves 16 + 250 tokens and runs for seconds; the second does not fit.
    let mut first = engine.submit(request(&CHAT, greedy(250), None)).unwrap();
    first.next().await.unwrap();
    let second = engine.submit(request(&CHAT, greedy(250), None)).unwrap();
    let err = second.collect().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded, "{err}");
    assert!(err.to_string().contains("KV"), "{err}");
    // Once the first is gone, the same request is admitted.
    drop(first);
    generate(&engine, request(&CHAT, greedy(250), None)).await;
    settled(&engine).await;
}

/// Replicas of one model in a process (engines over one `Arc<LlamaModel>`) run their steps as
/// shared forward passes, and each answers exactly what an engine alone answers: the same
/// greedy tokens, for base-model and adapter sequences of both replicas mixed in one pass.
/// (SmolLM2's steps take milliseconds, so neither replica can run its whole work within one
/// time slice before the other starts, as the tiny model's could.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_over_one_model_share_passes_and_answer_as_one_engine_alone() {
    let rt = runtime();
    // A model of this test's own: the shared one also runs the other tests' engines.
    let path = common::env_path("MODELMUX_TEST_GGUF");
    let weights = LlamaWeights::load(&path, WeightFormat::default()).unwrap();
    let model = Arc::new(LlamaModel::new(weights, 2048));
    let adapters = [None, Some("pirate"), None, Some("chef")];
    let requests: Vec<GenerationRequest> = (0..8)
        .map(|i| request(&CHAT[..10 + i % 4], greedy(16), adapters[i % 4]))
        .collect();
    let copy = |r: &GenerationRequest| GenerationRequest {
        prompt: r.prompt.clone(),
        params: r.params.clone(),
        adapter: r.adapter.clone(),
        constraint: None,
    };
    let alone = rt.engine(EngineConfig::default());
    let mut expected = Vec::new();
    for r in &requests {
        expected.push(generate(&alone, copy(r)).await.tokens);
    }

    let replicas = [0, 1].map(|_| {
        Engine::start(model.clone(), rt.tokenizer.clone(), EngineConfig::default()).unwrap()
    });
    let streams: Vec<_> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| replicas[i % 2].submit(copy(r)).unwrap())
        .collect();
    for (i, (stream, expected)) in streams.into_iter().zip(&expected).enumerate() {
        let tokens = stream.collect().await.unwrap().tokens;
        assert_eq!(&tokens, expected, "request {i} on replica {}", i % 2);
    }
    let each: Vec<u64> = replicas.iter().map(|e| e.snapshot().steps).collect();
    let (steps, passes) = (each.iter().sum::<u64>(), model.passes());
    // A pass holds at most one step of each replica, so there are at least as many as either
    // ran; alone, each step would be a pass of its own (passes == steps); in lockstep, about
    // one pass for both.
    assert!(
        passes >= each[0].max(each[1]),
        "{passes} passes for steps {each:?}: steps ran outside the shared passes"
    );
    assert!(
        passes * 4 <= steps * 3,
        "{passes} passes for {steps} steps of two replicas: their steps were not shared"
    );
    for engine in replicas.iter().chain([&alone]) {
        settled(engine).await;
    }
}
