//! The sampling parameters that change which token comes next reach the engine: a logit bias
//! of 100 forces its token, -100 bans the greedy choice, and a frequency penalty changes a
//! greedy answer (the arithmetic itself is checked against OpenAI's definition in
//! `modelmux-llm`'s sampler tests).

mod common;

use common::*;
use serde_json::json;

async fn greedy(addr: std::net::SocketAddr, extra: serde_json::Value) -> (String, Vec<u64>) {
    let mut body = json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 12,
                          "temperature": 0, "ignore_eos": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let reply = post(addr, "/v1/completions", body).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let text = reply.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let tokens = post(
        addr,
        "/tokenize",
        json!({"model": "smollm2", "prompt": text, "add_special_tokens": false}),
    )
    .await
    .json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    (text, tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_penalties_change_what_is_generated() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let (plain, plain_tokens) = greedy(addr, json!({})).await;
    // Banning the first greedy token changes the first token.
    let first = plain_tokens[0];
    let (banned, banned_tokens) =
        greedy(addr, json!({"logit_bias": {first.to_string(): -100}})).await;
    assert_ne!(
        banned_tokens.first(),
        Some(&first),
        "{plain:?} vs {banned:?}"
    );
    // Forcing a token (" cat") makes every generated token that one.
    let cat = post(
        addr,
        "/tokenize",
        json!({"model": "smollm2", "prompt": " cat", "add_special_tokens": false}),
    )
    .await
    .json()["tokens"][0]
        .as_u64()
        .unwrap();
    let (forced, _) = greedy(addr, json!({"logit_bias": {cat.to_string(): 100}})).await;
    assert_eq!(forced, " cat".repeat(12));
    // A frequency penalty makes the forced token give way once repeated enough: the same
    // request with the penalty is no longer all " cat".
    let (penalised, _) = greedy(
        addr,
        json!({"logit_bias": {cat.to_string(): 5}, "frequency_penalty": 2}),
    )
    .await;
    let (unpenalised, _) = greedy(addr, json!({"logit_bias": {cat.to_string(): 5}})).await;
    assert_ne!(penalised, unpenalised, "the penalty changed nothing");
    // Out of range or unknown tokens are 400s naming the field.
    for (extra, needle) in [
        (json!({"logit_bias": {"99999999": 1}}), "logit_bias"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
    ] {
        let mut body = json!({"model": "smollm2", "prompt": "x", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let reply = post(addr, "/v1/completions", body).await;
        assert_eq!(reply.status, 400, "{extra}");
        assert!(
            String::from_utf8_lossy(&reply.body).contains(needle),
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    server.shutdown().await;
}
