//! `model: {kind: llm, ...}`: the settings of an LLM deployment, shaped like Ray's `LLMConfig`
//! (`model_loading_config`, `lora_config`, `engine_kwargs`, `experimental_configs`) so a Ray
//! user recognises them. Unknown fields are refused with their path and line by serde;
//! [`LlmConfig::validate`] checks what serde cannot (ranges, the fields together).

use std::collections::BTreeMap;
use std::time::Duration;

use modelmux_llm::{
    AdapterPrecision, AdapterSources, AllowedSources, EngineConfig, KvDtype, RuntimeOptions,
    WeightFormat,
};
use modelmux_store::{DiskCache, OptionValue, RetryPolicy, StoreError};
use serde::Deserialize;

/// The whole `kind: llm` model section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Which model, from where.
    pub model_loading_config: ModelLoadingConfig,
    /// LoRA adapters loaded on demand; none when absent.
    #[serde(default)]
    pub lora_config: Option<LoraConfig>,
    /// The engine's limits.
    #[serde(default)]
    pub engine_kwargs: EngineKwargs,
    /// Streaming.
    #[serde(default)]
    pub experimental_configs: ExperimentalConfigs,
    /// Where `/v1/responses` keeps stored responses, and how many.
    #[serde(default)]
    pub responses_store: crate::ResponsesStoreConfig,
}

/// `model_loading_config`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLoadingConfig {
    /// The name clients use for the base model (`model` in requests); adapters are
    /// `<model_id>:<adapter>`.
    pub model_id: String,
    /// The GGUF file: a path, or a URL (`s3://bucket/dir/name/model.gguf`,
    /// `https://host/dir/name/model.gguf`) downloaded once into the disk cache.
    pub model_source: String,
    /// Store options for a remote `model_source` (as for `lora_config.options`).
    #[serde(default)]
    pub options: BTreeMap<String, OptionValue>,
}

/// `lora_config`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapter repository: a directory, `s3://bucket/prefix` or `https://host/path`; an
    /// adapter `a` is `<path>/a/adapter_config.json` + `adapter_model.safetensors` (PEFT).
    pub dynamic_lora_loading_path: String,
    /// Adapters held per replica (LRU past it).
    #[serde(default = "default_max_adapters")]
    pub max_num_adapters_per_replica: usize,
    /// Bytes of adapters held per replica, if bounded.
    #[serde(default)]
    pub max_adapter_bytes_per_replica: Option<u64>,
    /// Longest one adapter load may take, download included (seconds).
    #[serde(default = "default_download_timeout")]
    pub download_timeout_s: f64,
    /// Download attempts in all.
    #[serde(default = "default_download_tries")]
    pub max_download_tries: u32,
    /// Store options, as `object_store` names them (for S3: `endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `allow_http`, ...); unset ones come from the
    /// `AWS_*` environment variables. They apply to every remote location of this section
    /// (the repository and the remote `allowed_sources`), never to a local one.
    #[serde(default)]
    pub options: BTreeMap<String, OptionValue>,
    /// Where a request may name an adapter by its source instead of its id
    /// (`model: "<model_id>:s3://bucket/team-a/pirate"`, LoRAX's per-request adapter source):
    /// prefixes of directories (absolute paths, `file:///`), buckets (`s3://bucket[/prefix]`)
    /// or URLs (`https://host/path`). A source must lie below an entry by whole path segments
    /// (`s3://bucket/team-a` admits `s3://bucket/team-a/x`, not `s3://bucket/team-ab/x`);
    /// anything else is a 403 naming this rule, before any byte is read. Empty (the default):
    /// adapters come only by id from `dynamic_lora_loading_path`.
    #[serde(default)]
    pub allowed_sources: Vec<String>,
    /// How adapters' matrices are held: `auto` (default: `f16`, or `f32` with
    /// `weight_format: f32`), `f16`, `int8` (half the bytes of `f16`, so twice the adapters in
    /// `max_adapter_bytes_per_replica`, and a little faster with many adapters in a batch;
    /// less precise: see `docs/perf/2026-12-02-llm-engine.md`, "LoRA") or `f32`.
    #[serde(default)]
    pub adapter_dtype: AdapterDtypeName,
}

