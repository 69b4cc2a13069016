//! `model: {kind: ...}`: the registry of the model kinds this binary knows, and the one place
//! that knows which optional parts it was built with (the CLI's cargo features `onnx`, `llm`,
//! `python` and `cluster`, all on by default). Each kind's crate owns its settings (parsed
//! here as one variant, so serde names a bad field with its path and line) and how its
//! deployments are built; a new kind is its crate plus one variant, one [`Kind`] impl and, if
//! it is optional, one feature.
//!
//! A kind left out of the build keeps its variant, holding [`NotBuilt`]: a configuration that
//! names it does not parse, and the error says which feature it needs.

use modelmux_cache::MultiplexerBuilder;
use modelmux_serve::{AdminAccess, DeploymentSpec, model_deployment};
use modelmux_store::{DiskCache, StoreError};
use modelmux_synthetic::{Synthetic, SyntheticConfig};
use serde::Deserialize;

/// The CLI's optional parts (its cargo features), and whether this binary has each.
pub const FEATURES: [(&str, bool); 4] = [
    ("onnx", cfg!(feature = "onnx")),
    ("llm", cfg!(feature = "llm")),
    ("python", cfg!(feature = "python")),
    ("cluster", cfg!(feature = "cluster")),
];

/// Why `what` (a kind, a section, a flag) cannot be used: this binary was built without
/// `feature`.
pub fn not_built(feature: &str, what: &str) -> String {
    format!(
        "this modelmux was built without the `{feature}` feature (needed for {what}); build it \
         with `cargo build -p modelmux-cli --features {feature}` (the default features include \
         every part)"
    )
}

#[cfg(feature = "onnx")]
type OnnxSpec = modelmux_onnx::OnnxConfig;
#[cfg(not(feature = "onnx"))]
type OnnxSpec = NotBuilt;
#[cfg(feature = "llm")]
type LlmSpec = Box<modelmux_openai::LlmConfig>;
#[cfg(not(feature = "llm"))]
type LlmSpec = NotBuilt;

/// The model kinds this binary knows.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    /// Synthetic models (see `modelmux-synthetic`).
    Synthetic(SyntheticConfig),
    /// ONNX models from a model repository (see `modelmux-onnx`; the `onnx` feature).
    #[cfg_attr(not(feature = "onnx"), serde(deserialize_with = "NotBuilt::onnx"))]
    Onnx(OnnxSpec),
    /// An LLM and its LoRA adapters behind an OpenAI-compatible API (see `modelmux-openai`;
    /// the `llm` feature).
    #[cfg_attr(not(feature = "llm"), serde(deserialize_with = "NotBuilt::llm"))]
    Llm(LlmSpec),
}

/// The settings of a kind this binary was built without. There is no value of it: naming the
/// kind is a parse error (see [`not_built`]).
#[derive(Debug)]
pub enum NotBuilt {}

impl NotBuilt {
    #[cfg(not(feature = "onnx"))]
    fn onnx<'de, D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom(not_built("onnx", "`kind: onnx`")))
    }

    #[cfg(not(feature = "llm"))]
    fn llm<'de, D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom(not_built("llm", "`kind: llm`")))
    }
}

/// What a kind's deployments may need of the server being built.
pub(super) struct BuildContext<'a> {
    /// The disk cache, when some deployment reads from a remote store.
    #[cfg_attr(not(any(feature = "onnx", feature = "llm")), allow(dead_code))]
    pub(super) disk_cache: Option<&'a DiskCache>,
    /// Who may use the admin API (the LLM kind guards its adapter endpoints with it).
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
    pub(super) admin: &'a AdminAccess,
    /// The application's route prefix (the LLM kind's ingress serves under it).
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
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

impl Built {
    /// One deployment, 5 requests at once unless the configuration says otherwise.
    fn one(served: DeploymentSpec) -> Self {
        Self {
            served,
            front: None,
            default_max_ongoing: Some(5),
        }
    }
}

/// What the configuration asks of a kind's settings.
trait Kind {
    /// Whether it reads from a remote store (and so needs the disk cache).
    fn needs_disk_cache(&self) -> bool {
        false
    }

    /// Checks the fields together (serde checks each alone).
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// The locations in it that may be paths relative to the configuration file.
    fn locations(&mut self) -> Vec<&mut String> {
        Vec::new()
    }

