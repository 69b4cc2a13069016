//! The LLM deployment: one [`LlmRuntime`] per replica (the base model, its engine, its adapter
//! cache registered with the replica so the router sees which adapters it holds). It answers
//! what the ingress forwards: the request's multiplexed model id is the adapter (none: the
//! base model).

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{BoxError, Failure};
use modelmux_llm::{Engine, GenerationRequest, LlmRuntime, TextTokenizer, WeightsState};
use modelmux_serve::{Deployment, Request, Response, ServeError, json_response};
use serde_json::json;
use tokio::time::Instant;

use crate::call::{LlmCall, Op, Parsed};
use crate::errors::serve_error;
use crate::limits::{PromptLimit, TemplateBytes};
use crate::metrics::LlmMetrics;
use crate::params::{EmbeddingJob, Endpoint, Job, Prompt, TokenizeInput, invalid};
use crate::respond::{Answer, Echo, Timing, whole};
use crate::score::ScoreJob;
use crate::stream::streamed;
use crate::tools::Tools;
pub(crate) use idle::IdleSleep;

/// One replica of the LLM deployment.
pub(crate) struct LlmServer {
    pub(crate) runtime: Arc<LlmRuntime>,
    pub(crate) metrics: Arc<LlmMetrics>,
    pub(crate) stream_interval: Duration,
    /// The longest text that can still fit in the context: `max_model_len` tokens of the
    /// vocabulary's longest token. Longer prompts are refused before tokenizing them.
    pub(crate) max_prompt_bytes: usize,
    /// This replica's id (answers of adapter loads name it).
    pub(crate) replica: String,
    /// Its idle watch, when it sleeps while idle (`sleep_after_idle_s`).
    pub(crate) idle: Option<Arc<IdleSleep>>,
}

/// The bytes of the vocabulary's longest token.
pub(crate) fn longest_token(tokenizer: &TextTokenizer) -> usize {
    (0..tokenizer.vocab_size() as u32)
        .map(|id| tokenizer.token_bytes(id).len())
        .max()
        .unwrap_or(1)
        .max(1)
}

impl LlmServer {
    fn context(&self) -> usize {
        self.runtime.engine().config().max_model_len
    }

    /// What this replica's context holds.
    fn limit(&self) -> PromptLimit {
        PromptLimit {
            max_bytes: self.max_prompt_bytes,
            context: self.context(),
        }
    }

    /// Refuses, before any work is spent on it (no grammar compiled, no template rendered,
    /// nothing tokenized), a prompt that cannot fit in the context: by its bytes (a chat's
    /// as parsing counted them, `chat`) or by its number of token ids.
    fn check_fits(&self, prompt: &Prompt, chat: TemplateBytes) -> Result<(), ServeError> {
        let limit = self.limit();
        match prompt {
            Prompt::Chat(_) => limit.chat(chat),
            Prompt::Text(text) => limit.bytes("prompt", text.len()),
            Prompt::Tokens(ids) => limit.tokens("prompt", ids.len()),
            Prompt::Batch(many) => many.iter().try_for_each(|p| self.check_fits(p, chat)),
        }
    }

