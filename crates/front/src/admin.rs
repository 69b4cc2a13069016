//! The admin and observability API, under `/-/`, and `/metrics`.
//!
//! | method and path | what |
//! |---|---|
//! | `POST /-/deploy` | applies a new configuration (`{"config": "..."}`) to the running server: what did not change keeps its replicas and models (state-changing: token or JSON) |
//! | `GET /-/dashboard` | the dashboard page (`dashboard/`); `GET /-/dashboard/state` its data, behind the token as `/-/models` |
//! | `GET /-/healthz`, `GET /health` | 200 when every deployment has a replica taking requests, else 503 saying why (`loading` lists the deployments still starting while the port is open early; `/health` is the name vLLM and most probes use) |
//! | `GET /-/routes` | route prefix → application, as Ray Serve's `/-/routes` |
//! | `GET /-/models` | per application, deployment and replica: loaded and loading models |
//! | `POST /-/models/{deployment}/{model_id}/load[?pin=true]` | prewarm (and pin) a model |
//! | `DELETE /-/models/{deployment}/{model_id}` | evict a model from every replica |
//! | `POST /-/models/{deployment}/{model_id}/unpin` | unpin it everywhere |
//! | `POST /-/deployments/{deployment}/controls/{name}` | a deployment's own control (an LLM's `pause`), on every replica |
//! | `POST /-/deployments/{deployment}/call/{method}[?app=name]` | a handle call from outside the server (`serve.run`'s handle in a Python driver, or another node of the cluster, which adds `x-modelmux-forwarded`): the body is the encoded arguments; only with the admin token |
//! | `GET /metrics` | Prometheus text format |
//!
//! Access (see [`AdminAccess`](modelmux_serve::AdminAccess)): with an admin token, `/-/models*` and `/-/deployments*` need
//! `Authorization: Bearer <token>`, and every answer to a request with an `x-modelmux-nonce`
//! carries `x-modelmux-proof`, proving that the server holds the token
//! ([`identity_proof`](modelmux_serve::identity_proof)). Without one, the server listens only on loopback (unless
//! told the admin API may be open), and a call that changes state must carry
//! `Content-Type: application/json` and a `Host` that is an IP address, `localhost` or an
//! allowed host name: a web page can neither send such a request cross-site without a CORS
//! preflight (never granted) nor reach the API through a rebound DNS name.
//! Model ids may contain `/`; percent-encode other reserved characters.

use std::sync::Arc;

use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use modelmux_cache::ModelId;
use modelmux_context::{RequestContext, RequestId};
use serde_json::{Value, json};

use crate::Response;
use crate::state::FrontState;
use modelmux_serve::Health;
use modelmux_serve::{Body, FORWARDED_HEADER, HandleCall, Route, STREAM_HEADER, ServeError};

pub(crate) async fn handle(
    state: &std::sync::Arc<FrontState>,
    request: http::Request<Incoming>,
    request_id: &RequestId,
) -> Response {
    // A client that sent a nonce learns that this server holds the admin token (and nothing
    // of the token), before it trusts or sends anything: on every answer, refusals included.
    let proof = state.config.admin.prove(request.headers());
    let mut response = answer(state, request, request_id).await;
    if let Some(proof) = proof {
        response
            .headers_mut()
            .insert(modelmux_serve::PROOF_HEADER, proof);
    }
    response
}

async fn answer(
    state: &std::sync::Arc<FrontState>,
    request: http::Request<Incoming>,
    request_id: &RequestId,
) -> Response {
    let dashboard = crate::dashboard::route(
        state,
        request.method(),
        request.uri().path(),
        request.headers(),
    );
    let result = if let Some(answer) = dashboard {
        answer
    } else if request.uri().path() == "/-/deploy" {
        deploy(state, request).await
    } else if let Some((deployment, method)) = deployment_path(&request, "/call/") {
        call(state, request, &deployment, &method, request_id).await
    } else if let Some((deployment, name)) = deployment_path(&request, "/controls/") {
        control(state, request, &deployment, &name).await
    } else {
        route(state, &request).await
    };
    match result {
        Ok(response) => response,
        Err(e) => e.into_response(Some(request_id.as_str())),
    }
}

/// `POST /-/deployments/{deployment}{action}{name}` (`action` `/controls/` or `/call/`): its
/// deployment and name.
fn deployment_path(request: &http::Request<Incoming>, action: &str) -> Option<(String, String)> {
    let rest = request.uri().path().strip_prefix("/-/deployments/")?;
    let (deployment, name) = rest.split_once(action)?;
    (request.method() == Method::POST && !name.is_empty() && !name.contains('/'))
        .then(|| (deployment.to_owned(), name.to_owned()))
}

