use serde_json::{Value, json};

use super::*;

/// Every byte as a token, a few multi-byte tokens as BPE would have, two control tokens and
/// an end token: id 0 is `<end>`.
fn vocabulary() -> Vocabulary {
    let mut v = Vocabulary::new(vec![0]);
    v.push(b"<end>", TokenKind::Control);
    v.push(b"<start>", TokenKind::Control);
    for b in 0..=255u8 {
        v.push(&[b], TokenKind::Text);
    }
    for word in [
        "\"name\"", "\": \"", "true", "false", "null", "{\"", "\"}", ", \"", "123", "ab", "abc",
    ] {
        v.push(word.as_bytes(), TokenKind::Text);
    }
    v
}

fn compiler() -> GrammarCompiler {
    GrammarCompiler::new(&vocabulary()).expect("vocabulary indexes")
}

/// A tiny deterministic generator (SplitMix64), so the walks repeat.
struct Walk(u64);
impl Walk {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Generates under the constraint, choosing uniformly among allowed tokens (the end token
/// only when nothing else is allowed, or one time in four once allowed), and returns the text.
fn walk(c: &GrammarCompiler, constraint: &Constraint, seed: u64) -> String {
    let v = vocabulary();
    let mut m = c.compile(constraint).expect("compiles");
    let mut rng = Walk(seed);
    let mut out = Vec::new();
    for _ in 0..2000 {
        let mask = m.compute_mask().expect("a token is always allowed");
        let allowed: Vec<u32> = (0..v.len() as u32).filter(|&t| mask.allows(t)).collect();
        assert_eq!(allowed.len(), mask.count());
        let text: Vec<u32> = allowed.iter().copied().filter(|&t| t != 0).collect();
        let end_ok = mask.allows(0);
        let token = if text.is_empty() || (end_ok && rng.next().is_multiple_of(4)) {
            assert!(
                end_ok,
                "no token allowed after {:?}",
                String::from_utf8_lossy(&out)
            );
            0
        } else {
            text[(rng.next() % text.len() as u64) as usize]
        };
        if token == 0 {
            return String::from_utf8(out).expect("constrained output is UTF-8");
        }
        assert!(!mask.allows(1), "a control token is never text");
        out.extend_from_slice(&v.words_for_test(token));
        m.consume(token).expect("an allowed token is consumed");
    }
    panic!(
        "no end within 2000 tokens: {:?}",
        String::from_utf8_lossy(&out)
    );
}

impl Vocabulary {
    fn words_for_test(&self, token: u32) -> Vec<u8> {
        self.words[token as usize].clone()
    }
}

#[test]
fn random_walks_under_a_schema_always_give_valid_documents() {
    let schema = json!({
        "type": "object",
        "properties": {
            "kind": {"enum": ["cat", "dog", "fish"]},
            "age": {"type": "integer", "minimum": 1, "maximum": 20},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
        },
        "required": ["kind", "age", "ok", "tags"],
        "additionalProperties": false,
    });
    let c = compiler();
    for seed in 0..40 {
        let text = walk(&c, &Constraint::JsonSchema(schema.clone()), seed);
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} does not parse: {e}"));
        let object = value.as_object().expect("an object");
        assert_eq!(object.len(), 4, "{text}");
        assert!(["cat", "dog", "fish"].contains(&object["kind"].as_str().unwrap()));
        let age = object["age"].as_i64().expect("an integer");
        assert!((1..=20).contains(&age), "{text}");
        assert!(object["ok"].is_boolean());
        let tags = object["tags"].as_array().unwrap();
        assert!(tags.len() <= 3);
        assert!(
            tags.iter()
                .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 3)),
            "{text}"
        );
        // The separators are fixed: no free whitespace for a model to loop on.
        assert!(
            !text.contains(['\n', '\t', '\r']) && !text.contains("  "),
            "{text}"
        );
    }
}

#[test]
fn json_object_gives_an_object() {
    let c = compiler();
    for seed in 0..20 {
        let text = walk(&c, &Constraint::JsonObject, seed);
        match serde_json::from_str::<Value>(&text) {
            Ok(value) => assert!(value.is_object(), "{text}"),
            // JSON's grammar has no bound on exponents (`1e999999`); serde_json's f64 does.
            Err(e) => assert!(
                e.to_string().contains("number out of range") && text.starts_with('{'),
                "seed {seed}: {text:?} does not parse: {e}"
            ),
        }
    }
}

