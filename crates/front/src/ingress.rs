//! An application request: its application by route prefix, the model id header, the body
//! (its limit, timeout and share of the body budget), the application's ingress deployment
//! through the `Dispatch` port, and the `x-modelmux-replica` response header.
//!
//! It knows nothing of models beyond their ids: it validates the header and hands the request
//! to the application's ingress deployment.

use std::sync::Arc;

use crate::body_budget::{BodyReservation, ClientAddr};
use bytes::BytesMut;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use http_body::Body as _;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use modelmux_cache::ModelId;
use modelmux_context::{RequestContext, RequestId};
use tokio::time::Instant;

use crate::Response;
use crate::state::FrontState;
use modelmux_serve::Route;
use modelmux_serve::{Body, ServeError};
use modelmux_serve::{FORWARDED_HEADER, PEER_TOKEN_HEADER};

/// The header naming the model, as Ray Serve spells it.
pub const MODEL_ID_HEADER: HeaderName = HeaderName::from_static("serve_multiplexed_model_id");
/// The same with dashes, which some proxies rewrite underscores to.
pub const MODEL_ID_HEADER_DASHED: HeaderName =
    HeaderName::from_static("serve-multiplexed-model-id");
/// The request id header, echoed (or generated) on every response.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");
/// The replica that served the request.
pub const REPLICA_HEADER: HeaderName = HeaderName::from_static("x-modelmux-replica");
/// W3C Trace Context: the caller's span in a request, this server's in its response.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// An application request's response, with what its access line says of the request when it
/// reached an application. Returned beside the response rather than put on it: an extension
/// costs allocations on every request.
pub(crate) struct Routed {
    pub(crate) response: Response,
    pub(crate) served: Option<Served>,
}

/// What the access line says of a request that reached an application's ingress deployment.
pub(crate) struct Served {
    pub(crate) app: Arc<str>,
    /// The model the request's header named; else the one the innermost call that named one
    /// used comes back on the response (an OpenAI request's adapter, named in its body, from
    /// the LLM deployment: [`modelmux_serve::ServedModel`]).
    pub(crate) model: Option<ModelId>,
    pub(crate) replica: Option<Arc<str>>,
}

/// An application request, behind the front door's layers: route it to its application's
/// ingress deployment.
pub(crate) async fn route(
    state: &FrontState,
    request_id: RequestId,
    request: http::Request<Incoming>,
) -> Routed {
    let fail = |e: ServeError| Routed {
        response: e.into_response(Some(request_id.as_str())),
        served: None,
    };
    let Some(app) = state.controller.app_for(request.uri().path()) else {
        return fail(ServeError::NoRoute {
            path: request.uri().path().to_string(),
        });
    };
    let model = match model_id(request.headers()) {
        Ok(model) => model,
        Err(e) => return fail(e),
    };
    let (parts, body) = request.into_parts();
    // The body's bytes count against the server-wide budget until the request is answered.
    let client = parts
        .extensions
        .get::<ClientAddr>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0);
    let (body, _held) = match read_body(&parts.headers, body, client, state).await {
        Ok(read) => read,
        Err(e) => {
            let mut routed = fail(e);
            // The rest of the body may still be on its way: do not read it, close.
            routed
                .response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return routed;
        }
    };
    // A request another node forwarded here is served by this node's replicas, never
    // forwarded again.
    // Only a node of the cluster may name the replica (a client that could would force loads
    // wherever it liked); the proof it is one is removed before anything else sees it.
    let mut parts = parts;
    let from_peer = modelmux_serve::forwarded_by_peer(
        &parts.headers,
        state.config.node_id.is_some(),
        state.config.admin.shared_token(),
    );
    parts.headers.remove(PEER_TOKEN_HEADER);
    if !from_peer {
        parts.headers.remove(FORWARDED_HEADER);
    }
    let route = match parts.headers.get(FORWARDED_HEADER) {
        Some(replica) => Route::Local {
            preferred: replica.to_str().ok().map(Arc::from),
        },
        None => Route::Anywhere,
    };
    let mut context = RequestContext::new().with_request_id(request_id.clone());
    if let Some(model) = &model {
        context = context.with_multiplexed_model_id(model.clone());
    }
    let trace = state
        .tracer
        .as_ref()
        .and_then(|t| t.begin(parts.headers.get(TRACEPARENT)));
    if let Some(t) = &trace {
        context = context.with_trace(t.clone());
    }
    let root = trace.as_ref().map(|t| {
        let mut span = t.start_root("ingress");
        span.attribute("http.method", parts.method.as_str());
        span.attribute("http.target", parts.uri.path());
        span.attribute("app", app.name().to_string());
        span.attribute("request_id", request_id.as_str());
        if let Some(model) = &model {
            span.attribute("model_id", model.as_str());
        }
        span
    });
    let (result, replica) = app
        .dispatch(http::Request::from_parts(parts, body), context, route)
        .await;
    let mut response = result.unwrap_or_else(|e| e.into_response(Some(request_id.as_str())));
    if let Some(v) = replica.as_ref().and_then(|r| HeaderValue::from_str(r).ok()) {
        response.headers_mut().insert(REPLICA_HEADER, v);
    }
    if let (Some(trace), Some(mut span)) = (&trace, root) {
        let status = response.status();
        span.attribute("http.status_code", status.as_u16().to_string());
        if let Some(replica) = &replica {
            span.attribute("replica", replica.to_string());
        }
        span.end(status.is_server_error());
        if let Ok(v) = HeaderValue::from_str(&trace.traceparent()) {
            response.headers_mut().insert(TRACEPARENT, v);
        }
    }
    Routed {
        response,
        served: Some(Served {
            app: app.name().clone(),
            model,
            replica,
        }),
    }
}

