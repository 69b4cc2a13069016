//! OpenAI's Responses API, in process: every answer is the chat completion of the same
//! conversation (greedy), whole and streamed, on the base model and on adapters; a
//! conversation chained by `previous_response_id` is the chat of all its turns; stored
//! responses are read, listed, deleted, bounded (oldest evicted first, counted in a metric)
//! and kept across a restart when the store is a file; bad input is refused naming the
//! field.

use crate::common;

use std::net::SocketAddr;

use common::*;
use serde_json::{Value, json};

/// The chat completion of `messages` (greedy): its text and its usage.
async fn chat_of(addr: SocketAddr, model: &str, messages: Value, max_tokens: usize) -> Value {
    let reply = post(
        addr,
        "/v1/chat/completions",
        json!({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()
}

/// The text of a response object's output messages.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|m| m["content"].as_array().unwrap().clone())
        .map(|part| part["text"].as_str().unwrap().to_owned())
        .collect()
}

/// A response is the chat it translates to: same text, same token counts.
fn assert_same_as_chat(response: &Value, chat: &Value) {
    assert_eq!(
        output_text(response),
        chat["choices"][0]["message"]["content"].as_str().unwrap(),
        "{response}"
    );
    assert_eq!(
        response["usage"]["input_tokens"], chat["usage"]["prompt_tokens"],
        "{response}"
    );
    assert_eq!(
        response["usage"]["output_tokens"], chat["usage"]["completion_tokens"],
        "{response}"
    );
}

/// A streamed response's events (`event:` and `data:` each), checked: numbered in order,
/// each `data` typed as its `event`; returns the data.
fn response_events(reply: &Reply) -> Vec<Value> {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let text = std::str::from_utf8(&reply.body).unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let (event, data) = block.split_once('\n').unwrap();
        let kind = event.strip_prefix("event: ").unwrap();
        let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(data["type"], kind, "{block}");
        assert_eq!(data["sequence_number"], events.len(), "{block}");
        events.push(data);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_the_chat_it_translates_to_whole_and_streamed() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    for model in ["smollm2", "smollm2:pirate", "smollm2:chef"] {
        let request = json!({
            "model": model,
            "instructions": "Answer in one sentence.",
            "input": "What is the capital of France?",
            "max_output_tokens": 16,
            "temperature": 0,
        });
        let chat = chat_of(
            addr,
            model,
            json!([
                {"role": "system", "content": "Answer in one sentence."},
                {"role": "user", "content": "What is the capital of France?"},
            ]),
            16,
        )
        .await;
        let whole = post(addr, "/v1/responses", request.clone()).await;
        assert_eq!(
            whole.status,
            200,
            "{}",
            String::from_utf8_lossy(&whole.body)
        );
        let whole = whole.json();
        assert_eq!(whole["object"], "response");
        assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
        assert_eq!(whole["model"], model);
        let finished = chat["choices"][0]["finish_reason"] == "length";
        assert_eq!(
            whole["status"],
            if finished { "incomplete" } else { "completed" }
        );
        assert_same_as_chat(&whole, &chat);

        let mut streamed = request.clone();
        streamed["stream"] = true.into();
        let events = response_events(&post(addr, "/v1/responses", streamed).await);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let deltas = kinds
            .iter()
            .filter(|k| **k == "response.output_text.delta")
            .count();
        assert!(deltas >= 1, "{kinds:?}");
        let mut expected = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
        expected.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            if finished {
                "response.incomplete"
            } else {
                "response.completed"
            },
        ]);
        assert_eq!(kinds, expected);
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        let last = &events.last().unwrap()["response"];
        assert_eq!(text, output_text(last));
        assert_same_as_chat(last, &chat);
        // The streamed response was stored as it ended.
        let stored = get(
            addr,
            &format!("/v1/responses/{}", last["id"].as_str().unwrap()),
        )
        .await;
        assert_eq!(stored.status, 200);
        assert_eq!(output_text(&stored.json()), text);
    }
    server.shutdown().await;
}