    /// Builds its deployments as deployment `name`, with `cache` its replicas' model cache.
    async fn build(
        &self,
        name: &str,
        cache: MultiplexerBuilder,
        ctx: &BuildContext<'_>,
    ) -> Result<Built, StoreError>;
}

impl Kind for SyntheticConfig {
    async fn build(
        &self,
        name: &str,
        cache: MultiplexerBuilder,
        _: &BuildContext<'_>,
    ) -> Result<Built, StoreError> {
        let kind = Synthetic::new(self.clone());
        Ok(Built::one(model_deployment(name, kind, cache)))
    }
}

#[cfg(feature = "onnx")]
impl Kind for modelmux_onnx::OnnxConfig {
    fn needs_disk_cache(&self) -> bool {
        modelmux_onnx::OnnxConfig::needs_disk_cache(self)
    }

    fn validate(&self) -> Result<(), String> {
        modelmux_onnx::OnnxConfig::validate(self)
    }

    fn locations(&mut self) -> Vec<&mut String> {
        vec![&mut self.repository]
    }

    async fn build(
        &self,
        name: &str,
        cache: MultiplexerBuilder,
        ctx: &BuildContext<'_>,
    ) -> Result<Built, StoreError> {
        let kind = modelmux_onnx::Onnx::new(self.repository(ctx.disk_cache).await?);
        Ok(Built::one(model_deployment(name, kind, cache)))
    }
}

#[cfg(feature = "llm")]
impl Kind for Box<modelmux_openai::LlmConfig> {
    fn needs_disk_cache(&self) -> bool {
        modelmux_openai::LlmConfig::needs_disk_cache(self)
    }

    fn locations(&mut self) -> Vec<&mut String> {
        let mut paths = vec![&mut self.model_loading_config.model_source];
        if let Some(lora) = &mut self.lora_config {
            paths.push(&mut lora.dynamic_lora_loading_path);
        }
        paths
    }

    async fn build(
        &self,
        name: &str,
        _: MultiplexerBuilder,
        ctx: &BuildContext<'_>,
    ) -> Result<Built, StoreError> {
        // Two deployments, as Ray composes them: the OpenAI ingress and the LLM replicas it
        // calls through a handle. The adapters' cache is the kind's own.
        let both = modelmux_openai::llm_deployments(
            name,
            self,
            ctx.route_prefix,
            ctx.disk_cache,
            ctx.admin,
        )?;
        Ok(Built {
            served: both.server,
            front: Some(both.ingress),
            default_max_ongoing: None,
        })
    }
}

impl Kind for NotBuilt {
    async fn build(
        &self,
        _: &str,
        _: MultiplexerBuilder,
        _: &BuildContext<'_>,
    ) -> Result<Built, StoreError> {
        match *self {}
    }
}

/// `$body` with `$kind` bound to `$spec`'s settings, whichever kind it is.
macro_rules! each_kind {
    ($spec:expr, $kind:ident => $body:expr) => {
        match $spec {
            ModelSpec::Synthetic($kind) => $body,
            ModelSpec::Onnx($kind) => $body,
            ModelSpec::Llm($kind) => $body,
        }
    };
}

impl ModelSpec {
    /// Whether it reads from a remote store (and so needs the disk cache).
    pub fn needs_disk_cache(&self) -> bool {
        each_kind!(self, kind => Kind::needs_disk_cache(kind))
    }

    /// Checks its fields together (serde checks each alone).
    pub fn validate(&self) -> Result<(), String> {
        each_kind!(self, kind => Kind::validate(kind))
    }

    /// The locations in it that may be paths relative to the configuration file (an ONNX
    /// repository, an LLM's model and adapters).
    pub fn locations(&mut self) -> Vec<&mut String> {
        each_kind!(self, kind => Kind::locations(kind))
    }

    /// Builds this kind's deployments as deployment `name`, with `cache` its replicas' model
    /// cache. Repositories are opened now: a malformed location or option is an error here,
    /// not at the first request.
    pub(super) async fn build(
        &self,
        name: &str,
        cache: MultiplexerBuilder,
        ctx: &BuildContext<'_>,
    ) -> Result<Built, StoreError> {
        each_kind!(self, kind => Kind::build(kind, name, cache, ctx).await)
    }
}