/// The model id from either spelling of the header. Absent or empty: a normal request. Both
/// spellings, or one repeated, with different values: refused, so a gateway that sets one
/// spelling cannot be bypassed with the other.
pub(crate) fn model_id(headers: &HeaderMap) -> Result<Option<ModelId>, ServeError> {
    let mut values = headers
        .get_all(&MODEL_ID_HEADER)
        .iter()
        .chain(headers.get_all(&MODEL_ID_HEADER_DASHED).iter());
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.any(|other| other != value) {
        return Err(ServeError::BadRequest {
            message: "the request names two different models (serve_multiplexed_model_id and \
                      serve-multiplexed-model-id, or one of them twice): send one"
                .into(),
        });
    }
    let text = std::str::from_utf8(value.as_bytes()).map_err(|_| ServeError::BadRequest {
        message: "serve_multiplexed_model_id is not valid UTF-8".into(),
    })?;
    if text.is_empty() {
        return Ok(None);
    }
    Ok(Some(ModelId::new(text)?))
}

/// The most a body's buffer holds before its bytes arrive, whatever `Content-Length` says.
const FIRST_BUFFER: u64 = 64 << 10;

/// Reads the body within `body_read_timeout`, refusing it early (from `Content-Length`) or as
/// soon as it passes `max_body_bytes`, and reserving its bytes from the server's body budget
/// as they arrive, within `client`'s share (released when the returned reservation drops).
async fn read_body(
    headers: &HeaderMap,
    body: Incoming,
    client: std::net::IpAddr,
    state: &FrontState,
) -> Result<(Body, Option<BodyReservation>), ServeError> {
    let options = &state.config.http;
    let limit = options.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ServeError::PayloadTooLarge { limit });
    }
    if declared == Some(0) || (declared.is_none() && body.is_end_stream()) {
        return Ok((Body::empty(), None));
    }
    let deadline = Instant::now() + options.body_read_timeout;
    let reading = async {
        // Bytes are reserved as they arrive, not from `Content-Length`, and the buffer grows
        // with them: headers that announce a large body and then nothing hold nothing.
        let mut budget = BodyReservation::new(&state.body_budget, client);
        let mut body = Limited::new(body, limit);
        let mut bytes =
            BytesMut::with_capacity(declared.map_or(0, |n| n.min(FIRST_BUFFER)) as usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ServeError::PayloadTooLarge { limit }
                } else {
                    ServeError::BadRequest {
                        message: format!("reading the request body failed: {e}"),
                    }
                }
            })?;
            if let Ok(data) = frame.into_data() {
                budget.reserve(bytes.len() + data.len())?;
                bytes.extend_from_slice(&data);
            }
        }
        Ok((Body::from(bytes.freeze()), Some(budget)))
    };
    match tokio::time::timeout_at(deadline, reading).await {
        Ok(read) => read,
        Err(_) => Err(ServeError::BodyReadTimeout {
            limit: options.body_read_timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_header_spellings_are_read_and_validated() {
        let mut h = HeaderMap::new();
        assert_eq!(model_id(&h).unwrap(), None);
        h.insert(MODEL_ID_HEADER_DASHED, HeaderValue::from_static("m-1"));
        assert_eq!(model_id(&h).unwrap().unwrap().as_str(), "m-1");
        h.insert(MODEL_ID_HEADER, HeaderValue::from_static("m-2"));
        assert!(
            matches!(model_id(&h), Err(ServeError::BadRequest { .. })),
            "two spellings, two models: refused"
        );
        h.insert(MODEL_ID_HEADER, HeaderValue::from_static("m-1"));
        assert_eq!(
            model_id(&h).unwrap().unwrap().as_str(),
            "m-1",
            "the same model twice"
        );
        h.append(MODEL_ID_HEADER, HeaderValue::from_static("m-3"));
        assert!(
            model_id(&h).is_err(),
            "one spelling repeated with another model"
        );
        h.clear();
        h.insert(MODEL_ID_HEADER, HeaderValue::from_static(""));
        assert_eq!(
            model_id(&h).unwrap(),
            None,
            "empty means no model, as in Ray"
        );
        h.insert(MODEL_ID_HEADER, HeaderValue::from_bytes(b"a\tb").unwrap());
        assert!(matches!(model_id(&h), Err(ServeError::InvalidModelId(_))));
    }
}
