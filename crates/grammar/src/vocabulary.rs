//! A tokenizer's vocabulary as the grammar library sees it: each token's bytes, which tokens
//! are control tokens (never produced by text), and which end the output.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// What a token is, for the matcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// Text: its bytes can appear in constrained output.
    Text,
    /// A control token (`<|im_start|>`, `<s>`): no grammar of text allows it, but a Lark
    /// grammar may name it as `<|im_start|>`.
    Control,
}

/// The tokens of a model, in id order.
#[derive(Clone, Debug)]
pub struct Vocabulary {
    pub(crate) words: Vec<Vec<u8>>,
    end_tokens: Vec<u32>,
}

impl Vocabulary {
    /// An empty vocabulary whose output ends with any of `end_tokens` (EOS, end of turn).
    pub fn new(end_tokens: Vec<u32>) -> Self {
        Self {
            words: Vec::new(),
            end_tokens,
        }
    }

    /// Appends the next token (id = the number pushed before it).
    pub fn push(&mut self, bytes: &[u8], kind: TokenKind) {
        let word = match kind {
            TokenKind::Text => bytes.to_vec(),
            // llguidance's convention: a control token's "bytes" are a 0xFF marker and its
            // name, which no text can contain.
            TokenKind::Control => {
                let mut word = Vec::with_capacity(bytes.len() + 1);
                word.push(TokTrie::SPECIAL_TOKEN_MARKER);
                word.extend_from_slice(bytes);
                word
            }
        };
        self.words.push(word);
    }

    /// Pads the vocabulary to `size` tokens with ids no grammar allows (a model's logits may
    /// cover more ids than its tokenizer names).
    pub fn pad_to(&mut self, size: usize) {
        if self.words.len() < size {
            self.words.resize(size, Vec::new());
        }
    }

    /// Tokens pushed so far.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether no token was pushed.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub(crate) fn token_env(&self) -> TokEnv {
        let eos = self.end_tokens.first().copied().unwrap_or(0);
        let info = TokRxInfo::new(self.words.len() as u32, eos);
        let trie = TokTrie::from(&info, &self.words).with_eos_tokens(&self.end_tokens);
        Arc::new(TrieEnv { trie })
    }
}

/// Tokenizes by the trie's longest match. llguidance tokenizes only to force tokens and to
/// heal prompts, neither of which the engine uses (every token is sampled under the mask), so
/// the model's own tokenizer is not needed here.
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}
