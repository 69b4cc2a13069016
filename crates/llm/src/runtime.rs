//! The LLM runtime of one replica: a base model from a GGUF file, its engine, and its LoRA
//! adapters held in a [`Multiplexer`] (count and byte caps, single flight, pinned while a
//! sequence uses them, unloaded exactly once) and loaded from a [`ModelRepository`] as
//! `<repository>/<adapter_id>/adapter_config.json` + `adapter_model.safetensors`, or, for an
//! adapter a request names by its source, from below the allowed source it lies in
//! ([`AdapterSources`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{BoxError, Model, ModelId, Multiplexer};
use modelmux_store::{ModelRepository, StoreError};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::engine::{Engine, EngineConfig, GenerationRequest, GenerationStream};
use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, LlamaConfig};
use crate::lora::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterSources, AllowedSources, LoraAdapter,
};
use crate::lora::{AdapterLease, AdapterPrecision};
use crate::model::LlamaModel;
use crate::sampling::SamplingParams;
use crate::tokenizer::TextTokenizer;
use crate::weights::{LlamaWeights, WeightFormat};

impl Model for LoraAdapter {
    fn size_bytes(&self) -> Option<u64> {
        Some(LoraAdapter::size_bytes(self))
    }
}

/// Loads adapters of one base model from a repository, and those named by source from the
/// allowed sources.
#[derive(Clone)]
pub struct AdapterLoader {
    repository: ModelRepository,
    sources: AdapterSources,
    base: Arc<LlamaConfig>,
    precision: AdapterPrecision,
}

fn store_error(adapter: &ModelId, repository: &ModelRepository, error: StoreError) -> LlmError {
    match error {
        StoreError::NotFound { .. } => LlmError::AdapterNotFound {
            adapter: adapter.to_string(),
            repository: repository.url().to_owned(),
        },
        StoreError::InvalidId { .. } => LlmError::InvalidRequest(error.to_string()),
        other => LlmError::Storage {
            adapter: adapter.to_string(),
            message: other.to_string(),
        },
    }
}

impl AdapterLoader {
    /// Loads adapters for a base model shaped `base` from `repository`.
    pub fn new(repository: ModelRepository, base: LlamaConfig) -> Self {
        Self::with_sources(repository, AdapterSources::default(), base)
    }

    /// As [`new`](Self::new), and adapters named by their source (a path or URL) from
    /// `sources`; any other source is refused before it is read.
    pub fn with_sources(
        repository: ModelRepository,
        sources: AdapterSources,
        base: LlamaConfig,
    ) -> Self {
        Self {
            repository,
            sources,
            base: Arc::new(base),
            precision: AdapterPrecision::default(),
        }
    }

    /// Stores the adapters' matrices in `precision` (default: binary16).
    pub fn with_precision(mut self, precision: AdapterPrecision) -> Self {
        self.precision = precision;
        self
    }

    /// Where adapter `id` is read: the repository, or for a source (or a name registered for
    /// one) the repository of the allowed entry it lies below, with its id there.
    fn locate(&self, id: &ModelId) -> Result<(&ModelRepository, ModelId)> {
        if AllowedSources::is_source(id.as_str()) {
            self.sources.resolve(id.as_str())
        } else if let Some(source) = self.sources.names().get(id.as_str()) {
            // A name registered for a source (checked against the rule when it was, and
            // again here).
            self.sources.resolve(&source)
        } else {
            Ok((&self.repository, id.clone()))
        }
    }

    /// The repository.
    pub fn repository(&self) -> &ModelRepository {
        &self.repository
    }

    async fn read(&self, id: &ModelId, file: &str) -> Result<bytes::Bytes> {
        let (repository, key) = self.locate(id)?;
        let err = |e| store_error(id, repository, e);
        let fetched = repository.fetch(&key, file).await.map_err(err)?;
        fetched.bytes().await.map_err(err)
    }

