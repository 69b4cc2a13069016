//! `n > 1`: one request, several choices, the prompt prefilled once. Greedy choices are equal
//! to the single answer; seeded ones equal single requests with `seed + index`; the KV
//! accounting returns to zero.

use crate::common;

use common::{runtime, settled};
use modelmux_llm::{EngineConfig, ErrorKind, Generation, GenerationRequest, SamplingParams};

fn prompt() -> Vec<u32> {
    runtime()
        .tokenizer
        .encode_prompt("Once upon a time, in a quiet village,", true)
        .unwrap()
}

fn request(params: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt(),
        params,
        adapter: None,
        constraint: None,
    }
}

async fn collect(streams: Vec<modelmux_llm::GenerationStream>) -> Vec<Generation> {
    let mut out = Vec::new();
    for s in streams {
        out.push(s.collect().await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_choices_equal_the_single_answer_and_the_prompt_is_computed_once() {
    let engine = runtime().engine(EngineConfig::default());
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(10)
    };
    let single = engine
        .submit(request(params.clone()))
        .unwrap()
        .collect()
        .await
        .unwrap();
    let before = engine.snapshot();
    let choices = collect(engine.submit_choices(request(params), 4).unwrap()).await;
    let after = engine.snapshot();
    assert_eq!(choices.len(), 4);
    for c in &choices {
        assert_eq!(c.tokens, single.tokens);
        assert_eq!(c.text, single.text);
        assert_eq!(c.usage, single.usage);
    }
    // The prompt's rows went through the model once, not four times.
    assert_eq!(
        after.prompt_tokens - before.prompt_tokens,
        prompt().len() as u64
    );
    assert_eq!(after.generated_tokens - before.generated_tokens, 40);
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_choices_are_single_requests_with_seed_plus_index() {
    let engine = runtime().engine(EngineConfig::default());
    let params = |seed: u64| SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ignore_eos: true,
        ..SamplingParams::greedy(12)
    };
    let choices = collect(engine.submit_choices(request(params(7)), 3).unwrap()).await;
    for (i, c) in choices.iter().enumerate() {
        let single = engine
            .submit(request(params(7 + i as u64)))
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(c.tokens, single.tokens, "choice {i}");
    }
    assert!(
        choices[0].tokens != choices[1].tokens || choices[1].tokens != choices[2].tokens,
        "three seeds, one answer"
    );
    // The same request again gives the same choices.
    let again = collect(engine.submit_choices(request(params(7)), 3).unwrap()).await;
    assert_eq!(again, choices);
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_choices_are_refused_and_dropped_ones_are_freed() {
    let engine = runtime().engine(EngineConfig {
        max_num_seqs: 4,
        max_batch_tokens: 64,
        ..EngineConfig::default()
    });
    let err = engine
        .submit_choices(request(SamplingParams::greedy(4)), 5)
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("max_num_seqs"), "{err}");
    // Nor more than one adapter may run at once: they could never all be admitted.
    let capped = runtime().engine(EngineConfig {
        max_running_per_adapter: Some(2),
        ..EngineConfig::default()
    });
    let err = capped
        .submit_choices(request(SamplingParams::greedy(4)), 3)
        .err()
        .unwrap();
    assert!(err.to_string().contains("from 1 to 2"), "{err}");
    // Dropped before they finish: the sequences and their KV go.
    let streams = engine
        .submit_choices(request(SamplingParams::greedy(400)), 4)
        .unwrap();
    let mut streams = streams.into_iter();
    let mut first = streams.next().unwrap();
    assert!(first.next().await.is_some());
    drop(first);
    drop(streams);
    settled(&engine).await;
}
