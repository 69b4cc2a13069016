//! Fuzzing the OpenAI API's body parsers, which read client bytes for every LLM request
//! (chat, completions, tokenize, detokenize, embeddings): any body is refused with a 400-class
//! error naming what is wrong, or parsed into a job within the API's caps; never a panic; and
//! parsing allocates at most a stated multiple of the body (see [`PER_BODY_BYTE`]).
//!
//! The allocation meter counts the whole test binary (stats_alloc wraps the system allocator
//! for it), and other unit tests run meanwhile: each case is measured three times and the
//! least is judged, again after a pause while it is over (see [`allocated`]).

use proptest::prelude::*;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

use crate::params::{Endpoint, parse_detokenize, parse_embeddings, parse_job, parse_tokenize};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes a parse may allocate per byte of body (serde's values for parts, tools and schemas,
/// vectors grown by doubling and counted as all they allocated), plus [`BASE`].
const PER_BODY_BYTE: usize = 64;
const BASE: usize = 256 << 10;

/// The least of the measurements of the bytes `f` allocates: three, and while that is over
/// `allowed`, three more after a pause, up to 20 rounds. Parsing is deterministic, so a parse
/// over its cap is over it every time, while another test's allocations (one that loads a
/// model, say) inflate the meter for a while only: seen once in a full suite, three in a row.
fn allocated(mut f: impl FnMut(), allowed: usize) -> usize {
    let mut least = usize::MAX;
    for round in 0..20 {
        if round > 0 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for _ in 0..3 {
            let region = Region::new(ALLOCATOR);
            f();
            least = least.min(region.change().bytes_allocated);
        }
        if least <= allowed {
            break;
        }
    }
    least
}

/// JSON values drawn around the requests' fields: the right shapes and the wrong ones.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        any::<i64>().prop_map(|i| i.to_string()),
        any::<f64>()
            .prop_map(|f| format!("{f:?}"))
            .prop_filter("JSON", |s| !s.contains("inf") && !s.contains("NaN")),
        Just("1e999".to_string()),
        Just("-1".to_string()),
        Just("4294967296".to_string()),
        "\"[a-z<|>{} ]{0,12}\"",
        Just("\"\\u0000\\ud800\"".to_string()),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec((field(), inner), 0..6).prop_map(|kv| {
                let kv: Vec<String> = kv
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", kv.join(","))
            }),
        ]
    })
}

/// The requests' field names, and a few others.
fn field() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec![
        "model",
        "messages",
        "prompt",
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "tools",
        "tool_choice",
        "function",
        "arguments",
        "parameters",
        "type",
        "text",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stop",
        "stop_token_ids",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "echo",
        "stream",
        "stream_options",
        "response_format",
        "json_schema",
        "schema",
        "seed",
        "tokens",
        "input",
        "add_special_tokens",
        "encoding_format",
        "unknown",
    ])
}

/// Request bodies: objects of the requests' fields most of the time, and arbitrary bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let object = proptest::collection::vec((field(), value()), 0..8).prop_map(|kv| {
        let kv: Vec<String> = kv
            .into_iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", kv.join(",")).into_bytes()
    });
    // Nearly valid chats and completions, with a few fields of any value, so that parsing
    // gets past the shape and into the caps.
    let nearly = (
        prop_oneof![
            value().prop_map(|c| format!(r#""messages":[{{"role":"user","content":{c}}}]"#)),
            value().prop_map(|p| format!(r#""prompt":{p}"#)),
            Just(r#""messages":[{"role":"user","content":"hi"}],"prompt":"x""#.to_string()),
        ],
        proptest::collection::vec((field(), value()), 0..4),
    )
        .prop_map(|(main, kv)| {
            let kv: String = kv
                .into_iter()
                .map(|(k, v)| format!(",\"{k}\":{v}"))
                .collect();
            format!(r#"{{"model":"m",{main}{kv}}}"#).into_bytes()
        });
    prop_oneof![
        4 => nearly,
        4 => object,
        1 => value().prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..128),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn any_body_is_refused_or_parsed_within_the_caps_by_every_endpoint(body in body()) {
        let allowed = BASE + PER_BODY_BYTE * body.len();
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            let bytes = allocated(|| drop(parse_job(endpoint, &body)), allowed);
            prop_assert!(bytes <= allowed, "{bytes} bytes for a {}-byte body", body.len());
            match parse_job(endpoint, &body) {
                Ok(job) => {
                    prop_assert!(job.n >= 1);
                    prop_assert!(job.params.stop_token_ids.len() <= modelmux_llm::MAX_STOP_TOKEN_IDS);
                }
                Err(e) => prop_assert!(e.http_status().is_client_error(), "{e}"),
            }
        }
        let bytes = allocated(
            || {
                drop(parse_tokenize(&body));
                drop(parse_detokenize(&body));
                drop(parse_embeddings(&body));
            },
            allowed,
        );
        prop_assert!(bytes <= allowed, "{bytes} bytes for a {}-byte body", body.len());
        for error in [
            parse_tokenize(&body).err(),
            parse_detokenize(&body).err(),
            parse_embeddings(&body).err(),
        ]
        .into_iter()
        .flatten()
        {
            prop_assert!(error.http_status().is_client_error(), "{error}");
        }
    }
}

#[test]
fn the_fuzzed_shapes_reach_a_parsed_job() {
    // So that the fuzzing above reaches the caps, not only the refusals.
    let chat = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stop_token_ids":[1]}"#;
    assert_eq!(parse_job(Endpoint::Chat, chat).unwrap().n, 1);
    let completion = br#"{"model":"m","prompt":"hi","max_tokens":2}"#;
    assert!(parse_job(Endpoint::Completion, completion).is_ok());
}
