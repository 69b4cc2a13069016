//! SentencePiece-style vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral
//! v0.1-0.3, Gemma 2/3), tokenized as llama.cpp tokenizes them (`llm_tokenizer_spm` and
//! `tokenizer_st_partition` in its src/llama-vocab.cpp), so that ids equal llama.cpp's.
//!
//! - Special tokens first: every control, unknown and user-defined token written in the text
//!   (control and unknown ones only when special tokens are parsed; user-defined ones always),
//!   longest first, each over the whole text before the next, cuts the text into fragments.
//! - Each text fragment, after a space if the vocabulary adds a space prefix
//!   (`tokenizer.ggml.add_space_prefix`, true unless written false) and the fragment is first
//!   or follows a special token, has its spaces written `▁` (U+2581) and is split into
//!   characters; then the adjacent pair whose concatenation is a token with the highest score
//!   (ties: the leftmost) is merged, again and again. A symbol left that is not a token is
//!   written as its bytes' `<0xNN>` tokens (byte fallback).
//!
//! The merge loop is written here rather than taken from the `tokenizers` crate: its Unigram
//! model runs Viterbi over the pieces' scores (the most likely segmentation), which is
//! SentencePiece's unigram algorithm, not this greedy highest-score-pair merging that
//! llama.cpp runs on every "llama" vocabulary (and that SentencePiece's BPE models run), and
//! the two segment many strings differently.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::{Kind, Vocabulary, strings, token_types};
use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;

/// llama.cpp's token attributes (`llama_token_attr`), from `tokenizer.ggml.token_type`.
const NORMAL: u16 = 1 << 2;
const UNKNOWN: u16 = 1 << 1;
const UNUSED: u16 = 1 << 3;
const CONTROL: u16 = 1 << 4;
const USER_DEFINED: u16 = 1 << 5;
const BYTE: u16 = 1 << 6;
const LSTRIP: u16 = 1 << 8;
const RSTRIP: u16 = 1 << 9;

/// Tokens llama.cpp makes control tokens by their text, whatever the file says (its list of
/// end-of-generation tokens), separated by spaces.
const CONTROL_LOOKING: &str = "<|eot_id|> <|im_end|> <|end|> <|return|> <|call|> <|flush|> \
    <|calls|> <end_of_turn> <|endoftext|> </s> <|eom_id|> <EOT> _<EOT> [EOT] [EOS] \
    <|end_of_text|> <end_of_utterance> <eos> <turn|> <|tool_response> \
    <｜end▁of▁sentence｜> [e~[";

/// The space marker of SentencePiece pieces.
const SPACE: &str = "\u{2581}";

/// A SentencePiece vocabulary's tokenizer.
pub(super) struct Spm {
    /// Each token's text as written (an empty one as llama.cpp renames it, `[EMPTY_<id>]`).
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    /// The special tokens, longest text first (ties: lower id first).
    specials: Vec<u32>,
    /// The token of each byte, for byte fallback.
    bytes: Vec<Option<u32>>,
    add_space_prefix: bool,
}

/// A part of the text to tokenize: text (a byte range of it) or a special token found in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// An optional `u32` metadata value, as llama.cpp reads token ids.
fn id_key(file: &GgufFile, key: &str) -> Option<u32> {
    let v = file.get(key)?;
    v.to_u32()
        .ok()
        .or_else(|| v.to_i32().ok().and_then(|x| u32::try_from(x).ok()))
        .or_else(|| v.to_u64().ok().and_then(|x| u32::try_from(x).ok()))
        .or_else(|| v.to_i64().ok().and_then(|x| u32::try_from(x).ok()))
}

fn bool_key(file: &GgufFile, key: &str, default: bool) -> bool {
    file.get(key)
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(default)
}

/// The byte a `<0xNN>` token stands for: llama.cpp parses the two characters after `<0x` as
/// hexadecimal (leading hex digits; none is 0).
fn byte_of(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or(&[]);
    let mut value = 0u8;
    for &d in digits.iter().take(2) {
        match (d as char).to_digit(16) {
            Some(v) => value = value * 16 + v as u8,
            None => break,
        }
    }
    value
}

/// C's `isspace`, which llama.cpp strips around special tokens with.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

