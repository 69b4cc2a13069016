//! What a GGUF file may claim before anything is sized by it (security review T5-16). A file
//! is trusted input, but a wrong or hostile one must be refused with an error, never panic
//! or abort the process:
//!
//! - `general.alignment` is read here, before candle's reader, which divides by it (a 0
//!   panics): it must be a power of two of at most [`MAX_ALIGNMENT`];
//! - every tensor must lie inside the file (its element count and bytes computed without
//!   overflow), so no tensor read allocates more than the file holds;
//! - the shape in the metadata (blocks, widths, heads, vocabulary, context) has upper bounds
//!   far above any published model and must agree with the file's tensors, checked before
//!   anything is allocated per block or per head (an allocation of `block_count` entries
//!   that fails aborts the process).

use std::io::{BufReader, Read, Seek, SeekFrom};

use candle_core::quantized::gguf_file::Content;

use crate::error::Result;

/// The largest `general.alignment` accepted (llama.cpp writes 32).
pub(crate) const MAX_ALIGNMENT: u64 = 1 << 20;
/// The most transformer blocks accepted (the largest published models have under 200).
pub(crate) const MAX_LAYERS: usize = 4096;
/// The widest hidden size accepted (`embedding_length`; 16,384 for Llama 3.1 405B).
pub(crate) const MAX_EMBEDDING: usize = 1 << 16;
/// The most attention heads accepted (query or key/value).
pub(crate) const MAX_HEADS: usize = 1024;
/// The largest head size accepted (`attention.key_length`; 256 for Gemma).
pub(crate) const MAX_HEAD_DIM: usize = 4096;
/// The widest MLP accepted (`feed_forward_length`).
pub(crate) const MAX_FFN: usize = 1 << 20;
/// The longest context accepted (`context_length` and the window and YaRN lengths).
pub(crate) const MAX_CONTEXT: usize = 1 << 27;
/// The largest vocabulary accepted (the rows of `token_embd.weight`).
pub(crate) const MAX_VOCAB: usize = 1 << 24;

/// candle's own caps on what its reader reads (it refuses more; this scan defers to it).
const MAX_LENGTH: u64 = 1 << 30;
const MAX_DEPTH: usize = 64;

/// Checks `general.alignment` in the metadata of the GGUF file `reader` holds, which candle's
/// reader uses unchecked, and leaves the reader where it found it. A file this scan cannot
/// read to the end of its metadata is left to candle's reader, which refuses it with its own
/// error (the format is the same, read the same way).
pub(super) fn check_alignment<R: Read + Seek>(reader: &mut BufReader<R>) -> Result<(), String> {
    let start = reader.stream_position().map_err(|e| e.to_string())?;
    let found = scan_alignment(reader, start);
    reader
        .seek(SeekFrom::Start(start))
        .map_err(|e| e.to_string())?;
    match found {
        Some(Some(Alignment::Integer(a))) if !a.is_power_of_two() => Err(format!(
            "general.alignment is {a}: it must be a power of two (32 is usual)"
        )),
        Some(Some(Alignment::Integer(a))) if a > MAX_ALIGNMENT => Err(format!(
            "general.alignment is {a}: the most this engine accepts is {MAX_ALIGNMENT}"
        )),
        Some(Some(Alignment::Other(kind))) => Err(format!(
            "general.alignment is {kind}, not an unsigned 32-bit integer"
        )),
        _ => Ok(()),
    }
}

