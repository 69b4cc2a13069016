//! A request that gave its slot back while its model loaded takes a slot back before any
//! newcomer: on a replica with one slot, it runs before a request that arrived after its load
//! ended, though that one was queued first.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{get, get_model};
use http::StatusCode;
use modelmux_cache::{ModelId, Multiplexer};
use modelmux_serve::{Body, BoxError, Deployment, DeploymentSpec, Request, Response};

struct Nothing;

impl modelmux_cache::Model for Nothing {}

/// Serves any model; the load of `cold` waits for `load_gate`, and a request with `x-hold`
/// waits for `hold_gate` once it has its model. Logs each request's `x-seq` when it has its
/// model and a slot.
struct Gated {
    models: Multiplexer<Nothing>,
    hold_gate: Arc<tokio::sync::Semaphore>,
    log: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Deployment for Gated {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let id = modelmux_context::multiplexed_model_id().ok_or("no model named")?;
        let _model = modelmux_serve::waiting_for_load(self.models.get(id.as_str())).await?;
        if let Some(seq) = request.headers().get("x-seq") {
            self.log.lock().push(seq.to_str()?.to_string());
        }
        if request.headers().contains_key("x-hold") {
            let _open = self.hold_gate.acquire().await?;
        }
        Ok(Response::new(Body::from("ok")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_back_from_its_load_goes_before_newcomers() {
    let load_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let hold_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let log: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    let (lg, hg, l) = (load_gate.clone(), hold_gate.clone(), log.clone());
    let spec = DeploymentSpec::new("Gated", move |ctx| {
        let (load_gate, hold_gate, log) = (lg.clone(), hg.clone(), l.clone());
        async move {
            let models =
                ctx.multiplexer(Multiplexer::builder().max_models(4), move |id: ModelId| {
                    let gate = load_gate.clone();
                    async move {
                        if id.as_str() == "cold" {
                            let _open = gate.acquire().await?;
                        }
                        Ok::<_, BoxError>(Nothing)
                    }
                });
            Ok(Gated {
                models,
                hold_gate,
                log,
            })
        }
    })
    .max_ongoing_requests(1)
    .max_queued_requests(10);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    let replica = || async move {
        let models = get(addr, "/-/models", &[]).await.json();
        models["applications"][0]["deployments"][0].clone()
    };
    let until = |what: &'static str, check: Box<dyn Fn(&serde_json::Value) -> bool + Send>| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let deployment = replica().await;
            if check(&deployment) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: {deployment}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert_eq!(get_model(addr, "warm").await.status, StatusCode::OK);
    // "loaded" waits for its load without a slot; "holder" then takes the slot and keeps it.
    let loaded = tokio::spawn(async move {
        get(
            addr,
            "/",
            &[("serve_multiplexed_model_id", "cold"), ("x-seq", "loaded")],
        )
        .await
    });
    until(
        "the cold request waits for its load",
        Box::new(|d| d["replicas"][0]["waiting_for_load"] == 1),
    )
    .await;
    let holder = tokio::spawn(async move {
        get(
            addr,
            "/",
            &[
                ("serve_multiplexed_model_id", "warm"),
                ("x-seq", "holder"),
                ("x-hold", "1"),
            ],
        )
        .await
    });
    while !log.lock().iter().any(|s| s == "holder") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The load ends; its request now wants a slot back, and the holder has it.
    load_gate.add_permits(1);
    until(
        "the cold model loads",
        Box::new(|d| {
            d["replicas"][0]["loaded"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["id"] == "cold"))
        }),
    )
    .await;
    // A newcomer arrives after the load ended and queues for the slot.
    let newcomer = tokio::spawn(async move {
        get(
            addr,
            "/",
            &[
                ("serve_multiplexed_model_id", "warm"),
                ("x-seq", "newcomer"),
            ],
        )
        .await
    });
    until(
        "the newcomer queues",
        Box::new(|d| d["queued_requests"] == 1),
    )
    .await;
    hold_gate.add_permits(1);
    for r in [holder, loaded, newcomer] {
        assert_eq!(r.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        *log.lock(),
        ["holder", "loaded", "newcomer"],
        "the request back from its load must take the freed slot first"
    );
    server.shutdown().await;
}
