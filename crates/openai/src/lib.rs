//! `modelmux-openai`: OpenAI-compatible serving of the LLM runtime, composed as Ray's
//! `LLMServer` is: an ingress deployment parses each request and turns
//! `model: "<base>:<adapter>"` into the request's multiplexed model id, then calls the LLM
//! deployment through a handle, so the model-aware router sends the request to a replica
//! that already holds the adapter, and only when those are saturated (or none has it) does
//! another replica load it.
//!
//! - [`LlmConfig`]: the `kind: llm` settings, shaped like Ray's `LLMConfig`.
//! - [`llm_deployments`]: the two deployments (LLM replicas and their OpenAI ingress).
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (streamed as Server-Sent
//! Events when asked), `POST /v1/embeddings`, `GET /v1/models`, `POST /tokenize`,
//! `POST /detokenize`, OpenAI's Responses API (`/v1/responses`, its stored responses kept
//! per node) and Anthropic's Messages API (`/v1/messages`), both translated into chats, and
//! vLLM's
//! `POST /v1/load_lora_adapter` / `POST /v1/unload_lora_adapter` (behind the admin token).

mod adapter_control;
mod anthropic;
mod call;
mod chat_reply;
mod config;
mod errors;
#[cfg(test)]
mod fuzz_tests;
mod ingress;
mod limits;
mod llm_server;
mod logprobs;
mod messages;
mod metrics;
mod params;
mod protocol;
mod respond;
mod responses;
mod score;
mod stream;
mod structured;
#[cfg(test)]
mod test_pool;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use modelmux_llm::LlmRuntime;
use modelmux_serve::DeploymentSpec;
use modelmux_store::{DiskCache, FileSource, ModelRepository, RepositoryOptions, StoreError};

pub use config::{
    EngineKwargs, ExperimentalConfigs, LlmConfig, LoraConfig, ModelLoadingConfig, WeightFormatName,
};
pub use responses::ResponsesStoreConfig;

use crate::llm_server::{LlmServer, longest_token};
use modelmux_store::option_strings;

/// The deployments serving one LLM: `server` runs the model (its replicas are the ones to
/// scale), `ingress` takes the HTTP requests (make it the application's ingress).
pub struct LlmDeployments {
    /// The LLM replicas, named as asked.
    pub server: DeploymentSpec,
    /// The OpenAI ingress, named `<name>-openai`: one replica, many requests at once (it only
    /// parses and forwards).
    pub ingress: DeploymentSpec,
}

/// Requests one ingress replica handles at once: each waits on an LLM replica and holds
/// little memory.
const INGRESS_MAX_ONGOING: usize = 4096;

fn repository(
    location: &str,
    options: &std::collections::BTreeMap<String, modelmux_store::OptionValue>,
    disk_cache: Option<&DiskCache>,
    retry: modelmux_store::RetryPolicy,
) -> Result<ModelRepository, StoreError> {
    ModelRepository::open(
        location,
        RepositoryOptions {
            options: option_strings(options),
            disk_cache: disk_cache.cloned(),
            retry,
            verify_md5: true,
        },
    )
}

/// What can be known of a local model before any replica starts (so `serve --check` refuses
/// it): the file is a GGUF model this engine runs, and the engine's settings fit it. Reads the
/// header and metadata only.
fn check_local_model(path: &std::path::Path, config: &LlmConfig) -> Result<(), StoreError> {
    let wrong = |e: modelmux_llm::LlmError| {
        StoreError::Config(format!("model_loading_config.model_source: {e}"))
    };
    let model = modelmux_llm::GgufFile::open(path)
        .and_then(|file| file.llama_config())
        .map_err(wrong)?;
    let options = config.runtime_options();
    options
        .engine
        .check_fits(&model, options.weight_format)
        .map_err(|e| StoreError::Config(e.to_string()))
}

/// Where the GGUF file comes from: a path (checked now, and read as a model), or
/// `<repository>/<dir>/<file>` on a store, downloaded by the first replica that starts.
fn gguf_source(
    config: &LlmConfig,
    disk_cache: Option<&DiskCache>,
) -> Result<FileSource, StoreError> {
    let loading = &config.model_loading_config;
    let source = FileSource::open(
        &loading.model_source,
        option_strings(&loading.options),
        disk_cache,
        modelmux_store::RetryPolicy::default(),
    )
    .map_err(|e| StoreError::Config(format!("model_loading_config.model_source: {e}")))?;
    if let Some(path) = source.local_path() {
        check_local_model(path, config)?;
    }
    Ok(source)
}

/// The deployments serving `config` as deployment `name` of an application routed at
/// `route_prefix`. Repositories are opened now (a malformed location or option is an error
/// here, not at the first request); the model is loaded by each replica as it starts.
/// `admin` guards the adapter controls (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`)
/// as it guards the server's admin API: the token when there is one, else a JSON content type
/// and a trusted `Host`.
pub fn llm_deployments(
    name: &str,
    config: &LlmConfig,
    route_prefix: &str,
    disk_cache: Option<&DiskCache>,
    admin: &modelmux_serve::AdminAccess,
) -> Result<LlmDeployments, StoreError> {
    config.validate().map_err(StoreError::Config)?;
    let gguf = Arc::new(gguf_source(config, disk_cache)?);
    let adapters = config
        .lora_config
        .as_ref()
        .map(|l| {
            repository(
                &l.dynamic_lora_loading_path,
                &config.adapter_store_options(&l.dynamic_lora_loading_path),
                disk_cache,
                config.adapter_retry(),
            )
        })
        .transpose()?;
    // The adapters `/v1/load_lora_adapter` registers under a name: the ingress writes, this
    // process's LLM replicas read.
    let names = modelmux_llm::AdapterNames::default();
    let sources = config
        .adapter_sources(disk_cache)?
        .with_names(names.clone());
    let allowed = sources.allowed().clone();
    let options = config.runtime_options();
    let interval = Duration::from_millis(config.experimental_configs.stream_batching_interval_ms);
    let sleep_after = (config.experimental_configs.sleep_after_idle_s).map(Duration::from_secs_f64);
    let drop_adapters_after =
        (config.experimental_configs.drop_adapters_after_idle_s).map(Duration::from_secs_f64);
    let server_adapters = adapters.clone();
    let server = DeploymentSpec::new(name, move |ctx| {
        let gguf = gguf.clone();
        let adapters = server_adapters.clone();
        let sources = sources.clone();
        let options = options.clone();
        async move {
            let (path, _download) = gguf.fetch().await?;
            let runtime = LlmRuntime::load_with_sources(&path, adapters, sources, options).await?;
            if let Some(cache) = runtime.adapters() {
                ctx.register_multiplexer(cache);
            }
            let metrics = Arc::new(metrics::LlmMetrics::new(&runtime));
            ctx.register_metrics(metrics.clone());
            let max_prompt_bytes =
                longest_token(runtime.tokenizer()) * runtime.engine().config().max_model_len;
            let runtime = Arc::new(runtime);
            let idle = sleep_after
                .map(|after| llm_server::IdleSleep::start(after, drop_adapters_after, &runtime));
            Ok(LlmServer {
                runtime,
                idle,
                metrics,
                stream_interval: interval,
                max_prompt_bytes,
                replica: ctx.replica_id().to_owned(),
            })
        }
    })
    .max_ongoing_requests(config.engine_kwargs.max_num_seqs);
    let base = config.model_loading_config.model_id.clone();
    let max_model_len = config.engine_kwargs.max_model_len;
    let server_name = name.to_owned();
    let prefix = route_prefix.to_owned();
    let admin = admin.clone();
    let store_config = config.responses_store.clone();
    // One store per process, shared by its ingress replicas, opened by the first.
    let store: Arc<parking_lot::Mutex<Option<Arc<responses::ResponseStore>>>> = Arc::default();
    let ingress = DeploymentSpec::new(&format!("{name}-openai"), move |ctx| {
        let responses = responses::shared_store(&store, &store_config, &ctx);
        let node = ctx.node_id().map(str::to_owned);
        let own = node
            .as_ref()
            .map(|_| ctx.handle(ctx.deployment()))
            .transpose();
        let api_metrics = Arc::new(metrics::ApiMetrics::default());
        ctx.register_metrics(api_metrics.clone());
        let llm = ctx.handle(&server_name);
        let base = base.clone();
        let adapters = adapters.clone();
        let sources = allowed.clone();
        let names = names.clone();
        let prefix = prefix.clone();
        let admin = admin.clone();
        let max_model_len = max_model_len;
        async move {
            Ok(ingress::OpenAiIngress {
                llm: llm?,
                responses: responses?,
                node,
                own: own?,
                api_metrics,
                base,
                max_model_len,
                adapters,
                sources,
                names,
                created: protocol::unix_now(),
                prefix,
                admin,
            })
        }
    })
    .max_ongoing_requests(INGRESS_MAX_ONGOING);
    Ok(LlmDeployments { server, ingress })
}
