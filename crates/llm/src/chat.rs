//! Chat templates: the Jinja template a GGUF file carries (`tokenizer.chat_template`),
//! rendered with minijinja and its Python-compatibility methods (`.strip()`,
//! `.startswith()`, ...), as Hugging Face's `apply_chat_template` renders it.

use minijinja::value::{Rest, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind as JinjaErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{LlmError, Result};

/// One message of a conversation, with the fields templates that present tools read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message's text.
    pub content: String,
    /// An assistant's tool calls, as Hugging Face templates expect them:
    /// `{"type": "function", "function": {"name": ..., "arguments": {...}}, "id": ...}`
    /// (arguments as an object). Left out of the template's view when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// On a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function that answered (templates such as Llama 3's and
    /// Qwen's ignore it; others print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    presents_tools: bool,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts of the model's special tokens, which
    /// templates may use as `bos_token` / `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // transformers compiles templates with `trim_blocks=True, lstrip_blocks=True`: the
        // newline after a block tag and the indentation before one are not output. Without
        // these, templates written with `{% ... %}` on their own lines (not `{%- ... %}`)
        // render stray newlines and spaces.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, JinjaError> {
                Err(JinjaError::new(JinjaErrorKind::InvalidOperation, message))
            },
        );
        // transformers' `tojson` is Python's `json.dumps` (", " and ": " separators, keys in
        // their order, no HTML escaping), not Jinja's (nor minijinja's) HTML-safe compact one.
        env.add_filter("tojson", py_tojson);
        // transformers' `strftime_now(format)`; Llama 3.2's and Mistral Small 3's templates
        // put today's date in the system prompt with it.
        env.add_function("strftime_now", |format: String| {
            strftime(&format, std::time::SystemTime::now())
        });
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| {
                LlmError::Text(format!("the model's chat template does not compile: {e}"))
            })?;
        Ok(Self {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
            presents_tools: source.contains("tools"),
        })
    }

    /// Whether the template itself presents a `tools` list to the model (Llama 3.1+, Qwen2.5+,
    /// Mistral's and Hermes' templates do; SmolLM2's and Llama 2's do not).
    pub fn presents_tools(&self) -> bool {
        self.presents_tools
    }

    /// Renders `messages`; with `add_generation_prompt`, ends with the header of the
    /// assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders `messages` with `tools` (OpenAI's `tools` list, which Hugging Face templates
    /// read as is) in the template's `tools` variable; `None` makes it `none`, as
    /// `apply_chat_template` does.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_kwargs(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`render_with_tools`](Self::render_with_tools) with extra variables, as
    /// `apply_chat_template(..., **kwargs)` passes them (e.g. Qwen3's `enable_thinking`).
    /// The named variables (`messages`, `tools`, ...) take precedence over `kwargs`.
    pub fn render_with_kwargs(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        if messages.is_empty() {
            return Err(LlmError::InvalidRequest(
                "messages must not be empty".into(),
            ));
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| LlmError::Internal(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => messages,
                // transformers passes `tools=None` and `documents=None` when there are none:
                // defined, and `none` (templates test `tools is defined`, `tools is not none`).
                tools => tools.map_or(Value::from(()), Value::from_serialize),
                documents => (),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
                ..Value::from_serialize(kwargs)
            })
            .map_err(|e| {
                let detail = e.detail().unwrap_or_default().to_owned();
                if e.kind() == JinjaErrorKind::InvalidOperation && !detail.is_empty() {
                    // raise_exception: the template rejected the conversation.
                    LlmError::InvalidRequest(detail)
                } else {
                    LlmError::Text(format!("rendering the chat template failed: {e}"))
                }
            })
    }
}

