//! Constrained decoding in the engine: the tokens that end an output, the grammar compiler
//! of a tokenizer (built on first use), and the masks of a step's constrained rows, computed
//! on their own thread while the forward pass runs.

use std::sync::{Arc, OnceLock};

use modelmux_grammar::{
    Constraint, GrammarCompiler, GrammarError, TokenConstraint, TokenKind, TokenMask, Vocabulary,
};

use crate::error::{LlmError, Result};
use crate::tokenizer::TextTokenizer;

/// The tokens that end a sequence (unless it ignores EOS): the tokenizer's EOS and the
/// end-of-turn tokens chat models use instead.
pub(super) fn end_tokens(tokenizer: &TextTokenizer) -> Vec<u32> {
    let mut eos: Vec<u32> = tokenizer.eos().into_iter().collect();
    for text in [
        "<|im_end|>",
        "<|eot_id|>",
        "<|end_of_turn|>",
        "<|endoftext|>",
        // Gemma's and Phi-3's ends of turn.
        "<end_of_turn>",
        "<|end|>",
    ] {
        if let Some(id) = tokenizer.token_id(text)
            && tokenizer.is_control(id)
            && !eos.contains(&id)
        {
            eos.push(id);
        }
    }
    eos
}

/// A tokenizer's grammar compiler, built the first time a request asks for a constraint
/// (indexing a 50k-token vocabulary takes tens of milliseconds: unconstrained servers never
/// pay it).
pub(super) struct Grammars {
    tokenizer: Arc<TextTokenizer>,
    vocab_size: usize,
    compiler: OnceLock<std::result::Result<Arc<GrammarCompiler>, String>>,
}

impl Grammars {
    /// For `tokenizer`, whose model has `vocab_size` logits.
    pub(super) fn new(tokenizer: Arc<TextTokenizer>, vocab_size: usize) -> Self {
        Self {
            tokenizer,
            vocab_size,
            compiler: OnceLock::new(),
        }
    }

    fn compiler(&self) -> Result<&Arc<GrammarCompiler>> {
        self.compiler
            .get_or_init(|| {
                let t = &self.tokenizer;
                let mut vocabulary = Vocabulary::new(end_tokens(t));
                for id in 0..t.vocab_size() as u32 {
                    if t.is_control(id) {
                        let name = t.token_text(id).unwrap_or_default();
                        vocabulary.push(name.as_bytes(), TokenKind::Control);
                    } else {
                        vocabulary.push(t.token_bytes(id), TokenKind::Text);
                    }
                }
                vocabulary.pad_to(self.vocab_size);
                GrammarCompiler::new(&vocabulary)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| LlmError::Internal(format!("the grammar compiler: {e}")))
    }

    /// Compiles `constraint`; a constraint that does not compile is the request's error,
    /// named `what` (the request field it came from).
    pub(super) fn compile(&self, constraint: &Constraint, what: &str) -> Result<TokenConstraint> {
        self.compiler()?.compile(constraint).map_err(|e| match e {
            GrammarError::Compile(message) => {
                LlmError::InvalidRequest(format!("{what} cannot be enforced: {message}"))
            }
            GrammarError::Matcher(message) => LlmError::Internal(message),
        })
    }
}

/// A row's position in the step and its mask (or why there is none).
pub(super) type RowMask = (usize, std::result::Result<TokenMask, GrammarError>);

/// Runs `forward` on this thread while the masks of `rows` (a row's position in the step
/// and its matcher) are computed on another, so a constrained row adds no time to the step
/// unless its mask takes longer than the whole forward pass.
pub(super) fn forward_with_masks<R>(
    rows: Vec<(usize, &mut TokenConstraint)>,
    forward: impl FnOnce() -> R,
) -> (R, Vec<RowMask>) {
    if rows.is_empty() {
        return (forward(), Vec::new());
    }
    std::thread::scope(|scope| {
        let masker = std::thread::Builder::new()
            .name("modelmux-llm-mask".into())
            .spawn_scoped(scope, move || {
                rows.into_iter()
                    .map(|(row, c)| (row, c.compute_mask()))
                    .collect::<Vec<_>>()
            });
        let out = forward();
        let masks = match masker {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(e) => panic!("cannot start the mask thread: {e}"),
        };
        (out, masks)
    })
}
