//! The tokenizer of a GGUF model, built from the file's own vocabulary (and merges, and
//! pre-tokenizer name), so that token ids equal llama.cpp's for the same file (the test
//! fixtures are llama.cpp's output). Two kinds of vocabulary, as `tokenizer.ggml.model` names
//! them:
//!
//! - `gpt2`: byte-level BPE (SmolLM2, Llama 3, Qwen 2), in [`bpe`];
//! - `llama`: SentencePiece-style, scored pieces with byte fallback and `▁` for spaces (Llama 2,
//!   Mistral v0.1-0.3, Gemma 2/3), in [`spm`].

mod bpe;
mod spm;

use std::collections::HashMap;

use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;

/// How a token is turned back into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A text token: its bytes (byte-level BPE characters, `▁` and `<0xNN>` decoded).
    Normal,
    /// A control token (`<|im_end|>`), or one with no text at all (SentencePiece's unknown and
    /// unused tokens): no text.
    Control,
    /// A user-defined token: its text as written.
    UserDefined,
}

/// What every kind of tokenizer knows of its vocabulary.
struct Vocabulary {
    /// Each token's bytes, and kind.
    pieces: Vec<(Vec<u8>, Kind)>,
    ids: HashMap<String, u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

enum Model {
    /// Boxed: two `tokenizers` pipelines are kilobytes.
    Bpe(Box<bpe::Bpe>),
    Spm(spm::Spm),
}

/// A model's tokenizer and its special tokens.
pub struct TextTokenizer {
    model: Model,
    vocab: Vocabulary,
}

/// The string array `key` of `file`'s metadata.
fn strings(file: &GgufFile, key: &str) -> Result<Vec<String>> {
    let values = file
        .get(key)
        .and_then(|v| v.to_vec().ok())
        .ok_or_else(|| file.error(format!("metadata key {key} is missing")))?;
    values
        .iter()
        .map(|v| {
            v.to_string()
                .cloned()
                .map_err(|e| file.error(format!("{key}: {e}")))
        })
        .collect()
}

/// `tokenizer.ggml.token_type`, or all normal (1) where it is absent.
fn token_types(file: &GgufFile, n_tokens: usize) -> Result<Vec<i32>> {
    let Some(value) = file.get("tokenizer.ggml.token_type") else {
        return Ok(vec![1; n_tokens]);
    };
    let values = value
        .to_vec()
        .map_err(|e| file.error(format!("tokenizer.ggml.token_type: {e}")))?;
    Ok(values
        .iter()
        .map(|v| {
            v.to_i32()
                .or_else(|_| v.to_i64().map(|x| i32::try_from(x).unwrap_or(0)))
                .unwrap_or(1)
        })
        .collect())
}

impl TextTokenizer {
    /// Builds the tokenizer described by `file`'s metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let (model, vocab) = match file.string("tokenizer.ggml.model").unwrap_or("") {
            "gpt2" => {
                let (bpe, vocab) = bpe::Bpe::from_gguf(file)?;
                (Model::Bpe(Box::new(bpe)), vocab)
            }
            "llama" => {
                let (spm, vocab) = spm::Spm::from_gguf(file)?;
                (Model::Spm(spm), vocab)
            }
            other => {
                return Err(file.error(format!(
                    "tokenizer model '{other}' is not supported (byte-level BPE 'gpt2' and SentencePiece 'llama' are)"
                )));
            }
        };
        Ok(Self { model, vocab })
    }

    /// Token ids of `text`. With `parse_special`, special tokens written in the text
    /// (`<|im_start|>`) become those tokens; without, they are plain text, as untrusted input
    /// must be. (SentencePiece vocabularies' user-defined tokens are matched either way, as
    /// llama.cpp matches them.)
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        match &self.model {
            Model::Bpe(bpe) => bpe.encode(text, parse_special),
            Model::Spm(spm) => spm.encode(&self.vocab.ids, text, parse_special),
        }
    }

    /// The ids of a prompt: `encode(text, parse_special)`, after BOS if the model wants one.
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.vocab.add_bos
            && let Some(bos) = self.vocab.bos
        {
            ids.push(bos);
        }
        ids.extend(self.encode(text, parse_special)?);
        Ok(ids)
    }

    /// The bytes token `id` stands for (empty for control tokens and unknown ids). A
    /// SentencePiece token's `▁` is a space here, also at the start of a sequence: this is
    /// the piece as a stream of generated tokens shows it.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.vocab
            .pieces
            .get(id as usize)
            .map_or(&[], |(b, _)| b.as_slice())
    }

    /// The text of `ids`, control tokens left out; invalid UTF-8 is replaced. For a
    /// SentencePiece vocabulary that adds a space prefix when encoding, the first token's
    /// leading space is removed, as llama.cpp's detokenizer removes it.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes: Vec<u8> = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_bytes(id);
            let piece = match &self.model {
                Model::Spm(spm) if i == 0 && spm.add_space_prefix() => {
                    piece.strip_prefix(b" ").unwrap_or(piece)
                }
                _ => piece,
            };
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The token's text as written in the vocabulary (`<|im_end|>`, `Ġthe`, `▁the`).
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.model {
            Model::Bpe(bpe) => bpe.token_text(id),
            Model::Spm(spm) => spm.token_text(id).map(str::to_owned),
        }
    }

    /// The id of the token written `text`, if there is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.ids.get(text).copied()
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.pieces.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// Whether `id` is a control token (never shown as text).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab
            .pieces
            .get(id as usize)
            .is_some_and(|(_, k)| *k == Kind::Control)
    }
}

/// Turns a stream of tokens into text, holding back the bytes of a character split across
/// tokens until it is complete.
#[derive(Debug, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// A stream with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes`, returning the text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Bytes that can never become valid: flush them as replacement characters.
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        text
    }

    /// Whatever is still pending, as text (at the end of a sequence).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// The one check that token ids are in a vocabulary of `vocab` tokens (prompts, stop tokens,
/// ids to decode, the forward pass's input); `what` names them in the error.
pub fn check_token_ids(what: &str, ids: &[u32], vocab: usize) -> crate::Result<()> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => Err(LlmError::InvalidRequest(format!(
            "{what}: token id {t} is outside the vocabulary of {vocab} tokens"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stream_holds_split_characters() {
        let mut s = TextStream::new();
        let euro = "€".as_bytes();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&euro[2..]), "€");
        assert_eq!(s.push(&[0xff]), "\u{fffd}");
        assert_eq!(s.push(&euro[..2]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }
}
