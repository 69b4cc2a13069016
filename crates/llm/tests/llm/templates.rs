//! Each family's chat template (tests/fixtures/templates/, as the GGUF files carry them in
//! `tokenizer.chat_template`) rendered by [`ChatTemplate`] equal, byte for byte, to the
//! reference rendering: the `jinja2` package as transformers' `apply_chat_template` runs it
//! (scripts/llm/render_template.py, with the Python of `MODELMUX_TEST_PYTHON`). A
//! conversation the template refuses with `raise_exception` is refused by both, with the
//! template's message.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use modelmux_llm::{ChatMessage, ChatTemplate};
use serde_json::{Map, Value, json};

/// A template under test: its file, the texts of its special tokens, whether it presents
/// tools, and the conversations (by name) it must refuse.
struct Family {
    file: &'static str,
    bos: &'static str,
    eos: &'static str,
    tools: bool,
    refuses: &'static [&'static str],
}

/// Mistral's templates: roles must alternate after one optional system message, and tool
/// call ids are 9 characters.
const MISTRAL_REFUSES: &[&str] = &[
    "two_users",
    "assistant_first",
    "two_systems",
    "late_system",
    "bad_tool_call_id",
];

const FAMILIES: &[Family] = &[
    Family {
        file: "llama3.1",
        bos: "<|begin_of_text|>",
        eos: "<|eot_id|>",
        tools: true,
        refuses: &["two_tool_calls"],
    },
    Family {
        file: "llama3.2",
        bos: "<|begin_of_text|>",
        eos: "<|eot_id|>",
        tools: true,
        refuses: &["two_tool_calls"],
    },
    Family {
        file: "qwen2.5",
        bos: "",
        eos: "<|im_end|>",
        tools: true,
        refuses: &[],
    },
    Family {
        file: "qwen3",
        bos: "",
        eos: "<|im_end|>",
        tools: true,
        refuses: &[],
    },
    Family {
        file: "mistral-v0.3",
        bos: "<s>",
        eos: "</s>",
        tools: true,
        refuses: MISTRAL_REFUSES,
    },
    Family {
        file: "mistral-nemo",
        bos: "<s>",
        eos: "</s>",
        tools: true,
        refuses: MISTRAL_REFUSES,
    },
    Family {
        file: "mistral-small-3.2",
        bos: "<s>",
        eos: "</s>",
        tools: true,
        refuses: MISTRAL_REFUSES,
    },
    Family {
        file: "gemma2",
        bos: "<bos>",
        eos: "<eos>",
        tools: false,
        // Gemma 2 has no system role at all.
        refuses: &[
            "system_user",
            "system_user_assistant_user",
            "thinking_history",
            "enable_thinking_false",
            "two_users",
            "assistant_first",
            "two_systems",
            "late_system",
        ],
    },
    Family {
        file: "gemma3",
        bos: "<bos>",
        eos: "<eos>",
        tools: false,
        // A system message anywhere but first breaks the alternation.
        refuses: &["two_users", "assistant_first", "two_systems", "late_system"],
    },
    Family {
        file: "phi3",
        bos: "<s>",
        eos: "<|endoftext|>",
        tools: false,
        refuses: &[],
    },
    Family {
        file: "smollm2",
        bos: "<|im_start|>",
        eos: "<|im_end|>",
        tools: false,
        refuses: &[],
    },
    Family {
        file: "features",
        bos: "<s>",
        eos: "</s>",
        tools: true,
        refuses: &["two_systems", "late_system"],
    },
];

