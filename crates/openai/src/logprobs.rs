//! Log probabilities in OpenAI's two shapes: chat's `logprobs.content` (one entry per token,
//! with its bytes and `top_logprobs`) and completions' `logprobs` (parallel lists of tokens,
//! their log probabilities, the alternatives as `{token: logprob}` and each token's offset in
//! the text). Tokens are shown as their bytes decoded (lossily where a token holds part of a
//! character; `bytes` has them exactly).

use std::sync::Arc;

use modelmux_llm::{TextTokenizer, TokenLogprob};
use serde_json::{Map, Value, json};

use crate::params::Endpoint;

/// Renders the log probabilities of one answer's tokens, in order.
pub(crate) struct Logprobs {
    tokenizer: Arc<TextTokenizer>,
    /// Tokens not yet rendered (a streamed answer renders them chunk by chunk).
    pending: Vec<(u32, TokenLogprob)>,
    /// Completions' `text_offset`: where the next token's text starts.
    offset: usize,
}

impl Logprobs {
    pub(crate) fn new(tokenizer: Arc<TextTokenizer>) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
            offset: 0,
        }
    }

    /// Adds a generated token.
    pub(crate) fn push(&mut self, id: u32, logprob: TokenLogprob) {
        self.pending.push((id, logprob));
    }

    /// Whether tokens wait to be rendered.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn token(&self, id: u32) -> (String, &[u8]) {
        let bytes = self.tokenizer.token_bytes(id);
        (String::from_utf8_lossy(bytes).into_owned(), bytes)
    }

    /// The tokens pushed since the last call, in `endpoint`'s shape.
    pub(crate) fn take(&mut self, endpoint: Endpoint) -> Value {
        let pending = std::mem::take(&mut self.pending);
        match endpoint {
            Endpoint::Chat => {
                let content: Vec<Value> = pending
                    .iter()
                    .map(|(id, lp)| {
                        let (token, bytes) = self.token(*id);
                        let top: Vec<Value> = lp
                            .top
                            .iter()
                            .map(|(t, l)| {
                                let (token, bytes) = self.token(*t);
                                json!({"token": token, "logprob": l, "bytes": bytes})
                            })
                            .collect();
                        json!({"token": token, "logprob": lp.logprob, "bytes": bytes, "top_logprobs": top})
                    })
                    .collect();
                json!({"content": content})
            }
            Endpoint::Completion => {
                let (mut tokens, mut logprobs, mut tops, mut offsets) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for (id, lp) in &pending {
                    let (token, _) = self.token(*id);
                    offsets.push(self.offset);
                    self.offset += token.len();
                    tokens.push(token);
                    logprobs.push(lp.logprob);
                    let top: Map<String, Value> = lp
                        .top
                        .iter()
                        .map(|(t, l)| (self.token(*t).0, json!(l)))
                        .collect();
                    tops.push(Value::Object(top));
                }
                json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }
}