    /// Tokens of a prompt, on the blocking pool (a long prompt takes milliseconds), with the
    /// request's `tools` shown to the model: by the chat template when it presents tools,
    /// else in a system message (see `tools::Tools::for_plain_template`). A chat's size is
    /// checked by the caller first, from what parsing counted (`limits::TemplateBytes`).
    async fn tokens(
        &self,
        prompt: Prompt,
        tools: Option<Arc<Tools>>,
    ) -> Result<Vec<u32>, ServeError> {
        let limit = self.limit();
        let param = match &prompt {
            Prompt::Chat(_) => "messages",
            Prompt::Text(text) => {
                limit.bytes("prompt", text.len())?;
                "prompt"
            }
            Prompt::Tokens(ids) => {
                limit.tokens("prompt", ids.len())?;
                "prompt"
            }
            Prompt::Batch(_) => {
                return Err(ServeError::Failed(Failure::internal(
                    "a batch of prompts is tokenized one prompt at a time",
                )));
            }
        };
        let runtime = self.runtime.clone();
        let ids = modelmux_context::spawn_blocking(move || match prompt {
            Prompt::Chat(messages) => match tools {
                Some(t) if runtime.template_presents_tools() => {
                    runtime.chat_prompt_with_tools(&messages, Some(&t.listed))
                }
                Some(t) => runtime.chat_prompt(&t.for_plain_template(messages)),
                None => runtime.chat_prompt(&messages),
            },
            Prompt::Text(text) => runtime.tokenizer().encode_prompt(&text, true),
            Prompt::Tokens(ids) => {
                modelmux_llm::check_token_ids("prompt", &ids, runtime.tokenizer().vocab_size())
                    .map(|()| ids)
            }
            Prompt::Batch(_) => unreachable!("refused above"),
        })
        .await
        .map_err(|e| ServeError::Failed(Failure::internal(e.to_string())))?
        .map_err(|e| serve_error(&e))?;
        limit.tokens(param, ids.len())?;
        Ok(ids)
    }

    /// The text of `ids`, checked against the vocabulary (naming `param`), decoded on the
    /// blocking pool.
    async fn decode(&self, param: &'static str, ids: Vec<u32>) -> Result<String, ServeError> {
        let runtime = self.runtime.clone();
        modelmux_context::spawn_blocking(move || {
            let tokenizer = runtime.tokenizer();
            modelmux_llm::check_token_ids(param, &ids, tokenizer.vocab_size())
                .map(|()| tokenizer.decode(&ids))
        })
        .await
        .map_err(|e| ServeError::Failed(Failure::internal(e.to_string())))?
        .map_err(|e| match e {
            modelmux_llm::LlmError::InvalidRequest(message) => invalid(param, message),
            other => serve_error(&other),
        })
    }

    /// The request's adapter, loaded if need be and held until the lease is dropped.
    async fn lease(
        &self,
        adapter: Option<&modelmux_cache::ModelId>,
    ) -> Result<Option<modelmux_llm::AdapterLease>, ServeError> {
        match adapter {
            Some(id) => self
                .runtime
                .adapter(id.as_str())
                .await
                .map(Some)
                .map_err(|e| serve_error(&e)),
            None => Ok(None),
        }
    }

    async fn generate(&self, endpoint: Endpoint, job: Job) -> Result<Response, ServeError> {
        let started = Instant::now();
        let request_id = modelmux_context::request_id()
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default();
        let adapter = modelmux_context::multiplexed_model_id();
        self.check_fits(&job.prompt, job.template_bytes)?;
        let params = job.params;
        let logprobs = params.logprobs.is_some();
        let constraint = match job.constraint {
            Some((constraint, what)) => {
                let engine = self.runtime.engine().clone();
                // Compiling takes about a millisecond (the first one also indexes the
                // vocabulary): off the request threads.
                Some(
                    modelmux_context::spawn_blocking(move || {
                        engine.compile_constraint(&constraint, what)
                    })
                    .await
                    .map_err(|e| ServeError::Failed(Failure::internal(e.to_string())))?
                    .map_err(|e| serve_error(&e))?,
                )
            }
            None => None,
        };
        let lease = self.lease(adapter.as_ref()).await?;
        // A batch's prompts are submitted one after the other, each with its `n` choices,
        // which the answer numbers in that order.
        let prompts = match job.prompt {
            Prompt::Batch(prompts) => prompts,
            one => vec![one],
        };
        let tools = job.tools.map(Arc::new);
        let (mut streams, mut echo, mut prompt_tokens) = (Vec::new(), None, 0);
        for prompt in prompts {
            // (Parsing refuses `echo` with a batch.)
            let echo_text = match (&prompt, job.echo) {
                (Prompt::Text(text), true) => Some(text.clone()),
                _ => None,
            };
            let echo_ids = job.echo && matches!(prompt, Prompt::Tokens(_));
            let prompt = self.tokens(prompt, tools.clone()).await?;
            // Token ids are decoded once they are known to fit.
            let echo_text = match echo_text {
                None if echo_ids => Some(self.decode("prompt", prompt.clone()).await?),
                text => text,
            };
            echo = echo_text.map(|text| {
                Arc::new(Echo {
                    text,
                    ids: prompt.clone(),
                })
            });
            let mut params = params.clone();
            params.max_tokens = job
                .max_tokens
                .unwrap_or_else(|| self.context() - prompt.len());
            prompt_tokens += prompt.len();
            let choices = self
                .runtime
                .engine()
                .submit_choices(
                    GenerationRequest {
                        prompt,
                        params,
                        adapter: lease.clone(),
                        constraint: constraint.clone(),
                    },
                    job.n,
                )
                .map_err(|e| serve_error(&e))?;
            streams.extend(choices);
        }
        let model = adapter
            .as_ref()
            .map_or(&self.runtime.options().model_id[..], |a| a.as_str());
        self.metrics.request(model);
        // Debug: the front's access line already says one line per request.
        tracing::debug!(
            request_id = %request_id,
            model,
            prompt_tokens,
            stream = job.stream,
            "generation started"
        );
        let mut answer = Answer::new(endpoint, &request_id, job.model, job.include_usage);
        answer.choices_per_prompt = job.n;
        answer.functions =
            tools.map(|t| Arc::try_unwrap(t).map_or_else(|t| t.functions.clone(), |t| t.functions));
        if logprobs {
            answer.logprobs = Some(self.runtime.engine().tokenizer().clone());
        }
        answer.echo = echo;
        let timing = Timing::new(started, self.metrics.clone());
        if job.stream {
            Ok(streamed(answer, streams, timing, self.stream_interval))
        } else {
            whole(answer, streams, timing).await
        }
    }

