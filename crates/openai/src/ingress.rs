//! The OpenAI ingress: parses and checks each request, turns its `model` into an adapter id,
//! and calls the LLM deployment through a handle with that id as the multiplexed model id, so
//! the model-aware router sends it to a replica holding the adapter (or places the adapter).
//! An adapter named by its source (`<base>:s3://bucket/team-a/pirate`) is checked against
//! `lora_config.allowed_sources` here, before any replica (or store) sees the request.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, header};
use modelmux_cache::{BoxError, ModelId};
use modelmux_llm::{AdapterNames, AllowedSources};
use modelmux_serve::{
    Body, Deployment, DeploymentHandle, Holding, Request, Response, ServeError, json_response,
};
use modelmux_store::ModelRepository;

use crate::call::{LlmCall, Op, Parsed};
use crate::errors::serve_error;
use crate::params::invalid;
use crate::protocol::ModelCard;

/// Adapters listed by `GET /v1/models` from the repository, at most.
const MAX_LISTED: usize = 1000;

/// One replica of the ingress deployment.
pub(crate) struct OpenAiIngress {
    pub(crate) llm: DeploymentHandle,
    /// The base model's name.
    pub(crate) base: String,
    /// The longest sequence a request may make, in tokens (`/v1/models` says it).
    pub(crate) max_model_len: usize,
    /// The adapter repository, for listing (the LLM replicas load from their own handle).
    pub(crate) adapters: Option<ModelRepository>,
    /// Where requests may name adapters by source (`lora_config.allowed_sources`).
    pub(crate) sources: AllowedSources,
    /// Adapters registered under a name by `/v1/load_lora_adapter` (shared with this
    /// process's LLM replicas, which load them).
    pub(crate) names: AdapterNames,
    pub(crate) created: u64,
    /// The application's route prefix, taken off paths (`/` takes nothing).
    pub(crate) prefix: String,
    /// The admin API's bearer token, which the adapter controls require when set.
    pub(crate) admin: modelmux_serve::AdminAccess,
    /// This node's stored responses (`/v1/responses`).
    pub(crate) responses: std::sync::Arc<crate::responses::ResponseStore>,
    /// This node's id in a cluster, which the response ids it makes name.
    pub(crate) node: Option<String>,
    /// A handle to this deployment, in a cluster: a turn whose conversation another node
    /// stored goes to that node's replicas.
    pub(crate) own: Option<DeploymentHandle>,
    /// Requests by the API they came in through.
    pub(crate) api_metrics: std::sync::Arc<crate::metrics::ApiMetrics>,
}

impl OpenAiIngress {
    /// The adapter a request's `model` (and the `serve_multiplexed_model_id` header) names:
    /// `None` for the base model. An adapter named by its source (a path or URL) outside
    /// `lora_config.allowed_sources` is refused here (403), whichever of the two named it.
    pub(crate) fn adapter_for(&self, model: &str) -> Result<Option<ModelId>, ServeError> {
        let base = &self.base;
        let named = if model == base {
            None
        } else if let Some((b, adapter)) = model.split_once(':') {
            if b != base {
                return Err(ServeError::NotFound {
                    what: format!(
                        "model '{b}' is not served here: this server serves '{base}' and its adapters as '{base}:<adapter>'"
                    ),
                });
            }
            Some(adapter)
        } else {
            // A bare name that is not the base model's is an adapter's.
            Some(model)
        };
        let named = named
            .map(|a| {
                let usable = |e: &dyn std::fmt::Display| {
                    invalid(
                        "model",
                        format!("'{model}' does not name a usable adapter: {e}"),
                    )
                };
                let id = ModelId::new(a).map_err(|e| usable(&e))?;
                if !AllowedSources::is_source(a) {
                    id.as_relative_path().map_err(|e| usable(&e))?;
                }
                Ok::<_, ServeError>(id)
            })
            .transpose()?;
        let header = modelmux_context::multiplexed_model_id();
        let adapter = match (named, header) {
            (None, h) => h,
            (Some(a), None) => Some(a),
            (Some(a), Some(h)) if a == h => Some(a),
            (Some(a), Some(h)) => {
                return Err(invalid(
                    "model",
                    format!(
                        "model names adapter '{a}' but the serve_multiplexed_model_id header names '{h}'"
                    ),
                ));
            }
        };
        if let Some(a) = &adapter
            && AllowedSources::is_source(a.as_str())
        {
            self.sources
                .check(a.as_str())
                .map_err(|e| serve_error(&e))?;
        }
        if let Some(a) = &adapter
            && self.adapters.is_none()
        {
            return Err(ServeError::NotFound {
                what: format!(
                    "adapter '{a}' not found: this server serves '{base}' without an adapter repository (lora_config)"
                ),
            });
        }
        Ok(adapter)
    }

    /// Calls the LLM deployment with `call` (parsed from `body`, which goes along for a
    /// replica that must parse it again), on `adapter`'s multiplexed model id.
    pub(crate) async fn forward(
        &self,
        op: Op,
        body: Bytes,
        call: LlmCall,
        adapter: Option<ModelId>,
    ) -> Result<Response, ServeError> {
        let mut request = http::Request::builder()
            .method(Method::POST)
            .uri(op.path())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .map_err(|e| ServeError::BadRequest {
                message: e.to_string(),
            })?;
        request.extensions_mut().insert(Parsed::new(call));
        let handle = match adapter {
            Some(a) => self.llm.options().multiplexed_model_id(a.as_str())?,
            None => self.llm.options().no_model_id(),
        };
        handle.call(request).await
    }

