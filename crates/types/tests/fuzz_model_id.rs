//! Fuzzing the model id, the one string every request path takes from the client (a header,
//! `model: "base:<adapter>"`, an admin path): any string is refused or accepted without a
//! panic, what is accepted keeps the id's promises, and checking allocates no more than a
//! copy of the id. A test binary of its own, so that its allocation meter counts only it.

use modelmux_types::{MAX_MODEL_ID_LEN, ModelId};
use proptest::prelude::*;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes allocated while `f` runs.
fn allocated<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let region = Region::new(ALLOCATOR);
    let out = f();
    (out, region.change().bytes_allocated)
}

/// Characters text viewers act on rather than show: line and paragraph separators, bidi
/// embeddings, overrides and isolates.
const SHOWN_WRONG: [char; 11] = [
    '\u{2028}', '\u{2029}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}',
    '\u{2067}', '\u{2068}', '\u{2069}',
];

/// Strings of any chars, with the ones that matter over-represented: controls, separators,
/// bidi overrides, path pieces, and lengths around the cap.
fn hostile_text() -> impl Strategy<Value = String> {
    let interesting = prop_oneof![
        any::<char>(),
        Just('\u{0}'),
        Just('\u{1b}'),
        Just('\u{85}'),
        Just('\u{9b}'),
        Just('\u{2028}'),
        Just('\u{202e}'),
        Just('\u{2066}'),
        Just('/'),
        Just('.'),
        Just('\\'),
        Just(':'),
        Just('a'),
    ];
    prop_oneof![
        proptest::collection::vec(interesting, 0..80).prop_map(|c| c.into_iter().collect()),
        (0usize..2 * MAX_MODEL_ID_LEN).prop_map(|n| "x".repeat(n)),
    ]
}

proptest! {
    #[test]
    fn any_string_is_refused_or_accepted_keeping_the_ids_promises(text in hostile_text()) {
        let (checked, bytes) = allocated(|| ModelId::new(&text));
        match checked {
            Ok(id) => {
                prop_assert_eq!(id.as_str(), text.as_str());
                prop_assert!(!text.is_empty() && text.len() <= MAX_MODEL_ID_LEN);
                let forged = text.chars().any(|c| c.is_control() || SHOWN_WRONG.contains(&c));
                prop_assert!(!forged, "{:?} accepted", text);
                // A path inside a repository never climbs out of it.
                if let Ok(path) = id.as_relative_path() {
                    prop_assert!(!path.starts_with('/') && !path.contains('\\'));
                    prop_assert!(path.split('/').all(|s| !s.is_empty() && s != "." && s != ".."));
                }
                // The id itself (an `Arc<str>`: its bytes and two counters).
                prop_assert!(bytes <= text.len() + 64, "{bytes} bytes for a {}-byte id", text.len());
            }
            Err(e) => {
                // The error names the id's problem, in bounded text.
                prop_assert!(e.to_string().len() <= 2 * MAX_MODEL_ID_LEN + 200, "{e}");
            }
        }
    }
}