/// A handle call from outside the server: a driver's, or one another node of the cluster
/// forwarded here (it names the replica its router chose in `x-modelmux-forwarded`, and is
/// served by this node's replicas only, never forwarded again: `503` with
/// `x-modelmux-not-here` when none can take it, so that node tries another). The body is
/// trusted as the caller's encoded arguments (a pickle, which runs code when read), so only
/// the admin token's holder may call: a server without a token refuses every such call, and
/// the forwarded header changes nothing to that.
async fn call(
    state: &FrontState,
    request: http::Request<Incoming>,
    deployment: &str,
    method: &str,
    request_id: &RequestId,
) -> Result<Response, ServeError> {
    // A token made for local users alone (not configured) does not open this door either.
    if state.config.admin.shared_token().is_none() {
        return Err(ServeError::Forbidden {
            message: "handle calls from outside the server need the admin token (http_options.admin_token)".into(),
        });
    }
    state.config.admin.authorize(request.headers(), true)?;
    // Named as the caller's client (and another node) percent-encode them.
    let deployment = percent_decode(deployment)?;
    let method = percent_decode(method)?;
    let app = request
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("app=")))
        .map(percent_decode)
        .transpose()?;
    let headers = request.headers();
    let mut context = RequestContext::new().with_request_id(request_id.clone());
    // Either spelling, as an application request's (two that differ are refused).
    if let Some(id) = crate::ingress::model_id(headers)? {
        context = context.with_multiplexed_model_id(id);
    }
    // The caller's trace goes on here (another node's call is a span of its request).
    let trace = state
        .tracer
        .as_ref()
        .and_then(|t| t.begin(headers.get(crate::ingress::TRACEPARENT)));
    let mut root = None;
    if let Some(trace) = trace {
        let mut span = trace.start_root("handle_call");
        span.attribute("deployment", deployment.clone());
        span.attribute("method", method.clone());
        span.attribute("request_id", request_id.as_str());
        root = Some(span);
        context = context.with_trace(trace);
    }
    let route = match headers.get(FORWARDED_HEADER) {
        Some(replica) => Route::Local {
            preferred: replica.to_str().ok().map(Arc::from),
        },
        None => Route::Anywhere,
    };
    let call = HandleCall {
        method,
        stream: headers
            .get(STREAM_HEADER)
            .is_some_and(|v| v.as_bytes() == b"true"),
    };
    let body = read_body(state, request).await?;
    let result = state
        .controller
        .operations()
        .call(app.as_deref(), &deployment, call, context, route, body)
        .await;
    if let Some(span) = root {
        let served = result.as_ref().is_ok_and(|r| !r.status().is_server_error());
        span.end(!served);
    }
    result
}

/// `POST /-/deploy` with `{"config": "<the whole configuration>"}`: the server's
/// [`Deployer`](crate::Deployer) applies what changed, or refuses the whole of it.
async fn deploy(
    state: &FrontState,
    request: http::Request<Incoming>,
) -> Result<Response, ServeError> {
    if request.method() != Method::POST {
        return Err(ServeError::MethodNotAllowed {
            message: "use POST /-/deploy with {\"config\": \"...\"}".into(),
        });
    }
    state.config.admin.authorize(request.headers(), true)?;
    let Some(deployer) = state.deployer.clone() else {
        return Err(ServeError::NotImplemented {
            what: "POST /-/deploy on a server not started from a configuration".into(),
        });
    };
    let body = read_body(state, request).await?;
    let config = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("config").and_then(Value::as_str).map(str::to_owned))
        .ok_or_else(|| ServeError::BadRequest {
            message: "expected a JSON body {\"config\": \"<the configuration's YAML>\"}".into(),
        })?;
    let answer = deployer.deploy(config).await?;
    Ok(json_response(StatusCode::OK, &answer))
}

/// The body of an admin call, within the server's `max_body_bytes`.
async fn read_body(
    state: &FrontState,
    request: http::Request<Incoming>,
) -> Result<bytes::Bytes, ServeError> {
    let limit = state.config.http.max_body_bytes;
    Ok(http_body_util::Limited::new(request.into_body(), limit)
        .collect()
        .await
        .map_err(|_| ServeError::PayloadTooLarge { limit })?
        .to_bytes())
}

