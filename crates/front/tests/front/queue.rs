//! The queue in front of a deployment's replicas: first come, first served; requests that
//! leave it (timed out, or their client hung up) give back what they held, and cold requests
//! whose clients left cost no model loads; blocking work keeps its slot until it ends.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Counters, counted, get, get_model};
use http::StatusCode;
use modelmux_cache::Multiplexer;
use modelmux_front::Server;
use modelmux_serve::{Body, BoxError, Deployment, DeploymentSpec, Request, Response};

/// How many requests one replica (or all of them) runs at once, and the most it ever ran,
/// counted by the deployment itself: the server's own counters are what is being tested.
#[derive(Default)]
struct Concurrency {
    running: AtomicUsize,
    peak: AtomicUsize,
}

impl Concurrency {
    fn enter(self: &Arc<Self>) -> Running {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Running(self.clone())
    }
}

/// Counted down on drop, so also when the request is cancelled (its client hung up).
struct Running(Arc<Concurrency>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Records the order requests start in (by their `x-seq` header) and how many run at once,
/// per replica and in all; each takes `delay`, or `x-delay-ms`.
struct Recorder {
    delay: Duration,
    order: Arc<parking_lot::Mutex<Vec<u32>>>,
    all: Arc<Concurrency>,
    replica: Arc<Concurrency>,
}

impl Deployment for Recorder {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let _all = self.all.enter();
        let _replica = self.replica.enter();
        if let Some(seq) = request.headers().get("x-seq") {
            self.order.lock().push(seq.to_str()?.parse()?);
        }
        let delay = match request.headers().get("x-delay-ms") {
            Some(ms) => Duration::from_millis(ms.to_str()?.parse()?),
            None => self.delay,
        };
        tokio::time::sleep(delay).await;
        Ok(Response::new(Body::from("ok")))
    }
}

struct Recorded {
    order: Arc<parking_lot::Mutex<Vec<u32>>>,
    all: Arc<Concurrency>,
    /// One per replica started.
    replicas: Arc<parking_lot::Mutex<Vec<Arc<Concurrency>>>>,
}

async fn start(
    replicas: usize,
    max_ongoing: usize,
    delay: Duration,
    queue_timeout: Duration,
) -> (Server, Recorded) {
    let recorded = Recorded {
        order: Arc::default(),
        all: Arc::default(),
        replicas: Arc::default(),
    };
    let (order, all, each) = (
        recorded.order.clone(),
        recorded.all.clone(),
        recorded.replicas.clone(),
    );
    let spec = DeploymentSpec::new("Recorder", move |_ctx| {
        let (order, all) = (order.clone(), all.clone());
        let replica = Arc::new(Concurrency::default());
        each.lock().push(replica.clone());
        async move {
            Ok(Recorder {
                delay,
                order,
                all,
                replica,
            })
        }
    })
    .num_replicas(replicas)
    .max_ongoing_requests(max_ongoing)
    .max_queued_requests(10_000)
    .queue_timeout(queue_timeout);
    let server = common::serve(spec).await;
    (server, recorded)
}