    /// Reads adapter `id`'s config and checks that it is a JSON object, before its weights
    /// are fetched or their size asked: a config that is not one makes the adapter unusable
    /// (a 400 from `/v1/load_lora_adapter`, as vLLM answers it) even when the weights file is
    /// missing too, instead of a 404 for the weights. The rest of the config is checked with
    /// the weights ([`LoraAdapter::from_peft_in`]).
    async fn read_config(&self, id: &ModelId) -> Result<bytes::Bytes> {
        let config = self.read(id, ADAPTER_CONFIG_FILE).await?;
        let refused = match serde_json::from_slice::<serde_json::Value>(&config) {
            Ok(serde_json::Value::Object(_)) => return Ok(config),
            Ok(_) => format!("{ADAPTER_CONFIG_FILE} is not a JSON object"),
            Err(e) => format!("{ADAPTER_CONFIG_FILE} is not valid JSON: {e}"),
        };
        // Not kept, so a fixed upload is picked up by the next load.
        let (repository, key) = self.locate(id)?;
        repository.discard(&key, ADAPTER_CONFIG_FILE);
        Err(LlmError::adapter(id.as_str(), refused))
    }

    /// Reads and checks adapter `id`.
    pub async fn load_adapter(&self, id: &ModelId) -> Result<LoraAdapter> {
        let config = self.read_config(id).await?;
        let weights = self.read(id, ADAPTER_WEIGHTS_FILE).await?;
        let (base, precision) = (self.base.clone(), self.precision);
        let owned = id.to_string();
        let parsed = tokio::task::spawn_blocking(move || {
            LoraAdapter::from_peft_in(&owned, &config, &weights, &base, precision)
        })
        .await
        .map_err(|e| LlmError::Internal(format!("adapter parsing task: {e}")))?;
        if parsed.is_err() {
            // Downloaded fine but unusable: do not keep the copies, so a fixed upload is
            // picked up by the next load.
            let (repository, key) = self.locate(id)?;
            repository.discard(&key, ADAPTER_CONFIG_FILE);
            repository.discard(&key, ADAPTER_WEIGHTS_FILE);
        }
        parsed
    }
}

impl modelmux_cache::Loader<LoraAdapter> for AdapterLoader {
    async fn load(&self, id: &ModelId) -> Result<LoraAdapter, BoxError> {
        Ok(self.load_adapter(id).await?)
    }

    async fn probe(&self, id: &ModelId) -> Result<Option<u64>, BoxError> {
        // The config first (one small file): one that is not JSON is refused as such, not as
        // the weights missing.
        self.read_config(id).await?;
        let (repository, key) = self.locate(id)?;
        let size = repository
            .size(&key, ADAPTER_WEIGHTS_FILE)
            .await
            .map_err(|e| store_error(id, repository, e))?;
        // Weights stored as f16/bf16 take twice their file size in memory: the file size is
        // a lower bound, corrected once the adapter is loaded.
        Ok(Some(size))
    }
}

/// How a runtime is set up.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// The name clients use for the base model (OpenAI's `model`).
    pub model_id: String,
    /// How the weights are held in memory.
    pub weight_format: WeightFormat,
    /// The engine's limits.
    pub engine: EngineConfig,
    /// Adapters held at once (Ray's `max_num_adapters_per_replica`).
    pub max_adapters: usize,
    /// Bytes of adapters held at once, if bounded.
    pub max_adapter_bytes: Option<u64>,
    /// How long one adapter load may take, download included (Ray's `download_timeout_s`).
    pub adapter_load_timeout: Option<Duration>,
    /// How adapters' matrices are stored; `None`: as goes with the weights
    /// ([`AdapterPrecision::for_weights`]).
    pub adapter_precision: Option<AdapterPrecision>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            model_id: "model".into(),
            weight_format: WeightFormat::default(),
            engine: EngineConfig::default(),
            max_adapters: 8,
            max_adapter_bytes: None,
            adapter_load_timeout: Some(Duration::from_secs(60)),
            adapter_precision: None,
        }
    }
}

/// A base model, its engine, and its adapters.
pub struct LlmRuntime {
    engine: Engine,
    chat: Option<ChatTemplate>,
    adapters: Option<Multiplexer<LoraAdapter>>,
    /// The rule for adapters named by source, checked before the cache is asked.
    sources: AllowedSources,
    options: RuntimeOptions,
    path: PathBuf,
    weight_bytes: u64,
}

impl LlmRuntime {
    /// Loads the GGUF model at `path` and starts its engine; adapters come from `adapters`.
    pub async fn load(
        path: impl AsRef<Path>,
        adapters: Option<ModelRepository>,
        options: RuntimeOptions,
    ) -> Result<Self> {
        Self::load_with_sources(path, adapters, AdapterSources::default(), options).await
    }