/// What `general.alignment` holds.
enum Alignment {
    /// One of the integer types candle reads it from, not negative.
    Integer(u64),
    /// A type candle ignores (it would then use 32, unlike llama.cpp, which refuses it).
    Other(&'static str),
}

/// The last `general.alignment` of the metadata (`Some(None)`: there is none), or `None` when
/// the metadata cannot be read.
fn scan_alignment<R: Read + Seek>(r: &mut BufReader<R>, start: u64) -> Option<Option<Alignment>> {
    let file_len = r.seek(SeekFrom::End(0)).ok()?;
    r.seek(SeekFrom::Start(start)).ok()?;
    let magic = u32_le(r)?;
    if magic != 0x4655_4747 && magic != 0x4747_5546 {
        return None;
    }
    let wide = match u32_le(r)? {
        1 => false,
        2 | 3 => true,
        _ => return None,
    };
    let length = |r: &mut BufReader<R>| -> Option<u64> {
        if wide {
            u64_le(r)
        } else {
            u32_le(r).map(u64::from)
        }
    };
    let _tensors = length(r)?;
    let entries = length(r)?;
    if entries > MAX_LENGTH {
        return None;
    }
    let mut alignment = None;
    for _ in 0..entries {
        let key_len = length(r)?;
        if key_len > MAX_LENGTH || key_len > remaining(r, file_len)? {
            return None;
        }
        let is_alignment = if key_len == b"general.alignment".len() as u64 {
            let mut key = [0u8; 17];
            r.read_exact(&mut key).ok()?;
            &key == b"general.alignment"
        } else {
            r.seek_relative(key_len as i64).ok()?;
            false
        };
        let kind = u32_le(r)?;
        if is_alignment {
            let value = match kind {
                0 => i64::from(bytes::<R, 1>(r)?[0]),
                1 => i64::from(bytes::<R, 1>(r)?[0] as i8),
                2 => i64::from(u16::from_le_bytes(bytes(r)?)),
                3 => i64::from(i16::from_le_bytes(bytes(r)?)),
                4 => i64::from(u32_le(r)?),
                5 => i64::from(i32::from_le_bytes(bytes(r)?)),
                other => {
                    skip_value(r, other, wide, 0, file_len)?;
                    alignment = Some(Alignment::Other(type_name(other)));
                    continue;
                }
            };
            // A negative value is one candle ignores too.
            alignment = Some(match u64::try_from(value) {
                Ok(v) => Alignment::Integer(v),
                Err(_) => Alignment::Other("negative"),
            });
        } else {
            skip_value(r, kind, wide, 0, file_len)?;
        }
    }
    Some(alignment)
}

fn type_name(kind: u32) -> &'static str {
    match kind {
        6 => "a float",
        7 => "a bool",
        8 => "a string",
        9 => "an array",
        10 => "a 64-bit integer",
        11 => "a signed 64-bit integer",
        12 => "a double",
        _ => "of an unknown type",
    }
}

/// The size on disk of a value of fixed-size type `kind`.
fn fixed_size(kind: u32) -> Option<u64> {
    match kind {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Moves past one value of type `kind`, as candle's reader reads it.
fn skip_value<R: Read + Seek>(
    r: &mut BufReader<R>,
    kind: u32,
    wide: bool,
    depth: usize,
    file_len: u64,
) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let length = |r: &mut BufReader<R>| -> Option<u64> {
        if wide {
            u64_le(r)
        } else {
            u32_le(r).map(u64::from)
        }
    };
    let prefix = if wide { 8 } else { 4 };
    match kind {
        8 => {
            let len = length(r)?;
            if len > MAX_LENGTH || len > remaining(r, file_len)? {
                return None;
            }
            r.seek_relative(len as i64).ok()
        }
        9 => {
            let element = u32_le(r)?;
            let len = length(r)?;
            let min = fixed_size(element).or(match element {
                8 => Some(prefix),
                9 => Some(4 + prefix),
                _ => None,
            })?;
            if len > MAX_LENGTH || len.saturating_mul(min) > remaining(r, file_len)? {
                return None;
            }
            match fixed_size(element) {
                Some(size) => r.seek_relative((len * size) as i64).ok(),
                None => {
                    (0..len).try_for_each(|_| skip_value(r, element, wide, depth + 1, file_len))
                }
            }
        }
        kind => r.seek_relative(fixed_size(kind)? as i64).ok(),
    }
}

fn remaining<R: Read + Seek>(r: &mut BufReader<R>, file_len: u64) -> Option<u64> {
    Some(file_len.saturating_sub(r.stream_position().ok()?))
}

fn bytes<R: Read, const N: usize>(r: &mut BufReader<R>) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).ok()?;
    Some(b)
}

