//! Forwarding between nodes, without etcd: a router (a `Controller`) told of replicas on
//! "peers" that are in-process HTTP/2 servers on loopback. Each peer answers as the test says
//! (serves, turns the request away with `x-modelmux-not-here`, or resets it in flight) and
//! records what reached it; a peer with no server refuses connections. The router forwards
//! through the real `H2Forwarder`, so this is the path from `DeploymentRouter` to the wire and
//! back: retries elsewhere when a request never reached its node or was turned away, retries
//! of requests that failed in flight only for `idempotent` deployments, at most 3 replicas per
//! request, and a forwarded request served where it lands. Everything asserted is a count or
//! an order, never a timing.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Body as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use modelmux_cluster::H2Forwarder;
use modelmux_serve::{
    Application, Body, BoxError, Controller, Deployment, DeploymentSpec, Dispatched,
    FORWARDED_HEADER, ForwardError, Forwarder, NOT_HERE_HEADER, ReplicaState, Request, Response,
    Route,
};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How a fake peer answers every request.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// 200, naming itself in `x-test-peer`.
    Serve,
    /// 503 with `x-modelmux-not-here`: refused before it ran.
    NotHere,
    /// The stream is reset without an answer: the request failed after it was sent.
    Reset,
}

/// What reached a fake peer: the replica named in `x-modelmux-forwarded`, the path, query,
/// `Authorization` and model id headers, and the body.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    replica: Option<String>,
    path: String,
    query: Option<String>,
    authorization: Option<String>,
    model: Option<String>,
    body: Vec<u8>,
}

/// A node of the cluster as the router sees it: an id, an address, and (unless it refuses
/// connections) a server recording what reaches it.
struct FakePeer {
    node: String,
    address: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: Option<JoinHandle<()>>,
}

impl FakePeer {
    /// A peer whose server answers every request with `answer`.
    async fn start(node: &str, answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (recorded, name) = (seen.clone(), node.to_owned());
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (recorded, name) = (recorded.clone(), name.clone());
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let (recorded, name) = (recorded.clone(), name.clone());
                    async move { answer_with(answer, &name, request, &recorded).await }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Self {
            node: node.to_owned(),
            address,
            seen,
            server: Some(server),
        }
    }

    /// A peer at an address where nothing listens: every connection is refused.
    async fn refusing(node: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        Self {
            node: node.to_owned(),
            address,
            seen: Arc::default(),
            server: None,
        }
    }

    /// The id of its one replica of the deployment.
    fn replica(&self) -> String {
        format!("Model#1@{}", self.node)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

async fn answer_with(
    answer: Answer,
    name: &str,
    request: http::Request<hyper::body::Incoming>,
    recorded: &Mutex<Vec<Seen>>,
) -> Result<http::Response<Body>, std::io::Error> {
    let (parts, mut body) = request.into_parts();
    let mut bytes = Vec::new();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame.map_err(std::io::Error::other)?.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    recorded.lock().push(Seen {
        replica: header(FORWARDED_HEADER),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(String::from),
        authorization: header("authorization"),
        model: header("serve_multiplexed_model_id"),
        body: bytes,
    });
    let mut response = http::Response::new(Body::from(format!("served by {name}")));
    response
        .headers_mut()
        .insert("x-test-peer", name.parse().unwrap());
    match answer {
        Answer::Serve => Ok(response),
        Answer::NotHere => {
            *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            response
                .headers_mut()
                .insert(NOT_HERE_HEADER, http::HeaderValue::from_static("1"));
            Ok(response)
        }
        Answer::Reset => Err(std::io::Error::other("reset in flight")),
    }
}

/// The deployment a router-only node names but never runs.
struct NotRunHere;

impl Deployment for NotRunHere {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        unreachable!("a router-only node runs no replica")
    }
}

/// A deployment run on this node: answers "local".
struct Local;

impl Deployment for Local {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        Ok(Response::new(Body::from("local")))
    }
}

/// A node named `in` routing application `default` over `peers`, each a replica with
/// `max_ongoing_requests: 8` reporting the given requests in progress (the router prefers the
/// less loaded of two). With `local`, it also runs a replica of its own.
struct Router {
    controller: Arc<Controller>,
    forwarder: Arc<H2Forwarder>,
}

impl Router {
    async fn start(peers: &[(&FakePeer, usize)], idempotent: bool, local: bool) -> Self {
        Self::start_with_token(peers, idempotent, local, None).await
    }

