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
    /// Tokens not yet rendered (a streamed answer renders them chunk by chunk); `None` for
    /// an echoed prompt's first token, which has no log probability.
    pending: Vec<(u32, Option<TokenLogprob>)>,
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
        self.pending.push((id, Some(logprob)));
    }

    /// Adds an echoed prompt's tokens: the first without a log probability, each of the
    /// others with `logprobs[i - 1]`.
    pub(crate) fn push_prompt(&mut self, ids: &[u32], logprobs: Vec<TokenLogprob>) {
        let mut logprobs = logprobs.into_iter();
        for (i, &id) in ids.iter().enumerate() {
            let lp = if i == 0 { None } else { logprobs.next() };
            self.pending.push((id, lp));
        }
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
                    .filter_map(|(id, lp)| lp.as_ref().map(|lp| (id, lp)))
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
                    match lp {
                        Some(lp) => {
                            logprobs.push(json!(lp.logprob));
                            let top: Map<String, Value> = lp
                                .top
                                .iter()
                                .map(|(t, l)| (self.token(*t).0, json!(l)))
                                .collect();
                            tops.push(Value::Object(top));
                        }
                        // The prompt's first token: nothing before it to predict it.
                        None => {
                            logprobs.push(Value::Null);
                            tops.push(Value::Null);
                        }
                    }
                }
                json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }
}
