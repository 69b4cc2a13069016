//! The admin and observability API, under `/-/`, and `/metrics`.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /-/healthz`, `GET /health` | 200 when every deployment has a replica taking requests, else 503 (`/health` is the name vLLM and most probes use) |
//! | `GET /-/routes` | route prefix → application, as Ray Serve's `/-/routes` |
//! | `GET /-/models` | per application, deployment and replica: loaded and loading models |
//! | `POST /-/models/{deployment}/{model_id}/load[?pin=true]` | prewarm (and pin) a model |
//! | `DELETE /-/models/{deployment}/{model_id}` | evict a model from every replica |
//! | `POST /-/models/{deployment}/{model_id}/unpin` | unpin it everywhere |
//! | `POST /-/deployments/{deployment}/controls/{name}` | a deployment's own control (an LLM's `pause`), on every replica |
//! | `GET /metrics` | Prometheus text format |
//!
//! Access (see [`AdminAccess`]): with an admin token, `/-/models*` and `/-/deployments*` need
//! `Authorization: Bearer <token>`. Without one, the server listens only on loopback (unless
//! told the admin API may be open), and a call that changes state must carry
//! `Content-Type: application/json` and a `Host` that is an IP address, `localhost` or an
//! allowed host name: a web page can neither send such a request cross-site without a CORS
//! preflight (never granted) nor reach the API through a rebound DNS name.
//! Model ids may contain `/`; percent-encode other reserved characters.

use std::sync::Arc;

use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use modelmux_cache::{ErrorKind, Failure, ModelId};
use modelmux_context::RequestId;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::dispatch::DeploymentRouter;
use crate::placement::ReplicaView;
use crate::server::{ServerState, StartError};
use crate::{Body, Response, ServeError};

/// Whether the admin API, not an application, answers `path`: `/-/...`, `/metrics` and
/// `/health`.
pub(crate) fn is_admin_path(path: &str) -> bool {
    path == "/metrics" || path == "/health" || path.starts_with("/-/")
}

/// Whether an application's route prefix would take paths of the admin API (`/-...`,
/// `/metrics`, `/health`), which answers them first.
pub fn is_reserved_route_prefix(prefix: &str) -> bool {
    prefix.starts_with("/-")
        || prefix == "/metrics"
        || prefix.starts_with("/metrics/")
        || prefix == "/health"
}

/// Who may use the admin API.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AdminAccess {
    /// The bearer token the admin API requires, if any.
    pub token: Option<String>,
    /// Whether a server listening beyond loopback may run without a token.
    pub allow_open: bool,
    /// Host names the admin API answers to besides IP addresses and `localhost`.
    pub allowed_hosts: Vec<String>,
}

impl AdminAccess {
    /// Access with this bearer token required.
    pub fn with_token(token: impl Into<String>) -> Self {
        Self {
            token: Some(token.into()),
            ..Self::default()
        }
    }

    /// Refuses a tokenless admin API on a non-loopback address unless allowed.
    pub(crate) fn check_exposure(&self, bind: std::net::SocketAddr) -> Result<(), StartError> {
        if self.token.is_none() && !bind.ip().is_loopback() && !self.allow_open {
            return Err(StartError::OpenAdmin { addr: bind });
        }
        Ok(())
    }

    /// Checks a request to an admin endpoint by its headers; `changes_state` for loads,
    /// evictions and controls. Applications with admin endpoints of their own (the OpenAI
    /// ingress's adapter controls) call it too.
    pub fn authorize(
        &self,
        headers: &http::HeaderMap,
        changes_state: bool,
    ) -> Result<(), ServeError> {
        if let Some(token) = &self.token {
            return if crate::bearer_token_matches(headers, token) {
                Ok(())
            } else {
                Err(ServeError::Unauthorized)
            };
        }
        self.check_host(headers)?;
        if changes_state && !is_json(headers) {
            return Err(ServeError::UnsupportedMediaType {
                message: "admin calls that change state need 'Content-Type: application/json' \
                          (or the admin token): a plain cross-site POST must not reach them"
                    .into(),
            });
        }
        Ok(())
    }

