//! Where every HTTP request enters: its request id (the client's, if usable, else a new one),
//! the admin API or the application stack, the `x-request-id` response header, and the access
//! line.

use std::convert::Infallible;
use std::sync::Arc;

use http::HeaderValue;
use hyper::body::Incoming;
use modelmux_context::RequestId;
use tokio::time::Instant;

use super::stack::Apps;
use crate::Response;
use crate::access_log::AccessEntry;
use crate::ingress::{REQUEST_ID_HEADER, Routed, Served};
use crate::state::FrontState;
use modelmux_serve::{ServedModel, access_log_on};

pub(crate) async fn handle(
    state: Arc<FrontState>,
    apps: Arc<Apps>,
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
    let mut response = if modelmux_serve::is_admin_path(path) {
        // Boxed: the admin API's future is large and rare, and an application request's
        // future would otherwise carry (and copy) its size.
        Box::pin(crate::admin::handle(&state, request, &request_id)).await
    } else {
        // What the access line needs of the request, kept only while it is written.
        let asked = access_log_on().then(|| Asked {
            method: request.method().clone(),
            uri: request.uri().clone(),
            started: Instant::now(),
        });
        let (response, served) = match apps.call(request_id.clone(), request).await {
            Ok(Routed { response, served }) => (response, served),
            Err(e) => (e.into_response(Some(request_id.as_str())), None),
        };
        if let Some(asked) = asked {
            access_line(&state, &asked, &request_id, &response, served.as_ref());
        }
        response
    };
    if let Ok(v) = HeaderValue::from_str(request_id.as_str()) {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    Ok(response)
}

/// What the access line says of the request as it came in.
struct Asked {
    method: http::Method,
    uri: http::Uri,
    started: Instant,
}

/// One line per application request (see `access_log.rs`): formatted here, on the request's
/// task, and written by the log's writer off it.
fn access_line(
    state: &FrontState,
    asked: &Asked,
    request_id: &RequestId,
    response: &Response,
    served: Option<&Served>,
) {
    let entry = AccessEntry {
        request_id,
        method: asked.method.as_str(),
        path: asked.uri.path(),
        app: served.map_or("-", |s| &*s.app),
        replica: served.and_then(|s| s.replica.as_deref()).unwrap_or("-"),
        model: served
            .and_then(|s| s.model.as_ref())
            .or_else(|| response.extensions().get::<ServedModel>().map(|m| &m.0)),
        status: response.status().as_u16(),
        ms: asked.started.elapsed().as_secs_f64() * 1e3,
        error: response
            .extensions()
            .get::<modelmux_serve::ErrorType>()
            .map(|e| e.0),
    };
    entry.write(state.access_log.as_ref());
}