    /// The models served, once the LLM replicas of this node have started: while they start,
    /// 503 with `Retry-After`, as `/health` answers (clients poll this for readiness, as they
    /// do vLLM's).
    async fn models(&self) -> Result<Response, ServeError> {
        if self.llm.starting() {
            return Err(ServeError::Failed(modelmux_cache::Failure::new(
                modelmux_cache::ErrorKind::Unavailable,
                format!(
                    "'{}' is still loading: its replicas are starting (see /health)",
                    self.base
                ),
            )));
        }
        let held = self.llm.held_models();
        let replicas: Vec<String> = held.iter().map(|(r, _)| r.clone()).collect();
        let mut adapters: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if let Some(repository) = &self.adapters {
            match repository.list(MAX_LISTED).await {
                Ok(ids) => adapters.extend(ids.into_iter().map(|id| (id.to_string(), Vec::new()))),
                Err(e) => tracing::warn!("cannot list the adapter repository: {e}"),
            }
        }
        for (replica, models) in held {
            for (id, holding) in models {
                match holding {
                    Holding::Loaded => adapters
                        .entry(id.to_string())
                        .or_default()
                        .push(replica.clone()),
                    Holding::Loading => {
                        adapters.entry(id.to_string()).or_default();
                    }
                    Holding::Pending(_) => {}
                }
            }
        }
        let card =
            |id: String, root: String, parent: Option<String>, loaded_on: Vec<String>| ModelCard {
                id,
                object: "model",
                created: self.created,
                owned_by: "modelmux",
                root,
                parent,
                max_model_len: None,
                loaded_on,
            };
        let mut base = card(self.base.clone(), self.base.clone(), None, replicas);
        base.max_model_len = Some(self.max_model_len);
        let mut data = vec![base];
        // Names registered by a load with a path come last, in the order they were
        // registered, named as they were (vLLM's listing), with the path as their root.
        let names = self.names.list();
        data.extend(
            adapters
                .iter()
                .filter(|(a, _)| !names.iter().any(|(n, _)| n == *a))
                .map(|(a, on)| {
                    let id = format!("{}:{a}", self.base);
                    card(id.clone(), id, Some(self.base.clone()), on.clone())
                }),
        );
        data.extend(names.into_iter().map(|(name, path)| {
            let on = adapters.get(&name).cloned().unwrap_or_default();
            card(name, path, Some(self.base.clone()), on)
        }));
        Ok(json_response(
            &serde_json::json!({"object": "list", "data": data}),
        ))
    }
}

impl OpenAiIngress {
    /// Answers `request` to `op` (at `path`, the route prefix taken off).
    async fn dispatch(&self, op: Op, path: &str, request: Request) -> Result<Response, BoxError> {
        let answer = match op {
            Op::Models => self.models().await,
            Op::LoadAdapter => self.adapter_control(request, true).await,
            Op::UnloadAdapter => self.adapter_control(request, false).await,
            Op::StoredResponse | Op::DeleteResponse | Op::InputItems => {
                let id = Op::response_id(path);
                match self.stored_elsewhere(Some(id)) {
                    Some(node) => {
                        let (head, _) = request.into_parts();
                        self.on_node(&node, id, None, &head, Bytes::new()).await
                    }
                    None => self.stored_response(op, id, request.uri().query()).await,
                }
            }
            Op::Responses => {
                let (head, body) = request.into_parts();
                let body = body.to_bytes(usize::MAX).await?;
                self.create_response(&head, body).await
            }
            Op::Messages | Op::CountTokens => {
                let body = request.into_body().to_bytes(usize::MAX).await?;
                return Ok(self.anthropic(op, body).await);
            }
            _ => {
                // Parsed here, once (a long body on the blocking pool): the LLM replica gets
                // the parsed call with the request.
                let body = request.into_body().to_bytes(usize::MAX).await?;
                let (call, model) = LlmCall::parse_off_worker(op, body.clone()).await?;
                let adapter = self.adapter_for(&model.unwrap_or_default())?;
                // Adapters share the base model's tokenizer: any replica tokenizes.
                let adapter = match op {
                    Op::Tokenize | Op::Detokenize => None,
                    _ => adapter,
                };
                self.forward(op, body, call, adapter).await
            }
        };
        Ok(answer?)
    }
}

impl Deployment for OpenAiIngress {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let full = request.uri().path();
        let path = match full.strip_prefix(self.prefix.trim_end_matches('/')) {
            Some(rest) if rest.starts_with('/') => rest,
            _ => full,
        }
        .to_owned();
        let op = Op::of(request.method(), &path)?;
        let answer = self.dispatch(op, &path, request).await;
        let status = match &answer {
            Ok(response) => response.status(),
            Err(e) => e.downcast_ref::<ServeError>().map_or(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                ServeError::http_status,
            ),
        };
        self.api_metrics.count(op, status);
        answer
    }
}
