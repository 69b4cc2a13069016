//! Fuzzing the ONNX request body parser (`Signature::parse_request`), which reads client
//! bytes for every ONNX request: any bytes are refused with a message or accepted as tensors
//! of the signature's types and shapes, never a panic, and parsing allocates at most a
//! stated multiple of the body (the JSON tree serde builds, then the tensors: see
//! `ALLOWED_PER_BODY_BYTE`). A test binary of its own, so that its allocation meter counts only
//! it.

use modelmux_onnx::Signature;
use modelmux_onnx::tract_onnx::prelude::*;
use proptest::prelude::*;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes allocated while parsing, at most, per byte of body, plus [`ALLOWED_BASE`]: serde's
/// `Value` takes 32 bytes an element (a number as short as `0,`), its vectors grow by doubling
/// (counted here as all they allocated, not what they hold at the end), and the tensor and
/// the error message come on top. Bodies are capped at `max_body_bytes` before this runs.
const ALLOWED_PER_BODY_BYTE: usize = 128;
const ALLOWED_BASE: usize = 64 << 10;

/// A signature of two inputs: `x`, float32 `[batch, 4]` (the batch free), and `ids`, int64
/// `[2]`.
fn signature() -> Signature {
    let mut model = TypedModel::default();
    let batch = model.symbols.sym("batch");
    let x = model
        .add_source("x", f32::fact([batch.to_dim(), 4.to_dim()]))
        .unwrap();
    let ids = model.add_source("ids", i64::fact([2])).unwrap();
    model.select_output_outlets(&[x, ids]).unwrap();
    Signature::of(&model).unwrap()
}

/// JSON text that is mostly nearly right: the shapes this signature takes, wrong ones, deep
/// nesting, huge numbers, wrong types, stray fields, and arbitrary bytes.
fn bodies() -> impl Strategy<Value = Vec<u8>> {
    let number = prop_oneof![
        any::<f32>().prop_map(|f| format!("{f}")),
        any::<i64>().prop_map(|i| i.to_string()),
        Just("1e400".to_string()),
        Just("-0".to_string()),
        Just("null".to_string()),
        Just("\"7\"".to_string()),
        Just("true".to_string()),
    ];
    let row =
        proptest::collection::vec(number.clone(), 0..6).prop_map(|v| format!("[{}]", v.join(",")));
    let rows = proptest::collection::vec(row, 0..5).prop_map(|v| format!("[{}]", v.join(",")));
    let ids = proptest::collection::vec(number, 0..4).prop_map(|v| format!("[{}]", v.join(",")));
    let deep = (1usize..200).prop_map(|n| format!("{}0{}", "[".repeat(n), "]".repeat(n)));
    let structured =
        (rows, ids, any::<bool>(), any::<bool>()).prop_map(|(x, ids, named, extra)| {
            let extra = if extra { ", \"other\": 1" } else { "" };
            if named {
                format!("{{\"inputs\": {{\"x\": {x}, \"ids\": {ids}{extra}}}}}")
            } else {
                format!("{{\"inputs\": {x}{extra}}}")
            }
        });
    prop_oneof![
        4 => structured.prop_map(String::into_bytes),
        1 => deep.prop_map(|d| format!("{{\"inputs\": {{\"x\": {d}, \"ids\": [1, 2]}}}}").into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
}

proptest! {
    #[test]
    fn any_body_is_refused_or_becomes_tensors_of_the_signature(body in bodies()) {
        let signature = signature();
        let region = Region::new(ALLOCATOR);
        let parsed = signature.parse_request(&body);
        let bytes = region.change().bytes_allocated;
        let allowed = ALLOWED_BASE + ALLOWED_PER_BODY_BYTE * body.len();
        prop_assert!(bytes <= allowed, "{bytes} bytes allocated for a {}-byte body", body.len());
        match parsed {
            Ok(tensors) => {
                prop_assert_eq!(tensors.len(), 2);
                prop_assert_eq!(tensors[0].datum_type(), f32::datum_type());
                prop_assert_eq!(tensors[0].shape()[1], 4);
                prop_assert_eq!(tensors[1].datum_type(), i64::datum_type());
                prop_assert_eq!(tensors[1].shape(), &[2]);
            }
            Err(message) => prop_assert!(!message.is_empty()),
        }
    }
}

#[test]
fn the_fuzzed_shapes_are_the_signatures_own() {
    // So that the fuzzing above reaches the tensors, not only the refusals.
    let body = br#"{"inputs": {"x": [[1, 2, 3, 4], [5, 6, 7, 8]], "ids": [1, 2]}}"#;
    let tensors = signature().parse_request(body).unwrap();
    assert_eq!(tensors[0].shape(), &[2, 4]);
    assert!(
        signature()
            .parse_request(br#"{"inputs": [[1, 2, 3, 4]]}"#)
            .is_err(),
        "two inputs must be named"
    );
}
