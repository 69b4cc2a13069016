//! What a worker asks of modelmux: handle calls to other deployments (routed like any request,
//! so they reach the replicas holding their model) and models for an ensemble (through the
//! replica's own cache, so they count against its caps).

use bytes::Bytes;
use http_body_util::BodyExt;
use modelmux_cache::Multiplexer;
use modelmux_serve::{Body, HandleCall, ReplicaContext};

use crate::calls::CallAnswer;
use crate::conn::{BoxFuture, Callbacks};
use crate::model::PyModel;
use crate::wire::{CallError, CallHead, CallResultHead};

/// The most of an error answer (not a Python deployment's result) kept for its message.
const MAX_ERROR_BYTES: usize = 64 << 10;

/// A replica's answers to its worker.
pub(crate) struct ReplicaCallbacks {
    pub(crate) ctx: ReplicaContext,
    pub(crate) models: Option<Multiplexer<PyModel>>,
}

impl ReplicaCallbacks {
    async fn handle_call(&self, head: CallHead, args: Bytes) -> CallAnswer {
        // Another application's deployment (Ray's `get_deployment_handle(name, app_name)`),
        // or its ingress when no deployment is named (`get_app_handle`).
        let found = match head.app.as_deref() {
            Some(app) if app != self.ctx.app() || head.deployment.is_empty() => {
                let deployment = Some(head.deployment.as_str()).filter(|d| !d.is_empty());
                self.ctx.handle_in(app, deployment)
            }
            _ => self.ctx.handle(&head.deployment),
        };
        let unavailable = |message: String, status: u16| {
            CallAnswer::failed(CallError::new(
                "DeploymentUnavailableError",
                message,
                status,
            ))
        };
        let handle = match found {
            Ok(handle) => handle,
            Err(e) => return unavailable(e.to_string(), 404),
        };
        // A nested call carries the model id its caller set, never the caller's own.
        let handle = match head.model_id.as_deref() {
            Some(id) => match handle.options().multiplexed_model_id(id) {
                Ok(handle) => handle,
                Err(e) => {
                    return CallAnswer::failed(CallError::new("ValueError", e.to_string(), 400));
                }
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
            stream: head.stream,
        });
        let response = match handle.call(request).await {
            Ok(response) => response,
            Err(e) => return unavailable(e.to_string(), e.http_status().as_u16()),
        };
        let status = response.status().as_u16();
        let result = response
            .headers()
            .get("x-modelmux-result")
            .map(|v| v.as_bytes().to_vec());
        match result.as_deref() {
            // The value (or the stream of items) streams on to the caller as it comes.
            Some(b"value" | b"stream") => CallAnswer {
                head: CallResultHead::answered(status, false),
                body: response.into_body(),
            },
            Some(b"exception") => CallAnswer {
                head: CallResultHead::answered(status, true),
                body: response.into_body(),
            },
            // Not a Python deployment's answer (or an error before the call ran).
            _ => {
                let body = http_body_util::Limited::new(response.into_body(), MAX_ERROR_BYTES)
                    .collect()
                    .await
                    .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                    .unwrap_or_else(|e| format!("(the answer could not be read: {e})"));
                CallAnswer::failed(CallError::new("DeploymentResponseError", body, status))
            }
        }
    }
}

impl Callbacks for ReplicaCallbacks {
    fn call(&self, head: CallHead, args: Bytes) -> BoxFuture<'_, CallAnswer> {
        Box::pin(self.handle_call(head, args))
    }

    fn acquire(&self, model_id: String) -> BoxFuture<'_, Result<Box<dyn Send + Sync>, CallError>> {
        Box::pin(async move {
            let Some(models) = &self.models else {
                return Err(CallError::new(
                    "RuntimeError",
                    "this deployment has no @serve.multiplexed loader",
                    400,
                ));
            };
            match models.get(&model_id).await {
                Ok(guard) => Ok(Box::new(guard) as Box<dyn Send + Sync>),
                Err(e) => {
                    let message = e.to_string();
                    let status = modelmux_serve::ServeError::Model(e).http_status();
                    Err(CallError::new("ModelLoadError", message, status.as_u16()))
                }
            }
        })
    }
}
