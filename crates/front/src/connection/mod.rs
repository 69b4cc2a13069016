//! The front door: accepts connections (at most `max_connections` at once), serves each with
//! hyper under the HTTP timeouts, closes idle keep-alive connections, and puts application
//! requests through load shedding, a concurrency cap and the request timeout (`stack.rs`).
//!
//! What bounds what:
//! - HTTP/2 without TLS is accepted too (prior knowledge): it is how cluster nodes forward
//!   requests to each other; such a connection is pinged every second, carries at most
//!   [`MAX_H2_STREAMS`] streams at once, and is closed (GOAWAY, then close) once no stream has
//!   been open for `keep_alive_timeout`: frames alone (pings, SETTINGS) do not keep it;
//! - a connection that has not sent a whole request head within `header_read_timeout` (its
//!   first from when it opened, later ones from their first byte) is closed by the
//!   connection's watchdog (`activity.rs`), within a quarter of the shorter timeout more;
//! - a connection with no request in progress and no bytes moving for `keep_alive_timeout` is
//!   closed here (hyper has no idle timeout of its own) by the connection's watchdog, which
//!   looks every quarter of the timeout: within 1.25x of it;
//! - a body that has not fully arrived within `body_read_timeout` gets 408 (`ingress.rs`);
//! - memory: connections × [`MAX_BUF_BYTES`] plus `max_inflight_body_bytes`.

mod activity;
mod entry;
mod stack;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::body_budget::ClientAddr;
use crate::options::{HttpOptions, MAX_BUF_BYTES};
use crate::state::FrontState;

use activity::{Activity, Look, Watchdog, Watched};

/// Streams one HTTP/2 connection carries at once (a peer node's forwarded requests).
const MAX_H2_STREAMS: u32 = 1024;
/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered.
const H2_PING_INTERVAL: Duration = Duration::from_secs(1);

/// Accepts connections until `stopped` turns true, each under a connection permit.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    state: Arc<FrontState>,
    mut stopped: watch::Receiver<bool>,
) {
    let options = state.config.http.clone();
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let apps = stack::Apps::new(state.clone());
    loop {
        // The permit is taken before accepting: past the cap, clients wait in the kernel's
        // (bounded) listen backlog, costing this process nothing.
        let permit = tokio::select! {
            _ = stopped.changed() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let open = state.connection_opened();
        let state = state.clone();
        let apps = apps.clone();
        let stopped = stopped.clone();
        let options = options.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _open = open;
            serve_connection(stream, peer, state, apps, options, stopped).await;
        });
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    state: Arc<FrontState>,
    apps: Arc<stack::Apps>,
    options: HttpOptions,
    mut stopped: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
            let busy = activity.begin();
            request.extensions_mut().insert(ClientAddr(peer.ip()));
            let h2 = request.version() == http::Version::HTTP_2;
            let handling = entry::handle(state.clone(), apps.clone(), request);
            async move {
                let response = handling.await?;
                // An HTTP/2 stream is in progress until its body is sent: idleness there is
                // counted in streams, not bytes (`activity.rs`). On HTTP/1 a streamed body
                // moves bytes, which is what its watchdog counts.
                Ok::<_, std::convert::Infallible>(match response.body().as_full() {
                    Some(_) => response,
                    None if h2 => response.map(|body| body.holding(busy)),
                    None => response,
                })
            }
        })
    };
    let io = TokioIo::new(Watched::new(stream, activity.clone()));
    // HTTP/1.1 for clients; HTTP/2 without TLS (prior knowledge) for the other nodes of a
    // cluster, which forward requests over one multiplexed connection each.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The header read timeout is the watchdog's (`activity.rs`): hyper's own arms a timer for
    // every request.
    builder
        .http1()
        .header_read_timeout(None)
        .max_buf_size(MAX_BUF_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_H2_STREAMS)
        .keep_alive_interval(Some(H2_PING_INTERVAL))
        .keep_alive_timeout(H2_PING_INTERVAL);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    // When an idle connection was asked to close: one that is still open and idle a keep-alive
    // timeout later (a peer that never reads the GOAWAY, or never lets go) is dropped.
    let mut closing_idle_since: Option<Instant> = None;
    let mut watchdog = Watchdog::new(
        &activity,
        options.keep_alive_timeout,
        options.header_read_timeout,
    );
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            changed = stopped.changed(), if !closing => {
                // Either the server stops or its sender is gone: finish the request in
                // progress, take no more.
                let _ = changed;
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            // The watchdog keeps looking while the connection closes: a graceful shutdown
            // waits for a request head that has begun, and only the header read timeout ends
            // one that never completes.
            _ = tokio::time::sleep_until(watchdog.next_look()) => {
                match watchdog.look(&activity) {
                    Look::Fine => {}
                    Look::Idle if closing => {
                        let since = *closing_idle_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= options.keep_alive_timeout {
                            tracing::debug!(%peer, "dropping an idle connection that did not close");
                            return;
                        }
                    }
                    Look::Idle => {
                        tracing::trace!(%peer, "closing an idle keep-alive connection");
                        closing = true;
                        closing_idle_since = Some(Instant::now());
                        // On an idle connection this closes it at once; a request that slipped
                        // in meanwhile is answered first.
                        conn.as_mut().graceful_shutdown();
                    }
                    Look::SlowHead => {
                        tracing::debug!(
                            %peer,
                            "dropping a connection whose request head did not arrive within \
                             header_read_timeout"
                        );
                        return;
                    }
                }
            }
        }
    }
}
