//! Forwarding requests to other nodes: HTTP/2 without TLS, one multiplexed connection per
//! peer, pinged every second so a dead peer is noticed in about a second even when idle.
//!
//! A peer whose connection failed (refused, reset, a ping unanswered) is *down*: requests for
//! it fail at once as not sent, so the router places them elsewhere, and a background probe
//! reconnects with backoff. Only a probe the peer answered (its liveness endpoint, over a new
//! connection) brings the peer back, so a killed, hung or partitioned node is never retried
//! with live requests: an HTTP/2 handshake alone proves nothing (the client's handshake does
//! not wait for the server, and a stopped process's kernel still accepts connections).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::header::{self, HeaderName};
use http::uri::{Authority, Scheme};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use modelmux_serve::{Body, FORWARDED_HEADER, ForwardError, Forwarder, NOT_HERE_HEADER};
use modelmux_serve::{Request, Response};
use tokio::sync::Mutex;

use crate::membership::Membership;

/// How long connecting to a peer may take before the request goes elsewhere.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often an open connection is pinged.
const PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered, by default, before the connection is dropped.
pub(crate) const DEFAULT_PING_TIMEOUT: Duration = Duration::from_secs(1);
/// The first and the longest wait between probes of a peer that is down.
const PROBE_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// Headers that belong to one connection, not to the request (HTTP/2 forbids them).
const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::HOST,
];

/// Forwards requests to the nodes of a cluster by their advertised addresses. A request goes
/// only to the address its node's record names when it is sent (see [`NotAMember`]).
///
/// [`NotAMember`]: crate::NotAMember
pub struct H2Forwarder {
    /// Each peer's address as its record says.
    addresses: Arc<Membership>,
    /// One connection per peer, opened on first use and again after it breaks.
    /// Read on every routing decision (`reachable`) and forward; written only for a new peer.
    connections: parking_lot::RwLock<HashMap<String, Arc<Peer>>>,
    ping_timeout: Duration,
}

struct Peer {
    node: String,
    authority: Authority,
    ping_timeout: Duration,
    sender: Mutex<Option<http2::SendRequest<Body>>>,
    /// Its last connection failed and no probe has reached it since.
    down: AtomicBool,
    /// A probe is running.
    probing: AtomicBool,
    /// When each of its probes began (the tests' view of the backoff).
    #[cfg(test)]
    probed_at: parking_lot::Mutex<Vec<tokio::time::Instant>>,
}

impl Default for H2Forwarder {
    fn default() -> Self {
        Self::new()
    }
}

impl H2Forwarder {
    /// A forwarder that knows no peers yet, with the default ping timeout.
    pub fn new() -> Self {
        Self::with_ping_timeout(DEFAULT_PING_TIMEOUT)
    }

    /// A forwarder whose connections are dropped (and their peers probed) when a ping goes
    /// unanswered for `ping_timeout`. Shorter notices a dead peer sooner; longer rides out
    /// stalls of an overloaded machine without failing the requests in flight.
    pub fn with_ping_timeout(ping_timeout: Duration) -> Self {
        Self {
            addresses: Arc::default(),
            connections: parking_lot::RwLock::default(),
            ping_timeout,
        }
    }

    /// Sets the peers' addresses (`node` → `http://host:port`). A peer whose address changed
    /// gets a new connection; one no longer listed loses its connection.
    pub fn set_peers(&self, peers: impl IntoIterator<Item = (String, String)>) {
        let mut next = HashMap::new();
        for (node, address) in peers {
            match parse_authority(&address) {
                Some(authority) => {
                    next.insert(node, authority);
                }
                None => {
                    tracing::warn!(%node, %address, "a peer address that is not http://host:port")
                }
            }
        }
        let mut connections = self.connections.write();
        connections.retain(|node, peer| next.get(node) == Some(&peer.authority));
        self.addresses.replace(next);
    }

    fn peer(&self, node: &str) -> Option<Arc<Peer>> {
        if let Some(peer) = self.connections.read().get(node) {
            return Some(peer.clone());
        }
        let mut connections = self.connections.write();
        // Read under the lock `set_peers` holds: an address replaced meanwhile never gets a
        // connection that outlives the change.
        let authority = self.addresses.address(node)?;
        let peer = connections
            .entry(node.to_owned())
            .or_insert_with(|| {
                Arc::new(Peer {
                    node: node.to_owned(),
                    authority,
                    ping_timeout: self.ping_timeout,
                    sender: Mutex::new(None),
                    down: AtomicBool::new(false),
                    probing: AtomicBool::new(false),
                    #[cfg(test)]
                    probed_at: parking_lot::Mutex::default(),
                })
            })
            .clone();
        Some(peer)
    }
}