    /// [`start`](Self::start), with `token` as the admin token handle calls carry to peers.
    async fn start_with_token(
        peers: &[(&FakePeer, usize)],
        idempotent: bool,
        local: bool,
        token: Option<&str>,
    ) -> Self {
        let spec = if local {
            DeploymentSpec::new("Model", |_| async { Ok::<_, BoxError>(Local) })
        } else {
            DeploymentSpec::new("Model", |_| async { Ok::<_, BoxError>(NotRunHere) })
        };
        let app = Application::new("default").ingress(spec.idempotent(idempotent));
        let controller = Arc::new(
            Controller::start(vec![app], Some("in".into()), local)
                .await
                .unwrap(),
        );
        controller.node().set_call_token(token);
        let forwarder = Arc::new(H2Forwarder::new());
        forwarder.set_peers(
            peers
                .iter()
                .map(|(p, _)| (p.node.clone(), p.address.clone())),
        );
        let replicas: Vec<(Arc<str>, ReplicaState)> = peers
            .iter()
            .map(|(p, ongoing)| {
                let state = ReplicaState {
                    id: p.replica(),
                    max_ongoing: 8,
                    max_models: Some(2),
                    max_bytes: None,
                    ongoing: *ongoing,
                    available: true,
                    copies: Vec::new(),
                };
                (Arc::from(p.node.as_str()), state)
            })
            .collect();
        let as_dyn: Arc<dyn Forwarder> = forwarder.clone();
        controller
            .node()
            .set_remote_replicas("default", "Model", &replicas, &as_dyn);
        Self {
            controller,
            forwarder,
        }
    }

    /// One request, as the HTTP front hands it over (body read whole).
    async fn send(&self, route: Route) -> Dispatched {
        let request = http::Request::builder()
            .uri("/predict?x=1")
            .body(Body::from("payload"))
            .unwrap();
        let app = self.controller.app_for("/").unwrap();
        app.dispatch(request, Default::default(), route).await
    }
}

/// The replica a dispatch ended on, and the peer that answered (`x-test-peer`, "(none)" for
/// this node's own replica) or the error.
fn outcome(dispatched: &Dispatched) -> (Option<String>, String) {
    let (result, replica) = dispatched;
    let answer = match result {
        Ok(r) => r
            .headers()
            .get("x-test-peer")
            .map_or("(none)".into(), |v| v.to_str().unwrap().to_owned()),
        Err(e) => format!("error {}: {e}", e.error_type()),
    };
    (replica.as_deref().map(String::from), answer)
}

/// A request served by `peer`, on its replica.
fn served_by(peer: &FakePeer) -> (Option<String>, String) {
    (Some(peer.replica()), peer.node.clone())
}