/// One conversation to render.
struct Conversation {
    name: &'static str,
    messages: Vec<ChatMessage>,
    tools: Option<Vec<Value>>,
    /// Extra variables (`apply_chat_template(..., **kwargs)`).
    kwargs: Map<String, Value>,
    /// Only for templates that present tools.
    needs_tools: bool,
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

const SYSTEM: &str =
    "You are a careful assistant. Answer in \"plain\" text, <no markup> & no emoji.";

fn tools() -> Vec<Value> {
    vec![
        json!({
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city (°C or °F).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "The city, e.g. Zürich"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer", "minimum": 0, "maximum": 1e20},
                        "precision": {"type": "number", "default": 0.5, "exclusiveMinimum": 1e-7},
                        "_internal": {"type": "boolean", "default": false}
                    },
                    "required": ["city"]
                }
            }
        }),
        json!({
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web for \"exact\" phrases\\with a backslash.\n2nd line.",
                "parameters": {"type": "object", "properties": {}, "required": []}
            }
        }),
    ]
}

fn tool_call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"type": "function", "id": id, "function": {"name": name, "arguments": arguments}})
}

fn assistant_calling(calls: Vec<Value>) -> ChatMessage {
    let mut m = msg("assistant", "");
    m.tool_calls = calls;
    m
}

fn tool_result(id: &str, name: &str, content: &str) -> ChatMessage {
    let mut m = msg("tool", content);
    m.tool_call_id = Some(id.to_owned());
    m.name = Some(name.to_owned());
    m
}

fn conversations() -> Vec<Conversation> {
    let mut all = plain_conversations();
    all.extend(tool_conversations());
    all.extend(unusual_conversations());
    all
}

fn plain(name: &'static str, messages: Vec<ChatMessage>) -> Conversation {
    Conversation {
        name,
        messages,
        tools: None,
        kwargs: Map::new(),
        needs_tools: false,
    }
}

fn with_tools(name: &'static str, messages: Vec<ChatMessage>) -> Conversation {
    Conversation {
        name,
        messages,
        tools: Some(tools()),
        kwargs: Map::new(),
        needs_tools: true,
    }
}

fn weather_call() -> Value {
    tool_call(
        "Ab3dE6gH9",
        "get_weather",
        json!({"city": "Zürich", "unit": "celsius"}),
    )
}

/// Systems, users and assistants in the usual order, thinking on and off.
fn plain_conversations() -> Vec<Conversation> {
    let mut thinking_off = plain(
        "enable_thinking_false",
        vec![msg("system", SYSTEM), msg("user", "Quick: 2+2?")],
    );
    thinking_off
        .kwargs
        .insert("enable_thinking".into(), Value::Bool(false));
    vec![
        plain(
            "system_user",
            vec![msg("system", SYSTEM), msg("user", "  Hello there!\n")],
        ),
        plain(
            "system_user_assistant_user",
            vec![
                msg("system", SYSTEM),
                msg("user", "What is the capital of France?"),
                msg("assistant", " Paris.\n"),
                msg("user", "And of Italy? Answer with 'one' word, \\ please."),
            ],
        ),
        plain(
            "user_only",
            vec![msg(
                "user",
                "Ünïcödé ✓ and an emoji 🦀 in a line\nand a second line",
            )],
        ),
        plain(
            "thinking_history",
            vec![
                msg("system", SYSTEM),
                msg("user", "Think first: 3*3?"),
                msg("assistant", "<think>\nThree threes.\n</think>\n\n9"),
                msg("user", "And 4*4?"),
                msg("assistant", "<think>\nFour fours.\n</think>\n\n16"),
            ],
        ),
        thinking_off,
    ]
}