fn parse_authority(address: &str) -> Option<Authority> {
    let rest = address.strip_prefix("http://")?;
    rest.trim_end_matches('/').parse().ok()
}

impl Peer {
    /// A sender ready for a request: the open connection, or a new one. A peer that is down
    /// is not tried: its probe reconnects.
    async fn ready(self: &Arc<Self>) -> Result<http2::SendRequest<Body>, ForwardError> {
        let not_sent = |reason: String| ForwardError::NotSent {
            node: self.node.clone(),
            reason,
        };
        let down = || not_sent("it did not answer lately".into());
        if self.down.load(Ordering::SeqCst) {
            return Err(down());
        }
        let mut sender = self.sender.lock().await;
        if let Some(s) = sender.as_mut() {
            if s.ready().await.is_ok() {
                return Ok(s.clone());
            }
            *sender = None;
        }
        // Requests that waited here while a connection attempt failed do not try again each.
        if self.down.load(Ordering::SeqCst) {
            return Err(down());
        }
        match self.connect().await {
            Ok(s) => {
                *sender = Some(s.clone());
                Ok(s)
            }
            Err(reason) => {
                self.set_down(&reason);
                Err(not_sent(reason))
            }
        }
    }

    /// Opens a connection and waits until it takes requests. When the connection later ends
    /// with an error (a reset, a ping unanswered), the peer is down.
    async fn connect(self: &Arc<Self>) -> Result<http2::SendRequest<Body>, String> {
        let authority = &self.authority;
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(authority.as_str()),
        )
        .await
        .map_err(|_| format!("connecting to {authority} took longer than {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let handshake = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(PING_INTERVAL)
            .keep_alive_timeout(self.ping_timeout)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(stream));
        let (mut s, connection) = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| format!("HTTP/2 handshake with {authority} took too long"))?
            .map_err(|e| format!("HTTP/2 handshake with {authority}: {e}"))?;
        let peer = Arc::downgrade(self);
        tokio::spawn(async move {
            if let Err(e) = connection.await
                && let Some(peer) = peer.upgrade()
            {
                peer.set_down(&format!("connection ended: {e}"));
            }
        });
        tokio::time::timeout(CONNECT_TIMEOUT, s.ready())
            .await
            .map_err(|_| format!("{authority} took too long to take a request"))?
            .map_err(|e| format!("{authority}: {e}"))?;
        Ok(s)
    }

    /// [`connect`](Self::connect), then a `GET /-/healthz` on the new connection that the peer
    /// must answer (with any status) within the connect timeout.
    async fn connect_answered(self: &Arc<Self>) -> Result<http2::SendRequest<Body>, String> {
        let mut s = self.connect().await?;
        let authority = &self.authority;
        let uri = http::Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(authority.clone())
            .path_and_query("/-/healthz")
            .build()
            .map_err(|e| e.to_string())?;
        let request = http::Request::get(uri)
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(CONNECT_TIMEOUT, s.send_request(request))
            .await
            .map_err(|_| format!("{authority} did not answer within {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("{authority} did not answer: {e}"))?;
        Ok(s)
    }

    /// Marks the peer down and starts its probe, unless one runs.
    fn set_down(self: &Arc<Self>, reason: &str) {
        if !self.down.swap(true, Ordering::SeqCst) {
            tracing::warn!(peer = %self.node, "peer unreachable, passed over until it answers: {reason}");
        }
        if !self.probing.swap(true, Ordering::SeqCst) {
            tokio::spawn(probe(Arc::downgrade(self)));
        }
    }
}

/// Reconnects to a peer that is down, with backoff, until it answers (then it is up again
/// with that connection) or it is no longer a peer.
async fn probe(peer: Weak<Peer>) {
    let mut wait = PROBE_BACKOFF.0;
    loop {
        tokio::time::sleep(wait).await;
        let Some(peer) = peer.upgrade() else { return };
        #[cfg(test)]
        peer.probed_at.lock().push(tokio::time::Instant::now());
        if let Ok(s) = peer.connect_answered().await {
            *peer.sender.lock().await = Some(s);
            peer.probing.store(false, Ordering::SeqCst);
            peer.down.store(false, Ordering::SeqCst);
            tracing::info!(peer = %peer.node, "peer reachable again");
            return;
        }
        wait = next_probe_wait(wait);
    }
}

/// The wait before the next probe when one after `wait` failed: twice as long, up to the
/// longest.
fn next_probe_wait(wait: Duration) -> Duration {
    (wait * 2).min(PROBE_BACKOFF.1)
}

impl Forwarder for H2Forwarder {
    fn reachable(&self, node: &str) -> bool {
        self.connections
            .read()
            .get(node)
            .is_none_or(|peer| !peer.down.load(Ordering::SeqCst))
    }

    fn forward(
        &self,
        node: &str,
        replica: &str,
        request: Request,
    ) -> BoxFuture<'static, Result<Response, ForwardError>> {
        let peer = self.peer(node);
        let members = self.addresses.clone();
        let node = node.to_owned();
        let replica = replica.to_owned();
        Box::pin(async move {
            let Some(peer) = peer else {
                return Err(ForwardError::NotSent {
                    node,
                    reason: "its address is not known".into(),
                });
            };
            let mut sender = peer.ready().await?;
            let request = prepare(request, &peer.authority, &replica).map_err(|reason| {
                ForwardError::NotSent {
                    node: node.clone(),
                    reason,
                }
            })?;
            // The last check before a byte goes: the peer's address must be its record's now
            // (the membership may have changed since the request was routed, or while the
            // connection opened), so no request, and no handle call's token, goes elsewhere.
            members
                .check(&node, &peer.authority)
                .map_err(|e| ForwardError::NotSent {
                    node: node.clone(),
                    reason: e.to_string(),
                })?;
            let response = sender.send_request(request).await.map_err(|e| {
                let (node, reason) = (node.clone(), e.to_string());
                if not_processed(&e) {
                    ForwardError::NotSent { node, reason }
                } else {
                    ForwardError::Failed { node, reason }
                }
            })?;
            if response.headers().contains_key(NOT_HERE_HEADER) {
                return Err(ForwardError::NotHere {
                    node,
                    reason: format!("answered {}", response.status()),
                });
            }
            Ok(response.map(Body::wrap))
        })
    }
}

