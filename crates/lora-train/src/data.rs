//! Training examples: a user prompt and the answer the adapter should give, tokenized with the
//! base model's own chat template so that training sees exactly the prompt the server will
//! build, and batched with the loss on the answer's tokens only.

use std::path::Path;

use candle_core::{Device, Tensor};
use modelmux_llm::{ChatMessage, LlmRuntime};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One line of a dataset file (JSON lines).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The user's message.
    pub prompt: String,
    /// The assistant's answer to learn.
    pub answer: String,
}

/// Reads a JSON-lines dataset, naming the line of any error.
pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| Error::Invalid(format!("{}, line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

/// Writes records as JSON lines.
pub fn write_records(path: &Path, records: &[Record]) -> Result<()> {
    let mut out = String::new();
    for r in records {
        out.push_str(&serde_json::to_string(r)?);
        out.push('\n');
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// A tokenized example: the rendered chat prompt and the answer followed by the end of turn.
#[derive(Clone, Debug)]
pub struct Example {
    /// The prompt's ids, the template's generation prompt included.
    pub prompt: Vec<u32>,
    /// The answer's ids and the end-of-turn token.
    pub answer: Vec<u32>,
}

/// Tokenizes `records` as `runtime` would serve them: the user message through the chat
/// template, the answer as plain text and then the end-of-sequence token.
pub fn tokenize(runtime: &LlmRuntime, records: &[Record]) -> Result<Vec<Example>> {
    let tokenizer = runtime.tokenizer();
    let eos = tokenizer.eos().ok_or_else(|| {
        Error::Invalid("the model's tokenizer has no end-of-sequence token".into())
    })?;
    records
        .iter()
        .map(|r| {
            let prompt = runtime.chat_prompt(&[ChatMessage::new("user", r.prompt.as_str())])?;
            if prompt.is_empty() {
                return Err(Error::Invalid(
                    "the chat template rendered an empty prompt".into(),
                ));
            }
            let mut answer = tokenizer.encode(&r.answer, false)?;
            answer.push(eos);
            Ok(Example { prompt, answer })
        })
        .collect()
}

/// A right-padded batch: ids `[batch, len]`, and the positions (flat, `b · len + t`) whose
/// next token is an answer token, with those tokens.
pub struct Batch {
    /// The token ids, `u32`, `[batch, len]`.
    pub ids: Tensor,
    /// Flat positions whose output is scored, `u32`.
    pub positions: Tensor,
    /// The token each scored position must predict, `u32`, `[n, 1]`.
    pub targets: Tensor,
    /// How many tokens are scored.
    pub scored: usize,
}

/// Pads `examples` into one batch.
pub fn batch(examples: &[&Example]) -> Result<Batch> {
    let len = examples
        .iter()
        .map(|e| e.prompt.len() + e.answer.len())
        .max()
        .unwrap_or(0);
    let mut ids = Vec::with_capacity(examples.len() * len);
    let mut positions = Vec::new();
    let mut targets = Vec::new();
    for (b, e) in examples.iter().enumerate() {
        let sequence: Vec<u32> = e.prompt.iter().chain(&e.answer).copied().collect();
        for (i, &token) in e.answer.iter().enumerate() {
            // The answer's i-th token is predicted by the position before it.
            positions.push((b * len + e.prompt.len() + i - 1) as u32);
            targets.push(token);
        }
        let pad = *sequence.last().unwrap_or(&0);
        ids.extend(sequence.iter().copied());
        ids.extend(std::iter::repeat_n(pad, len - sequence.len()));
    }
    let scored = targets.len();
    Ok(Batch {
        ids: Tensor::from_vec(ids, (examples.len(), len), &Device::Cpu)?,
        positions: Tensor::from_vec(positions, scored, &Device::Cpu)?,
        targets: Tensor::from_vec(targets, (scored, 1), &Device::Cpu)?,
        scored,
    })
}