impl Spm {
    /// The tokenizer of `file`, whose `tokenizer.ggml.model` is `llama`, and its vocabulary.
    pub(super) fn from_gguf(file: &GgufFile) -> Result<(Self, Vocabulary)> {
        let mut texts = strings(file, "tokenizer.ggml.tokens")?;
        let n = texts.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(file.error(format!("tokenizer.ggml.tokens has {n} tokens")));
        }
        let scores: Vec<f32> = match file.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(value) => value
                .to_vec()
                .map_err(|e| file.error(format!("tokenizer.ggml.scores: {e}")))?
                .iter()
                .map(|v| {
                    v.to_f32()
                        .or_else(|_| v.to_i32().map(|x| x as f32))
                        .map_err(|e| file.error(format!("tokenizer.ggml.scores: {e}")))
                })
                .collect::<Result<_>>()?,
        };
        let types = token_types(file, n)?;
        if scores.len() < n || types.len() < n {
            return Err(file.error(format!(
                "{n} tokens but {} scores and {} token types",
                scores.len(),
                types.len()
            )));
        }
        let mut ids = HashMap::with_capacity(n);
        for (i, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{i}]");
            }
            // A later duplicate wins, as in llama.cpp's map.
            ids.insert(text.clone(), i as u32);
        }
        let mut attrs: Vec<u16> = types[..n]
            .iter()
            .map(|&t| match t {
                1 => NORMAL,
                2 => UNKNOWN,
                3 => CONTROL,
                4 => USER_DEFINED,
                5 => UNUSED,
                6 => BYTE,
                _ => 0,
            })
            .collect();
        for text in CONTROL_LOOKING.split_whitespace() {
            if let Some(&id) = ids.get(text) {
                attrs[id as usize] |= CONTROL;
            }
        }
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| attrs[id as usize] & (CONTROL | USER_DEFINED | UNKNOWN) != 0)
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
        // llama.cpp's one per-model rule for these vocabularies: Phi-3's special tokens eat
        // the whitespace after them.
        let name = file.string("general.name").unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &specials {
                attrs[id as usize] |= RSTRIP;
            }
            if let Some(&id) = ids.get("</s>") {
                attrs[id as usize] |= RSTRIP;
            }
            for text in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = ids.get(text) {
                    attrs[id as usize] &= !RSTRIP;
                }
            }
        }
        let bytes = (0..=255u8)
            .map(|b| {
                ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                    b.is_ascii()
                        .then(|| ids.get(&char::from(b).to_string()).copied())
                        .flatten()
                })
            })
            .collect();
        let pieces = texts
            .iter()
            .zip(&attrs)
            .map(|(text, &attr)| {
                if attr & (CONTROL | UNKNOWN) != 0 {
                    (Vec::new(), Kind::Control)
                } else if attr & USER_DEFINED != 0 {
                    (text.as_bytes().to_vec(), Kind::UserDefined)
                } else if attr & NORMAL != 0 {
                    (text.replace(SPACE, " ").into_bytes(), Kind::Normal)
                } else if attr & BYTE != 0 {
                    (vec![byte_of(text)], Kind::Normal)
                } else {
                    // Unused and undefined tokens: llama.cpp writes nothing for them.
                    (Vec::new(), Kind::Control)
                }
            })
            .collect();
        // llama.cpp's defaults for these vocabularies, unless the file says otherwise (an id
        // out of range is ignored).
        let in_range = |id: u32| (id as usize) < n;
        let special = |key: &str, default: u32| {
            id_key(file, key)
                .filter(|&id| in_range(id))
                .or(Some(default).filter(|&id| in_range(id)))
        };
        let vocabulary = Vocabulary {
            pieces,
            ids,
            bos: special("tokenizer.ggml.bos_token_id", 1),
            eos: special("tokenizer.ggml.eos_token_id", 2),
            add_bos: bool_key(file, "tokenizer.ggml.add_bos_token", true),
        };
        let spm = Self {
            texts,
            scores,
            attrs,
            specials,
            bytes,
            add_space_prefix: bool_key(file, "tokenizer.ggml.add_space_prefix", true),
        };
        Ok((spm, vocabulary))
    }

    /// Whether encoding puts a space before the text (and decoding removes it).
    pub(super) fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The token's text as written in the vocabulary.
    pub(super) fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// Token ids of `text`; `ids` is the vocabulary's text-to-id map.
    pub(super) fn encode(
        &self,
        ids: &HashMap<String, u32>,
        text: &str,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut after_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(start, end) => {
                    let mut escaped = String::with_capacity(end - start + 3);
                    if self.add_space_prefix && after_special {
                        escaped.push_str(SPACE);
                    }
                    escaped.push_str(&text[start..end].replace(' ', SPACE));
                    self.tokenize(ids, &escaped, &mut out)?;
                    after_special = false;
                }
            }
        }
        Ok(out)
    }

    /// `text` cut at the special tokens written in it, as llama.cpp's
    /// `tokenizer_st_partition` cuts it.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(0, text.len()));
        }
        let bytes = text.as_bytes();
        for &id in &self.specials {
            let attr = self.attrs[id as usize];
            if !parse_special && attr & (CONTROL | UNKNOWN) != 0 {
                continue;
            }
            let special = self.texts[id as usize].as_str();
            if !text.contains(special) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut base, end) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(found) = text[base..end].find(special) {
                    let at = base + found;
                    let mut left = at;
                    if attr & LSTRIP != 0 {
                        while left > base && is_c_space(bytes[left - 1]) {
                            left -= 1;
                        }
                    }
                    if left > base {
                        next.push(Fragment::Text(base, left));
                    }
                    next.push(Fragment::Token(id));
                    base = at + special.len();
                    if attr & RSTRIP != 0 {
                        while base < end && is_c_space(bytes[base]) {
                            base += 1;
                        }
                    }
                }
                if base < end {
                    next.push(Fragment::Text(base, end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` of an escaped text fragment.
    fn tokenize(&self, ids: &HashMap<String, u32>, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        let bigram = |symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
            let (left, right) = (left?, right?);
            let (l, r) = (&symbols[left], &symbols[right]);
            let size = l.len + r.len;
            let id = ids.get(&text[l.start..l.start + size])?;
            Some(Bigram {
                score: self.scores[*id as usize],
                left,
                right,
                size,
            })
        };
        for i in 1..symbols.len() {
            queue.extend(bigram(&symbols, Some(i - 1), Some(i)));
        }
        while let Some(Bigram {
            left, right, size, ..
        }) = queue.pop()
        {
            let (l, r) = (symbols[left].len, symbols[right].len);
            // One of them was merged since: this pair is gone.
            if l == 0 || r == 0 || l + r != size {
                continue;
            }
            symbols[left].len = size;
            symbols[right].len = 0;
            symbols[left].next = symbols[right].next;
            if let Some(next) = symbols[right].next {
                symbols[next].prev = Some(left);
            }
            queue.extend(bigram(&symbols, symbols[left].prev, Some(left)));
            queue.extend(bigram(&symbols, Some(left), symbols[left].next));
        }
        // Every merged symbol is a token; a single character may not be: its bytes then.
        // (llama.cpp also keeps a map to split such a symbol back into the pair it was merged
        // from, which this makes dead code.)
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let symbol = &symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        let id = self.bytes[b as usize].ok_or_else(|| {
                            LlmError::Text(format!(
                                "tokenizing failed: the vocabulary has no token for byte 0x{b:02X} (no <0x{b:02X}> token)"
                            ))
                        })?;
                        out.push(id);
                    }
                }
            }
            at = symbol.next;
        }
        Ok(())
    }
}

/// A run of the text in the merge loop: its bytes, and its neighbours (`len` 0 once merged
/// into the symbol on its left).
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Two adjacent symbols whose concatenation (of `size` bytes) is a token of `score`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    /// The heap's greatest: the highest score, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse_as_llama_cpp_parses_them() {
        assert_eq!(byte_of("<0x0A>"), 0x0a);
        assert_eq!(byte_of("<0xFF>"), 0xff);
        assert_eq!(byte_of("<0xfe>"), 0xfe);
        assert_eq!(byte_of("<0x"), 0);
        assert_eq!(byte_of("x"), 0);
        let control_looking: Vec<&str> = CONTROL_LOOKING.split_whitespace().collect();
        assert_eq!(control_looking.len(), 22);
        assert!(control_looking.contains(&"<｜end▁of▁sentence｜>"));
    }

    /// A vocabulary of `tokens` (text, llama.cpp attribute), scored by position.
    fn vocab(tokens: &[(&str, u16)]) -> (Spm, HashMap<String, u32>) {
        let texts: Vec<String> = tokens.iter().map(|(t, _)| t.to_string()).collect();
        let ids = (0..).zip(&texts).map(|(i, t)| (t.clone(), i)).collect();
        let attrs: Vec<u16> = tokens.iter().map(|&(_, a)| a).collect();
        let specials = (0..texts.len() as u32)
            .filter(|&i| attrs[i as usize] & (CONTROL | USER_DEFINED) != 0)
            .collect();
        let spm = Spm {
            scores: (0..texts.len()).map(|i| -(i as f32)).collect(),
            texts,
            attrs,
            specials,
            bytes: vec![None; 256],
            add_space_prefix: true,
        };
        (spm, ids)
    }

    #[test]
    fn a_byte_without_a_token_is_an_error_not_a_panic() {
        let (spm, ids) = vocab(&[("<unk>", UNKNOWN), ("\u{2581}", NORMAL), ("a", NORMAL)]);
        assert_eq!(spm.encode(&ids, "a", false).unwrap(), [1, 2]);
        let err = spm.encode(&ids, "ab", false).unwrap_err().to_string();
        assert!(err.contains("0x62"), "{err}");
    }

    #[test]
    fn stripping_special_tokens_eat_the_whitespace_beside_them() {
        let (mut spm, _) = vocab(&[("<|end|>", CONTROL), ("<x>", CONTROL)]);
        spm.attrs[0] |= RSTRIP;
        spm.attrs[1] |= LSTRIP;
        let text = "a<|end|> \n b \t<x>";
        assert_eq!(
            spm.partition(text, true),
            [
                Fragment::Text(0, 1),
                Fragment::Token(0),
                Fragment::Text(11, 12),
                Fragment::Token(1)
            ]
        );
        assert_eq!(spm.partition(text, false), [Fragment::Text(0, text.len())]);
    }

    #[test]
    fn bigrams_pop_highest_score_then_leftmost() {
        let mut heap = BinaryHeap::new();
        for (score, left) in [(-2.0, 0), (-1.0, 5), (-1.0, 3), (-3.0, 1)] {
            heap.push(Bigram {
                score,
                left,
                right: left + 1,
                size: 2,
            });
        }
        let order: Vec<usize> = std::iter::from_fn(|| heap.pop().map(|b| b.left)).collect();
        assert_eq!(order, [3, 5, 0, 1]);
    }
}
