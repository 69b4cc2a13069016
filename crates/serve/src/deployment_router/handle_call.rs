//! Handle calls between nodes. A handle call (a request with [`HandleCall`]) carries the
//! caller's arguments as a pickle, which runs code when it is read, so it leaves this node only
//! as a call of the other node's `POST /-/deployments/{deployment}/call/{method}` endpoint, with
//! the admin token that endpoint checks (the nodes of a cluster share it). Without a token a
//! handle call stays on this node: the router never chooses another node's replica for it.
//!
//! This module must never send anything: it says where a call may go and what it looks like
//! on the wire; the router sends it.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use http::{HeaderMap, HeaderValue, header};
use modelmux_cache::{ErrorKind, Failure};
use modelmux_context::RequestContext;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::{HandleCall, Request, Route, ServeError};

/// The bearer token handle calls carry to other nodes: this node's admin token, which every
/// node of a cluster shares. Set by the server when it starts; one for all of its routers.
#[derive(Default)]
pub(crate) struct CallToken(ArcSwapOption<String>);

impl CallToken {
    /// Sets the token (`None`, or an empty one: handle calls stay on this node).
    pub(crate) fn set(&self, token: Option<&str>) {
        let token = token
            .filter(|t| !t.is_empty())
            .map(|t| Arc::new(t.to_owned()));
        self.0.store(token);
    }

    pub(crate) fn get(&self) -> Option<Arc<String>> {
        self.0.load_full()
    }

    pub(crate) fn is_set(&self) -> bool {
        self.0.load().is_some()
    }
}

/// The route a request may take. A handle call may be sent to another node only when this node
/// has the token that node checks: without one, one routed anywhere stays here (and fails, as
/// unavailable, when no replica of its deployment runs here). Every other request keeps its
/// route.
pub(super) fn route_for(
    route: Route,
    is_call: bool,
    can_forward_calls: bool,
    runs_here: bool,
    deployment: &str,
) -> Result<Route, ServeError> {
    match route {
        Route::Anywhere if is_call && !can_forward_calls => {
            if !runs_here {
                return Err(ServeError::Failed(Failure::new(
                    ErrorKind::Unavailable,
                    format!(
                        "no replica of '{deployment}' runs on this node, and handle calls go to \
                         other nodes only when every node of the cluster has the same admin \
                         token (http_options.admin_token or MODELMUX_ADMIN_TOKEN)"
                    ),
                )));
            }
            Ok(Route::Local { preferred: None })
        }
        route => Ok(route),
    }
}

/// What a path segment or query value keeps unescaped: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The header naming the model, as the call endpoint reads it.
const MODEL_ID_HEADER: &str = "serve_multiplexed_model_id";
const REQUEST_ID_HEADER: &str = "x-request-id";
const TRACEPARENT: &str = "traceparent";