    /// An IP literal, `localhost` (or a name under it), or an allowed host; a request with no
    /// `Host` (HTTP/1.0) passes, since browsers always send one.
    fn check_host(&self, headers: &http::HeaderMap) -> Result<(), ServeError> {
        let mut hosts = headers.get_all(header::HOST).iter();
        let Some(host) = hosts.next() else {
            return Ok(());
        };
        if hosts.next().is_some() {
            return Err(ServeError::BadRequest {
                message: "the request has more than one Host header".into(),
            });
        }
        let host = host.to_str().unwrap_or_default().to_ascii_lowercase();
        let name = strip_port(&host);
        let allowed = name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self
                .allowed_hosts
                .iter()
                .any(|a| a.eq_ignore_ascii_case(&host) || a.eq_ignore_ascii_case(name));
        if allowed {
            Ok(())
        } else {
            Err(ServeError::Forbidden {
                message: "the admin API does not answer to this Host; add it to \
                          http_options.allowed_hosts or use an IP address"
                    .into(),
            })
        }
    }
}

/// `example.com:8000` → `example.com`; `[::1]:8000` → `::1`.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim();
            mime.eq_ignore_ascii_case("application/json")
                || (mime.len() > 5 && mime[mime.len() - 5..].eq_ignore_ascii_case("+json"))
        })
}

pub(crate) async fn handle(
    state: &ServerState,
    request: http::Request<Incoming>,
    request_id: &RequestId,
) -> Response {
    let result = match control_path(&request) {
        Some((deployment, name)) => control(state, request, &deployment, &name).await,
        None => route(state, &request).await,
    };
    match result {
        Ok(response) => response,
        Err(e) => e.into_response(Some(request_id.as_str())),
    }
}

/// `POST /-/deployments/{deployment}/controls/{name}`: its deployment and control.
fn control_path(request: &http::Request<Incoming>) -> Option<(String, String)> {
    let rest = request.uri().path().strip_prefix("/-/deployments/")?;
    let (deployment, name) = rest.split_once("/controls/")?;
    (request.method() == Method::POST && !name.is_empty() && !name.contains('/'))
        .then(|| (deployment.to_owned(), name.to_owned()))
}

/// Runs a deployment's control on every replica at once; 200 when every replica did it, else
/// the first failure's status, with each replica's answer or error.
async fn control(
    state: &ServerState,
    request: http::Request<Incoming>,
    deployment: &str,
    name: &str,
) -> Result<Response, ServeError> {
    state.config.admin.authorize(request.headers(), true)?;
    let router = find_deployment(state, deployment)?;
    let limit = state.config.http.max_body_bytes;
    let body = http_body_util::Limited::new(request.into_body(), limit)
        .collect()
        .await
        .map_err(|_| ServeError::PayloadTooLarge { limit })?
        .to_bytes();
    let replicas = router.replicas();
    let results =
        futures_util::future::join_all(replicas.iter().map(|r| r.control(name, body.clone())))
            .await;
    let mut answers = serde_json::Map::new();
    let mut failure = None;
    for (replica, result) in replicas.iter().zip(results) {
        let answer = match result {
            Ok(value) => value,
            Err(e) => {
                let value = json!({"error": {"message": e.to_string(), "type": e.error_type()}});
                failure.get_or_insert(e);
                value
            }
        };
        answers.insert(replica.id.to_string(), answer);
    }
    let status = failure.map_or(StatusCode::OK, |e| e.http_status());
    Ok(json_response(
        status,
        &json!({"deployment": deployment, "control": name, "replicas": answers}),
    ))
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = crate::json_response(body);
    *r.status_mut() = status;
    r
}

async fn route(
    state: &ServerState,
    request: &http::Request<Incoming>,
) -> Result<Response, ServeError> {
    let path = request.uri().path();
    let method = request.method();
    match (method, path) {
        (&Method::GET, "/-/healthz" | "/health") => Ok(healthz(state)),
        (&Method::GET, "/-/routes") => {
            let routes: serde_json::Map<String, Value> = state
                .apps
                .iter()
                .map(|a| (a.route_prefix.clone(), json!(&*a.name)))
                .collect();
            Ok(json_response(StatusCode::OK, &Value::Object(routes)))
        }
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Body::from(crate::metrics::render(state)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(r)
        }
        (_, p) if p == "/-/models" || p.starts_with("/-/models/") => {
            state
                .config
                .admin
                .authorize(request.headers(), method != Method::GET)?;
            models(state, method, p, request.uri().query()).await
        }
        (_, p) if p.starts_with("/-/deployments/") => {
            state
                .config
                .admin
                .authorize(request.headers(), method != Method::GET)?;
            Err(ServeError::NotFound {
                what: format!("no admin endpoint {method} {p}"),
            })
        }
        _ => Err(ServeError::NotFound {
            what: format!("no admin endpoint {method} {path}"),
        }),
    }
}

