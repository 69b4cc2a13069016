//! Fuzzing the GGUF reader as the weights' loader runs it: a sound tiny llama file with its
//! metadata changed to any value of any type, or its bytes overwritten or cut short, loads or
//! is refused with an error; never a panic, never an abort; and loading allocates at most
//! [`ALLOWED`] bytes in all, whatever the metadata claims (a block count of 2^40 once made
//! the loader ask for a terabyte). A test binary of its own, so that its allocation meter
//! counts only these loads (of files of a few kilobytes, far under the bound).

use candle_core::quantized::gguf_file::Value;
use modelmux_llm::{LlamaWeights, WeightFormat};
use proptest::prelude::*;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[path = "llm/common/gguf_bytes.rs"]
mod gguf_bytes;

use gguf_bytes::tiny_bytes;

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// What loading a file of a few kilobytes may allocate in all: its tensors, the model's
/// tables (rotary tables sized by the context length, a value the file states, are the
/// largest), and the reader's own buffers.
const ALLOWED: usize = 256 << 20;

/// Loads `bytes` as a model file; the bytes allocated meanwhile.
fn load(bytes: &[u8]) -> usize {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bytes).unwrap();
    let region = Region::new(ALLOCATOR);
    let loaded = LlamaWeights::load(file.path(), WeightFormat::AsStored);
    let bytes = region.change().bytes_allocated;
    if let Err(e) = loaded {
        assert!(!e.to_string().is_empty());
    }
    bytes
}

/// A metadata value of any GGUF type, extreme ones over-represented.
fn value() -> impl Strategy<Value = Value> {
    let big = prop_oneof![
        Just(0u64),
        Just(1),
        Just(3),
        Just(u64::from(u32::MAX)),
        Just(1 << 40),
        Just(u64::MAX),
        any::<u64>()
    ];
    prop_oneof![
        big.clone().prop_map(|n| Value::U32(n as u32)),
        big.clone().prop_map(Value::U64),
        big.prop_map(|n| Value::I32(n as i32)),
        any::<i64>().prop_map(Value::I64),
        any::<f32>().prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        "[a-z0-9.]{0,12}".prop_map(Value::String),
        proptest::collection::vec(any::<u32>().prop_map(Value::U32), 0..4).prop_map(Value::Array),
    ]
}

fn key() -> impl Strategy<Value = String> {
    proptest::sample::select(vec![
        "general.architecture",
        "general.alignment",
        "llama.block_count",
        "llama.context_length",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.attention.key_length",
        "llama.attention.value_length",
        "llama.attention.sliding_window",
        "llama.rope.dimension_count",
        "llama.rope.freq_base",
        "llama.rope.scaling.type",
        "llama.rope.scaling.factor",
        "llama.rope.scaling.original_context_length",
        "llama.vocab_size",
        "llama.attention.layer_norm_rms_epsilon",
    ])
    .prop_map(String::from)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    #[test]
    fn any_metadata_loads_or_is_refused_within_the_allocation_bound(
        changed in proptest::collection::vec((key(), value()), 1..4)
    ) {
        let bytes = load(&tiny_bytes(&changed));
        prop_assert!(bytes <= ALLOWED, "{bytes} bytes allocated for {changed:?}");
    }

    #[test]
    fn any_bytes_overwritten_or_cut_load_or_are_refused_within_the_bound(
        writes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut file = tiny_bytes::<&str>(&[]);
        // Most of the header and metadata lie in the first few hundred bytes.
        let head = file.len().min(600);
        for (at, byte) in writes {
            let i = at.index(head);
            file[i] = byte;
        }
        if let Some(cut) = cut {
            file.truncate(cut.index(file.len()));
        }
        let bytes = load(&file);
        prop_assert!(bytes <= ALLOWED, "{bytes} bytes allocated");
    }
}

#[test]
fn the_fuzzed_file_loads_unchanged() {
    // So that the fuzzing above starts from a file that loads.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), tiny_bytes::<&str>(&[])).unwrap();
    LlamaWeights::load(file.path(), WeightFormat::AsStored).unwrap();
}
