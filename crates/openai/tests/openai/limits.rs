//! The size guards of the LLM API (issue 50, item 7): every text a chat hands its template is
//! counted against the context before any work is spent on it, `/tokenize` checks a
//! conversation as a chat is checked, `/detokenize` takes at most the context's length of ids,
//! and `stop_token_ids` is capped. Each refusal is a 400 that names the field.

use crate::common;

use common::*;
use serde_json::json;

/// A refusal: 400, with the field named and a message that says why.
fn refused(reply: &Reply, param: &str, says: &str, what: &str) {
    let body = String::from_utf8_lossy(&reply.body);
    let start: String = body.chars().take(300).collect();
    assert_eq!(reply.status, 400, "{what}: {start}");
    let error = &reply.json()["error"];
    assert_eq!(error["param"], param, "{what}: {error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(says), "{what}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_checks_a_conversation_as_chat_does_and_detokenize_is_bounded() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let tokenize = |content: &str| json!({"model": "smollm2", "messages": [{"role": "user", "content": content}]});
    // Longer than the context can hold in bytes: refused before the template or the
    // tokenizer sees it.
    let huge = "word ".repeat(400_000);
    let started = tokio::time::Instant::now();
    let reply = post(addr, "/tokenize", tokenize(&huge)).await;
    refused(&reply, "messages", "bytes", "a 2 MB conversation");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    // Short in bytes, but more tokens than the context (1024) holds.
    let reply = post(addr, "/tokenize", tokenize(&"word ".repeat(1100))).await;
    refused(&reply, "messages", "tokens", "1100 words");
    let fits = post(addr, "/tokenize", tokenize(&"word ".repeat(100))).await;
    assert_eq!(fits.status, 200, "{}", String::from_utf8_lossy(&fits.body));
    assert!(fits.json()["count"].as_u64().unwrap() > 100);

    // At most max_model_len ids, each in the vocabulary.
    let detokenize = |n: usize| json!({"model": "smollm2", "tokens": vec![28; n]});
    let reply = post(addr, "/detokenize", detokenize(1025)).await;
    refused(&reply, "tokens", "at most 1024", "1025 ids");
    let reply = post(addr, "/detokenize", detokenize(1024)).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(!reply.json()["prompt"].as_str().unwrap().is_empty());
    let reply = post(
        addr,
        "/detokenize",
        json!({"model": "smollm2", "tokens": [1, 999999]}),
    )
    .await;
    refused(
        &reply,
        "tokens",
        "outside the vocabulary",
        "an id outside it",
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_measured_by_every_text_its_template_reads() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let huge = "word ".repeat(400_000);
    let user = json!({"role": "user", "content": "Hi"});
    let call = |id: &str, arguments: &str| {
        json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "f", "arguments": arguments}}]})
    };
    let tool = json!({"type": "function", "function": {"name": "f", "description": huge}});
    for (what, messages, tools, param) in [
        (
            "a long name",
            json!([{"role": "user", "content": "Hi", "name": huge}]),
            None,
            "messages",
        ),
        (
            "long arguments",
            json!([user, call("1", &huge)]),
            None,
            "messages",
        ),
        (
            "a long call id",
            json!([user, call(&huge, "{}")]),
            None,
            "messages",
        ),
        (
            "a long tool_call_id",
            json!([user, call("1", "{}"), {"role": "tool", "tool_call_id": huge, "content": "r"}]),
            None,
            "messages",
        ),
        (
            "a long tool description",
            json!([user]),
            Some(json!([tool])),
            "tools",
        ),
    ] {
        let mut body = json!({"model": "smollm2", "messages": messages, "max_tokens": 2});
        if let Some(tools) = tools {
            body["tools"] = tools;
        }
        let started = tokio::time::Instant::now();
        let reply = post(addr, "/v1/chat/completions", body).await;
        refused(&reply, param, "bytes", what);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{what}"
        );
    }

    // stop_token_ids is capped (the engine looks every generated token up in it).
    let stop = |n: usize| {
        let mut body = chat("smollm2", "Hi", 2, false);
        body["stop_token_ids"] = json!(vec![28; n]);
        body
    };
    let reply = post(addr, "/v1/chat/completions", stop(1025)).await;
    refused(&reply, "stop_token_ids", "at most 1024", "1025 stop ids");
    let reply = post(addr, "/v1/chat/completions", stop(1024)).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    server.shutdown().await;
}
