//! Autoscaling end to end on a paused clock: the controller's loop measures a deployment's
//! load, decides with Ray's policy and scales through the live add-and-drain. A rising load
//! adds replicas up to `max_replicas`, a falling one drains them (the models in use that only
//! a leaver held are loaded on a survivor first: no cold load afterwards), and a deployment at
//! `min_replicas: 0` starts a replica for the first request that finds none, refusing what
//! overflows its queue meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{BoxError, ModelId, Multiplexer};
use modelmux_context::RequestContext;
use modelmux_serve::{
    Application, AutoscalingConfig, Body, Controller, Deployment, DeploymentSpec, Request,
    Response, Route, ServeError,
};
use tokio::time::Instant;

/// Serves any model in 100 ms, loading it in 50 ms and counting loads per model id.
struct Timed {
    models: Multiplexer<Loaded>,
}

struct Loaded;

impl modelmux_cache::Model for Loaded {}

impl Deployment for Timed {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let id = modelmux_context::multiplexed_model_id().ok_or("no model named")?;
        let _model = modelmux_serve::waiting_for_load(self.models.get(id.as_str())).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(Response::new(Body::from("ok")))
    }
}

type Loads = Arc<parking_lot::Mutex<HashMap<String, usize>>>;

fn spec(loads: &Loads, autoscaling: AutoscalingConfig, max_queued: usize) -> DeploymentSpec {
    let counted = loads.clone();
    DeploymentSpec::new("Model", move |ctx| {
        let loads = counted.clone();
        async move {
            let models =
                ctx.multiplexer(Multiplexer::builder().max_models(8), move |id: ModelId| {
                    let loads = loads.clone();
                    async move {
                        *loads.lock().entry(id.as_str().to_string()).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, BoxError>(Loaded)
                    }
                });
            Ok(Timed { models })
        }
    })
    .max_ongoing_requests(5)
    .max_queued_requests(max_queued)
    .autoscaling(autoscaling)
}

async fn call(controller: &Controller, model: &str) -> Result<(), ServeError> {
    let app = controller.app_for("/").expect("the application");
    let context = RequestContext::new().with_multiplexed_model_id(ModelId::new(model).unwrap());
    let (result, _) = app
        .dispatch(http::Request::new(Body::empty()), context, Route::Anywhere)
        .await;
    result.map(|r| assert_eq!(r.status(), http::StatusCode::OK))
}

fn replicas(controller: &Controller) -> usize {
    controller.models().applications[0].deployments[0]
        .replicas
        .len()
}

/// `clients` callers, each calling the models `models` in turn without pause, until `until`.
fn traffic(
    controller: &Arc<Controller>,
    clients: usize,
    models: &'static [&'static str],
    until: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|c| {
            let controller = controller.clone();
            tokio::spawn(async move {
                let mut k = c;
                while Instant::now() < until {
                    call(&controller, models[k % models.len()]).await.unwrap();
                    k += 1;
                }
            })
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_rising_load_adds_replicas_to_the_max_and_a_falling_one_drains_them_keeping_models_warm()
{
    let loads = Loads::default();
    let config = AutoscalingConfig {
        min_replicas: 1,
        max_replicas: 4,
        upscale_delay: Duration::from_secs(1),
        downscale_delay: Duration::from_secs(5),
        look_back_period: Duration::from_secs(2),
        ..AutoscalingConfig::default()
    };
    let app = Application::new("a").ingress(spec(&loads, config, 1024));
    let controller = Arc::new(Controller::start(vec![app], None, true).await.unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let loops = controller.autoscale(&stopped);
    assert_eq!(replicas(&controller), 1);

    // 16 callers at once, 5 per replica: 16 requests over a target of 2 want 8; the max is 4.
    const MODELS: &[&str] = &["m0", "m1", "m2", "m3", "m4", "m5"];
    let busy = traffic(
        &controller,
        16,
        MODELS,
        Instant::now() + Duration::from_secs(10),
    );
    let mut most = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(replicas(&controller));
    }
    for b in busy {
        b.await.unwrap();
    }
    assert_eq!(most, 4, "scaled up to max_replicas");
    assert_eq!(replicas(&controller), 4);

    // One caller: 1 request wants one replica. After the 5 s delay the pool drains to one,
    // the models used lately moved onto it first: none is loaded again afterwards.
    let quiet = traffic(
        &controller,
        1,
        MODELS,
        Instant::now() + Duration::from_secs(20),
    );
    let start = Instant::now();
    while replicas(&controller) > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "still {} replicas",
            replicas(&controller)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after_scale_down = loads.lock().clone();
    for q in quiet {
        q.await.unwrap();
    }
    for m in MODELS {
        call(&controller, m).await.unwrap();
    }
    assert_eq!(
        *loads.lock(),
        after_scale_down,
        "a model was loaded again after the scale-down"
    );
    stop.send(true).unwrap();
    for l in loops {
        l.await.unwrap();
    }
    controller.stop().await;
}

#[tokio::test(start_paused = true)]
async fn at_zero_replicas_the_first_request_starts_one_and_the_queue_past_its_bound_is_refused() {
    let loads = Loads::default();
    let config = AutoscalingConfig {
        min_replicas: 0,
        max_replicas: 2,
        upscale_delay: Duration::from_secs(1),
        downscale_delay: Duration::from_secs(5),
        downscale_to_zero_delay: Some(Duration::from_secs(3)),
        look_back_period: Duration::from_secs(1),
        ..AutoscalingConfig::default()
    };
    let app = Application::new("a").ingress(spec(&loads, config, 2));
    let controller = Arc::new(Controller::start(vec![app], None, true).await.unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let loops = controller.autoscale(&stopped);
    assert_eq!(
        replicas(&controller),
        0,
        "initial_replicas defaults to min_replicas"
    );

    // The first request finds none: it waits while one starts, then pays its model's load.
    let start = Instant::now();
    call(&controller, "m0").await.unwrap();
    let took = start.elapsed();
    assert!(
        took <= Duration::from_millis(150 + 50),
        "the start, the 50 ms load and the 100 ms call took {took:?}"
    );
    assert_eq!(replicas(&controller), 1);

    // Idle: down to zero after the to-zero delay.
    let start = Instant::now();
    while replicas(&controller) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never scaled to zero"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_secs(3),
        "went to zero before its delay"
    );

    // Three at once with room for two in the queue: two are served by the one start, the
    // third is refused as overloaded (HTTP 503 with Retry-After at the front).
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let controller = controller.clone();
            tokio::spawn(async move { call(&controller, "m1").await })
        })
        .collect();
    let mut served = 0;
    let mut refused = 0;
    for c in calls {
        match c.await.unwrap() {
            Ok(()) => served += 1,
            Err(ServeError::Overloaded { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((served, refused), (2, 1));
    assert_eq!(
        replicas(&controller),
        1,
        "one start for every waiting request"
    );
    stop.send(true).unwrap();
    for l in loops {
        l.await.unwrap();
    }
    controller.stop().await;
}
