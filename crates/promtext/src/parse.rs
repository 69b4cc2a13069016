//! The text format's grammar: comments (`# HELP`, `# TYPE`, any other `#` line), blank lines,
//! and samples `name{label="value",...} value [timestamp]`.

use crate::{Page, Sample};

/// A line that is not of the text format, and which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Its number, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Reads a page of the text format.
///
/// # Errors
///
/// The first line that is not a comment, a blank or a well-formed sample.
pub fn parse(text: &str) -> Result<Page, ParseError> {
    let mut page = Page::default();
    for (i, line) in text.lines().enumerate() {
        let error = |message: String| ParseError {
            line: i + 1,
            message: format!("{message} in {line:?}"),
        };
        let line = line.trim_start();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            comment_line(&mut page, comment).map_err(error)?;
            continue;
        }
        page.samples.push(sample(line).map_err(error)?);
    }
    Ok(page)
}

/// A `# HELP name text` or `# TYPE name type` is kept; any other comment is not.
fn comment_line(page: &mut Page, comment: &str) -> Result<(), String> {
    let mut words = comment.trim_start().splitn(3, ' ');
    let (Some(keyword), Some(name)) = (words.next(), words.next()) else {
        return Ok(());
    };
    let rest = words.next().unwrap_or("");
    match keyword {
        "HELP" => {
            page.help.insert(name.to_owned(), unescape(rest, false)?);
        }
        "TYPE" => {
            page.types.insert(name.to_owned(), rest.trim().to_owned());
        }
        _ => {}
    }
    Ok(())
}

/// One sample line.
fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        rest = label_set(inside, &mut labels)?;
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = value(fields.next().ok_or("no value")?)?;
    let timestamp = match fields.next() {
        Some(t) => Some(t.parse().map_err(|_| format!("bad timestamp {t:?}"))?),
        None => None,
    };
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected {extra:?} after the value"));
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
        timestamp,
    })
}

/// Reads `key="value",...}` into `labels`; returns what follows the `}`.
fn label_set<'a>(mut s: &'a str, labels: &mut Vec<(String, String)>) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok(after);
        }
        let eq = s.find('=').ok_or("a label without '='")?;
        let key = s[..eq].trim();
        if !is_label_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        let quoted = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("label {key}'s value is not quoted"))?;
        let end = closing_quote(quoted).ok_or_else(|| format!("label {key}'s value is open"))?;
        labels.push((key.to_owned(), unescape(&quoted[..end], true)?));
        s = quoted[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(format!("expected ',' or '}}' after label {key}"));
        }
    }
}

/// The index of the `"` that closes a label value starting at `s` (escapes skipped).
fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, b) in s.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// Undoes `\\` and `\n` (and, in label values, `\"`).
fn unescape(s: &str, label: bool) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if label => out.push('"'),
            // HELP text keeps other backslashes as they are.
            Some(other) if !label => {
                out.push('\\');
                out.push(other);
            }
            other => return Err(format!("bad escape \\{}", other.unwrap_or(' '))),
        }
    }
    Ok(out)
}

/// A sample's value: a float, `+Inf`, `-Inf` or `NaN`.
pub(crate) fn value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().map_err(|_| format!("bad value {s:?}"))
        }
        _ => Err(format!("bad value {s:?}")),
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn is_label_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
