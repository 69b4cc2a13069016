//! What a GGUF file may not claim (`gguf/limits.rs`): an alignment candle would divide by
//! zero with, dimensions past the engine's bounds or past the file's own tensors, tensors
//! larger than the file. Each is refused, naming the key, before anything is sized by it.

use candle_core::quantized::gguf_file::Value;
use modelmux_llm::GgufFile;

use crate::common::gguf_bytes::{load_error, tiny_bytes};

#[test]
fn a_sound_tiny_file_loads() {
    assert_eq!(load_error(&tiny_bytes::<&str>(&[])), None);
    assert_eq!(
        load_error(&tiny_bytes(&[("general.alignment", Value::U32(32))])),
        None
    );
}

#[test]
fn an_alignment_of_zero_or_not_a_power_of_two_is_refused_not_a_panic() {
    for (value, says) in [
        (
            Value::U32(0),
            "general.alignment is 0: it must be a power of two",
        ),
        (
            Value::U8(0),
            "general.alignment is 0: it must be a power of two",
        ),
        (
            Value::I32(0),
            "general.alignment is 0: it must be a power of two",
        ),
        (
            Value::U32(3),
            "general.alignment is 3: it must be a power of two",
        ),
        (
            Value::U32(48),
            "general.alignment is 48: it must be a power of two",
        ),
        (
            Value::U32(1 << 24),
            "the most this engine accepts is 1048576",
        ),
        (Value::U64(0), "general.alignment is a 64-bit integer"),
        (Value::I32(-32), "general.alignment is negative"),
    ] {
        let bytes = tiny_bytes(&[("general.alignment", value.clone())]);
        let err = load_error(&bytes).unwrap_or_else(|| panic!("{value:?} loaded"));
        assert!(err.contains(says), "{value:?}: {err}");
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &bytes).unwrap();
        assert!(GgufFile::open(file.path()).is_err(), "{value:?}");
    }
    // The last of two keys counts, as candle reads them.
    let (zero, fine) = (Value::U32(0), Value::U32(32));
    let key = "general.alignment";
    assert_eq!(
        load_error(&tiny_bytes(&[(key, zero.clone()), (key, fine.clone())])),
        None
    );
    let err = load_error(&tiny_bytes(&[(key, fine), (key, zero)])).unwrap();
    assert!(err.contains("general.alignment is 0"), "{err}");
}

#[test]
fn a_huge_block_count_or_dimension_is_refused_before_anything_is_allocated() {
    let huge = 1u64 << 40;
    for key in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.attention.key_length",
        "llama.feed_forward_length",
        "llama.context_length",
    ] {
        let err =
            load_error(&tiny_bytes(&[(key, Value::U64(huge))])).unwrap_or_else(|| panic!("{key}"));
        assert!(
            err.contains(&format!("{key} is {huge}: the most this engine accepts is")),
            "{key}: {err}"
        );
    }
    // Within the bound, but more blocks than the file has.
    let err = load_error(&tiny_bytes(&[("llama.block_count", Value::U32(2))])).unwrap();
    assert!(
        err.contains("block_count is 2, but the file has no tensor blk.1.attn_norm.weight"),
        "{err}"
    );
    let err = load_error(&tiny_bytes(&[("llama.vocab_size", Value::U32(32))])).unwrap();
    assert!(
        err.contains("vocab_size is 32, but token_embd.weight has 16 rows"),
        "{err}"
    );
}

#[test]
fn a_tensor_larger_than_the_file_is_refused_before_it_is_read() {
    let bytes = tiny_bytes::<&str>(&[]);
    let at = bytes
        .windows(17)
        .position(|w| w == b"token_embd.weight")
        .unwrap()
        + 17;
    // Then: the number of dimensions (u32), and each, innermost first (u64).
    assert_eq!(&bytes[at..at + 4], &2u32.to_le_bytes());
    for (rows, cols, says) in [
        (1u64 << 40, 8u64, "ends past the end of the file"),
        (1 << 40, 1 << 40, "more than the file can hold"),
        (u64::MAX, 3, "more than the file can hold"),
    ] {
        let mut bad = bytes.clone();
        bad[at + 4..at + 12].copy_from_slice(&cols.to_le_bytes());
        bad[at + 12..at + 20].copy_from_slice(&rows.to_le_bytes());
        let err = load_error(&bad).unwrap();
        assert!(
            err.contains("tensor token_embd.weight") && err.contains(says),
            "{err}"
        );
    }
}