/// Tool calls and their results, one or two at a time.
fn tool_conversations() -> Vec<Conversation> {
    vec![
        with_tools(
            "tool_call_and_result",
            vec![
                msg("system", SYSTEM),
                msg("user", "What's the weather in Zürich?"),
                assistant_calling(vec![weather_call()]),
                tool_result(
                    "Ab3dE6gH9",
                    "get_weather",
                    "{\"temperature\": 18, \"sky\": \"clear ☀\", \"note\": \"🦀\"}",
                ),
                msg("assistant", "It is 18 °C and clear in Zürich."),
                msg("user", "Thanks! And tomorrow?"),
            ],
        ),
        with_tools(
            "tools_without_system",
            vec![msg("user", "Search for \"rust minijinja\".")],
        ),
        with_tools(
            "two_tool_calls",
            vec![
                msg("user", "Weather in Zürich and Bern?"),
                assistant_calling(vec![
                    weather_call(),
                    tool_call("Xy7kL0pQ2", "get_weather", json!({"city": "Bern"})),
                ]),
                tool_result("Ab3dE6gH9", "get_weather", "18"),
                tool_result("Xy7kL0pQ2", "get_weather", "16"),
            ],
        ),
        with_tools(
            "bad_tool_call_id",
            vec![
                msg("user", "Weather in Bern?"),
                assistant_calling(vec![tool_call(
                    "call_1",
                    "get_weather",
                    json!({"city": "Bern"}),
                )]),
                tool_result("call_1", "get_weather", "16"),
            ],
        ),
    ]
}

/// Orders some templates refuse and others accept: two users in a row, the assistant first,
/// two systems, a late system.
fn unusual_conversations() -> Vec<Conversation> {
    vec![
        plain(
            "two_users",
            vec![
                msg("system", SYSTEM),
                msg("user", "Hello."),
                msg("user", "Hello again."),
            ],
        ),
        plain(
            "assistant_first",
            vec![msg("assistant", "I speak first."), msg("user", "Hi.")],
        ),
        plain(
            "two_systems",
            vec![
                msg("system", SYSTEM),
                msg("system", "Another one."),
                msg("user", "Hi."),
            ],
        ),
        plain(
            "late_system",
            vec![
                msg("user", "Hi."),
                msg("assistant", "Hello."),
                msg("system", "Be brief."),
                msg("user", "Bye."),
            ],
        ),
    ]
}

fn template_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/templates")
        .join(format!("{file}.jinja"))
}

/// The reference renderings of `cases` (a conversation, and whether to add the generation
/// prompt), in one Python process: `Ok(text)`, or `Err(message)` where the template raises.
fn reference(
    source: &str,
    family: &Family,
    cases: &[(&Conversation, bool)],
) -> Vec<Result<String, String>> {
    let python = std::env::var("MODELMUX_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("MODELMUX_TEST_PYTHON is not set: run the tests with ./scripts/test, which makes the virtual environment with jinja2")
    });
    let requests: Vec<Value> = cases
        .iter()
        .map(|(conversation, add_generation_prompt)| {
            json!({
                "template": source,
                "messages": conversation.messages,
                "tools": conversation.tools,
                "add_generation_prompt": add_generation_prompt,
                "bos_token": family.bos,
                "eos_token": family.eos,
                "kwargs": conversation.kwargs,
            })
        })
        .collect();
    let mut child = Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/llm/render_template.py"
        ))
        // strftime_now: ours formats UTC (a server's clock), Python's the local time.
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::from(requests).to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "render_template.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answers: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answers.len(), cases.len(), "one answer per rendering");
    answers
        .iter()
        .zip(cases)
        .map(|(answer, (conversation, _))| reference_answer(answer, family, conversation))
        .collect()
}

/// One answer of `render_template.py`, checked: a template's own refusal is an `Err`.
fn reference_answer(
    answer: &Value,
    family: &Family,
    conversation: &Conversation,
) -> Result<String, String> {
    match (answer.get("text"), answer.get("error")) {
        (Some(Value::String(text)), _) => Ok(text.clone()),
        (_, Some(Value::String(error))) => {
            // Only the template's own refusal is an expected error; anything else (a jinja2
            // syntax error, an undefined variable) is a broken fixture.
            assert_eq!(
                answer["type"], "TemplateError",
                "{}: jinja2 failed on {}: {error}",
                family.file, conversation.name
            );
            Err(error.clone())
        }
        _ => panic!("render_template.py answered {answer}"),
    }
}