fn healthz(state: &ServerState) -> Response {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "draining"}),
        );
    }
    if let Some(check) = state.readiness.read().clone() {
        if let Err(reason) = check() {
            return json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "not_ready", "reason": reason}),
            );
        }
    }
    let unavailable: Vec<String> = state
        .routers()
        .filter(|r| {
            !r.replicas().iter().any(|rep| rep.is_available())
                && !r.remotes().iter().any(|rep| rep.reachable())
        })
        .map(|r| format!("{}/{}", r.app, r.name()))
        .collect();
    if unavailable.is_empty() {
        json_response(StatusCode::OK, &json!({"status": "ok"}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unavailable", "deployments_without_replicas": unavailable}),
        )
    }
}

async fn models(
    state: &ServerState,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<Response, ServeError> {
    if path == "/-/models" {
        return match *method {
            Method::GET => Ok(json_response(StatusCode::OK, &list_models(state))),
            _ => Err(ServeError::MethodNotAllowed {
                message: "use GET on /-/models".into(),
            }),
        };
    }
    let rest = &path["/-/models/".len()..];
    let (deployment, rest) = rest.split_once('/').ok_or_else(|| ServeError::BadRequest {
        message: "expected /-/models/{deployment}/{model_id}[/load|/unpin]".into(),
    })?;
    let router = find_deployment(state, deployment)?;
    let (id, action) = match (method, rest.rsplit_once('/')) {
        (&Method::POST, Some((id, "load"))) => (id, Action::Load),
        (&Method::POST, Some((id, "unpin"))) => (id, Action::Unpin),
        (&Method::DELETE, _) => (rest, Action::Evict),
        _ => {
            return Err(ServeError::MethodNotAllowed {
                message: "use POST .../{model_id}/load, POST .../{model_id}/unpin or DELETE \
                          .../{model_id}"
                    .into(),
            });
        }
    };
    let id = ModelId::new(percent_decode(id)?)?;
    match action {
        Action::Load => load(&router, &id, query_flag(query, "pin")).await,
        Action::Evict => {
            let evicted = on_every_cache(&router, |cache| cache.evict(&id));
            if evicted.is_empty() {
                return Err(ServeError::NotFound {
                    what: format!("model '{id}' is not loaded by any replica of '{deployment}'"),
                });
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"model_id": id.as_str(), "evicted_from": evicted}),
            ))
        }
        Action::Unpin => {
            let unpinned = on_every_cache(&router, |cache| cache.unpin(&id));
            Ok(json_response(
                StatusCode::OK,
                &json!({"model_id": id.as_str(), "unpinned_on": unpinned}),
            ))
        }
    }
}

/// Runs `f` on every cache of every replica; returns the replicas where it returned true.
fn on_every_cache(
    router: &DeploymentRouter,
    f: impl Fn(&dyn crate::replica::ModelCache) -> bool,
) -> Vec<String> {
    router
        .replicas()
        .iter()
        // Every cache is visited (no short-circuit): a model may be in more than one.
        .filter(|r| r.caches.iter().fold(false, |any, c| f(&**c) | any))
        .map(|r| r.id.to_string())
        .collect()
}

enum Action {
    Load,
    Evict,
    Unpin,
}

async fn load(router: &DeploymentRouter, id: &ModelId, pin: bool) -> Result<Response, ServeError> {
    let replicas = router.replicas();
    let index = crate::router::place(&replicas, id, Instant::now()).ok_or_else(|| {
        ServeError::Failed(Failure::new(
            ErrorKind::Unavailable,
            format!(
                "no replica of '{}' is available to load into",
                router.name()
            ),
        ))
    })?;
    let replica = &replicas[index];
    let cache = replica
        .caches
        .first()
        .ok_or_else(|| ServeError::BadRequest {
            message: format!(
                "deployment '{}' has no model cache to load into",
                router.name()
            ),
        })?;
    cache.load(id, pin).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"model_id": id.as_str(), "deployment": router.name(), "replica": &*replica.id, "pinned": pin}),
    ))
}