    /// `/tokenize`: a conversation is checked as a chat is (its size, then its tokens
    /// against the context); a text may be up to four times the longest prompt.
    async fn tokenize(&self, input: TokenizeInput) -> Result<Response, ServeError> {
        let ids = match input {
            TokenizeInput::Chat(messages, bytes, tools) => {
                self.limit().chat(bytes)?;
                self.tokens(Prompt::Chat(messages), tools.map(Arc::new))
                    .await?
            }
            TokenizeInput::Text { text, .. } if text.len() > self.max_prompt_bytes * 4 => {
                return Err(invalid(
                    "prompt",
                    format!(
                        "prompt: {} bytes is far longer than any context this model holds",
                        text.len()
                    ),
                ));
            }
            TokenizeInput::Text { text, add_special } => {
                let runtime = self.runtime.clone();
                modelmux_context::spawn_blocking(move || {
                    if add_special {
                        runtime.tokenizer().encode_prompt(&text, true)
                    } else {
                        runtime.tokenizer().encode(&text, true)
                    }
                })
                .await
                .map_err(|e| ServeError::Failed(Failure::internal(e.to_string())))?
                .map_err(|e| serve_error(&e))?
            }
        };
        #[derive(serde::Serialize)]
        struct Tokenized<'a> {
            count: usize,
            max_model_len: usize,
            tokens: &'a [u32],
        }
        Ok(json_response(&Tokenized {
            count: ids.len(),
            max_model_len: self.context(),
            tokens: &ids,
        }))
    }

    /// `/v1/embeddings`: each input's embedding (see `LlamaModel::embed`), with the request's
    /// adapter if it names one.
    async fn embeddings(&self, job: EmbeddingJob) -> Result<Response, ServeError> {
        use base64::Engine as _;
        let mut data = Vec::with_capacity(job.inputs.len());
        let mut prompt_tokens = 0;
        for (index, input) in job.inputs.into_iter().enumerate() {
            let (vector, tokens) = self.embed(input).await?;
            prompt_tokens += tokens;
            let embedding = if job.base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            data.push(json!({"object": "embedding", "index": index, "embedding": embedding}));
        }
        Ok(json_response(&json!({
            "object": "list",
            "data": data,
            "model": job.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        })))
    }

    /// One input's embedding, with the request's adapter if it names one, and its token count.
    async fn embed(&self, input: Prompt) -> Result<(Vec<f32>, usize), ServeError> {
        let adapter = modelmux_context::multiplexed_model_id();
        let tokens = self.tokens(input, None).await?;
        let count = tokens.len();
        let lease = self.lease(adapter.as_ref()).await?;
        let vector = self
            .runtime
            .engine()
            .embed(tokens, lease)
            .await
            .map_err(|e| serve_error(&e))?;
        Ok((vector, count))
    }

    /// `/v1/score` and `/v1/rerank`: each text embedded once, pairs scored by cosine.
    async fn score(&self, job: ScoreJob) -> Result<Response, ServeError> {
        let mut embeddings = Vec::with_capacity(job.texts.len());
        let mut tokens = 0;
        for text in &job.texts {
            let (vector, count) = self.embed(Prompt::Text(text.clone())).await?;
            embeddings.push(vector);
            tokens += count;
        }
        let request_id = modelmux_context::request_id()
            .map_or_else(|| "-".to_owned(), |r| r.as_str().to_owned());
        Ok(json_response(&crate::score::answer(
            &job,
            &request_id,
            &embeddings,
            tokens,
        )))
    }

    /// Loads the request's adapter (placed here by the router) and lets it go: it stays cached.
    async fn load_adapter(&self) -> Result<Response, ServeError> {
        let id = modelmux_context::multiplexed_model_id()
            .ok_or_else(|| invalid("lora_name", "no adapter named"))?;
        self.runtime
            .adapter(id.as_str())
            .await
            .map_err(|e| serve_error(&e))?;
        Ok(json_response(
            &json!({"lora_name": id.as_str(), "replica": self.replica}),
        ))
    }

    /// `/detokenize`: at most the context's length of ids, each in the vocabulary, decoded on
    /// the blocking pool.
    async fn detokenize(&self, ids: Vec<u32>) -> Result<Response, ServeError> {
        self.limit().detokenize(ids.len())?;
        let text = self.decode("tokens", ids).await?;
        Ok(json_response(&json!({"prompt": text})))
    }
}