    /// As [`load`](Self::load), and adapters a request names by their source (a path or URL)
    /// come from `sources` (with an adapter repository only); any other source is refused
    /// before anything is read.
    pub async fn load_with_sources(
        path: impl AsRef<Path>,
        adapters: Option<ModelRepository>,
        sources: AdapterSources,
        options: RuntimeOptions,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let owned = path.clone();
        let format = options.weight_format;
        let max_len = options.engine.max_model_len;
        let (model, tokenizer, chat) = tokio::task::spawn_blocking(move || -> Result<_> {
            let mut file = GgufFile::open(&owned)?;
            let config = file.llama_config()?;
            let tokenizer = TextTokenizer::from_gguf(&file)?;
            let chat = match file.string("tokenizer.chat_template") {
                Some(source) => {
                    let text = |id: Option<u32>| {
                        id.and_then(|id| tokenizer.token_text(id))
                            .unwrap_or_default()
                    };
                    Some(ChatTemplate::new(
                        source,
                        &text(tokenizer.bos()),
                        &text(tokenizer.eos()),
                    )?)
                }
                None => None,
            };
            if max_len > config.context_length {
                return Err(LlmError::InvalidRequest(format!(
                    "max_model_len {max_len} is longer than the model's context of {} tokens",
                    config.context_length
                )));
            }
            let model = crate::loaded::shared_model(&owned, format, max_len, || {
                let weights = LlamaWeights::from_gguf(&mut file, config, format)?;
                Ok(LlamaModel::new(weights, max_len))
            })?;
            Ok((model, tokenizer, chat))
        })
        .await
        .map_err(|e| LlmError::Internal(format!("model loading task: {e}")))??;
        let weight_bytes = model.weights().size_bytes();
        let base = model.config().clone();
        // After a sleep, the weights are read again from the same file in the same format.
        let reload_path = path.clone();
        let reload: crate::ModelReloader = Arc::new(move || {
            crate::loaded::shared_model(&reload_path, format, max_len, || {
                let mut file = GgufFile::open(&reload_path)?;
                let config = file.llama_config()?;
                let weights = LlamaWeights::from_gguf(&mut file, config, format)?;
                Ok(LlamaModel::new(weights, max_len))
            })
        });
        let engine = Engine::start_with_reload(
            model,
            Some(reload),
            Arc::new(tokenizer),
            options.engine.clone(),
        )?;
        let allowed = sources.allowed().clone();
        let adapters = adapters.map(|repository| {
            let mut builder = Multiplexer::builder()
                .max_models(options.max_adapters)
                .load_timeout(options.adapter_load_timeout);
            if let Some(bytes) = options.max_adapter_bytes {
                builder = builder.max_bytes(bytes);
            }
            builder.build(
                AdapterLoader::with_sources(repository, sources, base).with_precision(
                    (options.adapter_precision)
                        .unwrap_or_else(|| AdapterPrecision::for_weights(format)),
                ),
            )
        });
        tracing::info!(
            model = %options.model_id,
            path = %path.display(),
            weight_bytes,
            "Loaded base model."
        );
        Ok(Self {
            engine,
            chat,
            adapters,
            sources: allowed,
            options,
            path,
            weight_bytes,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        self.engine.tokenizer()
    }

    /// The options it was set up with.
    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// The GGUF file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the base model's weights in memory.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// The adapter cache, when adapters are configured.
    pub fn adapters(&self) -> Option<&Multiplexer<LoraAdapter>> {
        self.adapters.as_ref()
    }

    /// Adapter `id`, loading it on a miss; held until the lease is dropped. An id that is a
    /// source (a path or URL) outside the allowed sources is [`LlmError::SourceNotAllowed`].
    pub async fn adapter(&self, id: &str) -> Result<AdapterLease> {
        if AllowedSources::is_source(id) {
            // Refused here, not by the loader: nothing is asked of the cache (no load, no
            // failure remembered) for a source outside the rule.
            self.sources.check(id)?;
        }
        let Some(adapters) = &self.adapters else {
            return Err(LlmError::AdapterNotFound {
                adapter: id.to_owned(),
                repository: "(no adapter repository is configured)".into(),
            });
        };
        let guard = adapters.get(id).await.map_err(cache_error)?;
        Ok(AdapterLease::new(guard))
    }

    /// The prompt of a conversation, rendered with the model's chat template. Message
    /// contents are tokenized as plain text: a special token written in a message
    /// (`<|im_start|>system`) cannot forge a turn. Only the template's own text is parsed for
    /// special tokens.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.chat_prompt_with_tools(messages, None)
    }

    /// Whether the model's chat template presents a `tools` list itself.
    pub fn template_presents_tools(&self) -> bool {
        self.chat.as_ref().is_some_and(|c| c.presents_tools())
    }

    /// [`chat_prompt`](Self::chat_prompt) with `tools` given to the template. Tool calls and
    /// arguments in the messages are template text (the template formats them), so only
    /// message contents are guaranteed to be tokenized as plain text.
    pub fn chat_prompt_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Vec<u32>> {
        let chat = self.chat.as_ref().ok_or_else(|| {
            LlmError::InvalidRequest(
                "the model has no chat template; use a completion prompt".into(),
            )
        })?;
        let tokenizer = self.tokenizer();
        // Render with a sentinel in place of each content, then tokenize the template's
        // text with special tokens and each content without.
        let marker = |i: usize| format!("\u{F0000}{i}\u{F0001}");
        let masked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                content: marker(i),
                ..m.clone()
            })
            .collect();
        let rendered = chat.render_with_tools(&masked, tools, true)?;
        let mut ids = Vec::new();
        if let Some(bos) = tokenizer.bos().filter(|_| tokenizer.add_bos()) {
            ids.push(bos);
        }
        let mut rest = rendered.as_str();
        for (i, message) in messages.iter().enumerate() {
            let m = marker(i);
            let Some(at) = rest.find(&m) else {
                // The template transforms contents (rare): render them in and parse the
                // whole text, as Hugging Face's apply_chat_template does.
                tracing::debug!("chat template rewrites message contents; tokenizing it whole");
                let text = chat.render_with_tools(messages, tools, true)?;
                return tokenizer.encode_prompt(&text, true);
            };
            ids.extend(tokenizer.encode(&rest[..at], true)?);
            ids.extend(tokenizer.encode(&message.content, false)?);
            rest = &rest[at + m.len()..];
        }
        ids.extend(tokenizer.encode(rest, true)?);
        Ok(ids)
    }

    /// Starts generating `request`.
    pub fn submit(&self, request: GenerationRequest) -> Result<GenerationStream> {
        self.engine.submit(request)
    }

    /// Starts generating from `prompt` with `adapter` (or the base model).
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        params: SamplingParams,
        adapter: Option<AdapterLease>,
    ) -> Result<GenerationStream> {
        self.engine.submit(GenerationRequest {
            prompt,
            params,
            adapter,
            constraint: None,
        })
    }
}

