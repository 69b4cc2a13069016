//! vLLM's `/v1/score` and `/v1/rerank` against cosines computed here from `/v1/embeddings`,
//! and the rest of Ray's `LLMServer` surface: each method works or answers 501 naming it.

use crate::common;

use std::net::SocketAddr;

use common::*;
use serde_json::{Value, json};

async fn embedding(addr: SocketAddr, text: &str) -> Vec<f64> {
    let reply = post(
        addr,
        "/v1/embeddings",
        json!({"model": "smollm2", "input": text}),
    )
    .await;
    assert_eq!(reply.status, 200);
    reply.json()["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// Cosine similarity, written out from its definition.
fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// The one replica's answer to a control.
fn answer(reply: &Reply) -> Value {
    let body = reply.json();
    let replicas = body["replicas"].as_object().unwrap();
    assert_eq!(replicas.len(), 1, "{body}");
    replicas.values().next().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_and_reranking_are_cosines_of_the_embeddings() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let query = "Where is the Eiffel Tower?";
    let docs = [
        "Bananas are rich in potassium.",
        "The Eiffel Tower is in Paris.",
        "Where is the Eiffel Tower?",
        "Quantum chromodynamics describes the strong force.",
    ];
    let q = embedding(addr, query).await;
    let mut want = Vec::new();
    for d in docs {
        want.push(cosine(&q, &embedding(addr, d).await));
    }

    let reply = post(
        addr,
        "/v1/score",
        json!({"model": "smollm2", "text_1": query, "text_2": docs}),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), docs.len());
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i);
        assert_eq!(item["object"], "score");
        let got = item["score"].as_f64().unwrap();
        assert!((got - want[i]).abs() < 1e-5, "{i}: {got} vs {}", want[i]);
    }
    assert!(
        (want[2] - 1.0).abs() < 1e-5,
        "a text scores 1 against itself"
    );
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 10);

    let reply = post(
        addr,
        "/v1/rerank",
        json!({"model": "smollm2", "query": query, "documents": docs, "top_n": 3}),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let results = reply.json()["results"].as_array().unwrap().clone();
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
    assert_eq!(results.len(), 3);
    for (rank, result) in results.iter().enumerate() {
        let index = result["index"].as_u64().unwrap() as usize;
        assert_eq!(index, order[rank], "rank {rank}: {results:?}");
        assert_eq!(result["document"]["text"], docs[index]);
    }

    // Bad requests name the field.
    let reply = post(
        addr,
        "/v1/score",
        json!({"model": "smollm2", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["param"], "text_2");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_llm_server_method_works_or_says_it_is_not_implemented() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let reply = post(addr, "/v1/audio/transcriptions", json!({})).await;
    assert_eq!(reply.status, 501);
    let error: Value = reply.json();
    assert_eq!(error["error"]["type"], "not_implemented");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/audio/transcriptions"),
        "{error}"
    );
    for (name, status) in [
        ("is_paused", 200),
        ("is_sleeping", 200),
        ("llm_config", 200),
        ("reset_prefix_cache", 200),
        ("start_profile", 501),
        ("stop_profile", 501),
        ("collective_rpc", 501),
    ] {
        let reply = control(addr, name).await;
        assert_eq!(
            reply.status,
            status,
            "{name}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        if status == 501 {
            let message = answer(&reply)["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(message.contains(name), "{name}: {message}");
        }
    }
    assert_eq!(answer(&control(addr, "is_paused").await)["paused"], false);
    assert_eq!(control(addr, "pause").await.status, 200);
    assert_eq!(answer(&control(addr, "is_paused").await)["paused"], true);
    assert_eq!(answer(&control(addr, "is_sleeping").await)["asleep"], false);
    let config = answer(&control(addr, "llm_config").await);
    assert_eq!(config["model_id"], "smollm2", "{config}");
    assert!(config["engine_kwargs"]["max_model_len"].as_u64().unwrap() > 0);
    // Quantized weights keep their KV cache in binary16 unless told otherwise.
    assert_eq!(config["engine_kwargs"]["kv_cache_dtype"], "f16", "{config}");
    server.shutdown().await;
}
