//! **modelmux** serves many models of the same shape (one fine-tuned model per customer,
//! hundreds of LoRA adapters on one base model) from one pool of replicas.
//!
//! This crate gathers the public API of the layers:
//! - the per-replica model cache, [`Multiplexer`] (from `modelmux-cache`): models loaded on
//!   demand by your [`Loader`], held by [`ModelGuard`]s, evicted least-recently-used within a
//!   count and byte budget;
//! - the request context (from `modelmux-context`): [`multiplexed_model_id`] and
//!   [`request_id`] tell code inside a request which model and request it serves.
//!
//! ```
//! use modelmux::{Model, ModelId, Multiplexer, RequestContext, multiplexed_model_id};
//!
//! struct Classifier { threshold: f32 }
//! impl Model for Classifier {}
//!
//! struct Inferencer { models: Multiplexer<Classifier> }
//!
//! impl Inferencer {
//!     async fn call(&self, score: f32) -> Result<bool, modelmux::Error> {
//!         let id = multiplexed_model_id().expect("requests name a model");
//!         let model = self.models.get(&id).await?;
//!         Ok(score > model.threshold)
//!     }
//! }
//!
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # rt.block_on(async {
//! let inferencer = Inferencer {
//!     models: Multiplexer::builder().max_models(3).build(|id: ModelId| async move {
//!         Ok::<_, std::num::ParseFloatError>(Classifier { threshold: id.parse()? })
//!     }),
//! };
//! let request = RequestContext::new().with_multiplexed_model_id(ModelId::new("0.5")?);
//! assert!(request.scope(inferencer.call(0.7)).await?);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

pub use modelmux_cache::*;
pub use modelmux_context::{
    InvalidRequestId, MAX_REQUEST_ID_LEN, RequestContext, RequestId, multiplexed_model_id,
    request_id,
};

/// The README's code, compiled as a doc test so it cannot drift from the API.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