impl Deployment for LlmServer {
    async fn call(&self, mut request: Request) -> Result<Response, BoxError> {
        let _busy = (self.idle.as_ref()).map(|idle| idle.enter(&self.runtime));
        let op = Op::at(request.uri().path())?;
        // The ingress parsed it already; a request built elsewhere is parsed here.
        let parsed = request.extensions_mut().remove::<Parsed>();
        let call = match parsed.and_then(|p| p.take()) {
            Some(call) => call,
            None => {
                let body = request.into_body().to_bytes(usize::MAX).await?;
                LlmCall::parse_off_worker(op, body).await?.0
            }
        };
        let answer = match call {
            LlmCall::Generate(endpoint, job) => self.generate(endpoint, *job).await,
            LlmCall::Embeddings(job) => self.embeddings(job).await,
            LlmCall::Tokenize(input) => self.tokenize(input).await,
            LlmCall::Detokenize(ids) => self.detokenize(ids).await,
            LlmCall::Score(job) => self.score(job).await,
            LlmCall::LoadAdapter => self.load_adapter().await,
        };
        Ok(answer?)
    }

    async fn control(
        &self,
        name: &str,
        _body: bytes::Bytes,
    ) -> Result<serde_json::Value, BoxError> {
        let engine = self.runtime.engine();
        match name {
            "pause" => engine.pause(),
            "resume" => engine.resume(),
            "sleep" => sleep(engine).await?,
            "wakeup" | "wake_up" => wake_up(engine).await?,
            // Ray's LLMServer's state queries: the state is in every control's answer.
            "health" | "is_paused" | "is_sleeping" => {}
            "llm_config" => return Ok(self.llm_config()),
            "reset_prefix_cache" => engine
                .reset_prefix_cache()
                .await
                .map_err(|e| serve_error(&e))?,
            // The rest of Ray's LLMServer methods: known, not served here.
            "start_profile" | "stop_profile" | "collective_rpc" => {
                return Err(ServeError::NotImplemented {
                    what: format!("{name} (a vLLM engine method; this engine has none)"),
                }
                .into());
            }
            other => {
                return Err(ServeError::NotFound {
                    what: format!(
                        "the LLM deployment has no control '{other}' (it has pause, resume, sleep, wakeup, reset_prefix_cache, health, is_paused, is_sleeping, llm_config)"
                    ),
                }
                .into());
            }
        }
        Ok(self.state())
    }

