//! The OpenAI-compatible API over SmolLM2 and its test adapters, in process: answers equal
//! the engine's own, streaming equals the whole answer, errors have OpenAI's shape and the
//! right status, adapters are routed to the replicas holding them. (Streaming's timing and
//! errors, and the engine controls, are in `streaming.rs`; the adapter controls in
//! `adapter_controls.rs`.)

use std::net::SocketAddr;

use crate::common;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completion_answer_as_the_engine_does_with_and_without_an_adapter() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let question = "What is the capital of France?";
    let base_text = base_chat_answers_as_the_engine(addr, question).await;
    let pirate = adapter_chat_answers_as_the_engine(addr, question, &base_text).await;
    streaming_gives_the_same_chat(addr, question, &pirate).await;
    completions_answer_as_the_chat(addr, question, &base_text).await;
    stop_strings_end_the_answer_early(addr, question, &base_text).await;
    server.shutdown().await;
}

/// The base model's chat answer to `question`: OpenAI's shape, the engine's own text (which
/// it returns).
async fn base_chat_answers_as_the_engine(addr: SocketAddr, question: &str) -> String {
    let base = post(
        addr,
        "/v1/chat/completions",
        chat("smollm2", question, 12, false),
    )
    .await;
    assert_eq!(base.status, 200, "{}", String::from_utf8_lossy(&base.body));
    let request_id = base.headers["x-request-id"].to_str().unwrap().to_owned();
    let body = base.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["id"], format!("chatcmpl-{request_id}"));
    assert_eq!(body["model"], "smollm2");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 12);
    let base_text = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(base_text, direct(question, None, 12).await);
    base_text
}

/// The pirate adapter's chat answer.
struct PirateAnswer {
    text: String,
    finish_reason: String,
    usage: serde_json::Value,
}

/// The pirate adapter's chat answer to `question`, named `smollm2:pirate`, `pirate` or by the
/// header: the engine's own text with the adapter, not the base model's.
async fn adapter_chat_answers_as_the_engine(
    addr: SocketAddr,
    question: &str,
    base_text: &str,
) -> PirateAnswer {
    let pirate = post(
        addr,
        "/v1/chat/completions",
        chat("smollm2:pirate", question, 12, false),
    )
    .await;
    assert_eq!(
        pirate.status,
        200,
        "{}",
        String::from_utf8_lossy(&pirate.body)
    );
    let pirate_text = pirate.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(pirate_text, direct(question, Some("pirate"), 12).await);
    let pirate_reason = pirate.json()["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(pirate_text, base_text, "the adapter changes the answer");
    // A bare adapter name, and the header, name the same adapter.
    let bare = post(
        addr,
        "/v1/chat/completions",
        chat("pirate", question, 12, false),
    )
    .await;
    assert_eq!(
        bare.json()["choices"][0]["message"]["content"],
        pirate_text.as_str()
    );
    let header = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("serve_multiplexed_model_id", "pirate")],
        serde_json::to_vec(&chat("smollm2", question, 12, false)).unwrap(),
    )
    .await;
    assert_eq!(
        header.json()["choices"][0]["message"]["content"],
        pirate_text.as_str()
    );
    PirateAnswer {
        text: pirate_text,
        finish_reason: pirate_reason,
        usage: pirate.json()["usage"].clone(),
    }
}

/// Streaming gives the same text, in chunks, ending with [DONE]; usage when asked.
async fn streaming_gives_the_same_chat(addr: SocketAddr, question: &str, pirate: &PirateAnswer) {
    let mut request = chat("smollm2:pirate", question, 12, true);
    request["stream_options"] = json!({"include_usage": true});
    let streamed = post(addr, "/v1/chat/completions", request).await;
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.headers["content-type"], "text/event-stream");
    let (text, reason) = streamed_text(&streamed);
    assert_eq!(
        (text.as_str(), reason.as_str()),
        (pirate.text.as_str(), pirate.finish_reason.as_str())
    );
    let events = streamed.events();
    let usage: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], pirate.usage);
    let first: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["object"], "chat.completion.chunk");
}

