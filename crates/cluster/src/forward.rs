//! Forwarding requests to other nodes: HTTP/2 without TLS, one multiplexed connection per
//! peer, pinged every second so a dead peer is noticed in about a second even when idle.
//!
//! A peer whose connection failed (refused, reset, a ping unanswered) is *down*: requests for
//! it fail at once as not sent, so the router places them elsewhere, and a background probe
//! reconnects with backoff. Only a probe's successful handshake brings the peer back, so a
//! killed or partitioned node is never retried with live requests.

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

/// Forwards requests to the nodes of a cluster by their advertised addresses.
pub struct H2Forwarder {
    /// Each peer's address as its record says.
    addresses: parking_lot::RwLock<HashMap<String, Authority>>,
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
            addresses: parking_lot::RwLock::default(),
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
        *self.addresses.write() = next;
    }

    fn peer(&self, node: &str) -> Option<Arc<Peer>> {
        if let Some(peer) = self.connections.read().get(node) {
            return Some(peer.clone());
        }
        let authority = self.addresses.read().get(node).cloned()?;
        let mut connections = self.connections.write();
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
        if let Ok(s) = peer.connect().await {
            *peer.sender.lock().await = Some(s);
            peer.probing.store(false, Ordering::SeqCst);
            peer.down.store(false, Ordering::SeqCst);
            tracing::info!(peer = %peer.node, "peer reachable again");
            return;
        }
        wait = (wait * 2).min(PROBE_BACKOFF.1);
    }
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
            let response = sender.send_request(request).await.map_err(|e| {
                // Cancelled: the connection went before the request was sent on it.
                let (node, reason) = (node.clone(), e.to_string());
                if e.is_canceled() {
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
