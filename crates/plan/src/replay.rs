//! A trace replayed through the server's own code in virtual time.
//!
//! The replay starts the serve layer's [`Controller`] with one deployment of `replicas`
//! replicas, each with a [`Multiplexer`] built from the setting (caps, load slots, eviction
//! policy), and sends every request of the trace, at its time, through the application's
//! [`dispatch`](modelmux_serve::AppState::dispatch), the path the HTTP front takes. So the
//! router's placement, its queue and patience rules, the replication of hot models, the caches'
//! single-flight loads, their eviction and their load slots are the server's, not a model of
//! them. Only the models are stand-ins: a load takes the model's load time and a request its
//! service time, both as Tokio sleeps.
//!
//! The runtime is single-threaded on a paused clock: whenever every task waits, Tokio moves the
//! clock to the next timer at once, so time costs nothing but the code's own work.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use modelmux_cache::{
    BoxError, EvictReason, EvictionPolicy, Model, ModelEventKind, ModelId, Multiplexer,
};
use modelmux_context::RequestContext;
use modelmux_serve::{
    Application, Body, Controller, Deployment, DeploymentSpec, ReplicaContext, Request, Response,
    Route,
};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::trace::Trace;

/// One configuration of the deployment to replay: what `modelmux serve`'s YAML sets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Setting {
    /// Replicas of the deployment.
    pub replicas: usize,
    /// Models each replica holds at most (`None`: no cap).
    pub max_models: Option<usize>,
    /// Bytes each replica holds at most (`None`: no cap).
    pub max_bytes: Option<u64>,
    /// Loads that run at once on a replica.
    pub max_concurrent_loads: usize,
    /// Which idle model a replica evicts first.
    #[serde(serialize_with = "policy_name")]
    pub eviction: EvictionPolicy,
    /// Requests a replica serves at once (`None`: the serve layer's default).
    pub max_ongoing_requests: Option<usize>,
    /// Requests the router queues at most (`None`: the serve layer's default).
    pub max_queued_requests: Option<usize>,
    /// How long a request waits in the queue at most (`None`: the serve layer's default).
    pub queue_timeout: Option<Duration>,
}

fn policy_name<S: serde::Serializer>(p: &EvictionPolicy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(crate::policy_name(*p))
}

/// What the models cost, where the trace does not say.
#[derive(Debug, Clone, Default)]
pub struct Costs {
    /// A load's time, for a model the trace measured no load of.
    pub load: Duration,
    /// A request's service time, for a request the trace gives none.
    pub service: Duration,
    /// A model's size, for a model the trace gives none of.
    pub size_bytes: Option<u64>,
}

/// What happened to one request, in virtual time from the trace's start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    /// When it arrived.
    pub arrived: Duration,
    /// When a replica took it (after the router's queue).
    pub started: Duration,
    /// When its model was in hand (after any load it waited for).
    pub ready: Duration,
    /// When it was answered.
    pub ended: Duration,
    /// The replica that took it (an index into [`Outcome::replicas`]).
    pub replica: u16,
    /// Whether its model was loaded on that replica when it asked.
    pub hit: bool,
    /// Whether it was answered (not refused: queue full, timed out, load failed).
    pub ok: bool,
}

/// What happened to a model on a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// A load started.
    Loading,
    /// The load ended; the model is servable.
    Loaded,
    /// The load failed.
    Failed,
    /// It was evicted, and why.
    Evicting(EvictReason),
    /// Its unload ran; its room is free.
    Unloaded,
}

/// One model event of one replica.
#[derive(Debug, Clone, Copy)]
pub struct Happening {
    /// When.
    pub at: Duration,
    /// The replica (an index into [`Outcome::replicas`]).
    pub replica: u16,
    /// The model (an index into the trace's models).
    pub model: u32,
    /// What.
    pub what: What,
}

/// A replay's raw record.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Each request of the trace, in the trace's order.
    pub served: Vec<Served>,
    /// Every model event, in the order they happened.
    pub events: Vec<Happening>,
    /// The replicas' ids.
    pub replicas: Vec<String>,
    /// Loads started.
    pub loads: u64,
    /// How long the replay took in virtual time (until the last answer).
    pub span: Duration,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The serve layer refused the setting.
    #[error("the setting does not start: {0}")]
    Start(String),
    /// The runtime could not be built.
    #[error("the replay's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Replays `trace` under `setting`, calling `progress` with the number of requests sent now and
