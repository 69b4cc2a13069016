//! The replica's own answers, with the test model.
use super::*;
use crate::params::TokenizeInput;

/// A replica of the test model (it must be there: the test fails, never skips, without it).
async fn server() -> LlmServer {
    let gguf = std::env::var("MODELMUX_TEST_GGUF").unwrap_or_else(|_| {
        panic!("MODELMUX_TEST_GGUF is not set: run the tests with ./scripts/test")
    });
    let runtime = LlmRuntime::load(&gguf, None, modelmux_llm::RuntimeOptions::default())
        .await
        .unwrap();
    LlmServer {
        idle: None,
        metrics: Arc::new(LlmMetrics::new(&runtime)),
        max_prompt_bytes: longest_token(runtime.tokenizer()) * 512,
        runtime: Arc::new(runtime),
        stream_interval: Duration::ZERO,
        replica: "r".into(),
    }
}

fn refused_param(e: ServeError) -> String {
    match e {
        ServeError::InvalidParameter { param, .. } => param,
        other => panic!("not a 400 naming a parameter: {other}"),
    }
}

/// `/detokenize` takes at most the context's length of ids, each in the vocabulary, and
/// decodes them on the blocking pool, not on the async worker.
#[test]
fn detokenize_is_bounded_and_decodes_off_the_async_worker() {
    crate::test_pool::runtime().block_on(async {
        let server = server().await;
        let context = server.context();
        let tokenizer = server.runtime.tokenizer();
        let long = (0..tokenizer.vocab_size() as u32)
            .max_by_key(|&id| tokenizer.token_bytes(id).len())
            .unwrap();
        let too_many = server
            .detokenize(vec![long; context + 1])
            .await
            .unwrap_err();
        assert_eq!(refused_param(too_many), "tokens");
        let outside = server.detokenize(vec![1, 1 << 30]).await.unwrap_err();
        assert_eq!(refused_param(outside), "tokens");

        let ids = vec![long; context];
        let (inline, answer) = crate::test_pool::ran_inline(server.detokenize(ids.clone())).await;
        assert!(!inline, "decoded on the async worker");
        let body = answer.unwrap().into_body().to_bytes(1 << 24).await.unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["prompt"], tokenizer.decode(&ids));
    });
}

/// A replica parses a request only when it arrives without the ingress's parsed call: with
/// one, the body is not read (here it is not even JSON, and the answer is the call's).
#[tokio::test]
async fn a_replica_answers_the_parsed_call_and_parses_only_a_request_without_one() {
    let server = server().await;
    let request = |parsed: bool| {
        let mut request = http::Request::post("/tokenize")
            .body(modelmux_serve::Body::from("not json"))
            .unwrap();
        if parsed {
            let call = LlmCall::Tokenize(TokenizeInput::Text {
                text: "Hello".into(),
                add_special: false,
            });
            request.extensions_mut().insert(Parsed::new(call));
        }
        request
    };
    let answer = server.call(request(true)).await.unwrap();
    assert_eq!(answer.status(), http::StatusCode::OK);
    let body = answer.into_body().to_bytes(1 << 16).await.unwrap();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(json["count"].as_u64().unwrap() >= 1, "{json}");

    let refused = server.call(request(false)).await.unwrap_err();
    let refused = refused.downcast::<ServeError>().unwrap();
    assert_eq!(
        refused.http_status(),
        http::StatusCode::BAD_REQUEST,
        "{refused}"
    );
}
