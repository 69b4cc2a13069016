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
        })
        .unwrap();
    let Some(GenerationEvent::Token { .. }) = stream.next().await else {
        panic!("no first token")
    };
    engine.pause();
    assert!(engine.is_paused());
    // A step in flight may still land; after that, nothing for a while.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut tokens = 1;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(1), stream.next()).await {
        tokens += 1;
    }
    let steps = engine.snapshot().steps;
    let quiet = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(quiet.is_err(), "an event while paused: {quiet:?}");
    assert_eq!(engine.snapshot().steps, steps);
    // A request submitted while paused waits; one cancelled while paused is freed.
    let waiting = engine
        .submit(GenerationRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            adapter: None,
        })
        .unwrap();
    drop(
        engine
            .submit(GenerationRequest {
                prompt: prompt.clone(),
                params: params.clone(),
                adapter: None,
            })
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(engine.snapshot().steps, steps);

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
