//! `/v1/completions` with a batch of prompts (a list of texts or of token lists), as vLLM and
//! OpenAI answer it: prompt `p`'s choice `i` is choice `p * n + i`, each the same as the
//! prompt alone would get, and the usage counts each prompt's tokens once.

use crate::common::{config, post, serve, streamed_text};

use serde_json::json;

fn completion(prompt: serde_json::Value, n: usize, stream: bool) -> serde_json::Value {
    json!({"model": "smollm2", "prompt": prompt, "max_tokens": 6, "temperature": 0,
           "n": n, "stream": stream, "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_prompts_answers_each_as_alone_in_order() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"];
    let mut alone = Vec::new();
    let mut prompt_tokens = 0;
    for p in prompts {
        let reply = post(addr, "/v1/completions", completion(json!(p), 1, false)).await;
        assert_eq!(reply.status, 200, "{:?}", reply.json());
        alone.push(
            reply.json()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        prompt_tokens += reply.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    for n in [1, 2] {
        let reply = post(
            addr,
            "/v1/completions",
            completion(json!(prompts), n, false),
        )
        .await;
        assert_eq!(reply.status, 200, "{:?}", reply.json());
        let body = reply.json();
        let choices = body["choices"].as_array().unwrap();
        assert_eq!(choices.len(), prompts.len() * n, "{body}");
        for (k, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], k, "{body}");
            assert_eq!(
                choice["text"],
                alone[k / n],
                "choice {k} of n = {n}: {body}"
            );
        }
        assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens, "{body}");
        assert_eq!(
            body["usage"]["completion_tokens"],
            6 * prompts.len() * n,
            "{body}"
        );
    }
    // Token lists too, and streamed: each choice's chunks carry its index.
    let ids = [vec![1, 9690, 198], vec![1, 4093, 198]];
    let reply = post(addr, "/v1/completions", completion(json!(ids), 1, true)).await;
    assert_eq!(reply.status, 200);
    let mut texts = vec![String::new(); 2];
    for event in reply.events().iter().filter(|e| *e != "[DONE]") {
        let v: serde_json::Value = serde_json::from_str(event).unwrap();
        if let Some(choice) = v["choices"].get(0) {
            let i = choice["index"].as_u64().unwrap() as usize;
            texts[i].push_str(choice["text"].as_str().unwrap_or_default());
        }
    }
    for (i, ids) in ids.iter().enumerate() {
        let one = post(addr, "/v1/completions", completion(json!(ids), 1, true)).await;
        assert_eq!(texts[i], streamed_text(&one).0, "prompt {i}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_batch_is_refused_naming_what_is_wrong() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let refused = |body: serde_json::Value, says: &'static str| async move {
        let reply = post(addr, "/v1/completions", body).await;
        assert_eq!(reply.status, 400, "{:?}", reply.json());
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains(says), "{message}");
        let param = if says.starts_with("echo") {
            "echo"
        } else {
            "prompt"
        };
        assert_eq!(reply.json()["error"]["param"], param);
    };
    refused(completion(json!([]), 1, false), "empty list").await;
    refused(completion(json!(vec!["x"; 257]), 1, false), "at most 256").await;
    refused(
        completion(json!([[1, 2], []]), 1, false),
        "at least one token",
    )
    .await;
    let mut echo = completion(json!(["a", "b"]), 1, false);
    echo["echo"] = json!(true);
    refused(echo, "echo with a batch").await;
    server.shutdown().await;
}
