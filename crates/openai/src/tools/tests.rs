use modelmux_grammar::{GrammarCompiler, TokenKind, Vocabulary};
use serde_json::json;

use super::*;

fn weather_tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"enum": ["Paris", "Rome"]},
                "unit": {"enum": ["C", "F"]},
            }, "required": ["city", "unit"], "additionalProperties": false},
        }}),
        json!({"type": "function", "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 12}}, "required": ["zone"], "additionalProperties": false},
        }}),
    ]
}

fn tools(choice: Value, parallel: bool) -> Tools {
    parse(Some(weather_tools()), Some(choice), Some(parallel))
        .unwrap()
        .unwrap()
}

/// A byte-level vocabulary (id 0 ends the output), as a stand-in tokenizer.
fn bytes_compiler() -> GrammarCompiler {
    let mut v = Vocabulary::new(vec![0]);
    v.push(b"<end>", TokenKind::Control);
    for b in 0..=255u8 {
        v.push(&[b], TokenKind::Text);
    }
    GrammarCompiler::new(&v).unwrap()
}

/// Random walks under `constraint`, each answer split as the server splits it.
fn walks(
    constraint: &Constraint,
    functions: &[Function],
    count: u64,
) -> Vec<(String, Vec<ToolCall>)> {
    let compiler = bytes_compiler();
    let mut out = Vec::new();
    for seed in 0..count {
        let mut m = compiler.compile(constraint).unwrap();
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut text = Vec::new();
        loop {
            let mask = m.compute_mask().unwrap();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let allowed: Vec<u32> = (1..257).filter(|&t| mask.allows(t)).collect();
            if mask.allows(0) && (allowed.is_empty() || state.is_multiple_of(3)) {
                break;
            }
            let t = allowed[(state % allowed.len() as u64) as usize];
            text.push((t - 1) as u8);
            m.consume(t).unwrap();
            assert!(
                text.len() < 4000,
                "no end: {}",
                String::from_utf8_lossy(&text)
            );
        }
        let text = String::from_utf8(text).unwrap();
        let mut splitter = CallSplitter::new(functions);
        let mut content = String::new();
        // In pieces, as a stream would deliver it.
        for piece in text.as_bytes().chunks(3) {
            content.push_str(&splitter.push(std::str::from_utf8(piece).unwrap_or_default()));
        }
        let (rest, calls) = splitter.finish();
        content.push_str(&rest);
        out.push((content, calls));
    }
    out
}

#[test]
fn required_calls_always_parse_and_match_their_function() {
    let t = tools(json!("required"), true);
    let constraint = t.constraint(None).unwrap();
    for (content, calls) in walks(&constraint, &t.functions, 30) {
        assert!(content.trim().is_empty(), "{content:?}");
        assert!((1..=MAX_PARALLEL_CALLS).contains(&calls.len()));
        for call in calls {
            let args: Value = serde_json::from_str(&call.arguments).unwrap();
            match call.name.as_str() {
                "get_weather" => {
                    assert!(["Paris", "Rome"].contains(&args["city"].as_str().unwrap()));
                    assert!(["C", "F"].contains(&args["unit"].as_str().unwrap()));
                }
                "get_time" => {
                    assert!((-12..=12).contains(&args["zone"].as_i64().unwrap()));
                }
                other => panic!("{other}"),
            }
        }
    }
}

#[test]
fn a_named_function_is_called_once() {
    let t = tools(
        json!({"type": "function", "function": {"name": "get_time"}}),
        true,
    );
    for (_, calls) in walks(&t.constraint(None).unwrap(), &t.functions, 20) {
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_time");
    }
}

#[test]
fn auto_with_a_response_format_gives_calls_or_the_format() {
    let t = tools(json!("auto"), false);
    assert!(t.constraint(None).is_none(), "auto alone is free text");
    let format = Constraint::JsonSchema(
        json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"], "additionalProperties": false}),
    );
    let constraint = t.constraint(Some(&format)).unwrap();
    let mut kinds = (0, 0);
    for (content, calls) in walks(&constraint, &t.functions, 40) {
        if calls.is_empty() {
            let v: Value = serde_json::from_str(&content).unwrap();
            assert!(
                v == json!({"answer": "yes"}) || v == json!({"answer": "no"}),
                "{content}"
            );
            kinds.0 += 1;
        } else {
            assert_eq!(calls.len(), 1, "parallel_tool_calls: false");
            kinds.1 += 1;
        }
    }
    assert!(kinds.0 > 0 && kinds.1 > 0, "{kinds:?}");
}