/// `lora_config.adapter_dtype`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterDtypeName {
    /// Chosen with the weights' format ([`AdapterPrecision::for_weights`]).
    #[default]
    Auto,
    /// See [`AdapterPrecision::Half`].
    #[serde(alias = "float16", alias = "half")]
    F16,
    /// See [`AdapterPrecision::Int8`].
    Int8,
    /// See [`AdapterPrecision::Exact`].
    #[serde(alias = "float32", alias = "float")]
    F32,
}

fn default_max_adapters() -> usize {
    8
}
fn default_download_timeout() -> f64 {
    60.0
}
fn default_download_tries() -> u32 {
    3
}

/// `engine_kwargs`, with vLLM's names where it has them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineKwargs {
    /// Sequences decoded together.
    #[serde(default = "default_max_num_seqs")]
    pub max_num_seqs: usize,
    /// Prompt plus generated tokens of one sequence.
    #[serde(default = "default_max_model_len")]
    pub max_model_len: usize,
    /// Bytes of KV cache all sequences of a replica share.
    #[serde(default = "default_kv_cache_bytes")]
    pub kv_cache_bytes: u64,
    /// Tokens one step runs (decode rows plus prompt chunks).
    #[serde(default = "default_max_num_batched_tokens")]
    pub max_num_batched_tokens: usize,
    /// Requests waiting for room in the engine; past it, 503 at once.
    #[serde(default = "default_max_waiting")]
    pub max_waiting_seqs: usize,
    /// Longest a request waits for room in the engine before a 503 (seconds).
    #[serde(default = "default_queue_timeout")]
    pub queue_timeout_s: f64,
    /// How the weights are held: `auto` (default), `q8_0`, `as_stored`, `f32`.
    #[serde(default)]
    pub weight_format: WeightFormatName,
    /// How the KV cache stores keys and values (vLLM's name): `auto` (default: `f32` with
    /// `weight_format: f32`, else `f16`), `f16` or `f32`.
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtypeName,
    /// Most sequences of one adapter (the base model counting as one) running at once; by
    /// default only `max_num_seqs` bounds them (admission is fair between adapters anyway).
    #[serde(default)]
    pub max_num_seqs_per_adapter: Option<usize>,
    /// Keep prompts' KV for later prompts with the same prefix (vLLM's; default true).
    #[serde(default = "default_true")]
    pub enable_prefix_caching: bool,
    /// The cache salt of requests that give no `cache_salt`: only requests with the same salt
    /// (and adapter content) share cached prefixes. Give each tenant's deployment its own.
    #[serde(default)]
    pub prefix_cache_salt: Option<String>,
}

fn default_true() -> bool {
    true
}

fn default_max_num_seqs() -> usize {
    EngineConfig::default().max_num_seqs
}
fn default_max_model_len() -> usize {
    EngineConfig::default().max_model_len
}
fn default_kv_cache_bytes() -> u64 {
    EngineConfig::default().kv_cache_bytes
}
fn default_max_num_batched_tokens() -> usize {
    EngineConfig::default().max_batch_tokens
}
fn default_max_waiting() -> usize {
    EngineConfig::default().max_waiting
}
fn default_queue_timeout() -> f64 {
    EngineConfig::default().queue_timeout.as_secs_f64()
}