fn u32_le<R: Read>(r: &mut BufReader<R>) -> Option<u32> {
    bytes(r).map(u32::from_le_bytes)
}

fn u64_le<R: Read>(r: &mut BufReader<R>) -> Option<u64> {
    bytes(r).map(u64::from_le_bytes)
}

/// Checks that every tensor of `content` lies inside a file of `file_len` bytes: its element
/// count and size computed without overflow, whole blocks of its type, and its bytes before
/// the file's end. So no tensor read allocates more than the file holds.
pub(super) fn check_tensors(content: &Content, file_len: u64) -> Result<(), String> {
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort_unstable();
    for name in names {
        let info = &content.tensor_infos[name];
        let dims = info.shape.dims();
        let too_big = || format!("tensor {name} has shape {dims:?}: more than the file can hold");
        let elements = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .ok_or_else(too_big)?;
        let (block, size) = (
            info.ggml_dtype.block_size() as u64,
            info.ggml_dtype.type_size() as u64,
        );
        if !elements.is_multiple_of(block) {
            return Err(format!(
                "tensor {name} has shape {dims:?}, not whole blocks of {block} ({:?})",
                info.ggml_dtype
            ));
        }
        let bytes = (elements / block).checked_mul(size).ok_or_else(too_big)?;
        let end = content
            .tensor_data_offset
            .checked_add(info.offset)
            .and_then(|start| start.checked_add(bytes));
        if end.is_none_or(|end| end > file_len) {
            return Err(format!(
                "tensor {name} ({dims:?}, {:?}: {bytes} bytes at offset {}) ends past the end of \
                 the file ({file_len} bytes): the file is truncated or not a GGUF model",
                info.ggml_dtype, info.offset
            ));
        }
    }
    Ok(())
}

/// Checks `value` of metadata key `key` against `max`.
pub(super) fn at_most(key: &str, value: usize, max: usize) -> Result<(), String> {
    if value > max {
        return Err(format!(
            "{key} is {value}: the most this engine accepts is {max}"
        ));
    }
    Ok(())
}

impl super::GgufFile {
    /// Checks each `(key, value, max)` of the shape (`{arch}.key`) against its bound.
    pub(super) fn check_shape(&self, arch: &str, dims: &[(&str, usize, usize)]) -> Result<()> {
        for &(name, value, max) in dims {
            at_most(&format!("{arch}.{name}"), value, max).map_err(|m| self.error(m))?;
        }
        Ok(())
    }

    /// Checks that the file has the blocks `{arch}.block_count` claims (each has an
    /// `attn_norm`): a count past them is refused before anything is made per block.
    pub(super) fn check_blocks(&self, arch: &str, n_layer: usize) -> Result<()> {
        let last = format!("blk.{}.attn_norm.weight", n_layer.saturating_sub(1));
        if !self.has_tensor(&last) {
            return Err(self.error(format!(
                "{arch}.block_count is {n_layer}, but the file has no tensor {last}"
            )));
        }
        Ok(())
    }

    /// Checks the vocabulary (the rows of `token_embd.weight`) against its bound and against
    /// `{arch}.vocab_size` when the file gives one.
    pub(super) fn check_vocab(&self, arch: &str, vocab: usize) -> Result<()> {
        at_most("the rows of token_embd.weight", vocab, MAX_VOCAB).map_err(|m| self.error(m))?;
        let key = format!("{arch}.vocab_size");
        if self.get(&key).is_some() {
            let stated = self.u64(&key)?;
            if stated != vocab as u64 {
                return Err(self.error(format!(
                    "{key} is {stated}, but token_embd.weight has {vocab} rows"
                )));
            }
        }
        Ok(())
    }
}
