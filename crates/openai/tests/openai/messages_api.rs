//! Anthropic's Messages API, in process: every answer is the chat completion of the same
//! conversation (greedy), whole and streamed, on the base model and on adapters; a tool use
//! round trip is the chat with its tool messages; `count_tokens` is the chat's prompt count;
//! errors come in Anthropic's shape.

use crate::common;

use std::net::SocketAddr;

use common::*;
use serde_json::{Value, json};

async fn chat_of(addr: SocketAddr, body: Value) -> Value {
    let reply = post(addr, "/v1/chat/completions", body).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()
}

/// The text blocks of a message.
fn text_of(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap().to_owned())
        .collect()
}

/// A streamed message's events, checked (`event:` names each `data`'s type).
fn message_events(reply: &Reply) -> Vec<Value> {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    std::str::from_utf8(&reply.body)
        .unwrap()
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let (event, data) = block.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(
                data["type"],
                event.strip_prefix("event: ").unwrap(),
                "{block}"
            );
            data
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_the_chat_it_translates_to_whole_and_streamed() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    for model in ["smollm2", "smollm2:pirate", "smollm2:poet"] {
        let request = json!({
            "model": model,
            "system": "Answer briefly.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Where is Rome?"}]}],
            "max_tokens": 14,
            "temperature": 0,
            "stop_sequences": ["\n\n"],
        });
        let chat = chat_of(
            addr,
            json!({
                "model": model,
                "messages": [
                    {"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": "Where is Rome?"},
                ],
                "max_tokens": 14,
                "temperature": 0,
                "stop": ["\n\n"],
            }),
        )
        .await;
        let chat_text = chat["choices"][0]["message"]["content"].as_str().unwrap();
        let reason = match chat["choices"][0]["finish_reason"].as_str().unwrap() {
            "length" => "max_tokens",
            _ => "end_turn",
        };
        let whole = post(addr, "/v1/messages", request.clone()).await;
        assert_eq!(
            whole.status,
            200,
            "{}",
            String::from_utf8_lossy(&whole.body)
        );
        let whole = whole.json();
        assert_eq!(whole["type"], "message");
        assert_eq!(whole["role"], "assistant");
        assert!(whole["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(text_of(&whole), chat_text);
        assert_eq!(whole["stop_reason"], reason);
        assert_eq!(
            whole["usage"]["input_tokens"],
            chat["usage"]["prompt_tokens"]
        );
        assert_eq!(
            whole["usage"]["output_tokens"],
            chat["usage"]["completion_tokens"]
        );

        let mut streamed = request.clone();
        streamed["stream"] = true.into();
        let events = message_events(&post(addr, "/v1/messages", streamed).await);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let deltas = kinds
            .iter()
            .filter(|k| **k == "content_block_delta")
            .count();
        let mut expected = vec!["message_start", "content_block_start"];
        expected.extend(std::iter::repeat_n("content_block_delta", deltas));
        expected.extend(["content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(kinds, expected);
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "content_block_delta")
            .map(|e| e["delta"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, chat_text);
        let delta = &events[events.len() - 2];
        assert_eq!(delta["delta"]["stop_reason"], reason);
        assert_eq!(
            delta["usage"]["output_tokens"],
            chat["usage"]["completion_tokens"]
        );
        assert_eq!(
            delta["usage"]["input_tokens"],
            chat["usage"]["prompt_tokens"]
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_use_round_trip_is_the_chat_with_its_tool_messages() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let tools = json!([{"name": "weather", "description": "The weather in a city.", "input_schema": schema}]);
    let question = "What is the weather in Paris?";
    let first = post(
        addr,
        "/v1/messages",
        json!({
            "model": "smollm2:tutor",
            "messages": [{"role": "user", "content": question}],
            "tools": tools,
            "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": true},
            "max_tokens": 60,
            "temperature": 0,
        }),
    )
    .await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let first = first.json();
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let call = first["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use: {first}"))
        .clone();
    assert_eq!(call["name"], "weather");
    assert!(call["input"]["city"].is_string(), "{call}");

    let chat_tools = json!([{"type": "function", "function": {"name": "weather", "description": "The weather in a city.", "parameters": schema}}]);
    let arguments = serde_json::to_string(&call["input"]).unwrap();
    let answer = post(
        addr,
        "/v1/messages",
        json!({
            "model": "smollm2:tutor",
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": [call.clone()]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny, 24 C"}]},
            ],
            "tools": tools,
            "max_tokens": 20,
            "temperature": 0,
        }),
    )
    .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let chat = chat_of(
        addr,
        json!({
            "model": "smollm2:tutor",
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": null, "tool_calls": [{"id": call["id"], "type": "function", "function": {"name": "weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 24 C"},
            ],
            "tools": chat_tools,
            "max_tokens": 20,
            "temperature": 0,
        }),
    )
    .await;
    let answer = answer.json();
    let chat_message = &chat["choices"][0]["message"];
    match chat_message["tool_calls"].as_array() {
        Some(calls) => assert_eq!(
            answer["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .count(),
            calls.len(),
            "{answer}"
        ),
        None => assert_eq!(text_of(&answer), chat_message["content"].as_str().unwrap()),
    }
    assert_eq!(
        answer["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_the_prompt_a_message_would_have() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let tools = json!([{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    for with_tools in [false, true] {
        let mut body = json!({
            "model": "smollm2:pirate",
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello there"}],
        });
        if with_tools {
            body["tools"] = tools.clone();
        }
        let counted = post(addr, "/v1/messages/count_tokens", body.clone()).await;
        assert_eq!(
            counted.status,
            200,
            "{}",
            String::from_utf8_lossy(&counted.body)
        );
        let counted = counted.json()["input_tokens"].as_u64().unwrap();
        body["max_tokens"] = 1.into();
        let message = post(addr, "/v1/messages", body).await.json();
        assert_eq!(
            message["usage"]["input_tokens"], counted,
            "tools: {with_tools}"
        );
    }
    // Labelled by the API they came in through, though each ran as a chat or a tokenize.
    let page = page(&metrics(addr).await);
    let api = |api: &str| {
        page.sum_where(
            "modelmux_api_requests_total",
            &[("api", api), ("status", "2xx")],
        )
    };
    assert_eq!(api("messages"), 4.0);
    assert_eq!(api("chat_completions"), 0.0);
    assert_eq!(api("tokenize"), 0.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_come_in_anthropics_shape() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let ok = json!({"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    for (body, status, kind, says) in [
        (
            json!({"model": "smollm2", "messages": []}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            with("messages", json!([{"role": "robot", "content": "x"}])),
            400,
            "invalid_request_error",
            "messages[0].role",
        ),
        (
            with("model", json!("other:thing")),
            404,
            "not_found_error",
            "other",
        ),
        (
            with("max_tokens", json!(100_000)),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            with("top_k", json!(-3)),
            400,
            "invalid_request_error",
            "top_k",
        ),
    ] {
        let reply = post(addr, "/v1/messages", body.clone()).await;
        assert_eq!(
            reply.status,
            status,
            "{body}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let error = reply.json();
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], kind, "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    let reply = send(addr, "POST", "/v1/messages", &[], b"{not json".to_vec()).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
    server.shutdown().await;
}