/// then.
pub fn replay(
    trace: &Trace,
    setting: &Setting,
    costs: &Costs,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Outcome, ReplayError> {
    // Idle times and routing recency must follow the virtual clock too.
    modelmux_cache::coarse_clock::follow_tokio_time();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    runtime.block_on(run(trace, setting, costs, progress))
}

/// What every replica and request writes into.
struct Recorder {
    started: Instant,
    served: Mutex<Vec<Served>>,
    events: Mutex<Vec<Happening>>,
    replicas: Mutex<Vec<String>>,
    index: HashMap<ModelId, u32, foldhash::fast::RandomState>,
    load_times: Vec<Duration>,
    sizes: Vec<Option<u64>>,
    default_service: Duration,
    in_flight: AtomicUsize,
    done: tokio::sync::Notify,
}

impl Recorder {
    fn now(&self) -> Duration {
        Instant::now().duration_since(self.started)
    }

    fn model(&self, id: &ModelId) -> Option<u32> {
        self.index.get(id).copied()
    }
}

/// What a request carries to the replica: its index in the trace and its service time.
#[derive(Clone, Copy)]
struct Tag {
    index: usize,
    service: Duration,
}

async fn run(
    trace: &Trace,
    setting: &Setting,
    costs: &Costs,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Outcome, ReplayError> {
    let recorder = Arc::new(Recorder {
        started: Instant::now(),
        served: Mutex::new(vec![Served::default(); trace.requests.len()]),
        events: Mutex::new(Vec::new()),
        replicas: Mutex::new(Vec::new()),
        index: (trace.models.iter().cloned()).zip(0u32..).collect(),
        load_times: trace
            .facts
            .iter()
            .map(|f| median(&f.load_times).unwrap_or(costs.load))
            .collect(),
        sizes: trace
            .facts
            .iter()
            .map(|f| f.size_bytes.or(costs.size_bytes))
            .collect(),
        default_service: costs.service,
        in_flight: AtomicUsize::new(0),
        done: tokio::sync::Notify::new(),
    });
    let app = Application::new("plan").ingress(deployment(setting, &recorder));
    let controller = Controller::start(vec![app], None, true)
        .await
        .map_err(|e| ReplayError::Start(e.to_string()))?;
    let controller = Arc::new(controller);
    let origin = recorder.started;
    for (index, r) in trace.requests.iter().enumerate() {
        tokio::time::sleep_until(origin + r.at).await;
        if index % 4096 == 0 {
            progress(index);
        }
        let tag = Tag {
            index,
            service: r.service.unwrap_or(recorder.default_service),
        };
        let model = trace.model_of(r).clone();
        recorder.in_flight.fetch_add(1, Ordering::Relaxed);
        // Boxed: the request's future is some kilobytes, which the spawn would otherwise copy.
        // Boxed: the request's future is some kilobytes, which the spawn would otherwise copy.
        tokio::spawn(Box::pin(send(
            controller.clone(),
            recorder.clone(),
            tag,
            model,
        )));
    }
    progress(trace.requests.len());
    while recorder.in_flight.load(Ordering::Acquire) > 0 {
        let done = recorder.done.notified();
        if recorder.in_flight.load(Ordering::Acquire) == 0 {
            break;
        }
        done.await;
    }
    let span = recorder.now();
    controller.stop().await;
    let served = std::mem::take(&mut *recorder.served.lock());
    let events = std::mem::take(&mut *recorder.events.lock());
    let loads = events.iter().filter(|e| e.what == What::Loading).count() as u64;
    let replicas = recorder.replicas.lock().clone();
    Ok(Outcome {
        served,
        events,
        replicas,
        loads,
        span,
    })
}

/// One request through the application's ingress, as the HTTP front sends it.
async fn send(controller: Arc<Controller>, recorder: Arc<Recorder>, tag: Tag, model: ModelId) {
    let arrived = recorder.now();
    let mut request = Request::new(Body::empty());
    request.extensions_mut().insert(tag);
    let context = RequestContext::new().with_multiplexed_model_id(model);
    let app = controller.app_for("/").expect("the plan's application");
    let (answer, _) = app.dispatch(request, context, Route::Anywhere).await;
    let ended = recorder.now();
    {
        let mut served = recorder.served.lock();
        let s = &mut served[tag.index];
        s.arrived = arrived;
        s.ended = ended;
        s.ok = answer.is_ok_and(|r| r.status().is_success());
        if !s.ok {
            // Refused before a replica took it, or failed there: no service.
            s.started = s.started.max(arrived);
            s.ready = s.ready.max(s.started);
        }
    }
    if recorder.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
        recorder.done.notify_one();
    }
}

/// A stand-in model: its size, as the trace or the costs say.
struct Standin {
    size: Option<u64>,
}

impl Model for Standin {
    fn size_bytes(&self) -> Option<u64> {
        self.size
    }
}

/// A replica of the replayed deployment: the server's model deployment, its inference a sleep.
struct Replica {
    models: Multiplexer<Standin>,
    recorder: Arc<Recorder>,
    number: u16,
}

impl Deployment for Replica {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let id = modelmux_context::multiplexed_model_id().ok_or("no model")?;
        let tag = *request.extensions().get::<Tag>().ok_or("no tag")?;
        let started = self.recorder.now();
        // A hit is a model ready at the first poll; otherwise the request waits for a load as
        // the server's model deployment does (its slot given back meanwhile).
        let mut get = std::pin::pin!(self.models.get(&id));
        let first = std::future::poll_fn(|cx| Poll::Ready(get.as_mut().poll(cx))).await;
        let (model, hit) = match first {
            Poll::Ready(model) => (model, true),
            Poll::Pending => (modelmux_serve::waiting_for_load(get).await, false),
        };
        let ready = self.recorder.now();
        {
            let mut served = self.recorder.served.lock();
            let s = &mut served[tag.index];
            s.started = started;
            s.ready = ready;
            s.replica = self.number;
            s.hit = hit;
        }
        let _model = model?;
        tokio::time::sleep(tag.service).await;
        Ok(Response::new(Body::empty()))
    }
}