impl Default for EngineKwargs {
    fn default() -> Self {
        Self {
            max_num_seqs: default_max_num_seqs(),
            max_model_len: default_max_model_len(),
            kv_cache_bytes: default_kv_cache_bytes(),
            max_num_batched_tokens: default_max_num_batched_tokens(),
            max_waiting_seqs: default_max_waiting(),
            queue_timeout_s: default_queue_timeout(),
            weight_format: WeightFormatName::default(),
            kv_cache_dtype: KvCacheDtypeName::default(),
            max_num_seqs_per_adapter: None,
            enable_prefix_caching: true,
            prefix_cache_salt: None,
        }
    }
}

/// `engine_kwargs.weight_format`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormatName {
    /// See [`WeightFormat::Auto`].
    #[default]
    Auto,
    /// See [`WeightFormat::Q8_0`].
    #[serde(rename = "q8_0")]
    Q8_0,
    /// See [`WeightFormat::AsStored`].
    AsStored,
    /// See [`WeightFormat::F32`].
    F32,
}

/// `engine_kwargs.kv_cache_dtype`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtypeName {
    /// Chosen with the weights' format ([`KvDtype::for_weights`]).
    #[default]
    Auto,
    /// See [`KvDtype::F16`].
    #[serde(alias = "float16", alias = "half")]
    F16,
    /// See [`KvDtype::F32`].
    #[serde(alias = "float32", alias = "float")]
    F32,
}

/// `experimental_configs`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentalConfigs {
    /// Streamed text is sent at most this often (ms); 0 sends every token as it comes. The
    /// first text of a stream is always sent at once.
    #[serde(default = "default_stream_interval")]
    pub stream_batching_interval_ms: u64,
    /// After this many seconds with no request and no sequence, a replica's engine releases
    /// its weights (its adapters stay) until the next request wakes it; unset: never.
    #[serde(default)]
    pub sleep_after_idle_s: Option<f64>,
    /// Idle this long (more than `sleep_after_idle_s`), a sleeping replica also evicts its
    /// idle adapters (sleep level 2); unset: they stay.
    #[serde(default)]
    pub drop_adapters_after_idle_s: Option<f64>,
}

fn default_stream_interval() -> u64 {
    50
}

impl Default for ExperimentalConfigs {
    fn default() -> Self {
        Self {
            stream_batching_interval_ms: default_stream_interval(),
            sleep_after_idle_s: None,
            drop_adapters_after_idle_s: None,
        }
    }
}

fn seconds(field: &str, s: f64) -> Result<Duration, String> {
    if s.is_finite() && (0.001..1e9).contains(&s) {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!(
            "{field}: must be a positive number of seconds, got {s}"
        ))
    }
}

impl LlmConfig {
    /// Checks what serde cannot; the error names the field (relative to `model`).
    pub fn validate(&self) -> Result<(), String> {
        let id = &self.model_loading_config.model_id;
        if id.is_empty() || id.contains(':') || modelmux_cache::ModelId::new(id).is_err() {
            return Err(format!(
                "model_loading_config.model_id: '{id}' must be a non-empty model name without ':' \
                 (adapters are named '<model_id>:<adapter>')"
            ));
        }
        let e = &self.engine_kwargs;
        // Seconds first: the engine's settings are built from it.
        seconds("engine_kwargs.queue_timeout_s", e.queue_timeout_s)?;
        self.runtime_options()
            .engine
            .validate()
            .map_err(|e| e.to_string())?;
        if let Some(lora) = &self.lora_config {
            if lora.max_num_adapters_per_replica == 0 {
                return Err("lora_config.max_num_adapters_per_replica: must be at least 1".into());
            }
            if lora.max_download_tries == 0 {
                return Err("lora_config.max_download_tries: must be at least 1".into());
            }
            seconds("lora_config.download_timeout_s", lora.download_timeout_s)?;
            AllowedSources::parse(&lora.allowed_sources)
                .map_err(|e| format!("lora_config.allowed_sources[{}]: {e}", e.index))?;
        }
        self.responses_store.validate()?;
        let x = &self.experimental_configs;
        if let Some(s) = x.sleep_after_idle_s {
            seconds("experimental_configs.sleep_after_idle_s", s)?;
        }
        if let Some(s) = x.drop_adapters_after_idle_s {
            seconds("experimental_configs.drop_adapters_after_idle_s", s)?;
            if x.sleep_after_idle_s.is_none_or(|sleep| s <= sleep) {
                return Err("experimental_configs.drop_adapters_after_idle_s: must be longer than sleep_after_idle_s, which it needs".into());
            }
        }
        if self.experimental_configs.stream_batching_interval_ms > 60_000 {
            return Err("experimental_configs.stream_batching_interval_ms: at most 60000".into());
        }
        Ok(())
    }

