//! The OpenAI API while its LLM replicas start: `/v1/models` answers 503 (as `/health` does)
//! until they are up, and a chat sent meanwhile waits for them instead of being refused. The
//! LLM deployment here is a stand-in that starts when the test says so and answers every
//! request with 200: what is tested is the ingress and the router in front of it.

use crate::common::{self, chat, config};

use std::sync::Arc;
use std::time::Duration;

use modelmux_front::Server;
use modelmux_openai::llm_deployments;
use modelmux_serve::{Application, Body, BoxError, Deployment, DeploymentSpec, Request, Response};
use tokio::sync::{Notify, oneshot};

struct Answers;

impl Deployment for Answers {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        Ok(Response::new(Body::from(r#"{"answered": true}"#)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_chats_wait_for_the_llm_replicas_to_start() {
    let both = llm_deployments(
        "llm",
        &config(serde_json::json!({})),
        "/",
        None,
        &Default::default(),
    )
    .unwrap();
    let release = Arc::new(Notify::new());
    let held = {
        let release = release.clone();
        DeploymentSpec::new(&both.server.config().name, move |_ctx| {
            let release = release.clone();
            async move {
                release.notified().await;
                Ok(Answers)
            }
        })
    };
    let (tx, rx) = oneshot::channel();
    let start = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .on_listening(move |addr| {
            let _ = tx.send(addr);
        })
        .application(
            Application::new("llm")
                .ingress(both.ingress)
                .deployment(held),
        )
        .start();
    let task = tokio::spawn(start);
    let addr = rx.await.unwrap();
    // The ingress starts first; then only the LLM deployment is loading.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let health = common::get(addr, "/health").await;
        assert_eq!(health.status, 503, "{:?}", health.json());
        if health.json()["loading"] == serde_json::json!(["llm/llm"]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            health.json()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let models = common::get(addr, "/v1/models").await;
    assert_eq!(models.status, 503, "{:?}", models.json());
    assert!(models.headers.contains_key("retry-after"));
    assert!(
        models.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("loading"),
        "{:?}",
        models.json()
    );
    let early = tokio::spawn(common::post(
        addr,
        "/v1/chat/completions",
        chat("smollm2", "hi", 4, false),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !early.is_finished(),
        "a chat was answered before its replicas started"
    );
    release.notify_one();
    let answer = tokio::time::timeout(Duration::from_secs(10), early)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert_eq!(answer.json()["answered"], true);
    let server = task.await.unwrap().unwrap();
    let models = common::get(addr, "/v1/models").await;
    assert_eq!(models.status, 200, "{:?}", models.json());
    assert_eq!(models.json()["data"][0]["id"], "smollm2");
    server.shutdown().await;
}
