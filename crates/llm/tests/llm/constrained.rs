//! Constrained decoding in the engine with SmolLM2: outputs match their schema, constrained
//! rows share the batch with free ones without changing the free ones' tokens or adding
//! steps, and a schema that cannot be compiled is the request's error.

use crate::common;

use common::{runtime, settled};
use modelmux_llm::{
    Constraint, Engine, EngineConfig, ErrorKind, FinishReason, Generation, GenerationRequest,
    SamplingParams,
};
use serde_json::{Value, json};

fn chat(question: &str) -> Vec<u32> {
    let text = format!(
        "<|im_start|>system\nYou answer in JSON.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    );
    runtime().tokenizer.encode(&text, true).unwrap()
}

fn request(
    engine: &Engine,
    prompt: Vec<u32>,
    tokens: usize,
    schema: Option<&Value>,
) -> GenerationRequest {
    GenerationRequest {
        prompt,
        params: SamplingParams::greedy(tokens),
        adapter: None,
        constraint: schema.map(|s| {
            engine
                .compile_constraint(&Constraint::JsonSchema(s.clone()), "response_format")
                .unwrap()
        }),
    }
}

async fn generate(engine: &Engine, request: GenerationRequest) -> Generation {
    engine.submit(request).unwrap().collect().await.unwrap()
}

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "London", "Rome"]},
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false,
    })
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
    assert_eq!(o.len(), 3, "{text}");
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 20),
        "{text}"
    );
    assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
    assert!(
        ["Paris", "London", "Rome"].contains(&o["city"].as_str().unwrap()),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_output_matches_its_schema_and_ends_when_complete() {
    let engine = runtime().engine(EngineConfig::default());
    let out = generate(
        &engine,
        request(
            &engine,
            chat("Describe a person who lives in a capital city."),
            120,
            Some(&person()),
        ),
    )
    .await;
    check_person(&out.text);
    // The output ends when the grammar is complete, not at max_tokens.
    assert_eq!(out.finish_reason, FinishReason::Stop, "{:?}", out.text);
    assert!(out.usage.completion_tokens < 120);
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_constrained_rows_leave_four_free_rows_unchanged_and_add_no_steps() {
    const TOKENS: usize = 24;
    let engine = runtime().engine(EngineConfig::default());
    let questions = [
        "What is the capital of France?",
        "Name three colours.",
        "Write a haiku about rain.",
        "How do birds fly?",
    ];
    let mut alone = Vec::new();
    for q in questions {
        alone.push(
            generate(&engine, request(&engine, chat(q), TOKENS, None))
                .await
                .tokens,
        );
    }
    // Every request ready before the first is submitted, so they arrive together.
    let mut requests = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        requests.push(request(&engine, chat(q), TOKENS, None));
        let constrained = chat(&format!("Describe person number {i}."));
        requests.push(request(&engine, constrained, 200, Some(&person())));
    }
    // Paused while they are submitted, so they start together (an idle engine starts the
    // first request at once).
    engine.pause();
    let before = engine.snapshot().steps;
    let streams: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).unwrap())
        .collect();
    engine.resume();
    let mut outs = Vec::new();
    for s in streams {
        outs.push(s.collect().await.unwrap());
    }
    let steps = engine.snapshot().steps - before;
    for (i, out) in outs.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(
                out.tokens,
                alone[i / 2],
                "free row {} changed in the batch",
                i / 2
            );
        } else {
            check_person(&out.text);
        }
    }
    // Everything ran in one batch: as many steps as the longest sequence needs (its prompt in
    // one step, then one per token), not one batch for the free rows and another for the
    // constrained ones.
    let longest = outs
        .iter()
        .map(|o| o.usage.completion_tokens)
        .max()
        .unwrap();
    assert!(
        steps <= longest as u64 + 2,
        "{steps} steps for sequences of at most {longest} tokens"
    );
    settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_that_cannot_compile_are_the_requests_error() {
    let engine = runtime().engine(EngineConfig::default());
    for schema in [
        json!({"type": "no-such-type"}),
        json!({"$ref": "#/definitions/missing"}),
        json!(["not", "an", "object"]),
    ] {
        let err = engine
            .compile_constraint(&Constraint::JsonSchema(schema.clone()), "response_format")
            .expect_err("must not compile");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{schema}: {err}");
        assert!(
            err.to_string()
                .contains("response_format cannot be enforced: "),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_gives_an_object_even_when_the_prompt_asks_for_prose() {
    let engine = runtime().engine(EngineConfig::default());
    let constraint = engine
        .compile_constraint(&Constraint::JsonObject, "response_format")
        .unwrap();
    let out = generate(
        &engine,
        GenerationRequest {
            prompt: chat("Write a short poem about the sea, in plain prose."),
            params: SamplingParams::greedy(150),
            adapter: None,
            constraint: Some(constraint),
        },
    )
    .await;
    if out.finish_reason == FinishReason::Stop {
        let v: Value =
            serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{:?}: {e}", out.text));
        assert!(v.is_object());
    } else {
        // Cut at max_tokens: still the start of an object.
        assert!(out.text.starts_with('{'), "{:?}", out.text);
    }
    settled(&engine).await;
}
