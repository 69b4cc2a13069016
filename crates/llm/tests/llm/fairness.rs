//! Fair share between adapters under overload, on the tiny random-weight llama: a flood of
//! requests on one adapter does not hold back a single request on another (the base model
//! counting as one), and a per-adapter cap bounds one adapter's running sequences. Counted in
//! engine steps, not timed.

use crate::common;

use common::settled;
use common::tiny::tiny;
use modelmux_llm::{
    AdapterLease, Engine, EngineConfig, GenerationEvent, GenerationRequest, SamplingParams,
};

const FLOOD_TOKENS: usize = 30;

fn engine(config: EngineConfig) -> Engine {
    let t = tiny();
    Engine::start(
        t.model.clone(),
        t.tokenizer.clone(),
        EngineConfig {
            max_model_len: 512,
            ..config
        },
    )
    .unwrap()
}

fn flood_request(i: u32) -> GenerationRequest {
    GenerationRequest {
        prompt: vec![1, 2 + i, 3, 4, 5, 6, 7, 8],
        params: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(FLOOD_TOKENS)
        },
        adapter: Some(AdapterLease::new(tiny().adapter.clone())),
        constraint: None,
    }
}

/// 64 streams on the adapter, then one request on the base model: it is admitted at the first
/// free slot and its first token comes within 3 steps of its prompt being prefilled, where
/// arrival order would make it wait for all 64 (16 rounds of 4 slots x 30 tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_not_held_behind_another_adapters_flood() {
    let engine = engine(EngineConfig {
        max_num_seqs: 4,
        max_batch_tokens: 64,
        ..EngineConfig::default()
    });
    let flood: Vec<_> = (0..64)
        .map(|i| engine.submit(flood_request(i)).unwrap())
        .collect();
    // Let the flood fill every slot and queue up.
    while engine.snapshot().running < 4 {
        tokio::task::yield_now().await;
    }
    let submitted = engine.snapshot().steps;
    let mut single = engine
        .submit(GenerationRequest {
            prompt: vec![1, 9, 9, 9],
            params: SamplingParams::greedy(4),
            adapter: None,
            constraint: None,
        })
        .unwrap();
    let Some(GenerationEvent::Token { .. }) = single.next().await else {
        panic!("no first token")
    };
    let waited = engine.snapshot().steps - submitted;
    // A slot frees within FLOOD_TOKENS steps (the oldest running flood sequence ends), then
    // one step prefills the prompt and yields its first token; a couple of steps of slack
    // for the submission racing the step in flight.
    assert!(
        waited <= FLOOD_TOKENS as u64 + 3,
        "the single request waited {waited} steps behind the flood"
    );
    while single.next().await.is_some() {}
    for s in flood {
        s.collect().await.unwrap();
    }
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_adapter_cap_bounds_one_adapters_running_sequences() {
    let engine = engine(EngineConfig {
        max_num_seqs: 8,
        max_batch_tokens: 64,
        max_running_per_adapter: Some(2),
        ..EngineConfig::default()
    });
    let flood: Vec<_> = (0..6)
        .map(|i| engine.submit(flood_request(i)).unwrap())
        .collect();
    let mut most = 0;
    let mut streams = flood.into_iter();
    let mut first = streams.next().unwrap();
    // While the first stream runs, never more than 2 of the adapter's sequences run.
    while let Some(event) = first.next().await {
        most = most.max(engine.snapshot().running);
        if matches!(event, GenerationEvent::Finished { .. }) {
            break;
        }
    }
    // The cap is reached (6 wait), and never passed.
    assert_eq!(
        most, 2,
        "{most} sequences of one adapter ran at once, under a cap of 2"
    );
    for s in streams {
        s.collect().await.unwrap();
    }
    settled(&engine).await;
}