    /// The runtime's options.
    pub fn runtime_options(&self) -> RuntimeOptions {
        let e = &self.engine_kwargs;
        let lora = self.lora_config.as_ref();
        RuntimeOptions {
            model_id: self.model_loading_config.model_id.clone(),
            weight_format: match e.weight_format {
                WeightFormatName::Auto => WeightFormat::Auto,
                WeightFormatName::Q8_0 => WeightFormat::Q8_0,
                WeightFormatName::AsStored => WeightFormat::AsStored,
                WeightFormatName::F32 => WeightFormat::F32,
            },
            engine: EngineConfig {
                max_num_seqs: e.max_num_seqs,
                max_model_len: e.max_model_len,
                kv_cache_bytes: e.kv_cache_bytes,
                max_batch_tokens: e.max_num_batched_tokens,
                max_waiting: e.max_waiting_seqs,
                queue_timeout: Duration::from_secs_f64(e.queue_timeout_s),
                max_running_per_adapter: e.max_num_seqs_per_adapter,
                enable_prefix_caching: e.enable_prefix_caching,
                prefix_cache_salt: e.prefix_cache_salt.clone(),
                kv_cache_dtype: match e.kv_cache_dtype {
                    KvCacheDtypeName::Auto => None,
                    KvCacheDtypeName::F16 => Some(KvDtype::F16),
                    KvCacheDtypeName::F32 => Some(KvDtype::F32),
                },
            },
            max_adapters: lora.map_or(8, |l| l.max_num_adapters_per_replica),
            max_adapter_bytes: lora.and_then(|l| l.max_adapter_bytes_per_replica),
            adapter_load_timeout: lora.map(|l| Duration::from_secs_f64(l.download_timeout_s)),
            adapter_precision: match lora.map(|l| l.adapter_dtype) {
                None | Some(AdapterDtypeName::Auto) => None,
                Some(AdapterDtypeName::F16) => Some(AdapterPrecision::Half),
                Some(AdapterDtypeName::Int8) => Some(AdapterPrecision::Int8),
                Some(AdapterDtypeName::F32) => Some(AdapterPrecision::Exact),
            },
        }
    }

    /// The retries of adapter downloads.
    pub(crate) fn adapter_retry(&self) -> RetryPolicy {
        let mut policy = RetryPolicy::default();
        if let Some(lora) = &self.lora_config {
            policy.attempts = lora.max_download_tries;
            policy.attempt_timeout = Duration::from_secs_f64(lora.download_timeout_s);
        }
        policy
    }

    /// Whether the model or the adapters come from a remote store (and need the disk cache).
    pub fn needs_disk_cache(&self) -> bool {
        modelmux_store::is_remote(&self.model_loading_config.model_source)
            || self.lora_config.as_ref().is_some_and(|l| {
                modelmux_store::is_remote(&l.dynamic_lora_loading_path)
                    || l.allowed_sources
                        .iter()
                        .any(|s| modelmux_store::is_remote(s))
            })
    }

    /// The store options of `location`, an adapter location of `lora_config`: its `options`
    /// for a remote one; none for a local one, unless no location is remote (then the
    /// repository refuses them, naming the option that does not apply).
    pub(crate) fn adapter_store_options(&self, location: &str) -> BTreeMap<String, OptionValue> {
        let Some(lora) = &self.lora_config else {
            return BTreeMap::new();
        };
        let remote = modelmux_store::is_remote;
        let any_remote = remote(&lora.dynamic_lora_loading_path)
            || lora.allowed_sources.iter().any(|s| remote(s));
        if remote(location) || !any_remote {
            lora.options.clone()
        } else {
            BTreeMap::new()
        }
    }