/// Polls `check` every 10 ms until it holds; panics with `what` after 10 s.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_are_served_in_arrival_order_and_newcomers_do_not_overtake() {
    let (server, recorded) = start(1, 1, Duration::from_millis(80), Duration::from_secs(30)).await;
    let addr = server.local_addr();
    let mut requests = Vec::new();
    for seq in 0..12u32 {
        requests.push(tokio::spawn(async move {
            let seq = seq.to_string();
            get(addr, "/", &[("x-seq", &seq)]).await.status
        }));
        // The next one is sent once this one has arrived (started, or queued), so the arrival
        // order is certain however late a busy machine runs the client's task.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let models = get(addr, "/-/models", &[]).await.json();
            let queued = models["applications"][0]["deployments"][0]["queued_requests"]
                .as_u64()
                .unwrap();
            if recorded.order.lock().len() as u64 + queued > u64::from(seq) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "request {seq} never arrived"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for r in requests {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(
        *recorded.order.lock(),
        (0..12).collect::<Vec<_>>(),
        "served out of arrival order"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stampede_with_clients_leaving_keeps_every_slot_and_never_exceeds_capacity() {
    // 2 replicas x 3 slots; 400 requests from 100 clients, a third of whom hang up while
    // queued or while served, and a short queue timeout that some requests hit.
    let (server, recorded) =
        start(2, 3, Duration::from_millis(5), Duration::from_millis(400)).await;
    let addr = server.local_addr();
    let served = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..100)
        .map(|c| {
            let served = served.clone();
            tokio::spawn(async move {
                for i in 0..4 {
                    let request = get(addr, "/", &[]);
                    if (c + i) % 3 == 0 {
                        // Hang up after a moment, wherever the request is.
                        let _ = tokio::time::timeout(Duration::from_millis(3), request).await;
                    } else {
                        let status = request.await.status;
                        assert!(
                            status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
                            "{status}"
                        );
                        if status == StatusCode::OK {
                            served.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    assert!(served.load(Ordering::SeqCst) > 100);
    // Never more than a replica's slots on any replica, as the replicas themselves count.
    let replicas = recorded.replicas.lock().clone();
    assert_eq!(replicas.len(), 2);
    for (i, replica) in replicas.iter().enumerate() {
        let peak = replica.peak.load(Ordering::SeqCst);
        assert!(
            peak <= 3,
            "replica {i} ran {peak} requests at once on 3 slots"
        );
    }
    // Nothing leaked: six slow requests all run at once (a slot lost on either replica would
    // leave one of them queued), and the server's own view agrees once they are done.
    // (A client that hung up may have left its request in the replica for a moment longer.)
    eventually("requests still running after every client ended", || {
        recorded.all.running.load(Ordering::SeqCst) == 0
    })
    .await;
    let slow: Vec<_> = (0..6)
        .map(|_| tokio::spawn(async move { get(addr, "/", &[("x-delay-ms", "1500")]).await }))
        .collect();
    eventually(
        "six slow requests did not all run at once: a slot leaked",
        || recorded.all.running.load(Ordering::SeqCst) == 6,
    )
    .await;
    for s in slow {
        assert_eq!(s.await.unwrap().status, StatusCode::OK);
    }
    let models = get(addr, "/-/models", &[]).await.json();
    let deployment = &models["applications"][0]["deployments"][0];
    assert_eq!(deployment["queued_requests"], 0, "{models}");
    for r in deployment["replicas"].as_array().unwrap() {
        assert_eq!(r["ongoing_requests"], 0, "a slot leaked: {models}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_requests_whose_clients_hung_up_cause_no_loads() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(4).max_concurrent_loads(1),
        Duration::from_millis(300),
        Duration::ZERO,
    )
    .num_replicas(2)
    .max_queued_requests(1000);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    // Warm models on both replicas, to see they are not evicted by abandoned loads.
    for m in ["warm-0", "warm-1"] {
        assert_eq!(get_model(addr, m).await.status, StatusCode::OK);
    }
    let warm_loads = counters.loads.load(Ordering::SeqCst);
    let abandoned: Vec<_> = (0..60)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("cold-{i}");
                let _ = tokio::time::timeout(Duration::from_millis(20), get_model(addr, &id)).await;
            })
        })
        .collect();
    for a in abandoned {
        a.await.unwrap();
    }
    // Long enough for every queued load to have run, had it not been dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let loads = counters.loads.load(Ordering::SeqCst) - warm_loads;
    assert!(
        loads <= 2,
        "{loads} loads for 60 cold requests whose clients left at 20 ms (one may have started per replica)"
    );
    // A new model right after is not stuck behind them, and the warm ones stayed.
    let started = tokio::time::Instant::now();
    assert_eq!(get_model(addr, "fresh").await.status, StatusCode::OK);
    // Behind the 60 abandoned loads it would wait for them (30 loads of 300 ms per replica):
    // 3 s is 10x its own load.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a new model waited behind abandoned loads: {:?}",
        started.elapsed()
    );
    let before = counters.loads.load(Ordering::SeqCst);
    for m in ["warm-0", "warm-1"] {
        assert_eq!(get_model(addr, m).await.status, StatusCode::OK);
    }
    assert_eq!(
        counters.loads.load(Ordering::SeqCst),
        before,
        "warm models were evicted"
    );
    server.shutdown().await;
}

/// Runs each request's work on the blocking pool for `work`, recording how many run at once.
struct BlockingWork {
    work: Duration,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Deployment for BlockingWork {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let (work, running, peak) = (self.work, self.running.clone(), self.peak.clone());
        modelmux_context::spawn_blocking(move || {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(work);
            running.fetch_sub(1, Ordering::SeqCst);
        })
        .await?;
        Ok(Response::new(Body::from("ok")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_work_holds_its_slot_until_it_ends_though_its_client_left() {
    let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (r, p) = (running.clone(), peak.clone());
    let spec = DeploymentSpec::new("Blocking", move |_ctx| {
        let (running, peak) = (r.clone(), p.clone());
        async move {
            Ok(BlockingWork {
                work: Duration::from_millis(300),
                running,
                peak,
            })
        }
    })
    .max_ongoing_requests(1)
    .max_queued_requests(100);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    // A client that hangs up while its work runs.
    let _ = tokio::time::timeout(Duration::from_millis(60), get(addr, "/", &[])).await;
    let models = get(addr, "/-/models", &[]).await.json();
    let replica = &models["applications"][0]["deployments"][0]["replicas"][0];
    assert_eq!(
        replica["ongoing_requests"], 1,
        "the work still runs, so its slot is still taken: {models}"
    );
    // More clients that leave, then one that waits: one slot, so one piece of work at a time.
    for _ in 0..3 {
        let _ = tokio::time::timeout(Duration::from_millis(40), get(addr, "/", &[])).await;
    }
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "blocking work of abandoned requests ran beside newer work on a single slot"
    );
    server.shutdown().await;
}

/// Serves any model after loading it; the load of `cold` waits until the test opens `gate`.
struct Gated {
    models: Multiplexer<Nothing>,
}

impl Deployment for Gated {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let id = modelmux_context::multiplexed_model_id().ok_or("no model named")?;
        let _model = modelmux_serve::waiting_for_load(self.models.get(id.as_str())).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(Response::new(Body::from("ok")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_load_does_not_keep_loaded_models_waiting() {
    // One replica, one slot; the cold model's load lasts until the test ends it, so the warm
    // requests can only be served beside it if the waiting request gave its slot back.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let spec = DeploymentSpec::new("Gated", move |ctx| {
        let gate = g.clone();
        async move {
            let models = ctx.multiplexer(
                Multiplexer::builder().max_models(4),
                move |id: modelmux_cache::ModelId| {
                    let gate = gate.clone();
                    async move {
                        if id.as_str() == "cold" {
                            let _open = gate.acquire().await?;
                        }
                        Ok::<_, BoxError>(Nothing)
                    }
                },
            );
            Ok(Gated { models })
        }
    })
    .max_ongoing_requests(1)
    .max_queued_requests(100);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    assert_eq!(get_model(addr, "warm").await.status, StatusCode::OK);
    let cold = tokio::spawn(async move { get_model(addr, "cold").await });
    let waiting = || async move {
        let models = get(addr, "/-/models", &[]).await.json();
        models["applications"][0]["deployments"][0]["replicas"][0].clone()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while waiting().await["waiting_for_load"] != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cold request never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiting().await["ongoing_requests"], 0);
    // The warm model is served while the cold one loads, one request at a time.
    for _ in 0..5 {
        assert_eq!(get_model(addr, "warm").await.status, StatusCode::OK);
    }
    assert!(
        !cold.is_finished(),
        "the cold load is still held at the gate"
    );
    gate.add_permits(1);
    assert_eq!(cold.await.unwrap().status, StatusCode::OK);
    assert_eq!(waiting().await["waiting_for_load"], 0);
    server.shutdown().await;
}

/// Gives up waiting for a slow model after 50 ms, then works 300 ms without it.
struct GivesUp {
    models: Multiplexer<Nothing>,
}

struct Nothing;

impl modelmux_cache::Model for Nothing {}

impl Deployment for GivesUp {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let wait = modelmux_serve::waiting_for_load(self.models.get("slow"));
        let _ = tokio::time::timeout(Duration::from_millis(50), wait).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(Response::new(Body::from("done without it")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_stops_waiting_for_a_load_takes_its_slot_back() {
    let spec = DeploymentSpec::new("GivesUp", |ctx| async move {
        let models = ctx.multiplexer(Multiplexer::builder(), |_id| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, BoxError>(Nothing)
        });
        Ok(GivesUp { models })
    })
    .max_ongoing_requests(1);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    let request = tokio::spawn(async move { get(addr, "/", &[]).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let models = get(addr, "/-/models", &[]).await.json();
    let replica = &models["applications"][0]["deployments"][0]["replicas"][0];
    assert_eq!(
        (&replica["ongoing_requests"], &replica["waiting_for_load"]),
        (&serde_json::json!(1), &serde_json::json!(0)),
        "the request works on without its load, so it holds its slot again: {models}"
    );
    assert_eq!(request.await.unwrap().status, StatusCode::OK);
    server.shutdown().await;
}