fn find_deployment(state: &ServerState, name: &str) -> Result<Arc<DeploymentRouter>, ServeError> {
    let found: Vec<_> = state.routers().filter(|r| r.name() == name).collect();
    match found.as_slice() {
        [router] => Ok((*router).clone()),
        [] => Err(ServeError::NotFound {
            what: format!("no deployment named '{name}'"),
        }),
        several => Err(ServeError::BadRequest {
            message: format!(
                "deployment '{name}' exists in applications {}; give deployments distinct names to manage them here",
                several
                    .iter()
                    .map(|r| format!("'{}'", r.app))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

fn list_models(state: &ServerState) -> Value {
    let apps: Vec<Value> = state
        .apps
        .iter()
        .map(|app| {
            let deployments: Vec<Value> = app
                .deployments
                .iter()
                .map(|(router, _)| {
                    let replicas: Vec<Value> = router
                        .replicas()
                        .iter()
                        .map(|r| replica_models(r, state.config.node_id.as_deref()))
                        .chain(router.remotes().iter().map(|r| remote_models(r)))
                        .collect();
                    json!({"name": router.name(), "queued_requests": router.queued(), "replicas": replicas})
                })
                .collect();
            json!({"name": &*app.name, "route_prefix": app.route_prefix, "deployments": deployments})
        })
        .collect();
    json!({ "applications": apps })
}

/// A replica on another node, as this node last heard of it.
fn remote_models(replica: &crate::remote::RemoteReplica) -> Value {
    use crate::placement::Holding;
    let mut loaded = Vec::new();
    let mut loading = Vec::new();
    let mut holdings: Vec<_> = replica.slot.holdings().into_iter().collect();
    holdings.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    for (id, holding) in holdings {
        match holding {
            Holding::Loaded => loaded.push(json!({"id": id.as_str()})),
            Holding::Loading | Holding::Pending(_) => loading.push(json!(id.as_str())),
        }
    }
    json!({
        "id": replica.slot.id(),
        "node": &*replica.node,
        "remote": true,
        "available": replica.reachable() && replica.slot.is_available(),
        "ongoing_requests": replica.ongoing(),
        "max_ongoing_requests": replica.slot.max_ongoing(),
        "loaded": loaded,
        "loading": loading,
    })
}

fn replica_models(replica: &crate::replica::Replica, node: Option<&str>) -> Value {
    let mut loaded = Vec::new();
    let mut loading = Vec::new();
    for info in replica.caches.iter().flat_map(|c| c.models()) {
        match info.status {
            modelmux_cache::ModelStatus::Loaded => loaded.push(json!({
                "id": info.id.as_str(),
                "size_bytes": info.size_bytes,
                "in_use": info.in_use,
                "pinned": info.pinned,
                "idle_seconds": info.idle_for.as_secs_f64(),
            })),
            modelmux_cache::ModelStatus::Loading => loading.push(json!(info.id.as_str())),
        }
    }
    json!({
        "id": &*replica.id,
        "node": node,
        "available": replica.is_available(),
        "ongoing_requests": replica.ongoing(),
        "waiting_for_load": replica.slot.loading_waiters(),
        "max_ongoing_requests": replica.max_ongoing(),
        "loaded": loaded,
        "loading": loading,
    })
}

fn query_flag(query: Option<&str>, name: &str) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|kv| kv == name || kv == format!("{name}=true") || kv == format!("{name}=1"))
}

/// Decodes `%XX` escapes (model ids in paths may need them).
fn percent_decode(s: &str) -> Result<String, ServeError> {
    let bad = || ServeError::BadRequest {
        message: format!("'{s}' is not a valid percent-encoded model id"),
    };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err(bad());
            }
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%20c").unwrap(), "a/b c");
        assert!(percent_decode("bad%2").is_err());
        assert!(percent_decode("bad%zz").is_err());
        assert!(
            percent_decode("bad%+f").is_err(),
            "from_str_radix alone would take a sign"
        );
    }

    #[test]
    fn hosts_are_stripped_of_their_port() {
        assert_eq!(strip_port("example.com:8000"), "example.com");
        assert_eq!(strip_port("[::1]:8000"), "::1");
        assert_eq!(strip_port("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn json_content_types() {
        let mut h = http::HeaderMap::new();
        assert!(!is_json(&h));
        for (value, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("multipart/form-data; boundary=x", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_json(&h), json, "{value}");
        }
    }

    #[test]
    fn query_flags() {
        assert!(query_flag(Some("pin=true"), "pin"));
        assert!(query_flag(Some("x=1&pin"), "pin"));
        assert!(!query_flag(Some("pin=false"), "pin"));
        assert!(!query_flag(None, "pin"));
    }
}