fn deployment(setting: &Setting, recorder: &Arc<Recorder>) -> DeploymentSpec {
    let mut cache = Multiplexer::builder()
        .max_concurrent_loads(setting.max_concurrent_loads)
        .eviction_policy(setting.eviction)
        // Every event is recorded: a subscriber that lagged would lose some.
        .event_capacity(1 << 16);
    cache = match setting.max_models {
        Some(n) => cache.max_models(n),
        None => cache.unbounded_models(),
    };
    if let Some(bytes) = setting.max_bytes {
        cache = cache.max_bytes(bytes);
    }
    let recorder = recorder.clone();
    let mut spec = DeploymentSpec::new("Model", move |ctx: ReplicaContext| {
        let (cache, recorder) = (cache.clone(), recorder.clone());
        async move {
            let number = {
                let mut replicas = recorder.replicas.lock();
                replicas.push(ctx.replica_id().to_string());
                u16::try_from(replicas.len() - 1)?
            };
            let loader_recorder = recorder.clone();
            let models = ctx.multiplexer(cache, move |id: ModelId| {
                let recorder = loader_recorder.clone();
                async move {
                    let m = recorder.model(&id).map(|m| m as usize);
                    let took = m.map_or(Duration::ZERO, |m| recorder.load_times[m]);
                    tokio::time::sleep(took).await;
                    Ok::<_, BoxError>(Standin {
                        size: m.and_then(|m| recorder.sizes[m]),
                    })
                }
            });
            tokio::spawn(watch(models.clone(), recorder.clone(), number));
            Ok(Replica {
                models,
                recorder,
                number,
            })
        }
    })
    .num_replicas(setting.replicas);
    if let Some(n) = setting.max_ongoing_requests {
        spec = spec.max_ongoing_requests(n);
    }
    if let Some(n) = setting.max_queued_requests {
        spec = spec.max_queued_requests(n);
    }
    if let Some(t) = setting.queue_timeout {
        spec = spec.queue_timeout(t);
    }
    spec
}

/// Records one replica's model events until its cache is gone.
async fn watch(models: Multiplexer<Standin>, recorder: Arc<Recorder>, replica: u16) {
    let mut events = models.subscribe().events;
    drop(models);
    while let Ok(e) = events.recv().await {
        let what = match e.kind {
            ModelEventKind::Loading => What::Loading,
            ModelEventKind::Loaded { .. } => What::Loaded,
            ModelEventKind::Failed { .. } => What::Failed,
            ModelEventKind::Evicting { reason } => What::Evicting(reason),
            ModelEventKind::Unloaded { .. } => What::Unloaded,
            _ => continue,
        };
        let Some(model) = recorder.model(&e.id) else {
            continue;
        };
        let at = recorder.now();
        recorder.events.lock().push(Happening {
            at,
            replica,
            model,
            what,
        });
    }
}

fn median(v: &[Duration]) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied()
}