    async fn check_health(&self) -> Result<(), BoxError> {
        if self.runtime.engine().is_running() {
            Ok(())
        } else {
            Err("the engine thread stopped".into())
        }
    }
}

/// The `sleep` control: the engine lets its weights go, and the answer waits until they are
/// released (between two steps: a step in flight ends first).
async fn sleep(engine: &Engine) -> Result<(), BoxError> {
    engine.sleep().map_err(|e| serve_error(&e))?;
    let released = engine
        .wait_for_weights(|w| *w != WeightsState::Loaded, Duration::from_secs(60))
        .await;
    if released.is_none() {
        return Err(Failure::internal(if engine.is_running() {
            "the engine did not release its weights within 60 s"
        } else {
            "the engine has stopped"
        })
        .into());
    }
    Ok(())
}

/// The `wakeup` control: the engine loads its weights again, and the answer waits until they
/// are back, or says why they are not.
async fn wake_up(engine: &Engine) -> Result<(), BoxError> {
    engine.wake_up();
    let state = engine
        .wait_for_weights(|w| *w != WeightsState::Released, Duration::from_secs(600))
        .await;
    match state {
        Some(WeightsState::Loaded) => Ok(()),
        Some(WeightsState::ReloadFailed(e)) => {
            Err(Failure::internal(format!("the weights could not be loaded again: {e}")).into())
        }
        _ if !engine.is_running() => Err(Failure::internal("the engine has stopped").into()),
        _ => Err("the weights did not load within 10 minutes".into()),
    }
}

impl LlmServer {
    /// The `llm_config` control's answer: the runtime's options and the engine's, named as
    /// Ray's LLMConfig and vLLM's engine arguments name them.
    fn llm_config(&self) -> serde_json::Value {
        let engine = self.runtime.engine();
        let o = self.runtime.options();
        let e = &o.engine;
        json!({
            "model_id": o.model_id,
            "weight_format": format!("{:?}", o.weight_format),
            "max_num_adapters_per_replica": o.max_adapters,
            "max_adapter_bytes": o.max_adapter_bytes,
            "adapter_load_timeout_s": o.adapter_load_timeout.map(|t| t.as_secs_f64()),
            "engine_kwargs": {
                "max_num_seqs": e.max_num_seqs,
                "max_model_len": e.max_model_len,
                "kv_cache_bytes": e.kv_cache_bytes,
                "max_num_batched_tokens": e.max_batch_tokens,
                "max_waiting": e.max_waiting,
                "queue_timeout_s": e.queue_timeout.as_secs_f64(),
                "enable_prefix_caching": e.enable_prefix_caching,
                "kv_cache_dtype": format!("{:?}", engine.kv_dtype()).to_lowercase(),
            },
        })
    }

    /// What every other control answers: whether the engine runs, is paused or asleep, its
    /// sequences, its KV cache's use and the adapters it holds.
    fn state(&self) -> serde_json::Value {
        let engine = self.runtime.engine();
        let s = engine.snapshot();
        let adapters = self
            .runtime
            .adapters()
            .map(|a| {
                a.models()
                    .into_iter()
                    .map(|m| m.id.to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        json!({
            "running": engine.is_running(),
            "paused": engine.is_paused(),
            "asleep": engine.is_asleep(),
            "sequences_running": s.running,
            "sequences_waiting": s.waiting,
            "kv_cache_used_bytes": s.kv_reserved_bytes,
            "kv_cache_capacity_bytes": s.kv_capacity_bytes,
            "adapters": adapters,
        })
    }
}

mod idle;
#[cfg(test)]
mod tests;
