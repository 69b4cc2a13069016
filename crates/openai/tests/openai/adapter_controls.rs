//! vLLM's adapter controls over the OpenAI API: `/v1/load_lora_adapter` and
//! `/v1/unload_lora_adapter`, behind the admin token, seen in `/v1/models`.

use std::net::SocketAddr;

use crate::common;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_are_loaded_and_unloaded_with_vllms_controls_behind_the_admin_token() {
    let server = serve_with_admin_token("secret").await;
    let addr = server.local_addr();
    let no_token = admin_post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "poet"}),
        None,
    )
    .await;
    assert_eq!(no_token.status, 401);
    let wrong = admin_post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "poet"}),
        Some("guess"),
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert!(!loaded(
        &get(addr, "/v1/models").await.json(),
        "smollm2:poet"
    ));

    let ok = admin_post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "poet"}),
        Some("secret"),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    // vLLM's answer: a line of text saying it worked (the replica in a header, too).
    let text = String::from_utf8_lossy(&ok.body);
    assert!(
        text.contains("success") && text.contains("'poet'"),
        "{text}"
    );
    assert!(
        ok.headers["x-modelmux-loaded-on"]
            .to_str()
            .unwrap()
            .starts_with("llm#"),
        "{:?}",
        ok.headers
    );
    assert!(loaded(
        &get(addr, "/v1/models").await.json(),
        "smollm2:poet"
    ));
    let elsewhere = admin_post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "smollm2:chef", "lora_path": "/tmp/anything"}),
        Some("secret"),
    )
    .await;
    // Another path registers the name for it, but only below lora_config.allowed_sources
    // (none here).
    assert_eq!(
        elsewhere.status,
        403,
        "{}",
        String::from_utf8_lossy(&elsewhere.body)
    );
    assert!(
        elsewhere.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allowed_sources"),
        "{}",
        elsewhere.json()
    );
    let missing = admin_post(
        addr,
        "/v1/load_lora_adapter",
        json!({"lora_name": "nobody"}),
        Some("secret"),
    )
    .await;
    assert_eq!(missing.status, 404);

    let gone = admin_post(
        addr,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "poet"}),
        Some("secret"),
    )
    .await;
    assert_eq!(gone.status, 200, "{}", String::from_utf8_lossy(&gone.body));
    let text = String::from_utf8_lossy(&gone.body);
    assert!(
        text.contains("success") && text.contains("from 1 replica"),
        "{text}"
    );
    assert!(!loaded(
        &get(addr, "/v1/models").await.json(),
        "smollm2:poet"
    ));
    let again = admin_post(
        addr,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "poet"}),
        Some("secret"),
    )
    .await;
    assert_eq!(again.status, 404);
    server.shutdown().await;
}

/// A server as [`serve`] starts one (one replica), whose admin token is `token`.
async fn serve_with_admin_token(token: &str) -> modelmux_front::Server {
    let config = config(json!({}));
    let both = modelmux_openai::llm_deployments(
        "llm",
        &config,
        "/",
        None,
        &modelmux_serve::AdminAccess::with_token(token),
    )
    .unwrap();
    modelmux_front::Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .application(
            modelmux_serve::Application::new("llm")
                .ingress(both.ingress)
                .deployment(both.server),
        )
        .start()
        .await
        .unwrap()
}

/// POSTs `body` to an admin endpoint, with `token` as the bearer token if there is one.
async fn admin_post(
    addr: SocketAddr,
    path: &str,
    body: serde_json::Value,
    token: Option<&str>,
) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    send(
        addr,
        "POST",
        path,
        &headers,
        serde_json::to_vec(&body).unwrap(),
    )
    .await
}

/// Whether `/v1/models`' card `id` says a replica holds it.
fn loaded(models: &serde_json::Value, id: &str) -> bool {
    models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .map(|c| !c["loaded_on"].as_array().unwrap().is_empty())
        .unwrap()
}