#[test]
fn the_first_mask_allows_only_what_the_schema_can_start_with() {
    let c = compiler();
    let mut m = c
        .compile(&Constraint::JsonSchema(json!({"enum": ["abc", "abd"]})))
        .unwrap();
    let mask = m.compute_mask().unwrap();
    let v = vocabulary();
    let allowed: Vec<Vec<u8>> = (0..v.len() as u32)
        .filter(|&t| mask.allows(t))
        .map(|t| v.words_for_test(t))
        .collect();
    assert_eq!(allowed, vec![b"\"".to_vec()]);
    // Past the vocabulary nothing is allowed, and apply() masks it.
    assert!(!mask.allows(10_000));
    let mut logits = vec![1.0f32; v.len() + 40];
    mask.apply(&mut logits);
    let open_quote = 2 + u32::from(b'"');
    for (i, l) in logits.iter().enumerate() {
        assert_eq!(*l == 1.0, i as u32 == open_quote, "logit {i}");
    }
}

#[test]
fn a_finished_value_allows_only_the_end() {
    let c = compiler();
    let mut m = c
        .compile(&Constraint::JsonSchema(json!({"type": "boolean"})))
        .unwrap();
    let true_token = 2 + 256 + 2;
    m.consume(true_token).unwrap();
    assert!(m.is_accepting());
    let mask = m.compute_mask().unwrap();
    assert!(mask.allows(0));
    assert_eq!(mask.count(), 1);
}

#[test]
fn a_token_outside_the_mask_is_an_error() {
    let c = compiler();
    let mut m = c
        .compile(&Constraint::JsonSchema(json!({"type": "integer"})))
        .unwrap();
    m.compute_mask().unwrap();
    let letter_x = 2 + u32::from(b'x');
    assert!(matches!(m.consume(letter_x), Err(GrammarError::Matcher(_))));
}

#[test]
fn schemas_that_cannot_compile_name_the_problem() {
    let c = compiler();
    for (schema, needle) in [
        (json!({"type": "frobnicate"}), "frobnicate"),
        (json!({"$ref": "#/$defs/missing"}), "missing"),
        (json!({"type": "integer", "minimum": 5, "maximum": 1}), ""),
        (json!("not a schema"), "must be an object"),
    ] {
        let err = c
            .compile(&Constraint::JsonSchema(schema.clone()))
            .expect_err(&format!("{schema} must not compile"));
        let GrammarError::Compile(message) = &err else {
            panic!("{schema}: {err:?}")
        };
        assert!(!message.is_empty(), "{schema}");
        assert!(message.contains(needle), "{schema}: {message}");
    }
    let err = c
        .compile(&Constraint::Lark("start: undefined_rule".into()))
        .unwrap_err();
    assert!(err.to_string().contains("undefined_rule"), "{err}");
}

#[test]
fn lark_grammars_embed_json_schemas_and_name_control_tokens() {
    let c = compiler();
    let grammar = r#"start: "<call>" %json {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": false} "</call>""#;
    for seed in 0..10 {
        let text = walk(&c, &Constraint::Lark(grammar.into()), seed);
        let inner = text
            .strip_prefix("<call>")
            .and_then(|t| t.strip_suffix("</call>"))
            .unwrap_or_else(|| panic!("{text}"));
        let value: Value = serde_json::from_str(inner).unwrap();
        assert!(
            value == json!({"n": 1}) || value == json!({"n": 2}),
            "{text}"
        );
    }
}

#[test]
fn lark_helpers_embed_schemas_and_bound_repetition() {
    let c = compiler();
    let call = format!(
        "{} {} {}",
        lark_literal("<c>"),
        lark_json(&json!({"enum": [1, 2]})),
        lark_literal("</c>")
    );
    let grammar = format!("start: call (\"\\n\" call){{0,2}}\ncall: {call}");
    for seed in 0..20 {
        let text = walk(&c, &Constraint::Lark(grammar.clone()), seed);
        let calls: Vec<&str> = text.split('\n').collect();
        assert!((1..=3).contains(&calls.len()), "{text}");
        for call in calls {
            assert!(call == "<c>1</c>" || call == "<c>2</c>", "{text}");
        }
    }
}
