//! The HTTP front door: request id, model id header, body limit, route to an application,
//! and the `x-request-id` / `x-modelmux-replica` response headers.
//!
//! It knows nothing of models beyond their ids: it validates the header and hands the request
//! to the application's ingress deployment.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use modelmux_cache::ModelId;
use modelmux_context::{RequestContext, RequestId};

use crate::server::ServerState;
use crate::{Body, Response, ServeError};

/// The header naming the model, as Ray Serve spells it.
pub const MODEL_ID_HEADER: HeaderName = HeaderName::from_static("serve_multiplexed_model_id");
/// The same with dashes, which some proxies rewrite underscores to.
pub const MODEL_ID_HEADER_DASHED: HeaderName =
    HeaderName::from_static("serve-multiplexed-model-id");
/// The request id header, echoed (or generated) on every response.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");
/// The replica that served the request.
pub const REPLICA_HEADER: HeaderName = HeaderName::from_static("x-modelmux-replica");

pub(crate) async fn handle(
    state: Arc<ServerState>,
    request: http::Request<Incoming>,
) -> Result<Response, Infallible> {
    // A client's request id is echoed if it is usable, else one is made up.
    let request_id = request
        .headers()
        .get(&REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| RequestId::new(v).ok())
        .unwrap_or_else(RequestId::generate);
    let path = request.uri().path();
    let mut response = if path == "/metrics" || path.starts_with("/-/") {
        crate::admin::handle(&state, request, &request_id).await
    } else {
        route(&state, request, request_id.clone()).await
    };
    if let Ok(v) = HeaderValue::from_str(request_id.as_str()) {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    Ok(response)
}

async fn route(
    state: &ServerState,
    request: http::Request<Incoming>,
    request_id: RequestId,
) -> Response {
    let fail = |e: ServeError| e.into_response(Some(request_id.as_str()));
    let Some(app) = state.app_for(request.uri().path()) else {
        return fail(ServeError::NoRoute {
            path: request.uri().path().to_string(),
        });
    };
    let model = match model_id(request.headers()) {
        Ok(model) => model,
        Err(e) => return fail(e),
    };
    let (parts, body) = request.into_parts();
    let body = match read_body(&parts.headers, body, state.config.max_body_bytes).await {
        Ok(body) => body,
        Err(e) => return fail(e),
    };
    let mut context = RequestContext::new().with_request_id(request_id.clone());
    if let Some(model) = model {
        context = context.with_multiplexed_model_id(model);
    }
    let (result, replica) = app
        .ingress
        .dispatch(http::Request::from_parts(parts, body), context)
        .await;
    let mut response = result.unwrap_or_else(fail);
    if let Some(v) = replica.and_then(|r| HeaderValue::from_str(&r).ok()) {
        response.headers_mut().insert(REPLICA_HEADER, v);
    }
    response
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

/// Reads the body, refusing it early (from `Content-Length`) or as soon as it passes `limit`.
async fn read_body(headers: &HeaderMap, body: Incoming, limit: usize) -> Result<Body, ServeError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ServeError::PayloadTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(Body::from(collected.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ServeError::PayloadTooLarge { limit })
        }
        Err(e) => Err(ServeError::BadRequest {
            message: format!("reading the request body failed: {e}"),
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
