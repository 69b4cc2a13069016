//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), on the `tokenizers` crate's BPE model.
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

use super::{Kind, Vocabulary, strings, token_types};
use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;

/// GGUF token types (`tokenizer.ggml.token_type`).
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE tokenizer, twice: with and without special-token parsing.
pub(super) struct Bpe {
    /// Special tokens in the text are parsed as such (for rendered chat templates).
    with_special: Tokenizer,
    /// Special tokens in the text are plain text (for untrusted content).
    plain: Tokenizer,
}

pub(super) fn byte_decoder() -> HashMap<char, u8> {
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

impl Bpe {
    /// The tokenizer of `file`, whose `tokenizer.ggml.model` is `gpt2`, and its vocabulary.
    pub(super) fn from_gguf(file: &GgufFile) -> Result<(Self, Vocabulary)> {
        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings(file, "tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| file.error(format!("merge '{m}' is not two tokens")))
            })
            .collect::<Result<_>>()?;
        let types = token_types(file, tokens.len())?;
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
        let vocabulary = Vocabulary {
            pieces,
            ids,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_bos: file
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(false),
        };
        Ok((
            Self {
                with_special: tokenizer,
                plain,
            },
            vocabulary,
        ))
    }

    /// Token ids of `text`, special tokens parsed or not.
    pub(super) fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
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

    /// The token's text as written in the vocabulary.
    pub(super) fn token_text(&self, id: u32) -> Option<String> {
        self.with_special.id_to_token(id)
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
}
