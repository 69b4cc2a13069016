//! The sampling parameters that change which token comes next reach the engine: a logit bias
//! of 100 forces its token, -100 bans the greedy choice, and a frequency penalty changes a
//! greedy answer (the arithmetic itself is checked against OpenAI's definition in
//! `modelmux-llm`'s sampler tests).

use crate::common;

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

/// `logprobs` in both of OpenAI's shapes: one entry per generated token, the chosen (greedy)
/// token first among its `top_logprobs`, probabilities at most 1, and a streamed answer's
/// entries equal to the whole answer's; on an adapter too (the values themselves are checked
/// against the reference's logits in `modelmux-llm`'s reference tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_in_chat_and_completion_shapes_streamed_and_not() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    for model in ["smollm2", "smollm2:pirate"] {
        let mut body = chat(model, "Name a colour.", 6, false);
        body["temperature"] = json!(0);
        body["logprobs"] = json!(true);
        body["top_logprobs"] = json!(3);
        let whole = post(addr, "/v1/chat/completions", body.clone())
            .await
            .json();
        let content = whole["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap_or_else(|| panic!("{whole}"))
            .clone();
        assert_eq!(
            content.len() as u64,
            whole["usage"]["completion_tokens"].as_u64().unwrap(),
            "{whole}"
        );
        for entry in &content {
            let top = entry["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3, "{entry}");
            assert_eq!(
                top[0]["token"], entry["token"],
                "greedy takes the most likely"
            );
            let lp = entry["logprob"].as_f64().unwrap();
            assert!(
                lp <= 0.0 && lp == top[0]["logprob"].as_f64().unwrap(),
                "{entry}"
            );
            assert!(top[1]["logprob"].as_f64().unwrap() <= lp);
            assert!(!entry["bytes"].as_array().unwrap().is_empty());
        }
        body["stream"] = json!(true);
        let streamed = post(addr, "/v1/chat/completions", body).await;
        let mut pieces = Vec::new();
        for event in streamed.events() {
            if event == "[DONE]" {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&event).unwrap();
            if let Some(c) = v["choices"][0]["logprobs"]["content"].as_array() {
                pieces.extend(c.iter().cloned());
            }
        }
        assert_eq!(
            pieces, content,
            "{model}: streamed entries differ from the whole answer's"
        );
    }
    // Completions: parallel lists, the alternatives as {token: logprob}.
    let reply = post(
        addr,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": "The sky is", "max_tokens": 5, "temperature": 0,
               "ignore_eos": true, "logprobs": 2}),
    )
    .await
    .json();
    let lp = &reply["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5, "{reply}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert_eq!(lp["text_offset"][0], 0);
    assert!(lp["top_logprobs"][0].as_object().unwrap().len() <= 2);
    let text: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        text, reply["choices"][0]["text"],
        "the tokens spell the text"
    );
    // Without logprobs there are none.
    let plain = post(
        addr,
        "/v1/chat/completions",
        chat("smollm2", "Hi", 2, false),
    )
    .await;
    assert!(plain.json()["choices"][0]["logprobs"].is_null());
    server.shutdown().await;
}

/// `n > 1`: one choice per index, greedy choices equal to each other, a streamed answer's
/// choices (interleaved chunks, told apart by `index`) equal to the whole answer's, usage
/// summed over the choices, and more choices than the engine runs at once refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_whole_and_streamed() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let mut body = chat("smollm2:pirate", "Tell me about ships.", 8, false);
    body["temperature"] = json!(0);
    body["n"] = json!(3);
    let whole = post(addr, "/v1/chat/completions", body.clone())
        .await
        .json();
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{whole}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            c["message"], choices[0]["message"],
            "greedy choices are equal"
        );
    }
    let single = whole["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(single % 3, 0, "{whole}");

    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let streamed = post(addr, "/v1/chat/completions", body).await;
    let mut texts = vec![String::new(); 3];
    let mut finished = [0; 3];
    let mut usage = None;
    for event in streamed.events() {
        if event == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&event).unwrap();
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            texts[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
            if !c["finish_reason"].is_null() {
                finished[i] += 1;
            }
        }
    }
    assert_eq!(finished, [1, 1, 1]);
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            text,
            choices[i]["message"]["content"].as_str().unwrap(),
            "choice {i}"
        );
    }
    assert_eq!(usage.unwrap()["completion_tokens"], single);
    assert_eq!(streamed.events().last().unwrap(), "[DONE]");

    let too_many = post(
        addr,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": "x", "max_tokens": 2, "n": 1000}),
    )
    .await;
    assert_eq!(too_many.status, 400);
    assert!(
        String::from_utf8_lossy(&too_many.body).contains("max_num_seqs"),
        "{}",
        String::from_utf8_lossy(&too_many.body)
    );
    server.shutdown().await;
}

