//! The tokenizer of a GGUF model, built from the file's own vocabulary, merges and
//! pre-tokenizer name, so that token ids equal llama.cpp's for the same file (the test
//! fixture is llama.cpp's output). Byte-level BPE (`tokenizer.ggml.model = gpt2`) only.
//!
//! candle's generic GGUF tokenizer falls back to a byte-level pre-tokenizer that adds a prefix
//! space for names it does not know; SmolLM2's `smollm` is one of them, and its ids come out
//! wrong. Here each supported pre-tokenizer is spelled out as llama.cpp runs it, and an
//! unknown one is an error rather than a guess.

use std::collections::HashMap;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::tokenizer::SplitDelimiterBehavior;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;

/// GGUF token types (`tokenizer.ggml.token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a token is turned back into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A byte-level BPE token: its characters stand for bytes.
    Normal,
    /// A control token (`<|im_end|>`): no text.
    Control,
    /// A user-defined token: its text as written.
    UserDefined,
}

/// A model's tokenizer and its special tokens.
pub struct TextTokenizer {
    /// Special tokens in the text are parsed as such (for rendered chat templates).
    with_special: Tokenizer,
    /// Special tokens in the text are plain text (for untrusted content).
    plain: Tokenizer,
    /// Each token's bytes, and kind.
    pieces: Vec<(Vec<u8>, Kind)>,
    ids: HashMap<String, u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

fn byte_decoder() -> HashMap<char, u8> {
    // GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others are mapped
    // to code points from 256 up, in byte order.
    let mut map = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            b as char
        } else {
            let c = char::from_u32(next).expect("valid code point");
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        Split::new(
            SplitPattern::Regex(regex.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(Into::into)
        .map_err(|e| LlmError::Text(format!("pre-tokenizer regex: {e}")))
    };
    Ok(match pre {
        // GPT-2's regex, no prefix space.
        "default" | "gpt2" | "gpt-2" => ByteLevel::new(false, false, true).into(),
        // Digits one by one, then GPT-2's regex (llama.cpp groups these names together).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            Sequence::new(vec![
                split(r"\p{N}")?,
                ByteLevel::new(false, false, true).into(),
            ])
            .into()
        }
        "llama-bpe" | "llama3" | "smaug-bpe" | "falcon3" => Sequence::new(vec![
            split(REGEX_LLAMA3)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        "qwen2" | "deepseek-r1-qwen" => Sequence::new(vec![
            split(REGEX_QWEN2)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        other => {
            return Err(LlmError::Text(format!(
                "pre-tokenizer '{other}' is not supported (supported: default, gpt2, smollm, starcoder, refact, command-r, llama-bpe, llama3, qwen2)"
            )));
        }
    })
}

impl TextTokenizer {
    /// Builds the tokenizer described by `file`'s metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = file.string("tokenizer.ggml.model").unwrap_or("");
        if model != "gpt2" {
            return Err(file.error(format!(
                "tokenizer model '{model}' is not supported (only byte-level BPE, 'gpt2')"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
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
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| file.error(format!("merge '{m}' is not two tokens")))
            })
            .collect::<Result<_>>()?;
        let types: Vec<i64> = match file
            .get("tokenizer.ggml.token_type")
            .and_then(|v| v.to_vec().ok())
        {
            Some(values) => values
                .iter()
                .map(|v| {
                    v.to_i32()
                        .map(i64::from)
                        .or_else(|_| v.to_i64())
                        .unwrap_or(1)
                })
                .collect(),
            None => vec![1; tokens.len()],
        };
        let vocab: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let ids = vocab.clone();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
            .build()
            .map_err(|e| file.error(format!("tokenizer: {e}")))?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer(
            file.string("tokenizer.ggml.pre").unwrap_or("default"),
        )?));
        let decoder = byte_decoder();
        let mut pieces = Vec::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (i, token) in tokens.iter().enumerate() {
            let kind = match types.get(i).copied().unwrap_or(1) {
                TOKEN_CONTROL => Kind::Control,
                TOKEN_USER_DEFINED => Kind::UserDefined,
                _ => Kind::Normal,
            };
            let bytes = match kind {
                Kind::Normal => token
                    .chars()
                    .map(|c| decoder.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| token.as_bytes().to_vec()),
                Kind::Control => Vec::new(),
                Kind::UserDefined => token.as_bytes().to_vec(),
            };
            if kind != Kind::Normal {
                added
                    .push(AddedToken::from(token.clone(), kind == Kind::Control).normalized(false));
            }
            pieces.push((bytes, kind));
        }
        tokenizer
            .add_special_tokens(added)
            .map_err(|e| file.error(format!("special tokens: {e}")))?;
        let mut plain = tokenizer.clone();
        plain.set_encode_special_tokens(true);
        let id = |key: &str| file.get(key).and_then(|v| v.to_u32().ok());
        Ok(Self {
            with_special: tokenizer,
            plain,
            pieces,
            ids,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_bos: file
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(false),
        })
    }

    /// Token ids of `text`. With `parse_special`, special tokens written in the text
    /// (`<|im_start|>`) become those tokens; without, they are plain text, as untrusted input
    /// must be.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let tokenizer = if parse_special {
            &self.with_special
        } else {
            &self.plain
        };
        let encoding = tokenizer
            .encode_fast(text, false)
            .map_err(|e| LlmError::Text(format!("tokenizing failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The ids of a prompt: `encode(text, parse_special)`, after BOS if the model wants one.
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        ids.extend(self.encode(text, parse_special)?);
        Ok(ids)
    }

    /// The bytes token `id` stands for (empty for control tokens and unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces
            .get(id as usize)
            .map_or(&[], |(b, _)| b.as_slice())
    }

    /// The text of `ids`, control tokens left out; invalid UTF-8 is replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The token's text as written in the vocabulary (`<|im_end|>`, `Ġthe`).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.with_special.id_to_token(id)
    }

    /// The id of the token written `text`, if there is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `id` is a control token (never shown as text).
    pub fn is_control(&self, id: u32) -> bool {
        self.pieces
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
        Some(t) => Err(crate::LlmError::InvalidRequest(format!(
            "{what}: token id {t} is outside the vocabulary of {vocab} tokens"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_decoder_is_a_bijection_over_bytes() {
        let d = byte_decoder();
        assert_eq!(d.len(), 256);
        assert_eq!(d[&'Ġ'], b' ');
        assert_eq!(d[&'Ċ'], b'\n');
        assert_eq!(d[&'a'], b'a');
        let mut seen: Vec<u8> = d.values().copied().collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
    }

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
