//! The request checks, case by case.
use modelmux_llm::{MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS};

use super::*;

fn err(endpoint: Endpoint, body: &str) -> (String, String) {
    match parse_job(endpoint, body.as_bytes()).unwrap_err() {
        ServeError::InvalidParameter { param, message } => (param, message),
        other => ("".into(), other.to_string()),
    }
}

#[test]
fn a_chat_request_becomes_a_job() {
    let job = parse_job(
        Endpoint::Chat,
        br#"{"model": "m:a", "messages": [{"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
            "max_tokens": 5, "temperature": 0, "stop": "x", "seed": -1, "stream": true,
            "stream_options": {"include_usage": true}, "user": "u1",
            "metadata": {"team": "a"}, "service_tier": "auto", "store": false,
            "presence_penalty": 0.5, "frequency_penalty": -0.25,
            "logit_bias": {"7": -100, "12": 3.5}}"#,
    )
    .unwrap();
    assert_eq!(job.model, "m:a");
    assert_eq!(
        (job.params.presence_penalty, job.params.frequency_penalty),
        (0.5, -0.25)
    );
    let mut bias = job.params.logit_bias.clone();
    bias.sort_by_key(|b| b.0);
    assert_eq!(bias, [(7, -100.0), (12, 3.5)]);
    let Prompt::Chat(m) = &job.prompt else {
        panic!()
    };
    assert_eq!(m[0], ChatMessage::new("system", "be brief"));
    assert_eq!(m[1].content, "hi there");
    assert_eq!(job.max_tokens, Some(5));
    assert_eq!(job.params.stop, vec!["x".to_string()]);
    assert_eq!(job.params.seed, Some(u64::MAX));
    assert!(job.stream && job.include_usage);
    let job = parse_job(Endpoint::Completion, br#"{"model": "m", "prompt": [1, 2]}"#).unwrap();
    assert!(matches!(job.prompt, Prompt::Tokens(ref t) if t == &[1, 2]));
    assert_eq!(job.max_tokens, Some(16));
}

#[test]
fn bad_fields_are_named() {
    let chat = |extra: &str| {
        format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "x"}}]{extra}}}"#)
    };
    for (body, param, says) in [
        (chat(r#", "max_tokens": -1"#), "max_tokens", "at least 1"),
        (chat(r#", "max_tokens": 0"#), "max_tokens", "at least 1"),
        (chat(r#", "temperature": 5"#), "temperature", "between 0 and 2"),
        (chat(r#", "top_p": 0"#), "top_p", "greater than 0"),
        (chat(r#", "n": 0"#), "n", "at least 1"),
        (chat(r#", "prompt": "x""#), "prompt", "belongs to /v1/completions"),
        (chat(r#", "colour": "red""#), ".", "unknown field `colour`"),
        (chat(r#", "temperature": "hot""#), "temperature", "invalid type"),
        (chat(r#", "logprobs": 3"#), "logprobs", "true or false"),
        (chat(r#", "logprobs": true, "top_logprobs": 21"#), "top_logprobs", "from 0 to 20"),
        (chat(r#", "top_logprobs": 2"#), "top_logprobs", "needs logprobs: true"),
        (chat(r#", "presence_penalty": 2.5"#), "presence_penalty", "between -2 and 2"),
        (chat(r#", "frequency_penalty": -3"#), "frequency_penalty", "between -2 and 2"),
        (chat(r#", "logit_bias": {"x": 1}"#), "logit_bias", "not a token id"),
        (chat(r#", "logit_bias": {"5": 101}"#), "logit_bias", "from -100 to 100"),
        (chat(r#", "store": true"#), "store", "not supported"),
        (chat(r#", "stream_options": {"include_usage": true}"#), "stream_options", "stream is true"),
        (r#"{"model": "m", "messages": []}"#.into(), "messages", "at least one"),
        (r#"{"model": "m", "messages": [{"role": "robot", "content": "x"}]}"#.into(), "messages[0].role", "not supported"),
        (r#"{"model": "m", "messages": [{"role": "tool", "content": "x"}]}"#.into(), "messages[0].tool_call_id", "required on tool messages"),
        (r#"{"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}"#.into(), "messages[0].tool_calls", "only assistant"),
        (chat(r#", "response_format": {"type": "yaml"}"#), "response_format", "expected"),
        (chat(r#", "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required", "response_format": {"type": "json_object"}"#), "response_format", "forces a tool call"),
        (chat(r#", "tool_choice": "auto""#), "tool_choice", "non-empty tools"),
        (r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}"#.into(), "messages[0].content[0]", "only text"),
        (r#"{"messages": [{"role": "user", "content": "x"}]}"#.into(), ".", "missing field `model`"),
    ] {
        let (p, message) = err(Endpoint::Chat, &body);
        assert!(message.contains(says), "{body}: {message}");
        if param != "." {
            assert_eq!(p, param, "{body}: {message}");
        }
    }
    // `stop_token_ids` is capped as `logit_bias` is: the engine looks every generated token
    // up in it.
    let ids = |n: usize| vec!["1"; n].join(", ");
    let body = |n| chat(&format!(r#", "stop_token_ids": [{}]"#, ids(n)));
    let (p, m) = err(Endpoint::Chat, &body(MAX_STOP_TOKEN_IDS + 1));
    assert_eq!(p, "stop_token_ids", "{m}");
    assert!(m.contains("at most 1024"), "{m}");
    let job = parse_job(Endpoint::Chat, body(MAX_STOP_TOKEN_IDS).as_bytes()).unwrap();
    assert_eq!(job.params.stop_token_ids.len(), MAX_STOP_TOKEN_IDS);
    let bias = (0..=MAX_LOGIT_BIAS)
        .map(|t| format!(r#""{t}": 1"#))
        .collect::<Vec<_>>()
        .join(", ");
    let (p, m) = err(
        Endpoint::Chat,
        &chat(&format!(r#", "logit_bias": {{{bias}}}"#)),
    );
    assert_eq!(
        (p.as_str(), m.contains("at most 1024")),
        ("logit_bias", true),
        "{m}"
    );
    // A batch of prompts is taken (tests/openai/batch.rs); an empty one is not.
    let (p, m) = err(Endpoint::Completion, r#"{"model": "m", "prompt": []}"#);
    assert_eq!((p.as_str(), m.contains("empty list")), ("prompt", true));
    let job = parse_job(
        Endpoint::Completion,
        br#"{"model": "m", "prompt": ["a", [1, 2]]}"#,
    );
    assert!(job.is_err(), "a batch mixes texts and token lists: {job:?}");
    let (_, m) = err(
        Endpoint::Completion,
        r#"{"model": "m", "prompt": "a"} trailing"#,
    );
    assert!(m.contains("not a valid JSON"), "{m}");
}
