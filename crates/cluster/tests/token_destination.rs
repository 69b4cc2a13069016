//! The cluster token goes only to registered nodes: a handle call rewritten for another node
//! carries `Authorization: Bearer <admin token>`, and the forwarder sends it (as any forwarded
//! request) only to the address the node's record names when it is sent. A request routed to
//! a node whose record then changed its address, or that left, is refused unsent (`NotSent`,
//! naming the rule), and the old address receives nothing; sent again, it goes to the address
//! the record names now.

use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use modelmux_cluster::H2Forwarder;
use modelmux_serve::{Body, ForwardError, Forwarder, Request, Response};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// An HTTP/2 server on loopback that records the `Authorization` of every request it gets.
struct Recorder {
    address: String,
    tokens: Arc<Mutex<Vec<Option<String>>>>,
    task: JoinHandle<()>,
}

impl Recorder {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let tokens: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let log = tokens.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = log.clone();
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let token = request
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .map(String::from);
                    log.lock().push(token);
                    async { Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok"))) }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Self {
            address,
            tokens,
            task,
        }
    }

    fn tokens(&self) -> Vec<Option<String>> {
        self.tokens.lock().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A handle call as the router hands it to the forwarder: the call endpoint, with the token.
fn handle_call() -> Request {
    http::Request::post("/-/deployments/Model/call/__call__?app=default")
        .header("authorization", "Bearer cluster-token")
        .body(Body::from("pickled"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_goes_only_to_the_address_a_nodes_record_names_when_it_is_sent() {
    let (old, new) = (Recorder::start().await, Recorder::start().await);
    let forwarder = H2Forwarder::new();
    forwarder.set_peers([("n1".to_owned(), old.address.clone())]);
    // While registered there, it goes there.
    let served = forwarder.forward("n1", "Model#1@n1", handle_call()).await;
    assert_eq!(served.expect("sent").status(), 200);
    assert_eq!(old.tokens(), [Some("Bearer cluster-token".to_owned())]);

    // Routed to n1, then n1's record names another address before the call is sent.
    let routed = forwarder.forward("n1", "Model#1@n1", handle_call());
    forwarder.set_peers([("n1".to_owned(), new.address.clone())]);
    let refused = routed
        .await
        .expect_err("the old address is no registered node's now");
    match &refused {
        ForwardError::NotSent { node, reason } => {
            assert_eq!(node, "n1");
            assert!(
                reason.contains("is not a registered node's address"),
                "{reason}"
            );
        }
        other => panic!("expected NotSent, got {other:?}"),
    }
    assert_eq!(old.tokens().len(), 1, "the old address got nothing more");
    assert!(new.tokens().is_empty());

    // Sent again (as the router retries a request not sent): to the address registered now.
    let served = forwarder.forward("n1", "Model#1@n1", handle_call()).await;
    assert_eq!(served.expect("sent").status(), 200);
    assert_eq!(new.tokens(), [Some("Bearer cluster-token".to_owned())]);

    // Routed to n1, then n1 leaves the cluster: refused, and nothing reaches either address.
    let routed = forwarder.forward("n1", "Model#1@n1", handle_call());
    forwarder.set_peers(std::iter::empty::<(String, String)>());
    let refused = routed.await.expect_err("n1 is no member now");
    assert!(
        matches!(&refused, ForwardError::NotSent { reason, .. } if reason.contains("not a member")),
        "{refused:?}"
    );
    assert_eq!((old.tokens().len(), new.tokens().len()), (1, 1));
}
