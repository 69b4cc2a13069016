//! The engine's mechanics on a tiny random-weight llama (`common::tiny`): it generates and
//! its adapter applies; cancellation frees the sequence, its KV memory and its adapter; a full
//! queue refuses at once; bad requests are typed errors; a panic in a step fails that step's
//! sequences and nothing else. A step takes microseconds.

use crate::common;

use std::sync::Arc;

use common::settled;
use common::tiny::tiny;
use modelmux_llm::{
    AdapterLease, Engine, EngineConfig, ErrorKind, GenerationRequest, SamplingParams,
};

/// "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
const CHAT: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

/// An engine over the tiny model (whose context is 512 tokens).
fn engine(config: EngineConfig) -> Engine {
    let t = tiny();
    let max_model_len = config.max_model_len.min(t.model.max_positions());
    Engine::start(
        t.model.clone(),
        t.tokenizer.clone(),
        EngineConfig {
            max_model_len,
            ..config
        },
    )
    .unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(n)
    }
}

fn request(prompt: &[u32], params: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        params,
        adapter: None,
        constraint: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tiny_model_generates_and_its_adapter_changes_the_output() {
    let engine = engine(EngineConfig::default());
    let base = engine
        .submit(request(&CHAT, greedy(16)))
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(base.tokens.len(), 16);
    let adapted = engine
        .submit(GenerationRequest {
            adapter: Some(AdapterLease::new(tiny().adapter.clone())),
            ..request(&CHAT, greedy(16))
        })
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_ne!(
        adapted.tokens, base.tokens,
        "the adapter changes the tokens"
    );
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_frees_its_sequence_kv_and_adapter() {
    let engine = engine(EngineConfig::default());
    // An adapter of its own: the shared one is used by the tests running beside this one.
    let adapter = Arc::new(common::tiny::adapter(&tiny().model));
    let before = Arc::strong_count(&adapter);
    let mut stream = engine
        .submit(GenerationRequest {
            prompt: CHAT.to_vec(),
            params: greedy(400),
            adapter: Some(AdapterLease::new(adapter.clone())),
            constraint: None,
        })
        .unwrap();
    stream.next().await.unwrap();
    stream.next().await.unwrap();
    assert!(engine.snapshot().kv_reserved_bytes > 0);
    assert!(
        Arc::strong_count(&adapter) > before,
        "the sequence holds the adapter"
    );
    drop(stream);
    settled(&engine).await;
    assert_eq!(
        Arc::strong_count(&adapter),
        before,
        "the sequence let the adapter go"
    );
    assert!(engine.snapshot().generated_tokens < 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_typed_errors() {
    let engine = engine(EngineConfig {
        max_model_len: 64,
        ..EngineConfig::default()
    });
    let vocab = tiny().model.config().vocab_size as u32;
    let cases: Vec<(Vec<u32>, SamplingParams, &str)> = vec![
        (vec![5; 60], SamplingParams::greedy(10), "context holds 64"),
        (
            CHAT.to_vec(),
            SamplingParams::greedy(usize::MAX),
            "context holds 64",
        ),
        (CHAT.to_vec(), SamplingParams::greedy(0), "max_tokens"),
        (vec![], SamplingParams::greedy(1), "empty"),
        (
            vec![1, vocab],
            SamplingParams::greedy(1),
            "outside the vocabulary",
        ),
        (
            CHAT.to_vec(),
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::greedy(1)
            },
            "temperature",
        ),
    ];
    for (prompt, params, message) in cases {
        let Err(err) = engine.submit(request(&prompt, params)) else {
            panic!("{message}: accepted");
        };
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(
            err.to_string().contains(message),
            "{err} should say {message}"
        );
    }
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once() {
    let engine = engine(EngineConfig {
        max_num_seqs: 1,
        max_waiting: 1,
        max_batch_tokens: 16,
        ..EngineConfig::default()
    });
    let mut accepted = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        match engine.submit(request(&CHAT, greedy(50))) {
            Ok(s) => accepted.push(s),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Overloaded, "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused >= 4, "only {refused} refused");
    for s in accepted {
        s.collect().await.unwrap();
    }
    settled(&engine).await;
}

/// A panic inside a step (injected in the forward pass, as a bug there would) fails the
/// sequences of that step with an internal error naming the panic; a sequence still waiting
/// for a slot is not in the step and is served afterwards, the engine keeps running, a later
/// request gets exactly the tokens an engine that never failed gives, and no KV memory is left
/// behind. The engine is paused while the scene is set, so which sequences are in the failing
/// step does not depend on timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_step_fails_only_its_sequences() {
    let config = EngineConfig {
        max_num_seqs: 2,
        max_batch_tokens: 64,
        ..EngineConfig::default()
    };
    let clean = engine(config.clone())
        .submit(request(&CHAT, greedy(8)))
        .unwrap()
        .collect()
        .await
        .unwrap();
    let engine = engine(config);
    engine.pause();
    // Two sequences fill both slots, so both are in the next step; a third waits for a slot.
    let in_step: Vec<_> = (0..2)
        .map(|_| engine.submit(request(&CHAT, greedy(8))).unwrap())
        .collect();
    let waiting = engine.submit(request(&CHAT, greedy(8))).unwrap();
    engine.inject_step_panic();
    engine.resume();
    for stream in in_step {
        let err = stream.collect().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
        assert!(err.to_string().contains("injected fault"), "{err}");
    }
    assert_eq!(waiting.collect().await.unwrap().tokens, clean.tokens);
    assert!(engine.is_running(), "the engine survives the panic");
    let later = engine
        .submit(request(&CHAT, greedy(8)))
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(later.tokens, clean.tokens);
    settled(&engine).await;
}

/// A finished request's sequence, KV memory and adapter are gone from the engine's figures by
/// the time its answer arrives: the engine publishes them before it announces the end (the
/// OpenAI metrics test read `sequences_running` right after its answers and once saw 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_figures_are_settled_when_the_answer_arrives() {
    let engine = engine(EngineConfig::default());
    let adapter = Arc::new(common::tiny::adapter(&tiny().model));
    for round in 0..200 {
        let lease = (round % 2 == 1).then(|| AdapterLease::new(adapter.clone()));
        let answer = engine
            .submit(GenerationRequest {
                prompt: CHAT.to_vec(),
                params: SamplingParams::greedy(1 + round % 3),
                adapter: lease,
                constraint: None,
            })
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(answer.tokens.len(), 1 + round % 3);
        let s = engine.snapshot();
        assert_eq!(
            (s.running, s.waiting, s.kv_reserved_bytes),
            (0, 0, 0),
            "round {round}: {s:?}"
        );
        assert!(
            engine.adapters_in_use().running.is_empty(),
            "round {round}: {:?}",
            engine.adapters_in_use()
        );
    }
}
