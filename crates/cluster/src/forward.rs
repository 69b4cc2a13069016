//! Forwarding requests to other nodes: HTTP/2 without TLS, one multiplexed connection per
//! peer, pinged every second so a dead peer is noticed in about a second even when idle.

use std::collections::HashMap;
use std::sync::Arc;
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
/// Ping period, and how long a ping may go unanswered before the connection is dropped.
const PING: Duration = Duration::from_secs(1);

/// Headers that belong to one connection, not to the request (HTTP/2 forbids them).
const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::HOST,
];

/// Forwards requests to the nodes of a cluster by their advertised addresses.
#[derive(Default)]
pub struct H2Forwarder {
    /// Each peer's address as its record says.
    addresses: parking_lot::RwLock<HashMap<String, Authority>>,
    /// One connection per peer, opened on first use and again after it breaks.
    connections: parking_lot::Mutex<HashMap<String, Arc<Peer>>>,
}

struct Peer {
    authority: Authority,
    sender: Mutex<Option<http2::SendRequest<Body>>>,
}

impl H2Forwarder {
    /// A forwarder that knows no peers yet.
    pub fn new() -> Self {
        Self::default()
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
        let mut connections = self.connections.lock();
        connections.retain(|node, peer| next.get(node) == Some(&peer.authority));
        *self.addresses.write() = next;
    }

    fn peer(&self, node: &str) -> Option<Arc<Peer>> {
        let authority = self.addresses.read().get(node).cloned()?;
        let mut connections = self.connections.lock();
        let peer = connections
            .entry(node.to_owned())
            .or_insert_with(|| {
                Arc::new(Peer {
                    authority,
                    sender: Mutex::new(None),
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
    /// A sender ready for a request: the open connection, or a new one.
    async fn ready(&self, node: &str) -> Result<http2::SendRequest<Body>, ForwardError> {
        let mut sender = self.sender.lock().await;
        if let Some(s) = sender.as_mut() {
            if s.ready().await.is_ok() {
                return Ok(s.clone());
            }
            *sender = None;
        }
        let not_sent = |reason: String| ForwardError::NotSent {
            node: node.to_owned(),
            reason,
        };
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(self.authority.as_str()),
        )
        .await
        .map_err(|_| not_sent(format!("connecting took longer than {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| not_sent(format!("connecting to {}: {e}", self.authority)))?;
        let _ = stream.set_nodelay(true);
        let (mut s, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(PING)
            .keep_alive_timeout(PING)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| not_sent(format!("HTTP/2 handshake with {}: {e}", self.authority)))?;
        let peer = node.to_owned();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, "connection to peer ended: {e}");
            }
        });
        s.ready()
            .await
            .map_err(|e| not_sent(format!("{}: {e}", self.authority)))?;
        *sender = Some(s.clone());
        Ok(s)
    }
}

impl Forwarder for H2Forwarder {
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
            let mut sender = peer.ready(&node).await?;
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