fn ours(
    template: &ChatTemplate,
    conversation: &Conversation,
    add_generation_prompt: bool,
) -> Result<String, String> {
    template
        .render_with_kwargs(
            &conversation.messages,
            conversation.tools.as_deref(),
            add_generation_prompt,
            &conversation.kwargs,
        )
        .map_err(|e| e.to_string())
}

/// Renders every conversation the family takes, both ways; returns how many cases agreed,
/// and fails with every disagreement.
fn check(family: &Family) -> usize {
    let source = std::fs::read_to_string(template_path(family.file)).unwrap();
    let template = ChatTemplate::new(&source, family.bos, family.eos)
        .unwrap_or_else(|e| panic!("{}: {e}", family.file));
    assert_eq!(template.presents_tools(), family.tools, "{}", family.file);
    let mut failures = Vec::new();
    let mut passed = 0;
    let conversations = conversations();
    let cases: Vec<(&Conversation, bool)> = conversations
        .iter()
        .filter(|c| family.tools || !c.needs_tools)
        .flat_map(|c| [(c, true), (c, false)])
        .collect();
    // Ours first, then jinja2's: a template with today's date is re-rendered below if
    // midnight passed in between.
    let ours_first: Vec<_> = cases
        .iter()
        .map(|(conversation, add)| ours(&template, conversation, *add))
        .collect();
    let references = reference(&source, family, &cases);
    for ((&(conversation, add_generation_prompt), before), expected) in
        cases.iter().zip(ours_first).zip(references)
    {
        let case = format!(
            "{} / {} / add_generation_prompt={add_generation_prompt}",
            family.file, conversation.name
        );
        let refuses = family.refuses.contains(&conversation.name);
        match (&expected, &before) {
            (Ok(text), Ok(got)) => {
                // A template with today's date may have seen midnight pass between the
                // two renderings: one more of ours then agrees.
                let agrees = text == got
                    || ours(&template, conversation, add_generation_prompt).as_ref() == Ok(text);
                if refuses {
                    failures.push(format!("{case}: jinja2 did not refuse it"));
                } else if agrees {
                    passed += 1;
                } else {
                    failures.push(format!(
                        "{case}: the renderings differ\n--- jinja2:\n{text:?}\n--- ours:\n{got:?}"
                    ));
                }
            }
            (Err(message), Err(error)) => {
                if !refuses {
                    failures.push(format!("{case}: jinja2 refused it: {message}"));
                } else if error.contains(message.as_str()) {
                    passed += 1;
                } else {
                    failures.push(format!(
                        "{case}: our error does not carry the template's message {message:?}: {error}"
                    ));
                }
            }
            (Ok(text), Err(error)) => failures.push(format!(
                "{case}: ours failed: {error}\n--- jinja2:\n{text:?}"
            )),
            (Err(message), Ok(got)) => failures.push(format!(
                "{case}: jinja2 refused it ({message}), ours rendered:\n{got:?}"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        failures.len() + passed,
        failures.join("\n\n")
    );
    println!("{}: {passed} cases agree", family.file);
    passed
}

#[test]
fn every_fixture_template_is_checked() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut checked: Vec<String> = FAMILIES
        .iter()
        .map(|f| format!("{}.jinja", f.file))
        .collect();
    checked.sort();
    assert_eq!(files, checked);
}

macro_rules! family_tests {
    ($($name:ident => $file:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            let family = FAMILIES.iter().find(|f| f.file == $file).unwrap();
            assert!(check(family) > 0);
        }
    )*};
}

family_tests! {
    llama3_1 => "llama3.1",
    llama3_2 => "llama3.2",
    qwen2_5 => "qwen2.5",
    qwen3 => "qwen3",
    mistral_v0_3 => "mistral-v0.3",
    mistral_nemo => "mistral-nemo",
    mistral_small_3_2 => "mistral-small-3.2",
    gemma2 => "gemma2",
    gemma3 => "gemma3",
    phi3 => "phi3",
    smollm2 => "smollm2",
    features => "features",
}