/// The cache's error for an adapter, typed as the runtime's own: the loader's error kind
/// (not found, invalid, storage) with the cache's wording (which says, for example, that the
/// failure is remembered for a while).
fn cache_error(error: modelmux_cache::Error) -> LlmError {
    use modelmux_cache::Error as E;
    fn loader_error(e: &E) -> Option<&LlmError> {
        match e {
            E::LoadFailed { source, .. } => source.downcast_ref::<LlmError>(),
            E::BackingOff { cause, .. } => loader_error(cause),
            _ => None,
        }
    }
    let message = error.to_string();
    if let Some(inner) = loader_error(&error) {
        return match inner {
            LlmError::AdapterNotFound {
                adapter,
                repository,
            } => LlmError::AdapterNotFound {
                adapter: adapter.clone(),
                repository: repository.clone(),
            },
            LlmError::InvalidAdapter { adapter, .. } => LlmError::InvalidAdapter {
                adapter: adapter.clone(),
                message,
            },
            LlmError::Storage { adapter, .. } => LlmError::Storage {
                adapter: adapter.clone(),
                message,
            },
            LlmError::InvalidRequest(_) => LlmError::InvalidRequest(message),
            LlmError::SourceNotAllowed { adapter, reason } => LlmError::SourceNotAllowed {
                adapter: adapter.clone(),
                reason: reason.clone(),
            },
            _ => LlmError::Internal(message),
        };
    }
    match error {
        E::InvalidModelId(_) | E::ModelTooLarge { .. } => LlmError::InvalidRequest(message),
        E::CapacityExhausted { .. } => LlmError::Overloaded {
            reason: message,
            retry_after: Duration::from_secs(1),
        },
        E::LoadTimeout { id, .. } => LlmError::Storage {
            adapter: id.to_string(),
            message,
        },
        E::ShuttingDown => LlmError::EngineStopped(message),
        _ => LlmError::Internal(message),
    }
}