    /// `lora_config.allowed_sources`, each entry opened as a repository now (an entry the
    /// store cannot use, a missing directory, an option that does not apply, is an error
    /// naming it); none without `lora_config`.
    pub(crate) fn adapter_sources(
        &self,
        disk_cache: Option<&DiskCache>,
    ) -> Result<AdapterSources, StoreError> {
        let Some(lora) = &self.lora_config else {
            return Ok(AdapterSources::default());
        };
        let field = |i: usize| format!("lora_config.allowed_sources[{i}]");
        let allowed = AllowedSources::parse(&lora.allowed_sources)
            .map_err(|e| StoreError::Config(format!("{}: {e}", field(e.index))))?;
        AdapterSources::open(allowed, |i, entry| {
            crate::repository(
                entry,
                &self.adapter_store_options(entry),
                disk_cache,
                self.adapter_retry(),
            )
            .map_err(|e| StoreError::Config(format!("{}: {e}", field(i))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lora: serde_json::Value) -> LlmConfig {
        serde_json::from_value(serde_json::json!({
            "model_loading_config": {"model_id": "m", "model_source": "/models/m.gguf"},
            "lora_config": lora,
        }))
        .unwrap()
    }

    /// `lora_config.adapter_dtype`: chosen with the weights unless named; a wrong name is
    /// refused naming the choices.
    #[test]
    fn the_adapter_dtype_is_chosen_with_the_weights_unless_named() {
        let precision = |lora: serde_json::Value| {
            let mut value = serde_json::json!({
                "model_loading_config": {"model_id": "m", "model_source": "/m.gguf"},
                "lora_config": {"dynamic_lora_loading_path": "/adapters"},
            });
            for (k, v) in lora.as_object().unwrap() {
                value["lora_config"][k] = v.clone();
            }
            serde_json::from_value::<LlmConfig>(value)
                .map(|c| c.runtime_options().adapter_precision)
                .map_err(|e| e.to_string())
        };
        assert_eq!(precision(serde_json::json!({})), Ok(None));
        assert_eq!(
            precision(serde_json::json!({"adapter_dtype": "int8"})),
            Ok(Some(AdapterPrecision::Int8))
        );
        assert_eq!(
            precision(serde_json::json!({"adapter_dtype": "float16"})),
            Ok(Some(AdapterPrecision::Half))
        );
        assert_eq!(
            precision(serde_json::json!({"adapter_dtype": "f32"})),
            Ok(Some(AdapterPrecision::Exact))
        );
        let wrong = precision(serde_json::json!({"adapter_dtype": "fp8"})).unwrap_err();
        assert!(wrong.contains("int8"), "{wrong}");
    }

    #[test]
    fn the_kv_cache_dtype_is_chosen_with_the_weights_unless_named() {
        let with = |engine: serde_json::Value| -> Result<LlmConfig, String> {
            serde_json::from_value(serde_json::json!({
                "model_loading_config": {"model_id": "m", "model_source": "/models/m.gguf"},
                "engine_kwargs": engine,
            }))
            .map_err(|e| e.to_string())
        };
        let dtype = |engine| {
            let options = with(engine).unwrap().runtime_options();
            options.engine.kv_dtype(options.weight_format)
        };
        assert_eq!(dtype(serde_json::json!({})), KvDtype::F16);
        assert_eq!(
            dtype(serde_json::json!({"weight_format": "f32"})),
            KvDtype::F32
        );
        assert_eq!(
            dtype(serde_json::json!({"weight_format": "f32", "kv_cache_dtype": "f16"})),
            KvDtype::F16
        );
        assert_eq!(
            dtype(serde_json::json!({"kv_cache_dtype": "float32"})),
            KvDtype::F32
        );
        let wrong = with(serde_json::json!({"kv_cache_dtype": "fp8"})).unwrap_err();
        assert!(wrong.contains("fp8") && wrong.contains("f16"), "{wrong}");
    }

    #[test]
    fn allowed_sources_default_to_none_and_bad_entries_are_named_by_index() {
        let none = config(serde_json::json!({"dynamic_lora_loading_path": "/srv/a"}));
        assert!(
            none.lora_config
                .as_ref()
                .unwrap()
                .allowed_sources
                .is_empty()
        );
        none.validate().unwrap();
        let fine = config(serde_json::json!({
            "dynamic_lora_loading_path": "/srv/a",
            "allowed_sources": ["s3://bucket/team-a/", "/srv/adapters", "https://host/m"],
        }));
        fine.validate().unwrap();
        for (bad, why) in [
            ("ftp://host/x", "not a scheme"),
            ("relative/dir", "neither an absolute path"),
            ("s3://bucket/a/../b", "'..'"),
            ("/", "root"),
        ] {
            let e = config(serde_json::json!({
                "dynamic_lora_loading_path": "/srv/a",
                "allowed_sources": ["/srv/fine", bad],
            }))
            .validate()
            .unwrap_err();
            assert!(e.starts_with("lora_config.allowed_sources[1]: "), "{e}");
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn remote_sources_need_the_disk_cache_and_take_the_options() {
        let c = config(serde_json::json!({
            "dynamic_lora_loading_path": "/srv/a",
            "allowed_sources": ["s3://bucket/team-a", "/srv/b"],
            "options": {"endpoint": "http://127.0.0.1:9"},
        }));
        assert!(c.needs_disk_cache());
        assert_eq!(c.adapter_store_options("s3://bucket/team-a").len(), 1);
        // A local location never takes them while another location is remote.
        assert!(c.adapter_store_options("/srv/a").is_empty());
        let local = config(serde_json::json!({
            "dynamic_lora_loading_path": "/srv/a",
            "allowed_sources": ["/srv/b"],
            "options": {"endpoint": "http://127.0.0.1:9"},
        }));
        assert!(!local.needs_disk_cache());
        // ... and with none remote, the repository refuses them (naming the option).
        assert_eq!(local.adapter_store_options("/srv/a").len(), 1);
    }

    #[test]
    fn the_idle_sleep_time_is_a_positive_number_of_seconds() {
        let with = |s: f64| {
            let mut c = config(serde_json::json!({"dynamic_lora_loading_path": "/srv/a"}));
            c.experimental_configs.sleep_after_idle_s = Some(s);
            c.validate()
        };
        assert_eq!(with(600.0), Ok(()));
        for bad in [0.0, -1.0, f64::NAN] {
            let e = with(bad).unwrap_err();
            assert!(
                e.starts_with("experimental_configs.sleep_after_idle_s: "),
                "{e}"
            );
        }
        let mut c = config(serde_json::json!({"dynamic_lora_loading_path": "/srv/a"}));
        c.experimental_configs.drop_adapters_after_idle_s = Some(60.0);
        let e = c.validate().unwrap_err();
        assert!(e.contains("longer than sleep_after_idle_s"), "{e}");
        c.experimental_configs.sleep_after_idle_s = Some(10.0);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn an_entry_the_store_cannot_open_is_named() {
        let c = config(serde_json::json!({
            "dynamic_lora_loading_path": "/srv/a",
            "allowed_sources": ["/nonexistent-modelmux-dir/adapters"],
        }));
        let Err(e) = c.adapter_sources(None) else {
            panic!("a missing directory was accepted");
        };
        assert!(
            e.to_string()
                .starts_with("lora_config.allowed_sources[0]: "),
            "{e}"
        );
    }
}