/// Turn by turn, a chained conversation is the chat of every turn so far: turn 3 sees what
/// turn 1 said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_chained_by_previous_response_id_is_the_chat_of_all_its_turns() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let questions = [
        "My name is Ada and my favourite colour is green.",
        "What is two plus two?",
        "What is my name, and what is my favourite colour?",
    ];
    // Instructions are the turn's own: a chained turn does not carry them over (as OpenAI's).
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut previous: Option<String> = None;
    let mut ids = Vec::new();
    for (turn, question) in questions.iter().enumerate() {
        let mut request = json!({
            "model": "smollm2",
            "input": [{"role": "user", "content": question}],
            "max_output_tokens": 24,
            "temperature": 0,
        });
        match &previous {
            Some(id) => request["previous_response_id"] = id.clone().into(),
            None => request["instructions"] = "You are a helpful assistant.".into(),
        }
        let reply = post(addr, "/v1/responses", request).await;
        assert_eq!(
            reply.status,
            200,
            "turn {turn}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let response = reply.json();
        messages.push(json!({"role": "user", "content": question}));
        let chat = chat_of(addr, "smollm2", Value::Array(messages.clone()), 24).await;
        assert_same_as_chat(&response, &chat);
        if turn == 0 {
            messages.remove(0);
        }
        messages.push(json!({"role": "assistant", "content": output_text(&response)}));
        let id = response["id"].as_str().unwrap().to_owned();
        assert_eq!(response["previous_response_id"], json!(previous));
        ids.push(id.clone());
        previous = Some(id);
    }
    // The last turn's input items: its own, newest first by default.
    let items = get(addr, &format!("/v1/responses/{}/input_items", ids[2])).await;
    assert_eq!(items.status, 200);
    let items = items.json();
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"].as_array().unwrap().len(), 1, "{items}");
    assert_eq!(items["data"][0]["role"], "user");
    assert_eq!(items["data"][0]["content"][0]["text"], questions[2]);
    // Deleted: gone, and it can no longer be continued.
    let deleted = send(
        addr,
        "DELETE",
        &format!("/v1/responses/{}", ids[1]),
        &[],
        vec![],
    )
    .await;
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.json()["deleted"], true);
    assert_eq!(
        get(addr, &format!("/v1/responses/{}", ids[1])).await.status,
        404
    );
    let orphan = post(
        addr,
        "/v1/responses",
        json!({"model": "smollm2", "input": "Hi", "previous_response_id": ids[1]}),
    )
    .await;
    assert_eq!(orphan.status, 404);
    let message = orphan.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.starts_with("previous_response_id"), "{message}");
    server.shutdown().await;
}