/// Handle call `call` of deployment `deployment` of application `app` as it goes to another
/// node: `POST /-/deployments/{deployment}/call/{method}?app={app}` (each part
/// percent-encoded) with the body unchanged and only the headers that endpoint reads: the
/// model id and request id of `context`, the request's `traceparent` and `Content-Type`, and
/// `Authorization: Bearer <token>`. Nothing else of the request goes (a header the caller set
/// cannot pass as the other node's). The forwarder adds the chosen replica.
pub(super) fn for_peer(
    request: Request,
    call: &HandleCall,
    app: &str,
    deployment: &str,
    context: &RequestContext,
    token: &str,
) -> Result<Request, ServeError> {
    let path = format!(
        "/-/deployments/{}/call/{}?app={}",
        utf8_percent_encode(deployment, SEGMENT),
        utf8_percent_encode(&call.method, SEGMENT),
        utf8_percent_encode(app, SEGMENT),
    );
    let invalid = |what: &str| {
        ServeError::Failed(Failure::new(
            ErrorKind::Internal,
            format!("a handle call to '{deployment}' could not be sent to another node: {what}"),
        ))
    };
    let (mut parts, body) = request.into_parts();
    let mut headers = HeaderMap::new();
    for name in [header::CONTENT_TYPE.as_str(), TRACEPARENT] {
        if let Some(value) = parts.headers.get(name) {
            headers.insert(name, value.clone());
        }
    }
    if call.stream {
        headers.insert(crate::STREAM_HEADER, HeaderValue::from_static("true"));
    }
    if let Some(id) = context.multiplexed_model_id() {
        let value = HeaderValue::from_str(id.as_str()).map_err(|_| invalid("its model id"))?;
        headers.insert(MODEL_ID_HEADER, value);
    }
    if let Some(id) = context.request_id() {
        let value = HeaderValue::from_str(id.as_str()).map_err(|_| invalid("its request id"))?;
        headers.insert(REQUEST_ID_HEADER, value);
    }
    let mut bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| invalid("the admin token is not a valid header value"))?;
    // Kept out of HTTP/2's header table and out of debug output.
    bearer.set_sensitive(true);
    headers.insert(header::AUTHORIZATION, bearer);
    parts.method = http::Method::POST;
    parts.uri = path.parse().map_err(|_| invalid("its path"))?;
    parts.headers = headers;
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use modelmux_cache::ModelId;
    use modelmux_context::RequestId;

    use super::*;
    use crate::Body;

    fn call() -> Request {
        let mut request = http::Request::builder()
            .uri("/whatever/the/caller/said")
            .header("content-type", "application/x-python-pickle")
            .header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .header("authorization", "Bearer the-callers-own")
            .header("x-modelmux-forwarded", "forged")
            .header("cookie", "secret")
            .body(Body::from("pickled"))
            .unwrap();
        request.extensions_mut().insert(HandleCall {
            method: "__call__".into(),
            stream: false,
        });
        request
    }

    #[test]
    fn a_forwarded_call_goes_to_the_call_endpoint_with_the_token_and_the_callers_ids() {
        let context = RequestContext::new()
            .with_request_id(RequestId::new("req-1").unwrap())
            .with_multiplexed_model_id(ModelId::new("org/model 7").unwrap());
        let request = call();
        let method = request.extensions().get::<HandleCall>().unwrap().clone();
        let sent = for_peer(request, &method, "my app", "Model/X", &context, "s3cret").unwrap();
        assert_eq!(sent.method(), http::Method::POST);
        assert_eq!(
            sent.uri().to_string(),
            "/-/deployments/Model%2FX/call/__call__?app=my%20app"
        );
        let headers: Vec<(String, String)> = sent
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let mut headers = headers;
        headers.sort();
        assert_eq!(
            headers,
            [
                ("authorization", "Bearer s3cret"),
                ("content-type", "application/x-python-pickle"),
                ("serve_multiplexed_model_id", "org/model 7"),
                (
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                ),
                ("x-request-id", "req-1"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            "the caller's own authorization, cookies and forwarded header never go"
        );
        assert!(sent.headers()[header::AUTHORIZATION].is_sensitive());
        assert_eq!(sent.body().full_bytes().unwrap(), "pickled");
    }

    #[test]
    fn a_call_without_a_model_or_request_id_names_none() {
        let request = call();
        let method = HandleCall {
            method: "m é".into(),
            stream: true,
        };
        let sent = for_peer(request, &method, "a", "D", &RequestContext::new(), "t").unwrap();
        assert_eq!(sent.uri().path(), "/-/deployments/D/call/m%20%C3%A9");
        assert!(!sent.headers().contains_key(MODEL_ID_HEADER));
        assert!(!sent.headers().contains_key(REQUEST_ID_HEADER));
        // A streamed call says so to the other node's call endpoint.
        assert_eq!(sent.headers()[crate::STREAM_HEADER], "true");
    }

    #[test]
    fn without_a_token_a_handle_call_stays_on_this_node() {
        let local = |r: &Route| matches!(r, Route::Local { preferred: None });
        // No token: kept here, or refused when nothing runs here.
        let kept = route_for(Route::Anywhere, true, false, true, "D").unwrap();
        assert!(local(&kept));
        let refused = route_for(Route::Anywhere, true, false, false, "D").unwrap_err();
        assert_eq!(refused.http_status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(refused.to_string().contains("admin token"), "{refused}");
        // With a token, anywhere.
        let anywhere = route_for(Route::Anywhere, true, true, false, "D").unwrap();
        assert!(matches!(anywhere, Route::Anywhere));
        // Requests that are not handle calls keep their route, token or not.
        let plain = route_for(Route::Anywhere, false, false, false, "D").unwrap();
        assert!(matches!(plain, Route::Anywhere));
        let preferred = Route::Local {
            preferred: Some("r".into()),
        };
        let forwarded = route_for(preferred, true, false, true, "D").unwrap();
        assert!(matches!(forwarded, Route::Local { preferred: Some(p) } if &*p == "r"));
    }

    #[test]
    fn an_empty_token_is_no_token() {
        let token = CallToken::default();
        assert!(!token.is_set());
        token.set(Some(""));
        assert!(!token.is_set());
        token.set(Some("t"));
        assert_eq!(token.get().as_deref().map(String::as_str), Some("t"));
        token.set(None);
        assert!(token.get().is_none());
    }
}
