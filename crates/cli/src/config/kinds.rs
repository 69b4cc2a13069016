//! `model: {kind: ...}`: the registry of the model kinds this binary knows. Each kind's crate
//! owns its settings (parsed here as one variant, so serde names a bad field with its path and
//! line) and how its deployments are built; a new kind is its crate plus one variant and one
//! arm below.

use modelmux_cache::MultiplexerBuilder;
use modelmux_onnx::{Onnx, OnnxConfig};
use modelmux_serve::{AdminAccess, DeploymentSpec, model_deployment};
use modelmux_store::{DiskCache, StoreError};
use modelmux_synthetic::{Synthetic, SyntheticConfig};
use serde::Deserialize;

use crate::demo_models::BUILTIN_DEMO_REPOSITORY;

/// The model kinds this binary knows.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    /// Synthetic models (see `modelmux-synthetic`).
    Synthetic(SyntheticConfig),
    /// ONNX models from a model repository (see `modelmux-onnx`).
    Onnx(OnnxConfig),
    /// An LLM and its LoRA adapters behind an OpenAI-compatible API (see `modelmux-openai`).
    Llm(Box<modelmux_openai::LlmConfig>),
}

impl ModelSpec {
    /// Whether it reads from a remote store (and so needs the disk cache).
    pub fn needs_disk_cache(&self) -> bool {
        match self {
            ModelSpec::Synthetic(_) => false,
            ModelSpec::Onnx(onnx) => onnx.needs_disk_cache(),
            ModelSpec::Llm(llm) => llm.needs_disk_cache(),
        }
    }
}

/// What a kind's deployments may need of the server being built.
pub(super) struct BuildContext<'a> {
    /// The disk cache, when some deployment reads from a remote store.
    pub(super) disk_cache: Option<&'a DiskCache>,
    /// Who may use the admin API (the LLM kind guards its adapter endpoints with it).
    pub(super) admin: &'a AdminAccess,
    /// The application's route prefix (the LLM kind's ingress serves under it).
    pub(super) route_prefix: &'a str,
}

/// A kind's deployments for one configured deployment.
pub(super) struct Built {
    /// The deployment the configuration names (its replicas, caps and queue are the
    /// configuration's).
    pub(super) served: DeploymentSpec,
    /// A deployment in front of it that takes its HTTP requests and calls it through a
    /// handle (the LLM kind's OpenAI ingress), if the kind has one.
    pub(super) front: Option<DeploymentSpec>,
    /// `max_ongoing_requests` when the configuration says none (`None`: the kind's own).
    pub(super) default_max_ongoing: Option<usize>,
}

impl ModelSpec {
    /// Builds this kind's deployments as deployment `name`, with `cache` its replicas' model
    /// cache. Repositories are opened now: a malformed location or option is an error here,
    /// not at the first request.
    pub(super) async fn build(
        &self,
        name: &str,
        cache: MultiplexerBuilder,
        ctx: &BuildContext<'_>,
    ) -> Result<Built, StoreError> {
        let one = |served| Built {
            served,
            front: None,
            default_max_ongoing: Some(5),
        };
        Ok(match self {
            ModelSpec::Synthetic(config) => one(model_deployment(
                name,
                Synthetic::new(config.clone()),
                cache,
            )),
            ModelSpec::Onnx(onnx) => {
                let repository = if onnx.repository == BUILTIN_DEMO_REPOSITORY {
                    if !onnx.options.is_empty() {
                        return Err(StoreError::Config(format!(
                            "{BUILTIN_DEMO_REPOSITORY} takes no options"
                        )));
                    }
                    crate::demo_models::repository().await?
                } else {
                    onnx.open(ctx.disk_cache)?
                };
                one(model_deployment(name, Onnx::new(repository), cache))
            }
            ModelSpec::Llm(llm) => {
                // Two deployments, as Ray composes them: the OpenAI ingress and the LLM
                // replicas it calls through a handle. The adapters' cache is the kind's own.
                let both = modelmux_openai::llm_deployments(
                    name,
                    llm,
                    ctx.route_prefix,
                    ctx.disk_cache,
                    ctx.admin,
                )?;
                Built {
                    served: both.server,
                    front: Some(both.ingress),
                    default_max_ongoing: None,
                }
            }
        })
    }
}
