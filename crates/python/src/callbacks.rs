//! What a worker asks of modelmux: handle calls to other deployments (routed like any request,
//! so they reach the replicas holding their model) and models for an ensemble (through the
//! replica's own cache, so they count against its caps).

use bytes::Bytes;
use http_body_util::BodyExt;
use modelmux_cache::Multiplexer;
use modelmux_serve::{Body, HandleCall, ReplicaContext};

use crate::conn::{BoxFuture, Callbacks};
use crate::model::PyModel;
use crate::wire::{CallError, CallHead, CallResultHead};

/// The largest result a handle call may return to a worker.
const MAX_RESULT_BYTES: usize = 256 << 20;

/// A replica's answers to its worker.
pub(crate) struct ReplicaCallbacks {
    pub(crate) ctx: ReplicaContext,
    pub(crate) models: Option<Multiplexer<PyModel>>,
}

fn failed(kind: &str, message: String, status: u16) -> (CallResultHead, Bytes) {
    (
        CallResultHead {
            ok: false,
            status: None,
            exception: false,
            error: Some(CallError {
                kind: kind.into(),
                message,
                status,
            }),
        },
        Bytes::new(),
    )
}

impl ReplicaCallbacks {
    async fn handle_call(&self, head: CallHead, args: Bytes) -> (CallResultHead, Bytes) {
        // Another application's deployment (Ray's `get_deployment_handle(name, app_name)`),
        // or its ingress when no deployment is named (`get_app_handle`).
        let found = match head.app.as_deref() {
            Some(app) if app != self.ctx.app() || head.deployment.is_empty() => {
                let deployment = Some(head.deployment.as_str()).filter(|d| !d.is_empty());
                self.ctx.handle_in(app, deployment)
            }
            _ => self.ctx.handle(&head.deployment),
        };
        let handle = match found {
            Ok(handle) => handle,
            Err(e) => return failed("DeploymentUnavailableError", e.to_string(), 404),
        };
        // A nested call carries the model id its caller set, never the caller's own.
        let handle = match head.model_id.as_deref() {
            Some(id) => match handle.options().multiplexed_model_id(id) {
                Ok(handle) => handle,
                Err(e) => return failed("ValueError", e.to_string(), 400),
            },
            None => handle.options().no_model_id(),
        };
        let mut request = http::Request::new(Body::from(args));
        *request.method_mut() = http::Method::POST;
        request.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-python-pickle"),
        );
        request.extensions_mut().insert(HandleCall {
            method: head.method,
        });
        let response = match handle.call(request).await {
            Ok(response) => response,
            Err(e) => {
                let status = e.http_status().as_u16();
                return failed("DeploymentUnavailableError", e.to_string(), status);
            }
        };
        let status = response.status().as_u16();
        let result = response
            .headers()
            .get("x-modelmux-result")
            .map(|v| v.as_bytes().to_vec());
        let body = match http_body_util::Limited::new(response.into_body(), MAX_RESULT_BYTES)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(e) => {
                return failed(
                    "DeploymentResponseError",
                    format!("reading the result failed: {e}"),
                    502,
                );
            }
        };
        match result.as_deref() {
            Some(b"value") => (ok(status, false), body),
            Some(b"exception") => (ok(status, true), body),
            // Not a Python deployment's answer (or an error before the call ran).
            _ => failed(
                "DeploymentResponseError",
                String::from_utf8_lossy(&body).into_owned(),
                status,
            ),
        }
    }
}

fn ok(status: u16, exception: bool) -> CallResultHead {
    CallResultHead {
        ok: true,
        status: Some(status),
        exception,
        error: None,
    }
}

impl Callbacks for ReplicaCallbacks {
    fn call(&self, head: CallHead, args: Bytes) -> BoxFuture<'_, (CallResultHead, Bytes)> {
        Box::pin(self.handle_call(head, args))
    }

    fn acquire(&self, model_id: String) -> BoxFuture<'_, Result<Box<dyn Send + Sync>, CallError>> {
        Box::pin(async move {
            let Some(models) = &self.models else {
                return Err(CallError {
                    kind: "RuntimeError".into(),
                    message: "this deployment has no @serve.multiplexed loader".into(),
                    status: 400,
                });
            };
            match models.get(&model_id).await {
                Ok(guard) => Ok(Box::new(guard) as Box<dyn Send + Sync>),
                Err(e) => Err(CallError {
                    kind: "ModelLoadError".into(),
                    message: e.to_string(),
                    status: modelmux_serve::ServeError::Model(e).http_status().as_u16(),
                }),
            }
        })
    }
}
