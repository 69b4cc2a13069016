//! The one endpoint table of the OpenAI API, and a request as parsed once.
//!
//! The ingress deployment reads each request's path ([`Op::of`]) and parses its body into an
//! [`LlmCall`] (checking every field, naming the one at fault), routes on the model it names,
//! and hands the parsed call to the LLM deployment on the request it forwards ([`Parsed`], a
//! request extension). The LLM replica takes it from there; only a request that arrives
//! without it (one built from bytes, as a handle from elsewhere sends) is parsed again.

use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use modelmux_serve::ServeError;

use crate::params::{
    EmbeddingJob, Endpoint, Job, TokenizeInput, parse_detokenize, parse_embeddings, parse_job,
    parse_tokenize,
};
use crate::score::{ScoreJob, parse_rerank, parse_score};

/// Bodies longer than this are parsed on the blocking pool, not on the async worker that
/// received them: a 16 MiB body takes tens of milliseconds to parse, and every other request
/// on that worker would wait.
pub(crate) const PARSE_INLINE_BYTES: usize = 64 << 10;

/// What a request asks for, by method and path (the application's route prefix taken off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `GET /v1/models`
    Models,
    /// `POST /v1/load_lora_adapter`
    LoadAdapter,
    /// `POST /v1/unload_lora_adapter`
    UnloadAdapter,
    /// `POST /v1/chat/completions`, `POST /v1/completions`
    Generate(Endpoint),
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /tokenize`
    Tokenize,
    /// `POST /detokenize`
    Detokenize,
    /// `POST /v1/score` (also `/score`)
    Score,
    /// `POST /v1/rerank` (also `/rerank`)
    Rerank,
    /// `POST /v1/responses`
    Responses,
    /// `GET /v1/responses/{id}`
    StoredResponse,
    /// `DELETE /v1/responses/{id}`
    DeleteResponse,
    /// `GET /v1/responses/{id}/input_items`
    InputItems,
    /// `POST /v1/messages` (Anthropic's)
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic's)
    CountTokens,
}

impl Op {
    /// The endpoint `method` and `path` name: 405 for a known path with another method, 404
    /// for an unknown path.
    pub(crate) fn of(method: &Method, path: &str) -> Result<Self, ServeError> {
        if let Some(op) = Self::stored_response(method, path) {
            return op;
        }
        let (expected, op) = Self::table(path)?;
        if expected == *method {
            Ok(op)
        } else {
            Err(ServeError::MethodNotAllowed {
                message: format!("{method} is not allowed on {path}"),
            })
        }
    }

    /// The endpoint `path` names, whatever the method (the LLM deployment's calls come from
    /// handles, which may not set one).
    pub(crate) fn at(path: &str) -> Result<Self, ServeError> {
        Self::table(path).map(|(_, op)| op)
    }

    /// A stored response's paths (`/v1/responses/{id}`, `/v1/responses/{id}/input_items`),
    /// which carry the id.
    fn stored_response(method: &Method, path: &str) -> Option<Result<Self, ServeError>> {
        let rest = path.strip_prefix("/v1/responses/")?;
        let (id, items) = match rest.split_once('/') {
            Some((id, "input_items")) => (id, true),
            Some(_) => return None,
            None => (rest, false),
        };
        if id.is_empty() {
            return None;
        }
        Some(match (items, method) {
            (true, &Method::GET) => Ok(Op::InputItems),
            (false, &Method::GET) => Ok(Op::StoredResponse),
            (false, &Method::DELETE) => Ok(Op::DeleteResponse),
            _ => Err(ServeError::MethodNotAllowed {
                message: format!("{method} is not allowed on {path}"),
            }),
        })
    }

    /// The response id a stored response's path names.
    pub(crate) fn response_id(path: &str) -> &str {
        let rest = path.strip_prefix("/v1/responses/").unwrap_or_default();
        rest.split_once('/').map_or(rest, |(id, _)| id)
    }

    /// The one table: each path, its method and its endpoint.
    fn table(path: &str) -> Result<(Method, Self), ServeError> {
        Ok(match path {
            "/v1/models" => (Method::GET, Op::Models),
            "/v1/load_lora_adapter" => (Method::POST, Op::LoadAdapter),
            "/v1/unload_lora_adapter" => (Method::POST, Op::UnloadAdapter),
            "/v1/chat/completions" => (Method::POST, Op::Generate(Endpoint::Chat)),
            "/v1/completions" => (Method::POST, Op::Generate(Endpoint::Completion)),
            "/v1/embeddings" => (Method::POST, Op::Embeddings),
            "/tokenize" => (Method::POST, Op::Tokenize),
            "/detokenize" => (Method::POST, Op::Detokenize),
            "/v1/score" | "/score" => (Method::POST, Op::Score),
            "/v1/rerank" | "/rerank" => (Method::POST, Op::Rerank),
            "/v1/responses" => (Method::POST, Op::Responses),
            "/v1/messages" => (Method::POST, Op::Messages),
            "/v1/messages/count_tokens" => (Method::POST, Op::CountTokens),
            // In the API this one follows (vLLM's, Ray's LLMServer), not served here.
            "/v1/audio/transcriptions" | "/v1/audio/translations" => {
                return Err(ServeError::NotImplemented {
                    what: format!("{path} (speech to text: the engine serves text models)"),
                });
            }
            _ => {
                return Err(ServeError::UnknownEndpoint {
                    path: path.to_owned(),
                    endpoints: "this is an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/score, /v1/rerank, /v1/models, /tokenize, /detokenize) and Anthropic's /v1/messages".into(),
                });
            }
        })
    }

    /// The path the LLM deployment answers this on.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Op::Models => "/v1/models",
            Op::LoadAdapter => "/v1/load_lora_adapter",
            Op::UnloadAdapter => "/v1/unload_lora_adapter",
            Op::Generate(Endpoint::Chat) => "/v1/chat/completions",
            Op::Generate(Endpoint::Completion) => "/v1/completions",
            Op::Embeddings => "/v1/embeddings",
            Op::Tokenize => "/tokenize",
            Op::Detokenize => "/detokenize",
            Op::Score => "/v1/score",
            Op::Rerank => "/v1/rerank",
            Op::Responses => "/v1/responses",
            Op::StoredResponse | Op::DeleteResponse => "/v1/responses/{id}",
            Op::InputItems => "/v1/responses/{id}/input_items",
            Op::Messages => "/v1/messages",
            Op::CountTokens => "/v1/messages/count_tokens",
        }
    }
}

/// A request for the LLM deployment, parsed and checked.
pub(crate) enum LlmCall {
    /// A chat or text completion.
    Generate(Endpoint, Box<Job>),
    /// Embeddings of each input.
    Embeddings(EmbeddingJob),
    /// Tokens of a text or a chat.
    Tokenize(TokenizeInput),
    /// The text of token ids.
    Detokenize(Vec<u32>),
    /// Scores of text pairs (or documents against a query) from their embeddings.
    Score(ScoreJob),
    /// Load the request's adapter (its multiplexed model id) and keep it cached.
    LoadAdapter,
}

impl LlmCall {
    /// [`parse`](Self::parse), on the blocking pool when `body` is longer than
    /// [`PARSE_INLINE_BYTES`].
    pub(crate) async fn parse_off_worker(
        op: Op,
        body: Bytes,
    ) -> Result<(Self, Option<String>), ServeError> {
        if body.len() <= PARSE_INLINE_BYTES {
            return Self::parse(op, &body);
        }
        modelmux_context::spawn_blocking(move || Self::parse(op, &body))
            .await
            .map_err(|e| ServeError::Failed(modelmux_cache::Failure::internal(e.to_string())))?
    }

    /// Parses `body` as a request for `op`; also returns the `model` it names (none for an
    /// adapter load, which names its adapter in the model id).
    pub(crate) fn parse(op: Op, body: &[u8]) -> Result<(Self, Option<String>), ServeError> {
        Ok(match op {
            Op::Generate(endpoint) => {
                let job = parse_job(endpoint, body)?;
                let model = job.model.clone();
                (LlmCall::Generate(endpoint, Box::new(job)), Some(model))
            }
            Op::Embeddings => {
                let job = parse_embeddings(body)?;
                let model = job.model.clone();
                (LlmCall::Embeddings(job), Some(model))
            }
            Op::Tokenize => {
                let (model, input) = parse_tokenize(body)?;
                (LlmCall::Tokenize(input), Some(model))
            }
            Op::Detokenize => {
                let (model, ids) = parse_detokenize(body)?;
                (LlmCall::Detokenize(ids), Some(model))
            }
            Op::Score | Op::Rerank => {
                let job = if op == Op::Score {
                    parse_score(body)?
                } else {
                    parse_rerank(body)?
                };
                let model = job.model.clone();
                (LlmCall::Score(job), Some(model))
            }
            Op::LoadAdapter => (LlmCall::LoadAdapter, None),
            Op::Models
            | Op::UnloadAdapter
            | Op::Responses
            | Op::StoredResponse
            | Op::DeleteResponse
            | Op::InputItems
            | Op::Messages
            | Op::CountTokens => {
                return Err(ServeError::NotFound {
                    what: format!("the LLM deployment does not answer {}", op.path()),
                });
            }
        })
    }
}

/// A parsed call riding on the request the ingress forwards, taken once by the replica that
/// runs it (request extensions must be `Clone`; the call is not).
#[derive(Clone)]
pub(crate) struct Parsed(Arc<parking_lot::Mutex<Option<LlmCall>>>);

impl Parsed {
    pub(crate) fn new(call: LlmCall) -> Self {
        Self(Arc::new(parking_lot::Mutex::new(Some(call))))
    }

    /// The call, if no one took it yet.
    pub(crate) fn take(&self) -> Option<LlmCall> {
        self.0.lock().take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_table_knows_each_path_and_its_method() {
        for op in [
            Op::Models,
            Op::LoadAdapter,
            Op::UnloadAdapter,
            Op::Generate(Endpoint::Chat),
            Op::Generate(Endpoint::Completion),
            Op::Embeddings,
            Op::Tokenize,
            Op::Detokenize,
            Op::Score,
            Op::Rerank,
            Op::Responses,
            Op::Messages,
            Op::CountTokens,
        ] {
            let method = if op == Op::Models {
                Method::GET
            } else {
                Method::POST
            };
            assert_eq!(Op::of(&method, op.path()).unwrap(), op);
            let wrong = if op == Op::Models {
                Method::POST
            } else {
                Method::GET
            };
            assert!(matches!(
                Op::of(&wrong, op.path()),
                Err(ServeError::MethodNotAllowed { .. })
            ));
        }
        assert!(matches!(
            Op::of(&Method::POST, "/v2/chat"),
            Err(ServeError::UnknownEndpoint { .. })
        ));
        assert_eq!(Op::of(&Method::POST, "/score").unwrap(), Op::Score);
        let stored = "/v1/responses/resp_1";
        assert_eq!(Op::of(&Method::GET, stored).unwrap(), Op::StoredResponse);
        assert_eq!(Op::of(&Method::DELETE, stored).unwrap(), Op::DeleteResponse);
        let items = "/v1/responses/resp_1/input_items";
        assert_eq!(Op::of(&Method::GET, items).unwrap(), Op::InputItems);
        assert_eq!(Op::response_id(items), "resp_1");
        assert!(matches!(
            Op::of(&Method::POST, stored),
            Err(ServeError::MethodNotAllowed { .. })
        ));
        assert!(matches!(
            Op::of(&Method::GET, "/v1/responses/resp_1/other"),
            Err(ServeError::UnknownEndpoint { .. })
        ));
        assert!(matches!(
            Op::of(&Method::POST, "/v1/audio/transcriptions"),
            Err(ServeError::NotImplemented { .. })
        ));
    }

    /// A long body is parsed on the blocking pool; a short one at once, where it arrived.
    #[test]
    fn long_bodies_are_parsed_off_the_async_worker() {
        let body = |content: &str| {
            let body = serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": content}],
            });
            Bytes::from(body.to_string())
        };
        let op = Op::Generate(Endpoint::Chat);
        crate::test_pool::runtime().block_on(async {
            for (body, inline) in [
                (body("hi"), true),
                (body(&"word ".repeat(PARSE_INLINE_BYTES / 4)), false),
            ] {
                let len = body.len();
                let parse = LlmCall::parse_off_worker(op, body);
                let (ran_inline, parsed) = crate::test_pool::ran_inline(parse).await;
                assert_eq!(ran_inline, inline, "{len} bytes");
                assert_eq!(parsed.unwrap().1.as_deref(), Some("m"));
            }
        });
    }

    #[test]
    fn a_parsed_call_is_taken_once_and_names_its_model() {
        let body = br#"{"model": "base:pirate", "prompt": "Hi", "max_tokens": 3}"#;
        let (call, model) = LlmCall::parse(Op::Generate(Endpoint::Completion), body).unwrap();
        assert_eq!(model.as_deref(), Some("base:pirate"));
        let parsed = Parsed::new(call);
        let copy = parsed.clone();
        assert!(matches!(
            copy.take(),
            Some(LlmCall::Generate(Endpoint::Completion, _))
        ));
        assert!(
            parsed.take().is_none(),
            "taken once, by whoever holds a clone"
        );
    }
}