/// Whether the peer never began the request, so that it may go elsewhere: the connection went
/// before it was sent (cancelled), or the peer refused its stream (`REFUSED_STREAM`), or closed
/// the connection (GOAWAY without an error, as when it closes an idle connection) before that
/// stream: HTTP/2 promises such streams were not processed (RFC 9113, 8.7).
fn not_processed(e: &hyper::Error) -> bool {
    if e.is_canceled() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR));
        }
        source = error.source();
    }
    false
}

/// The request as it goes to the peer: an absolute URI for HTTP/2, no connection headers, and
/// the replica the router chose.
fn prepare(request: Request, authority: &Authority, replica: &str) -> Result<Request, String> {
    let (mut parts, body) = request.into_parts();
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(authority.clone());
    uri.path_and_query = parts.uri.path_and_query().cloned();
    parts.uri = http::Uri::from_parts(uri).map_err(|e| e.to_string())?;
    parts.version = http::Version::HTTP_2;
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    parts.headers.remove("keep-alive");
    parts.headers.remove("proxy-connection");
    parts.headers.insert(
        FORWARDED_HEADER,
        replica
            .parse()
            .map_err(|_| format!("replica id {replica:?}"))?,
    );
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    use super::*;

    /// A loopback port where nothing listens (yet): connections to it are refused.
    async fn closed_port() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }

    /// A peer's server on `address`: records each connection it accepts (the client's
    /// address), and answers 200 to every request over HTTP/2.
    struct Server {
        accepted: Arc<parking_lot::Mutex<Vec<SocketAddr>>>,
        task: JoinHandle<()>,
    }

    impl Server {
        async fn start(address: SocketAddr) -> Self {
            let listener = TcpListener::bind(address).await.unwrap();
            let accepted: Arc<parking_lot::Mutex<Vec<_>>> = Arc::default();
            let log = accepted.clone();
            let task = tokio::spawn(async move {
                while let Ok((stream, client)) = listener.accept().await {
                    log.lock().push(client);
                    let service = hyper::service::service_fn(|_| async {
                        Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok")))
                    });
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
            Self { accepted, task }
        }

        fn accepted(&self) -> Vec<SocketAddr> {
            self.accepted.lock().clone()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// Waits (at most 20 s) until `done`.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "not within 20 s: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn forwarder_to(address: SocketAddr) -> H2Forwarder {
        let forwarder = H2Forwarder::new();
        forwarder.set_peers([("p".to_owned(), format!("http://{address}"))]);
        forwarder
    }

    async fn forward(forwarder: &H2Forwarder) -> Result<Response, ForwardError> {
        forwarder
            .forward("p", "Model#1@p", Request::new(Body::from("x")))
            .await
    }

    #[test]
    fn probes_wait_100_ms_doubling_up_to_1_s() {
        let mut wait = PROBE_BACKOFF.0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            waits.push(wait.as_millis());
            wait = next_probe_wait(wait);
        }
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_is_down_gets_no_request_until_a_probe_reaches_it() {
        let address = closed_port().await;
        let forwarder = forwarder_to(address);
        // As if its probe were running already: none is started, so every connection made
        // below comes from a request (or from the probe started at the end).
        let peer = forwarder.peer("p").unwrap();
        peer.probing.store(true, Ordering::SeqCst);
        assert!(forwarder.reachable("p"));
        // Refused: not sent, and the peer is down.
        let first = forward(&forwarder).await;
        assert!(
            matches!(first, Err(ForwardError::NotSent { .. })),
            "{first:?}"
        );
        assert!(!forwarder.reachable("p"));

        // It would answer now, but requests do not try: they fail at once, unsent.
        let server = Server::start(address).await;
        for _ in 0..20 {
            let next = forward(&forwarder).await;
            assert!(
                matches!(next, Err(ForwardError::NotSent { .. })),
                "{next:?}"
            );
        }
        assert!(!forwarder.reachable("p"));
        // None of them connected: a connection made after them is the first one accepted.
        let own = tokio::net::TcpStream::connect(address).await.unwrap();
        let own = own.local_addr().unwrap();
        until("our connection accepted", || {
            server.accepted().contains(&own)
        })
        .await;
        assert_eq!(server.accepted(), [own]);

        // A probe reaches it: up again, and requests go over the probe's connection.
        tokio::spawn(probe(Arc::downgrade(&peer)));
        until("the probe brought it back", || forwarder.reachable("p")).await;
        assert_eq!(server.accepted().len(), 2);
        let response = forward(&forwarder).await.expect("served");
        assert_eq!(response.status(), 200);
        assert_eq!(server.accepted().len(), 2, "no new connection");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_is_down_is_probed_at_growing_intervals() {
        // Nothing listens there: every connection is refused, every probe fails.
        let forwarder = forwarder_to(closed_port().await);
        let start = Instant::now();
        let first = forward(&forwarder).await;
        assert!(
            matches!(first, Err(ForwardError::NotSent { .. })),
            "{first:?}"
        );
        assert!(!forwarder.reachable("p"));
        let peer = forwarder.peer("p").unwrap();
        until("six probes", || peer.probed_at.lock().len() >= 6).await;
        // Each probe waits 100, 200, 400, 800, 1000 ms after the last one failed, and a wait
        // never ends early: each comes at least that long after the one before (a slow
        // machine only makes them later). At a fixed 100 ms, they would come every 100 ms.
        let at: Vec<Duration> = peer.probed_at.lock().iter().map(|t| *t - start).collect();
        assert!(at[0] >= Duration::from_millis(100), "{at:?}");
        for (k, wait) in [200, 400, 800, 1000, 1000].into_iter().enumerate() {
            let gap = at[k + 1] - at[k];
            assert!(
                gap >= Duration::from_millis(wait),
                "probe {} after {gap:?}: {at:?}",
                k + 1
            );
        }
        assert!(!forwarder.reachable("p"));
    }

    /// A peer whose kernel still accepts connections but whose process does not answer
    /// (stopped, hung) stays down: hyper's client handshake and `ready()` return without a
    /// byte from the peer, so a probe that stopped there brought it back at every probe, 100 ms
    /// after it went down, and live requests were sent to it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_accepts_connections_but_never_answers_stays_down() {
        // Accepts every connection and keeps it open, never reading or writing a byte.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let forwarder = forwarder_to(address);
        let peer = forwarder.peer("p").unwrap();
        peer.set_down("the test says so");
        // Through the first four probes (100 + 200 + 400 + 800 ms apart at the least).
        let start = Instant::now();
        while peer.probed_at.lock().len() < 4 {
            assert!(
                !forwarder.reachable("p"),
                "back after {:?} with no answer from it; probes at {:?}",
                start.elapsed(),
                peer.probed_at.lock()
            );
            assert!(start.elapsed() < Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        silent.abort();
    }
}