/// Runs a deployment's control on every replica at once; 200 when every replica did it, else
/// the first failure's status, with each replica's answer or error.
async fn control(
    state: &FrontState,
    request: http::Request<Incoming>,
    deployment: &str,
    name: &str,
) -> Result<Response, ServeError> {
    state.config.admin.authorize(request.headers(), true)?;
    state.controller.operations().check_deployment(deployment)?;
    let body = read_body(state, request).await?;
    let results = state
        .controller
        .operations()
        .control(deployment, name, body)
        .await?;
    let mut answers = serde_json::Map::new();
    let mut failure = None;
    for (replica, result) in results {
        let answer = match result {
            Ok(value) => value,
            Err(e) => {
                let value = json!({"error": {"message": e.to_string(), "type": e.error_type()}});
                failure.get_or_insert(e);
                value
            }
        };
        answers.insert(replica, answer);
    }
    let status = failure.map_or(StatusCode::OK, |e| e.http_status());
    Ok(json_response(
        status,
        &json!({"deployment": deployment, "control": name, "replicas": answers}),
    ))
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = modelmux_serve::json_response(body);
    *r.status_mut() = status;
    r
}

async fn route(
    state: &FrontState,
    request: &http::Request<Incoming>,
) -> Result<Response, ServeError> {
    let path = request.uri().path();
    let method = request.method();
    match (method, path) {
        (&Method::GET, "/-/healthz" | "/health") => Ok(healthz(state)),
        (&Method::GET, "/-/routes") => {
            let routes: serde_json::Map<String, Value> = state
                .controller
                .routes()
                .into_iter()
                .map(|(prefix, app)| (prefix, json!(&*app)))
                .collect();
            Ok(json_response(StatusCode::OK, &Value::Object(routes)))
        }
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Body::from(crate::metrics::render(&state.metrics)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
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

fn healthz(state: &FrontState) -> Response {
    let unavailable = |body: Value| json_response(StatusCode::SERVICE_UNAVAILABLE, &body);
    match state.controller.health() {
        Health::Ready => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Health::Draining => unavailable(json!({"status": "draining"})),
        Health::Loading(deployments) => {
            unavailable(json!({"status": "loading", "loading": deployments}))
        }
        Health::NotReady(reason) => unavailable(json!({"status": "not_ready", "reason": reason})),
        Health::Unavailable(deployments) => unavailable(
            json!({"status": "unavailable", "deployments_without_replicas": deployments}),
        ),
    }
}

async fn models(
    state: &FrontState,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<Response, ServeError> {
    if path == "/-/models" {
        return match *method {
            Method::GET => Ok(json_response(
                StatusCode::OK,
                &json!(state.controller.models()),
            )),
            _ => Err(ServeError::MethodNotAllowed {
                message: "use GET on /-/models".into(),
            }),
        };
    }
    let rest = &path["/-/models/".len()..];
    let (deployment, rest) = rest.split_once('/').ok_or_else(|| ServeError::BadRequest {
        message: "expected /-/models/{deployment}/{model_id}[/load|/unpin]".into(),
    })?;
    // Decoded as the model id is (the dashboard encodes both).
    let deployment = &percent_decode(deployment)?;
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
    let operations = state.controller.operations();
    let answer = match action {
        Action::Load => {
            let pin = query_flag(query, "pin");
            let replica = operations.load_model(deployment, &id, pin).await?;
            json!({"model_id": id.as_str(), "deployment": deployment, "replica": replica, "pinned": pin})
        }
        Action::Evict => {
            let evicted = operations.evict_model(deployment, &id)?;
            json!({"model_id": id.as_str(), "evicted_from": evicted})
        }
        Action::Unpin => {
            let unpinned = operations.unpin_model(deployment, &id)?;
            json!({"model_id": id.as_str(), "unpinned_on": unpinned})
        }
    };
    Ok(json_response(StatusCode::OK, &answer))
}

enum Action {
    Load,
    Evict,
    Unpin,
}

fn query_flag(query: Option<&str>, name: &str) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|kv| kv == name || kv == format!("{name}=true") || kv == format!("{name}=1"))
}

/// Decodes `%XX` escapes (model ids and deployment names in paths may need them).
fn percent_decode(s: &str) -> Result<String, ServeError> {
    let bad = || ServeError::BadRequest {
        message: format!("'{s}' is not validly percent-encoded UTF-8"),
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
    fn query_flags() {
        assert!(query_flag(Some("pin=true"), "pin"));
        assert!(query_flag(Some("x=1&pin"), "pin"));
        assert!(!query_flag(Some("pin=false"), "pin"));
        assert!(!query_flag(None, "pin"));
    }
}