fn sent(replica: &str) -> Seen {
    Seen {
        replica: Some(replica.to_owned()),
        path: "/predict".into(),
        query: Some("x=1".into()),
        authorization: None,
        model: None,
        body: b"payload".to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_turned_away_is_sent_to_another_replica() {
    // `a` is the less loaded, so tried first; it answers not-here.
    let a = FakePeer::start("a", Answer::NotHere).await;
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start(&[(&a, 0), (&b, 4)], false, false).await;
    let done = router.send(Route::Anywhere).await;
    assert_eq!(outcome(&done), served_by(&b));
    // Each got the request once, naming the replica chosen there, with its path and body.
    assert_eq!(a.seen(), [sent(&a.replica())]);
    assert_eq!(b.seen(), [sent(&b.replica())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_reaches_at_most_three_replicas() {
    let peers = [
        FakePeer::start("a", Answer::NotHere).await,
        FakePeer::start("b", Answer::NotHere).await,
        FakePeer::start("c", Answer::NotHere).await,
        FakePeer::start("d", Answer::NotHere).await,
    ];
    let listed: Vec<(&FakePeer, usize)> = peers.iter().map(|p| (p, 0)).collect();
    let router = Router::start(&listed, false, false).await;
    let (result, _) = router.send(Route::Anywhere).await;
    let error = result.expect_err("every replica turned it away");
    assert_eq!(
        (error.http_status().as_u16(), error.error_type()),
        (503, "node_refused"),
        "{error}"
    );
    // Three attempts, on three different replicas; the fourth never saw it.
    let tried: Vec<usize> = peers.iter().map(|p| p.seen().len()).collect();
    assert_eq!(
        tried.iter().sum::<usize>(),
        3,
        "attempts per peer: {tried:?}"
    );
    assert!(
        tried.iter().all(|&n| n <= 1),
        "attempts per peer: {tried:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_failed_in_flight_is_not_sent_again_unless_idempotent() {
    let a = FakePeer::start("a", Answer::Reset).await;
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start(&[(&a, 0), (&b, 4)], false, false).await;
    let (result, replica) = router.send(Route::Anywhere).await;
    let error = result.expect_err("it may have run on a: not sent again");
    assert_eq!(
        (error.http_status().as_u16(), error.error_type()),
        (502, "forward_failed"),
        "{error}"
    );
    assert_eq!(replica.as_deref(), Some(a.replica().as_str()));
    assert_eq!((a.seen().len(), b.seen().len()), (1, 0));

    // The same for an idempotent deployment: sent again, to b, and served.
    let a = FakePeer::start("a", Answer::Reset).await;
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start(&[(&a, 0), (&b, 4)], true, false).await;
    let done = router.send(Route::Anywhere).await;
    assert_eq!(outcome(&done), served_by(&b));
    assert_eq!(a.seen(), [sent(&a.replica())]);
    assert_eq!(b.seen(), [sent(&b.replica())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_request_failing_everywhere_reaches_at_most_three_replicas() {
    let peers = [
        FakePeer::start("a", Answer::Reset).await,
        FakePeer::start("b", Answer::Reset).await,
        FakePeer::start("c", Answer::Reset).await,
        FakePeer::start("d", Answer::Reset).await,
    ];
    let listed: Vec<(&FakePeer, usize)> = peers.iter().map(|p| (p, 0)).collect();
    let router = Router::start(&listed, true, false).await;
    let (result, _) = router.send(Route::Anywhere).await;
    let error = result.expect_err("it failed everywhere");
    assert_eq!(error.error_type(), "forward_failed", "{error}");
    let tried: Vec<usize> = peers.iter().map(|p| p.seen().len()).collect();
    assert_eq!(
        tried.iter().sum::<usize>(),
        3,
        "attempts per peer: {tried:?}"
    );
    assert!(
        tried.iter().all(|&n| n <= 1),
        "attempts per peer: {tried:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refuses_connections_is_passed_over_and_not_tried_again() {
    // Not idempotent: a request that never reached its node is safe to send elsewhere anyway.
    let a = FakePeer::refusing("a").await;
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start(&[(&a, 0), (&b, 4)], false, false).await;
    for _ in 0..5 {
        let done = router.send(Route::Anywhere).await;
        assert_eq!(outcome(&done), served_by(&b));
    }
    assert_eq!(b.seen().len(), 5);
    // Down: passed over until a probe reaches it (none can: nothing listens).
    assert!(!router.forwarder.reachable("a"));
    assert!(router.forwarder.reachable("b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_is_never_forwarded_again() {
    let a = FakePeer::start("a", Answer::Serve).await;
    // A router-only node: a request on any route reaches the peer...
    let router = Router::start(&[(&a, 0)], false, false).await;
    let done = router.send(Route::Anywhere).await;
    assert_eq!(outcome(&done), served_by(&a));
    // ...but one forwarded to it is turned away (for the forwarding node to try another),
    // not sent on.
    let (result, replica) = router
        .send(Route::Local {
            preferred: Some(a.replica().into()),
        })
        .await;
    let error = result.expect_err("no replica here");
    assert_eq!(
        (error.http_status().as_u16(), error.error_type()),
        (503, "not_here"),
        "{error}"
    );
    assert!(
        error
            .into_response(None)
            .headers()
            .contains_key(NOT_HERE_HEADER)
    );
    assert_eq!(replica, None);
    assert_eq!(a.seen().len(), 1);

    // A node with a replica of its own serves what is forwarded to it there, even when the
    // replica named is another node's.
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start(&[(&b, 0)], false, true).await;
    for preferred in [Some(b.replica().into()), None] {
        let done = router.send(Route::Local { preferred }).await;
        let (replica, answer) = outcome(&done);
        assert_eq!(answer, "(none)", "served here, not by b");
        assert!(
            replica.as_ref().is_some_and(|r| r.ends_with("@in")),
            "{replica:?}"
        );
    }
    assert_eq!(b.seen().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarder_tells_refused_failed_and_unreachable_apart() {
    let turned_away = FakePeer::start("a", Answer::NotHere).await;
    let reset = FakePeer::start("b", Answer::Reset).await;
    let refusing = FakePeer::refusing("c").await;
    let serving = FakePeer::start("d", Answer::Serve).await;
    let forwarder = H2Forwarder::new();
    forwarder.set_peers(
        [&turned_away, &reset, &refusing, &serving]
            .iter()
            .map(|p| (p.node.clone(), p.address.clone())),
    );
    let request = || {
        let mut r = http::Request::builder()
            .uri("http://ingress:8000/predict?x=1")
            .header(http::header::CONNECTION, "keep-alive")
            .body(Body::from("payload"))
            .unwrap();
        *r.version_mut() = http::Version::HTTP_11;
        r
    };
    let forward = |p: &FakePeer| forwarder.forward(&p.node, &p.replica(), request());
    assert!(matches!(
        forward(&turned_away).await,
        Err(ForwardError::NotHere { .. })
    ));
    assert!(matches!(
        forward(&reset).await,
        Err(ForwardError::Failed { .. })
    ));
    assert!(matches!(
        forward(&refusing).await,
        Err(ForwardError::NotSent { .. })
    ));
    assert!(matches!(
        forwarder
            .forward("nobody", "Model#1@nobody", request())
            .await,
        Err(ForwardError::NotSent { .. })
    ));
    let response = forward(&serving).await.expect("served");
    assert_eq!(response.status(), 200);
    assert_eq!(serving.seen(), [sent(&serving.replica())]);
}

/// A handle call (a driver's, through `Controller::call`) of the deployment, with `context`.
async fn handle_call(
    router: &Router,
    context: modelmux_context::RequestContext,
) -> Result<Response, modelmux_serve::ServeError> {
    let body = bytes_of("pickled");
    router
        .controller
        .operations()
        .call(
            Some("default"),
            "Model",
            modelmux_serve::HandleCall {
                method: "__call__".into(),
                stream: false,
            },
            context,
            Route::Anywhere,
            body,
        )
        .await
}

fn bytes_of(text: &'static str) -> hyper::body::Bytes {
    hyper::body::Bytes::from_static(text.as_bytes())
}

/// A handle call as a peer must see it: the call endpoint, the replica chosen, the token.
fn called(replica: &str, model: Option<&str>) -> Seen {
    Seen {
        replica: Some(replica.to_owned()),
        path: "/-/deployments/Model/call/__call__".into(),
        query: Some("app=default".into()),
        authorization: Some("Bearer t0ken".into()),
        model: model.map(String::from),
        body: b"pickled".to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_call_goes_to_another_node_as_a_call_of_its_call_endpoint_with_the_token() {
    // `a` is tried first and turns it away; `b` serves it. Both see the same call.
    let a = FakePeer::start("a", Answer::NotHere).await;
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start_with_token(&[(&a, 0), (&b, 4)], false, false, Some("t0ken")).await;
    let response = handle_call(&router, Default::default()).await.unwrap();
    assert_eq!(response.headers()["x-test-peer"], "b");
    assert_eq!(a.seen(), [called(&a.replica(), None)]);
    assert_eq!(b.seen(), [called(&b.replica(), None)]);

    // The model it names goes with it.
    let c = FakePeer::start("c", Answer::Serve).await;
    let router = Router::start_with_token(&[(&c, 0)], false, false, Some("t0ken")).await;
    let context = modelmux_context::RequestContext::new()
        .with_multiplexed_model_id(modelmux_cache::ModelId::new("org/m 1").unwrap());
    handle_call(&router, context).await.unwrap();
    assert_eq!(c.seen(), [called(&c.replica(), Some("org/m 1"))]);
    // An application's own request still goes as it came, and never with the token.
    router.send(Route::Anywhere).await.0.unwrap();
    assert_eq!(c.seen()[1], sent(&c.replica()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_a_handle_call_never_leaves_this_node() {
    // Nothing runs here: the call fails, unsent, saying why.
    let a = FakePeer::start("a", Answer::Serve).await;
    let router = Router::start(&[(&a, 0)], false, false).await;
    let error = handle_call(&router, Default::default()).await.unwrap_err();
    assert_eq!(error.http_status().as_u16(), 503, "{error}");
    assert!(error.to_string().contains("admin token"), "{error}");
    assert!(a.seen().is_empty());
    // An application's own request still goes.
    router.send(Route::Anywhere).await.0.unwrap();
    assert_eq!(a.seen(), [sent(&a.replica())]);

    // A replica here serves every call, however idle the other node's replica is.
    let b = FakePeer::start("b", Answer::Serve).await;
    let router = Router::start(&[(&b, 0)], false, true).await;
    for _ in 0..10 {
        let response = handle_call(&router, Default::default()).await.unwrap();
        assert!(!response.headers().contains_key("x-test-peer"));
    }
    assert!(b.seen().is_empty());
}
