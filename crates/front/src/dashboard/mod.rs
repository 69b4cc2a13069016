//! The dashboard at `/-/dashboard`: a page embedded in the binary (no CDN, no build step)
//! that polls `/-/dashboard/state` every second: the models of every replica (as
//! `/-/models`) and each deployment's recent rates and percentiles from the in-process
//! ring of samples (`samples.rs`). Its actions (load, pin, unpin, evict) are the admin API's
//! own calls, under the same access rules; the page itself may not be framed by another
//! origin (`frame-ancestors 'none'`), and runs only its own scripts.

mod samples;

use http::{HeaderValue, Method, StatusCode, header};
use modelmux_serve::{Body, ServeError};
use serde_json::json;

pub(crate) use samples::Samples;

use crate::Response;
use crate::state::FrontState;

/// The page's files: path under `/-/dashboard`, content type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_str!("../../assets/dashboard/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/dashboard/app.js"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/dashboard/app.css"),
    ),
    (
        "/uplot.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/dashboard/uplot.min.js"),
    ),
    (
        "/uplot.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/dashboard/uPlot.min.css"),
    ),
];

/// Only the page's own files, scripts and calls; never inside another site's frame.
const POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                      script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

/// Answers `path` (under `/-/dashboard`), or `None` when it is not the dashboard's.
pub(crate) fn route(
    state: &std::sync::Arc<FrontState>,
    method: &Method,
    path: &str,
    headers: &http::HeaderMap,
) -> Option<Result<Response, ServeError>> {
    let rest = path.strip_prefix("/-/dashboard")?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    if method != Method::GET {
        return Some(Err(ServeError::MethodNotAllowed {
            message: format!("use GET on {path}"),
        }));
    }
    if rest == "/state" {
        return Some(state_json(state, headers));
    }
    let rest = if rest == "/" { "" } else { rest };
    let (_, kind, content) = ASSETS.iter().find(|(p, _, _)| *p == rest)?;
    let mut r = Response::new(Body::from(*content));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(Ok(r))
}

/// `GET /-/dashboard/state`: what `/-/models` says, and each deployment's series; behind the
/// admin token as `/-/models` is. The first call starts the sampling.
fn state_json(
    state: &std::sync::Arc<FrontState>,
    headers: &http::HeaderMap,
) -> Result<Response, ServeError> {
    state.config.admin.authorize(headers, false)?;
    state.dashboard.start(state);
    let body = json!({
        "time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        "interval_seconds": samples::INTERVAL.as_secs_f64(),
        "models": state.controller.models(),
        "deployments": state.dashboard.series(),
    });
    let mut r = modelmux_serve::json_response(&body);
    *r.status_mut() = StatusCode::OK;
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}
