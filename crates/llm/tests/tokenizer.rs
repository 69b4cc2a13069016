//! The tokenizer built from SmolLM2's GGUF against llama.cpp's (the reference implementation
//! that reads the same file): `tests/fixtures/tokenizer-smollm2.json` holds llama.cpp's ids for
//! 500+ strings (unicode, digits, code, whitespace runs, the chat markup), made by
//! `scripts/llm/tokenizer-fixture.py`. Every id must be equal, with special-token parsing on
//! and off, and decoding must give the text back.

mod common;

#[derive(serde::Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_special: Vec<u32>,
}

#[test]
fn token_ids_equal_llama_cpp_on_the_fixture() {
    let fixture: Fixture =
        serde_json::from_str(include_str!("fixtures/tokenizer-smollm2.json")).unwrap();
    assert!(fixture.cases.len() >= 200);
    let tokenizer = &common::runtime().tokenizer;
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let plain = tokenizer.encode(&case.text, false).unwrap();
        let special = tokenizer.encode(&case.text, true).unwrap();
        if plain != case.ids || special != case.ids_special {
            failures.push(format!(
                "{:?}\n  plain   {plain:?}\n  want    {:?}\n  special {special:?}\n  want    {:?}",
                case.text, case.ids, case.ids_special
            ));
        }
        assert_eq!(
            tokenizer.decode(&case.ids),
            case.text,
            "decoding {:?}",
            case.text
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        fixture.cases.len(),
        failures.join("\n")
    );
}
