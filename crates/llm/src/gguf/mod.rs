//! Reading a GGUF file: its metadata as a [`LlamaConfig`], and its tensors. Owns the checks
//! that a file is a Llama-family model this engine can run; never computes anything.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{LlmError, Result};

mod config;
pub(crate) mod int4;
mod limits;

pub use config::{AttentionTemperature, LlamaConfig, RopeScaling};

/// Why a file could not be read: a tensor type the engine has no kernel for is named as
/// llama.cpp names it (candle's reader gives only its number).
fn unreadable(error: &str) -> String {
    const GGML_TYPES: &[(u32, &str)] = &[
        (9, "Q8_1"),
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (17, "IQ2_XS"),
        (18, "IQ3_XXS"),
        (19, "IQ1_S"),
        (20, "IQ4_NL"),
        (21, "IQ3_S"),
        (22, "IQ2_S"),
        (23, "IQ4_XS"),
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (29, "IQ1_M"),
        (34, "TQ1_0"),
        (35, "TQ2_0"),
        (39, "MXFP4"),
    ];
    // candle's message may carry a backtrace after its first line.
    let first = error.lines().next().unwrap_or(error);
    let number = first
        .strip_prefix("unknown dtype for tensor ")
        .and_then(|n| n.trim().parse::<u32>().ok());
    match number {
        Some(n) => {
            let name = GGML_TYPES
                .iter()
                .find(|(t, _)| *t == n)
                .map_or("an unknown type", |(_, name)| name);
            format!(
                "tensor type {name} (ggml type {n}) is not supported: this engine reads F32, F16, BF16, \
                 Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K (convert or quantize the model to one of them)"
            )
        }
        None => format!("not a readable GGUF file: {first}"),
    }
}

/// An open GGUF file: metadata read, tensors read on demand.
pub struct GgufFile {
    path: PathBuf,
    reader: BufReader<File>,
    content: Content,
    /// Tensors read so far: the weights' loader refuses a file with tensors it did not read.
    read: std::collections::HashSet<String>,
}

impl GgufFile {
    /// Opens `path` and reads its header and metadata.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| LlmError::InvalidGguf {
            path: path.display().to_string(),
            message: format!("cannot open: {e}"),
        })?;
        let mut reader = BufReader::new(file);
        let invalid = |message: String| LlmError::InvalidGguf {
            path: path.display().to_string(),
            message,
        };
        // Before candle's reader, which divides by it; then every tensor inside the file.
        limits::check_alignment(&mut reader).map_err(invalid)?;
        let content =
            Content::read(&mut reader).map_err(|e| invalid(unreadable(&e.to_string())))?;
        let file_len = reader
            .get_ref()
            .metadata()
            .map_err(|e| invalid(format!("cannot read: {e}")))?
            .len();
        limits::check_tensors(&content, file_len).map_err(invalid)?;
        Ok(Self {
            path,
            reader,
            content,
            read: Default::default(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn error(&self, message: impl Into<String>) -> LlmError {
        LlmError::InvalidGguf {
            path: self.path.display().to_string(),
            message: message.into(),
        }
    }

    /// A metadata value, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    pub(crate) fn u64(&self, key: &str) -> Result<u64> {
        let value = self
            .get(key)
            .ok_or_else(|| self.error(format!("metadata key {key} is missing")))?;
        value
            .to_u64()
            .or_else(|_| value.to_i64().map(|v| v.max(0) as u64))
            .map_err(|e| self.error(format!("metadata key {key}: {e}")))
    }

    pub(crate) fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .to_f32()
                .or_else(|_| v.to_f64().map(|v| v as f32))
                .map_err(|e| self.error(format!("metadata key {key}: {e}"))),
        }
    }

    pub(crate) fn string(&self, key: &str) -> Option<&str> {
        self.get(key)
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
    }

    /// Whether the file has tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads tensor `name`, checking its shape (`[rows, columns]` = `[out, in]` for weights).
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| self.error(format!("tensor {name} is missing")))?;
        if info.shape.dims() != shape {
            return Err(self.error(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                info.shape.dims()
            )));
        }
        let tensor = info
            .read(
                &mut self.reader,
                self.content.tensor_data_offset,
                &Device::Cpu,
            )
            .map_err(|e| LlmError::InvalidGguf {
                path: self.path.display().to_string(),
                message: format!("tensor {name}: {e}"),
            })?;
        self.read.insert(name.to_owned());
        Ok(tensor)
    }

    /// The file's tensors not read so far, sorted.
    pub(crate) fn unread_tensors(&self) -> Vec<&str> {
        let mut unread: Vec<&str> = self
            .content
            .tensor_infos
            .keys()
            .map(String::as_str)
            .filter(|name| !self.read.contains(*name))
            .collect();
        unread.sort_unstable();
        unread
    }
}
