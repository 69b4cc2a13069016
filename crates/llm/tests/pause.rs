//! Pausing an engine: nothing is generated while paused, everything resumes where it was, and
//! cancelling while paused still frees the sequence.

mod common;

use std::time::Duration;

use common::runtime;
use modelmux_llm::{EngineConfig, GenerationEvent, GenerationRequest, SamplingParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_engine_generates_nothing_until_resumed() {
    let rt = runtime();
    let engine = rt.engine(EngineConfig::default());
    let prompt = rt.tokenizer.encode_prompt("The sky is", true).unwrap();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(12)
    };
    let expected = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
            constraint: None,
        })
        .unwrap()
        .collect()
        .await
        .unwrap();

    let mut stream = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
            constraint: None,
        })
        .unwrap();
    let Some(GenerationEvent::Token { .. }) = stream.next().await else {
        panic!("no first token")
    };
    engine.pause();
    assert!(engine.is_paused());
    // The engine looks at the flag before each step, so the step in flight when it was set
    // (if any) is the only one that can still run: from here the step count may grow by one,
    // and the stream may get one more token, however long the engine is watched. An engine
    // that did not pause would run at least two of the 11 steps left within this watch at any
    // step time under 500 ms (3x the slowest measured on this busy machine, 165 ms).
    let steps = engine.snapshot().steps;
    let mut tokens = 1;
    let quiet_until = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Ok(event) = tokio::time::timeout_at(quiet_until, stream.next()).await {
        match event {
            Some(GenerationEvent::Token { .. }) => tokens += 1,
            other => panic!("while paused: {other:?}"),
        }
    }
    assert!(tokens <= 2, "{tokens} tokens while paused");
    let after_pause = engine.snapshot().steps;
    assert!(
        after_pause <= steps + 1,
        "{} steps ran while paused",
        after_pause - steps
    );
    // One cancelled while paused is freed; a request submitted while paused waits (it is not
    // even admitted). The engine takes them in order, and drops cancelled ones before it
    // publishes its counts, so once it counts one waiting, the cancelled one is gone.
    drop(
        engine
            .submit(GenerationRequest {
                prompt: prompt.clone(),
                params: params.clone(),
                adapter: None,
                constraint: None,
            })
            .unwrap(),
    );
    let waiting = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
            constraint: None,
        })
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while engine.snapshot().waiting != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            engine.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = engine.snapshot();
    assert_eq!(
        (s.running, s.waiting, s.steps),
        (1, 1, after_pause),
        "{s:?}"
    );

    engine.resume();
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { .. } => tokens += 1,
            GenerationEvent::Finished { .. } => break,
            GenerationEvent::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(tokens, expected.tokens.len());
    assert_eq!(waiting.collect().await.unwrap().tokens, expected.tokens);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while engine.snapshot().running + engine.snapshot().waiting > 0
        || engine.snapshot().kv_reserved_bytes > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            engine.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
