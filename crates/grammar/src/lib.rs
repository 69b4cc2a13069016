//! Constrained decoding: a JSON schema, "any JSON object" or a Lark grammar compiled into a
//! matcher that says, before each token, which tokens of the vocabulary may come next.
//!
//! The work is llguidance's (the grammar library vLLM, SGLang, llama.cpp and mistral.rs use):
//! an Earley parser over a lazily built lexer, walking the tokenizer's trie to compute a mask
//! in tens to hundreds of microseconds, with no per-schema precomputation over the whole
//! vocabulary (outlines-core builds an index over every token for each schema up front, which
//! costs seconds for large schemas; per-request schemas make that the wrong trade here).
//!
//! One [`GrammarCompiler`] exists per tokenizer (building it walks the vocabulary once); each
//! constrained sequence gets its own [`TokenConstraint`]. A constraint the library cannot
//! compile is an error naming the problem, never a silent fallback to free text, and so is a
//! matcher that reaches a state with no allowed token.

mod vocabulary;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;
use toktrie::SimpleVob;

pub use vocabulary::{TokenKind, Vocabulary};

/// What a constrained sequence must produce.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid against this JSON schema.
    JsonSchema(Value),
    /// Text in this grammar, in llguidance's Lark dialect (which embeds JSON schemas with
    /// `%json { ... }`): tool calls wrapped in a model's own tags are written this way.
    Lark(String),
}

/// Why a constraint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The schema or grammar does not compile; the message says where and why.
    #[error("{0}")]
    Compile(String),
    /// The matcher failed while generating (an internal limit, or no token allowed).
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

/// Compiles constraints against one tokenizer; share it (`Arc`) between sequences.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .finish()
    }
}

impl GrammarCompiler {
    /// Builds the token trie and the lexer's token slices for `vocabulary` (tens of
    /// milliseconds for a 50k-token vocabulary: do it once per tokenizer).
    pub fn new(vocabulary: &Vocabulary) -> Result<Self, GrammarError> {
        let env = vocabulary.token_env();
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError::Compile(format!("cannot index the vocabulary: {e}")))?;
        // Errors come back as values; nothing is printed on the server's stderr.
        factory.quiet();
        Ok(Self { factory })
    }

    /// The number of tokens masks cover (the model's logits may have more; those are never
    /// allowed).
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Compiles `constraint` into a fresh matcher at the start of the output.
    pub fn compile(&self, constraint: &Constraint) -> Result<TokenConstraint, GrammarError> {
        let grammar = match constraint {
            Constraint::JsonObject => json_grammar(serde_json::json!({"type": "object"})),
            Constraint::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Compile(
                        "a JSON schema must be an object (or true / false)".into(),
                    ));
                }
                json_grammar(schema.clone())
            }
            Constraint::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Compile(first_line(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(first_line(&e)));
        }
        Ok(TokenConstraint {
            matcher,
            vocab: self.vocab_size(),
        })
    }
}

/// JSON with the separators people print (`", "` and `": "`) and no free whitespace: a free
/// choice of whitespace is where small models loop (newline after newline) until
/// `max_tokens`, and nothing a schema asks for needs it. A schema's own `x-guidance` options
/// are replaced: they could relax the constraint (`lenient`).
fn with_json_options(mut schema: Value) -> Value {
    let options = JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    };
    if let Some(object) = schema.as_object_mut() {
        object.remove("x-guidance");
        options.apply_to(&mut schema);
    }
    schema
}

fn json_grammar(schema: Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(with_json_options(schema))
}

/// A Lark expression for a JSON value valid against `schema`, written as [`Constraint`]'s
/// JSON schemas are (same separators, no free whitespace), to embed in a Lark grammar.
pub fn lark_json(schema: &Value) -> String {
    format!("%json {}", with_json_options(schema.clone()))
}

/// `text` as a Lark string literal.
pub fn lark_literal(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// llguidance's verbose errors add the grammar and parser state after the first line.
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

/// One sequence's matcher: ask for the mask, sample under it, then [`consume`] the token.
///
/// [`consume`]: TokenConstraint::consume
///
/// Cloning copies the parser's state (the choices of one request start from one state).
#[derive(Clone)]
pub struct TokenConstraint {
    matcher: Matcher,
    vocab: usize,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl TokenConstraint {
    /// The tokens allowed next (only end-of-sequence once the grammar is complete).
    pub fn compute_mask(&mut self) -> Result<TokenMask, GrammarError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Matcher(first_line(&e.to_string())))?;
        if mask.is_zero() {
            return Err(GrammarError::Matcher(
                "the grammar allows no token here".into(),
            ));
        }
        Ok(TokenMask {
            bits: Arc::new(mask),
            vocab: self.vocab,
        })
    }

    /// Advances past `token`, which must be allowed by the last mask.
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Matcher(first_line(&e.to_string())))
    }

    /// Whether the output is complete: the grammar allows nothing but the end.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a complete sentence of the grammar (more may follow).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// The tokens allowed at one position.
#[derive(Clone, Debug)]
pub struct TokenMask {
    bits: Arc<SimpleVob>,
    vocab: usize,
}

impl TokenMask {
    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.vocab && self.bits.is_allowed(token)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.bits.num_set()
    }

    /// Sets every disallowed logit to negative infinity (logits past the vocabulary too).
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.bits.as_slice();
        for (chunk, &word) in logits.chunks_mut(32).zip(words) {
            if word == u32::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        let covered = (words.len() * 32).min(logits.len());
        logits[covered..].fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests;
