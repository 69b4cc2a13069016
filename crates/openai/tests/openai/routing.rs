//! Adapters across replicas: concurrent streams over several adapters and the base model
//! answer exactly as they do one at a time, each adapter is loaded once (the router sends its
//! requests to the replica holding it), and a client that goes away frees its sequence.

use crate::common;

use std::time::Duration;

use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_over_adapters_equal_their_sequential_answers() {
    let models = [
        "smollm2",
        "smollm2:pirate",
        "smollm2:tutor",
        "smollm2:poet",
        "smollm2:chef",
    ];
    let prompts = [
        "Name a colour.",
        "What is 2 + 2?",
        "Say hello.",
        "Where is Rome?",
    ];
    let requests: Vec<(String, String)> = (0..16)
        .map(|i| (models[i % 5].to_owned(), prompts[i % 4].to_owned()))
        .collect();

    // One at a time.
    let alone = serve(&config(json!({})), 1).await;
    let mut expected = Vec::new();
    for (model, prompt) in &requests {
        let reply = post(
            alone.local_addr(),
            "/v1/chat/completions",
            chat(model, prompt, 10, false),
        )
        .await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        expected.push(
            reply.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    alone.shutdown().await;

    // All at once, streamed, on two replicas.
    let server = serve(&config(json!({})), 2).await;
    let addr = server.local_addr();
    let tasks: Vec<_> = requests
        .iter()
        .map(|(model, prompt)| {
            let body = chat(model, prompt, 10, true);
            tokio::spawn(async move { post(addr, "/v1/chat/completions", body).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let reply = task.await.unwrap();
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let (text, _) = streamed_text(&reply);
        assert_eq!(text, expected[i], "request {i}: {:?}", requests[i]);
    }
    // Each adapter was loaded once, on one replica, and is listed there.
    let text = metrics(addr).await;
    assert_eq!(metric(&text, "modelmux_model_loads_total"), 4.0, "{text}");
    let listed = get(addr, "/v1/models").await.json();
    for model in &models[1..] {
        let card = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == *model)
            .unwrap();
        assert_eq!(card["loaded_on"].as_array().unwrap().len(), 1, "{card}");
    }
    assert_eq!(metric(&text, "modelmux_llm_sequences_running"), 0.0);
    assert_eq!(metric(&text, "modelmux_llm_requests_total"), 16.0);
    // Each request's first token, once.
    assert_eq!(
        metric(&text, "modelmux_llm_time_to_first_token_seconds_count"),
        16.0,
        "{text}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_stream_frees_its_sequence() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let mut body = chat("smollm2:pirate", "Tell me a long story.", 800, true);
    body["ignore_eos"] = json!(true);
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let connection = tokio::spawn(conn);
    let request = hyper::Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(
            serde_json::to_vec(&body).unwrap(),
        )))
        .unwrap();
    let mut response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    // Read a few chunks: the sequence is running.
    for _ in 0..3 {
        response.body_mut().frame().await.unwrap().unwrap();
    }
    assert_eq!(
        metric(&metrics(addr).await, "modelmux_llm_sequences_running"),
        1.0
    );
    drop(response);
    drop(sender);
    connection.abort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics(addr).await;
        if metric(&text, "modelmux_llm_sequences_running") == 0.0 {
            assert_eq!(
                metric(&text, "modelmux_llm_kv_cache_used_bytes"),
                0.0,
                "{text}"
            );
            // It stopped long before its 800 tokens.
            assert!(
                metric(&text, "modelmux_llm_generation_tokens_total") < 400.0,
                "{text}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sequence still runs: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.shutdown().await;
}