/// Function calling: a forced call comes back as a `function_call` item with the chat's
/// arguments; its output, sent back on the chained response, answers as the chat with the
/// tool message does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_call_round_trip_is_the_chat_with_its_tool_messages() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let parameters = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    });
    let question = "What is the weather in Paris?";
    let response = post(
        addr,
        "/v1/responses",
        json!({
            "model": "smollm2:pirate",
            "input": question,
            "tools": [{"type": "function", "name": "weather", "description": "The weather in a city.", "parameters": parameters}],
            "tool_choice": "required",
            "parallel_tool_calls": false,
            "max_output_tokens": 60,
            "temperature": 0,
        }),
    )
    .await;
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let response = response.json();
    let call = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no function call: {response}"))
        .clone();
    assert_eq!(call["name"], "weather");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    let chat = post(
        addr,
        "/v1/chat/completions",
        json!({
            "model": "smollm2:pirate",
            "messages": [{"role": "user", "content": question}],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "The weather in a city.", "parameters": parameters}}],
            "tool_choice": "required",
            "parallel_tool_calls": false,
            "max_tokens": 60,
            "temperature": 0,
        }),
    )
    .await
    .json();
    let chat_call = &chat["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["arguments"], chat_call["arguments"]);

    let answer = post(
        addr,
        "/v1/responses",
        json!({
            "model": "smollm2:pirate",
            "previous_response_id": response["id"],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 24 C"}],
            "max_output_tokens": 20,
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
        "smollm2:pirate",
        json!([
            {"role": "user", "content": question},
            {"role": "assistant", "content": null, "tool_calls": [{"id": call["call_id"], "type": "function", "function": {"name": "weather", "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["call_id"], "content": "Sunny, 24 C"},
        ]),
        20,
    )
    .await;
    assert_same_as_chat(&answer.json(), &chat);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_format_json_schema_holds() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": false,
    });
    let reply = post(
        addr,
        "/v1/responses",
        json!({
            "model": "smollm2",
            "input": "Name a large city and its population.",
            "text": {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": true}},
            "max_output_tokens": 60,
            "temperature": 0,
        }),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let response = reply.json();
    let answer: Value =
        serde_json::from_str(&output_text(&response)).unwrap_or_else(|e| panic!("{e}: {response}"));
    assert!(
        answer["city"].is_string() && answer["population"].is_i64(),
        "{answer}"
    );
    assert_eq!(answer.as_object().unwrap().len(), 2, "{answer}");
    assert_eq!(response["text"]["format"]["type"], "json_schema");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_unstored_and_malformed_requests_are_refused_naming_why() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let unknown = post(
        addr,
        "/v1/responses",
        json!({"model": "smollm2", "input": "Hi", "previous_response_id": "resp_nothing"}),
    )
    .await;
    assert_eq!(unknown.status, 404);
    let error = &unknown.json()["error"];
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("previous_response_id") && message.contains("resp_nothing"),
        "{error}"
    );
    assert_eq!(get(addr, "/v1/responses/resp_nothing").await.status, 404);

    let unstored = post(
        addr,
        "/v1/responses",
        json!({"model": "smollm2", "input": "Hi", "store": false, "max_output_tokens": 2}),
    )
    .await
    .json();
    assert_eq!(unstored["store"], false);
    let id = unstored["id"].as_str().unwrap();
    assert_eq!(get(addr, &format!("/v1/responses/{id}")).await.status, 404);
    let chained = post(
        addr,
        "/v1/responses",
        json!({"model": "smollm2", "input": "Hi", "previous_response_id": id}),
    )
    .await;
    assert_eq!(
        chained.status, 404,
        "a response stored with store: false cannot be chained"
    );

    for (body, param) in [
        (
            json!({"model": "smollm2", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"model": "smollm2", "input": [{"type": "function_call_output", "output": "x"}]}),
            "input[0].call_id",
        ),
        (
            json!({"model": "smollm2", "input": [{"role": "pirate", "content": "x"}]}),
            "input[0].role",
        ),
        (json!({"model": "smollm2", "input": 7}), "input"),
        (
            json!({"model": "smollm2", "input": "Hi", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
        (
            json!({"model": "smollm2", "input": "Hi", "colour": "red"}),
            "colour",
        ),
        (
            json!({"model": "smollm2", "input": "Hi", "text": {"format": {"type": "json_schema"}}}),
            "text.format",
        ),
    ] {
        let reply = post(addr, "/v1/responses", body.clone()).await;
        assert_eq!(
            reply.status,
            400,
            "{body}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_bound_the_store_evicts_the_oldest_first_and_counts_it() {
    let server = serve(&config(json!({"responses_store": {"max_responses": 2}})), 1).await;
    let addr = server.local_addr();
    let mut ids = Vec::new();
    for i in 0..3 {
        let reply = post(
            addr,
            "/v1/responses",
            json!({"model": "smollm2", "input": format!("Say {i}"), "max_output_tokens": 2}),
        )
        .await;
        assert_eq!(reply.status, 200);
        ids.push(reply.json()["id"].as_str().unwrap().to_owned());
    }
    let status = |id: &str| {
        let path = format!("/v1/responses/{id}");
        async move { get(addr, &path).await.status }
    };
    assert_eq!(status(&ids[0]).await, 404, "the oldest went first");
    assert_eq!(status(&ids[1]).await, 200);
    assert_eq!(status(&ids[2]).await, 200);
    let page = page(&metrics(addr).await);
    assert_eq!(page.sum("modelmux_responses_stored"), 2.0);
    assert_eq!(
        page.sum_where("modelmux_responses_evicted_total", &[("reason", "count")]),
        1.0
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_file_keeps_its_responses_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("responses.redb");
    let config = config(json!({"responses_store": {"path": path}}));
    let server = serve(&config, 1).await;
    let first = post(
        server.local_addr(),
        "/v1/responses",
        json!({"model": "smollm2", "input": "My name is Ada.", "max_output_tokens": 8, "temperature": 0}),
    )
    .await
    .json();
    server.shutdown().await;

    let server = serve(&config, 1).await;
    let addr = server.local_addr();
    let stored = get(
        addr,
        &format!("/v1/responses/{}", first["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(stored.status, 200, "kept across the restart");
    assert_eq!(stored.json(), first);
    let next = post(
        addr,
        "/v1/responses",
        json!({"model": "smollm2", "input": "What is my name?", "previous_response_id": first["id"], "max_output_tokens": 8}),
    )
    .await;
    assert_eq!(next.status, 200, "{}", String::from_utf8_lossy(&next.body));
    server.shutdown().await;
}
