//! `modelmux-onnx`: ONNX models served by modelmux, on [tract](https://github.com/sonos/tract)
//! (pure Rust, CPU).
//!
//! Each model is `<repository>/<model_id>/model.onnx` in a [`ModelRepository`] (a local
//! directory, or S3 through the disk cache). A load reads the file, parses it, optimizes it once
//! for the machine it runs on, and reports the file's size to the cache (so `max_bytes` caps
//! are honest and known before a load starts). Requests are JSON:
//!
//! ```json
//! {"inputs": {"features": [[5.1, 3.5, 1.4, 0.2]]}}
//! ```
//!
//! or, for a model with one input, `{"inputs": [[5.1, 3.5, 1.4, 0.2]]}`. The answer names the
//! model and every output:
//!
//! ```json
//! {"model_id": "customer-1", "outputs": {"probabilities": [[0.1, 0.7, 0.2]]}}
//! ```
//!
//! Inputs are checked against the model's signature before anything runs: a missing or
//! unknown input, a wrong shape (symbolic dimensions such as a batch `N` take any size, the
//! same everywhere they appear) or a value of the wrong type is a 400 that names the input and
//! what it expects. Inference runs on Tokio's blocking pool, never on the async workers that
//! route requests.

mod config;
pub mod demo;
mod signature;

use std::sync::Arc;

use http::{HeaderValue, header};
use modelmux_cache::{BoxError, ErrorKind, Failure, Model, ModelId};
use modelmux_serve::{Body, ModelKind, Request, Response};
use modelmux_store::{ModelRepository, StoreError};
use tract_onnx::prelude::*;

pub use config::OnnxConfig;
pub use demo::BUILTIN_DEMO_REPOSITORY;
pub use signature::{InputSpec, Signature};
/// The tract crate this kind runs on, for callers that need its types.
pub use tract_onnx;

/// The file each model directory holds.
pub const MODEL_FILE: &str = "model.onnx";

/// The ONNX model kind: models from one repository.
#[derive(Clone)]
pub struct Onnx {
    repository: ModelRepository,
}

impl Onnx {
    /// Serves the ONNX models of `repository`.
    pub fn new(repository: ModelRepository) -> Self {
        Self { repository }
    }

    /// The repository.
    pub fn repository(&self) -> &ModelRepository {
        &self.repository
    }
}

/// A loaded, optimized ONNX model.
pub struct OnnxModel {
    plan: Arc<TypedRunnableModel>,
    signature: Arc<Signature>,
    size: u64,
}

impl OnnxModel {
    /// Parses and optimizes an ONNX model. CPU-bound: call it on a blocking thread.
    pub fn from_bytes(bytes: &[u8]) -> TractResult<Self> {
        let model = tract_onnx::onnx()
            .model_for_read(&mut std::io::Cursor::new(bytes))?
            .into_optimized()?;
        let signature = Arc::new(Signature::of(&model)?);
        let plan = model.into_runnable()?;
        Ok(Self {
            plan,
            signature,
            size: bytes.len() as u64,
        })
    }

    /// Its inputs and outputs.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Runs it on `inputs` (in the signature's order). CPU-bound: call it on a blocking thread.
    pub fn run(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.plan.run(inputs)
    }
}

impl Model for OnnxModel {
    fn size_bytes(&self) -> Option<u64> {
        Some(self.size)
    }
}

/// A store error as a [`Failure`] of its kind (an unknown model is the client's, failed
/// storage the upstream's), which the serving layer maps to a status.
fn store_error(error: StoreError) -> BoxError {
    Failure::from(error).into()
}

impl ModelKind for Onnx {
    type Model = OnnxModel;

    async fn probe(&self, id: &ModelId) -> Result<Option<u64>, BoxError> {
        let size = self
            .repository
            .size(id, MODEL_FILE)
            .await
            .map_err(store_error)?;
        Ok(Some(size))
    }

    async fn load(&self, id: &ModelId) -> Result<OnnxModel, BoxError> {
        let file = self
            .repository
            .fetch(id, MODEL_FILE)
            .await
            .map_err(store_error)?;
        let bytes = file.bytes().await.map_err(store_error)?;
        // The file is parsed; a cached copy may be evicted from disk from now on.
        drop(file);
        let parsed = tokio::task::spawn_blocking(move || OnnxModel::from_bytes(&bytes)).await?;
        parsed.map_err(|e| {
            // Downloaded fine, but not a model we can run: do not keep the bad copy, so a
            // fixed upload is picked up by the next load.
            self.repository.discard(id, MODEL_FILE);
            Failure::new(
                ErrorKind::UnusableModel,
                format!(
                    "model '{id}': {MODEL_FILE} in {} is not a valid ONNX model tract can run: {e:#}",
                    self.repository.url()
                ),
            )
            .into()
        })
    }

    async fn infer(
        &self,
        model: &OnnxModel,
        id: &ModelId,
        request: Request,
    ) -> Result<Response, BoxError> {
        // The ingress bounds bodies (`max_body_bytes`); this is the whole body it accepted.
        let body = request.into_body().to_bytes(usize::MAX).await?;
        let plan = model.plan.clone();
        let signature = model.signature.clone();
        let owned_id = id.clone();
        // Parsing the JSON, running the model and writing the answer are all CPU work: none of
        // it runs on the async workers that route requests.
        // The replica counts the work until it ends, even if the client leaves before.
        let body = modelmux_context::spawn_blocking(move || {
            let inputs = signature
                .parse_request(&body)
                .map_err(Failure::invalid_input)?;
            let outputs = plan
                .run(inputs)
                .map_err(|e| format!("model '{owned_id}' failed to run: {e:#}"))?;
            signature
                .render_response(owned_id.as_str(), &outputs)
                .map_err(BoxError::from)
        })
        .await??;
        let mut response = Response::new(Body::from(body));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }
}