/// Completions: a prompt with special tokens, answered as text_completion, whole and streamed.
async fn completions_answer_as_the_chat(addr: SocketAddr, question: &str, base_text: &str) {
    // The chat's prompt as token ids (the template adds a default system turn).
    let prompt = post(
        addr,
        "/tokenize",
        json!({"model": "smollm2", "messages": [{"role": "user", "content": question}]}),
    )
    .await
    .json()["tokens"]
        .clone();
    let completion = post(
        addr,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    let body = completion.json();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(
        body["choices"][0]["text"], base_text,
        "same prompt as the chat"
    );
    let streamed = post(
        addr,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": true}),
    )
    .await;
    assert_eq!(streamed_text(&streamed).0, base_text);
}

/// Stop strings end the answer early, with finish_reason stop.
async fn stop_strings_end_the_answer_early(addr: SocketAddr, question: &str, base_text: &str) {
    let word = base_text.split_whitespace().nth(1).unwrap().to_owned();
    let mut request = chat("smollm2", question, 12, false);
    request["stop"] = json!([word]);
    let stopped = post(addr, "/v1/chat/completions", request).await.json();
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    let cut = stopped["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert!(
        base_text.starts_with(cut) && !cut.contains(&word),
        "{cut:?} / {base_text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_tokenize_and_detokenize() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    post(
        addr,
        "/v1/chat/completions",
        chat("smollm2:tutor", "Hi", 2, false),
    )
    .await;
    let models = get(addr, "/v1/models").await.json();
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().unwrap();
    assert_eq!(data[0]["id"], "smollm2");
    assert!(data[0]["parent"].is_null());
    for adapter in ["chef", "patterns", "pirate", "poet", "tutor", "zero"] {
        let card = data
            .iter()
            .find(|c| c["id"] == format!("smollm2:{adapter}"))
            .unwrap_or_else(|| panic!("{adapter} is listed: {models}"));
        assert_eq!(card["parent"], "smollm2");
        assert_eq!(card["object"], "model");
        let loaded = !card["loaded_on"].as_array().unwrap().is_empty();
        assert_eq!(loaded, adapter == "tutor", "{card}");
    }

    let tokens = post(
        addr,
        "/tokenize",
        json!({"model": "smollm2", "prompt": "Hello world", "add_special_tokens": false}),
    )
    .await
    .json();
    assert_eq!(tokens["count"], 2, "{tokens}");
    let text = post(
        addr,
        "/detokenize",
        json!({"model": "smollm2", "tokens": tokens["tokens"]}),
    )
    .await
    .json();
    assert_eq!(text["prompt"], "Hello world");
    let chat_tokens = post(
        addr,
        "/tokenize",
        json!({"model": "smollm2:pirate", "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await
    .json();
    assert!(chat_tokens["count"].as_u64().unwrap() > 5, "{chat_tokens}");
    let bad = post(
        addr,
        "/detokenize",
        json!({"model": "smollm2", "tokens": [1, 999999]}),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "tokens");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_openai_errors() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let with = |extra: serde_json::Value| {
        let mut r = chat("smollm2", "Hi", 4, false);
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    };
    for (body, param) in [
        (with(json!({"max_tokens": -1})), "max_tokens"),
        (with(json!({"temperature": 5})), "temperature"),
        (with(json!({"messages": []})), "messages"),
        (with(json!({"n": 0})), "n"),
        (with(json!({"max_tokens": 100000})), "max_tokens"),
        (with(json!({"model": "smollm2:"})), "model"),
        (with(json!({"model": "smollm2:../etc"})), "model"),
    ] {
        let reply = post(addr, "/v1/chat/completions", body.clone()).await;
        assert_eq!(
            reply.status,
            400,
            "{body}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let error = &reply.json()["error"];
        assert_eq!(error["param"], param, "{body}: {error}");
        assert_eq!(error["code"], 400);
        assert!(error["message"].as_str().unwrap().len() > 5);
    }
    // A 2 MB prompt is refused without tokenizing it.
    let huge = "word ".repeat(400_000);
    let started = tokio::time::Instant::now();
    let reply = post(
        addr,
        "/v1/chat/completions",
        chat("smollm2", &huge, 4, false),
    )
    .await;
    assert_eq!(
        reply.status,
        400,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["error"]["param"], "messages");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));

    let unknown = post(
        addr,
        "/v1/chat/completions",
        chat("smollm2:nobody", "Hi", 4, false),
    )
    .await;
    assert_eq!(unknown.status, 404);
    let message = unknown.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    // It names the repository by its last component only: clients never see server paths.
    let repository = env_path("MODELMUX_TEST_ADAPTERS");
    let last = repository.file_name().unwrap().to_str().unwrap();
    assert!(
        message.contains("nobody") && message.contains(&format!("…/{last}")),
        "{message}"
    );
    assert!(!message.contains(repository.to_str().unwrap()), "{message}");
    let other_base = post(
        addr,
        "/v1/chat/completions",
        chat("llama:pirate", "Hi", 4, false),
    )
    .await;
    assert_eq!(other_base.status, 404);
    assert!(
        other_base.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("smollm2")
    );
    let not_json = send(addr, "POST", "/v1/chat/completions", &[], b"{nope".to_vec()).await;
    assert_eq!(not_json.status, 400);
    let wrong_method = get(addr, "/v1/chat/completions").await;
    assert_eq!(wrong_method.status, 405);
    let nowhere = get(addr, "/v2/anything").await;
    assert_eq!(nowhere.status, 404);
    // The answer names the path asked for and the API's endpoints as they are: they are not
    // file paths, and the redaction of server paths must leave them alone.
    let message = nowhere.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    for path in [
        "/v2/anything",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
    ] {
        assert!(
            message.contains(&format!("{path},")) || message.contains(&format!("{path}:")),
            "{path}: {message}"
        );
    }
    assert!(!message.contains('…'), "{message}");
    // Header and model disagreeing is refused.
    let clash = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("serve_multiplexed_model_id", "poet")],
        serde_json::to_vec(&chat("smollm2:pirate", "Hi", 4, false)).unwrap(),
    )
    .await;
    assert_eq!(clash.status, 400);
    // Nothing leaked: no sequence left running, no KV reserved.
    let metrics = metrics(addr).await;
    assert!(
        metric(&metrics, "modelmux_llm_sequences_running") == 0.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "modelmux_llm_kv_cache_used_bytes") == 0.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_unit_vectors_per_input_and_per_adapter() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let embed = |body: serde_json::Value| async move { post(addr, "/v1/embeddings", body).await };
    let vector = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let reply =
        embed(json!({"model": "smollm2", "input": ["The sky is blue.", "Paris is in France."]}))
            .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 6);
    let a = vector(&body["data"][0]["embedding"]);
    let b = vector(&body["data"][1]["embedding"]);
    assert_eq!(body["data"][1]["index"], 1);
    assert_eq!(a.len(), 576);
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
    assert!((dot(&a, &a) - 1.0).abs() < 1e-4);
    assert!(dot(&a, &b) < 0.99, "different texts, different vectors");
    // The same text alone gives the same vector; base64 carries the same floats.
    let alone = embed(
        json!({"model": "smollm2", "input": "The sky is blue.", "encoding_format": "base64"}),
    )
    .await
    .json();
    let encoded = alone["data"][0]["embedding"].as_str().unwrap();
    let bytes = base64_decode(encoded);
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, a);
    // An adapter moves it.
    let pirate = embed(json!({"model": "smollm2:pirate", "input": "The sky is blue."}))
        .await
        .json();
    let p = vector(&pirate["data"][0]["embedding"]);
    assert!(
        dot(&a, &p) < 0.9999,
        "the adapter changed nothing: {}",
        dot(&a, &p)
    );
    for (body, param) in [
        (
            json!({"model": "smollm2", "input": "x", "dimensions": 8}),
            "dimensions",
        ),
        (json!({"model": "smollm2", "input": ""}), "input"),
        (
            json!({"model": "smollm2", "input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
    ] {
        let r = embed(body.clone()).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param);
    }
    server.shutdown().await;
}

/// Standard base64, for checking the server's (no padding errors expected).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    digits
        .chunks(4)
        .flat_map(|c| {
            let n = c.iter().fold(0u32, |n, &d| (n << 6) | u32::from(d)) << (6 * (4 - c.len()));
            n.to_be_bytes()[1..c.len()].to_vec()
        })
        .collect()
}