/// transformers' `tojson` filter, `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, with its arguments by position or by name.
fn py_tojson(value: &Value, args: Rest<Value>) -> std::result::Result<String, JinjaError> {
    let mut args = args.0;
    let kwargs = match args.last() {
        Some(last) if last.is_kwargs() => args.pop(),
        _ => None,
    };
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(JinjaError::new(
            JinjaErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut options: [Option<Value>; 4] = Default::default();
    for (slot, arg) in options.iter_mut().zip(args) {
        *slot = Some(arg);
    }
    if let Some(kwargs) = kwargs {
        for key in kwargs.try_iter()? {
            let name = key.as_str().unwrap_or_default();
            let Some(i) = NAMES.iter().position(|n| *n == name) else {
                return Err(JinjaError::new(
                    JinjaErrorKind::TooManyArguments,
                    format!("tojson got an unexpected keyword argument '{name}'"),
                ));
            };
            options[i] = Some(kwargs.get_item(&key)?);
        }
    }
    let [ensure_ascii, indent, separators, sort_keys] = options.map(|o| o.filter(|v| !v.is_none()));
    // `indent`: a string as is, a number of spaces (`True` is 1), or none for one line.
    let indent = match indent {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) if v.kind() == ValueKind::Bool => Some(" ".repeat(usize::from(v.is_true()))),
        Some(v) => {
            let n = i64::try_from(v).map_err(|_| {
                JinjaError::new(
                    JinjaErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                )
            })?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
    };
    let (item_separator, key_separator) = match separators {
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
        Some(v) => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .filter(|p: &Vec<String>| p.len() == 2)
                .ok_or_else(|| {
                    JinjaError::new(
                        JinjaErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            let [item, key]: [String; 2] = parts.try_into().unwrap_or_default();
            (item, key)
        }
    };
    let mut encoder = PyJson {
        out: String::new(),
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    encoder.value(value, 0)?;
    Ok(encoder.out)
}

/// Python's `json.dumps` encoder (`json.encoder._make_iterencode`) over template values.
struct PyJson {
    out: String,
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&mut self, level: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(indent);
            }
        }
    }

    fn value(&mut self, value: &Value, level: usize) -> std::result::Result<(), JinjaError> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.out.push_str(&py_number(value)),
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(&self.item_separator.clone());
                    }
                    self.newline(level + 1);
                    self.value(item, level + 1)?;
                }
                self.newline(level);
                self.out.push(']');
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((py_json_key(&key)?, item));
                }
                if entries.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(&self.item_separator.clone());
                    }
                    self.newline(level + 1);
                    self.string(key);
                    self.out.push_str(&self.key_separator.clone());
                    self.value(item, level + 1)?;
                }
                self.newline(level);
                self.out.push('}');
            }
            kind => {
                return Err(JinjaError::new(
                    JinjaErrorKind::InvalidOperation,
                    format!("tojson: a value of type {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// A JSON string as Python writes it: `"`, `\` and control characters escaped
    /// (`\n`-style where JSON has one, else `\u00XX`, lowercase), and with `ensure_ascii`
    /// everything outside printable ASCII as `\uXXXX` (surrogate pairs above U+FFFF).
    fn string(&mut self, s: &str) {
        use std::fmt::Write;
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// A map key as `json.dumps` converts it: strings as they are, numbers, booleans and none
/// as their JSON text.
fn py_json_key(key: &Value) -> std::result::Result<String, JinjaError> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => Ok(py_number(key)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        kind => Err(JinjaError::new(
            JinjaErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// A number as Python's `json.dumps` writes it: integers in full, floats as `repr(float)`
/// (shortest round-trip digits; exponent form, `1e+16` / `1e-05`, outside 1e-4 <= |x| < 1e16;
/// `NaN`, `Infinity`).
fn py_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits, e.g. `1.5e-7`.
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let plain = f.to_string();
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

/// `time` (UTC) formatted with the C `strftime` directives Python's `datetime.strftime`
/// passes through: `%Y %y %m %B %b %d %e %j %A %a %H %I %M %S %p %%`, with glibc's `-`
/// flag (`%-d`: no padding). Other directives are output as written. Python formats local
/// time; a server runs in UTC.
fn strftime(format: &str, time: std::time::SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let secs = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let of_day = secs % 86_400;
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[(month - 1) as usize] + day + i64::from(leap && month > 2);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 3).rem_euclid(7) as usize;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let number = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&number(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&number(month, 2)),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('d') => out.push_str(&number(day, 2)),
            Some('e') => out.push_str(&if unpadded {
                day.to_string()
            } else {
                format!("{day:2}")
            }),
            Some('j') => out.push_str(&number(yday, 3)),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&number(hour as i64, 2)),
            Some('I') => out.push_str(&number(hour12 as i64, 2)),
            Some('M') => out.push_str(&number(minute as i64, 2)),
            Some('S') => out.push_str(&number(second as i64, 2)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_a_default_system_prompt() {
        let t = ChatTemplate::new(CHATML, "<s>", "</s>").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}{{ bos_token }}{{ messages[0].content.strip().upper() }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  hi ")], false)
                .unwrap(),
            "<s>HI"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("first message must be from the user"),
            "{err}"
        );
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