#[test]
fn the_splitter_lets_text_through_and_holds_calls() {
    let t = tools(json!("auto"), true);
    let mut s = CallSplitter::new(&t.functions);
    let mut out = s.push("The weather: <tool");
    assert_eq!(out, "The weather: ");
    out.push_str(
        &s.push("_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 2}}\n</tool_call>"),
    );
    assert_eq!(out, "The weather: ");
    let (rest, calls) = s.finish();
    assert_eq!(rest, "");
    assert_eq!(
        calls,
        vec![ToolCall {
            name: "get_time".into(),
            arguments: "{\"zone\":2}".into()
        }]
    );

    // A tail that only looked like a tag is text after all.
    let mut s = CallSplitter::new(&t.functions);
    let mut out = s.push("a <tool");
    out.push_str(&s.push("box> b"));
    let (rest, calls) = s.finish();
    assert_eq!(out + &rest, "a <toolbox> b");
    assert!(calls.is_empty());

    // Llama 3's bare JSON, with "parameters".
    let mut s = CallSplitter::new(&t.functions);
    assert_eq!(
        s.push(" {\"name\": \"get_time\", \"parameters\": {\"zone\": -3}}"),
        ""
    );
    let (_, calls) = s.finish();
    assert_eq!(calls[0].arguments, "{\"zone\":-3}");

    // Cut short by max_tokens after a complete call: the complete one counts.
    let mut s = CallSplitter::new(&t.functions);
    s.push("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_");
    let (rest, calls) = s.finish();
    assert_eq!((rest.as_str(), calls.len()), ("", 1));

    // A call of a function not offered, or broken JSON, is text.
    for text in [
        "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"get_time\", </tool_call>",
        "{\"answer\": 1}",
    ] {
        let mut s = CallSplitter::new(&t.functions);
        let out = s.push(text);
        let (rest, calls) = s.finish();
        assert_eq!(out + &rest, text);
        assert!(calls.is_empty(), "{text}");
    }
}

#[test]
fn bad_tool_requests_name_the_field() {
    let cases = [
        (Some(vec![json!({"type": "retrieval"})]), None, "tools[0]"),
        (
            Some(vec![
                json!({"type": "function", "function": {"name": "a b"}}),
            ]),
            None,
            "tools[0].function.name",
        ),
        (
            Some(vec![
                json!({"type": "function", "function": {"name": "f", "parameters": 3}}),
            ]),
            None,
            "tools[0].function.parameters",
        ),
        (
            Some(vec![
                json!({"type": "function", "function": {"name": "f"}}),
                json!({"type": "function", "function": {"name": "f"}}),
            ]),
            None,
            "tools[1].function.name",
        ),
        (
            Some(weather_tools()),
            Some(json!("sometimes")),
            "tool_choice",
        ),
        (
            Some(weather_tools()),
            Some(json!({"type": "function", "function": {"name": "nope"}})),
            "tool_choice.function.name",
        ),
        (None, Some(json!("required")), "tool_choice"),
    ];
    for (tools, choice, param) in cases {
        match parse(tools, choice, None) {
            Err(ServeError::InvalidParameter { param: p, .. }) => assert_eq!(p, param),
            other => panic!("{param}: {other:?}"),
        }
    }
    assert!(parse(None, Some(json!("none")), None).unwrap().is_none());
}

#[test]
fn plain_templates_get_the_tools_in_the_system_message() {
    let t = tools(json!("auto"), true);
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.tool_calls = vec![
        json!({"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {"zone": 1}}}),
    ];
    let mut result = ChatMessage::new("tool", "14:00");
    result.tool_call_id = Some("c1".into());
    let out = t.for_plain_template(vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Time?"),
        assistant,
        result,
    ]);
    assert_eq!(out.len(), 4);
    assert!(
        out[0]
            .content
            .starts_with("Be brief.\n\nYou may call functions")
    );
    assert!(out[0].content.contains("\"name\":\"get_weather\""));
    let written = json!({"name": "get_time", "arguments": {"zone": 1}});
    assert_eq!(
        out[2].content,
        format!("<tool_call>\n{written}\n</tool_call>")
    );
    assert_eq!(out[3].role, "user");
    assert_eq!(out[3].content, "<tool_response>\n14:00\n</tool_response>");
}