/// Completions' `echo` (what evaluation harnesses send to score a text): the answer starts
/// with the prompt, and with `logprobs` its tokens come first in the lists (the first with a
/// null log probability), streamed and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_the_prompt_and_its_log_probabilities() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let prompt = "The capital of France is";
    let prompt_tokens = post(
        addr,
        "/tokenize",
        json!({"model": "smollm2", "prompt": prompt, "add_special_tokens": false}),
    )
    .await
    .json()["count"]
        .as_u64()
        .unwrap() as usize;
    let body = json!({"model": "smollm2:pirate", "prompt": prompt, "max_tokens": 3,
        "temperature": 0, "ignore_eos": true, "echo": true, "logprobs": 1});
    let whole = post(addr, "/v1/completions", body.clone()).await.json();
    let choice = &whole["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(
        text.starts_with(prompt) && text.len() > prompt.len(),
        "{whole}"
    );
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), prompt_tokens + 3, "{whole}");
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for i in 1..tokens.len() {
        let l = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(l <= 0.0, "{i}: {l}");
    }
    let spelled: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(spelled, text);

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let streamed = post(addr, "/v1/completions", streamed_body).await;
    let (mut streamed_text, mut streamed_tokens) = (String::new(), Vec::new());
    for event in streamed.events() {
        if event == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&event).unwrap();
        streamed_text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        if let Some(t) = v["choices"][0]["logprobs"]["token_logprobs"].as_array() {
            streamed_tokens.extend(t.iter().cloned());
        }
    }
    assert_eq!(streamed_text, text);
    assert_eq!(&streamed_tokens, lp["token_logprobs"].as_array().unwrap());

    // Without logprobs, the text alone.
    let mut plain = body;
    plain.as_object_mut().unwrap().remove("logprobs");
    let answer = post(addr, "/v1/completions", plain).await.json();
    assert_eq!(answer["choices"][0]["text"], text);
    assert!(answer["choices"][0]["logprobs"].is_null());
    server.shutdown().await;
}

/// `echo` with `max_tokens: 0` (how evaluation harnesses score a text): the prompt alone, its
/// log probabilities the same as when tokens follow, streamed and not; without `echo` and
/// `logprobs`, 0 is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_max_tokens_0_scores_the_prompt_alone() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let prompt = "The capital of France is";
    let scored = |max_tokens: usize, stream: bool| {
        json!({"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "echo": true, "logprobs": 1, "stream": stream})
    };
    let alone = post(addr, "/v1/completions", scored(0, false)).await.json();
    let choice = &alone["choices"][0];
    assert_eq!(choice["text"], prompt, "{alone}");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(alone["usage"]["completion_tokens"], 0);
    let with_tokens = post(addr, "/v1/completions", scored(2, false)).await.json();
    let lp = choice["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .clone();
    let longer = with_tokens["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(lp.len() + 2, longer.len(), "{alone}");
    assert!(lp[0].is_null());
    for (a, b) in lp.iter().zip(&longer).skip(1) {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
    let streamed = post(addr, "/v1/completions", scored(0, true)).await;
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    for event in streamed.events() {
        if event == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&event).unwrap();
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        if let Some(t) = v["choices"][0]["logprobs"]["token_logprobs"].as_array() {
            logprobs.extend(t.iter().cloned());
        }
    }
    assert_eq!(text, prompt);
    assert_eq!(logprobs, lp);

    for body in [
        json!({"model": "smollm2", "prompt": prompt, "max_tokens": 0, "echo": true}),
        json!({"model": "smollm2", "prompt": prompt, "max_tokens": 0, "logprobs": 1}),
    ] {
        let reply = post(addr, "/v1/completions", body).await;
        assert_eq!(reply.status, 400);
        assert_eq!(reply.json()["error"]["param"], "max_tokens");
    }
}
