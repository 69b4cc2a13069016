//! Parse errors as a person reads them: serde's messages speak Rust ("expected a nonzero
//! usize") and name no line for a misspelt top-level key; this rewrites the types into words,
//! finds the key's line, and suggests the field that was meant.

/// The message for a YAML parse error of `text`.
pub(super) fn parse_error(text: &str, error: &serde_yaml_ng::Error) -> String {
    let mut message = plain_words(&error.to_string());
    if let Some((unknown, expected)) = unknown_field(&message) {
        if error.location().is_none()
            && let Some(line) = key_line(text, &unknown)
        {
            message = format!("{message} at line {line}");
        }
        if let Some(meant) = closest(&unknown, &expected) {
            message = format!("{message} (did you mean `{meant}`?)");
        }
    }
    message
}

/// Rust's type names in serde's "expected ..." replaced by what they mean to a person.
fn plain_words(message: &str) -> String {
    const WORDS: [(&str, &str); 11] = [
        ("a nonzero usize", "a whole number of at least 1"),
        ("a nonzero u64", "a whole number of at least 1"),
        ("a nonzero u32", "a whole number of at least 1"),
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
    ];
    let mut out = message.to_string();
    for (rust, words) in WORDS {
        out = out.replace(rust, words);
    }
    out.replace("invalid type: ", "")
        .replace("invalid value: ", "")
}

/// `unknown field `x`, expected one of `a`, `b`` (or `expected `a``) as the field and the
/// names serde expected.
fn unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.split("unknown field `").nth(1)?;
    let (field, rest) = rest.split_once('`')?;
    let expected = rest
        .split_once("expected")
        .map(|(_, names)| names)
        .unwrap_or_default()
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((field.to_string(), expected))
}

/// The first line (1-based) where `key` is a mapping key.
fn key_line(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start().trim_start_matches("- ");
            line.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// The expected name nearest to `unknown`, if one is near enough to be a typo.
fn closest<'a>(unknown: &str, expected: &'a [String]) -> Option<&'a str> {
    expected
        .iter()
        .map(|name| (strsim::damerau_levenshtein(unknown, name), name))
        .filter(|(distance, name)| *distance <= (name.len() / 3).max(2))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_key_gets_a_line_and_a_suggestion() {
        let text = "http_options: {port: 0}\napplicatons: []\n";
        let error = serde_yaml_ng::from_str::<super::super::Config>(text).unwrap_err();
        let message = parse_error(text, &error);
        assert!(message.contains("unknown field `applicatons`"), "{message}");
        assert!(message.contains("line 2"), "{message}");
        assert!(
            message.contains("did you mean `applications`?"),
            "{message}"
        );
    }

    #[test]
    fn a_key_far_from_every_field_gets_no_suggestion() {
        let expected = vec!["http_options".to_string(), "logging".to_string()];
        assert_eq!(closest("zzz", &expected), None);
        assert_eq!(closest("loging", &expected), Some("logging"));
    }

    #[test]
    fn rust_type_names_become_words() {
        assert_eq!(
            plain_words("invalid type: integer `-3`, expected a nonzero usize"),
            "integer `-3`, expected a whole number of at least 1"
        );
        assert_eq!(
            plain_words("invalid value: integer `70000`, expected u16"),
            "integer `70000`, expected a whole number from 0 to 65535"
        );
    }
}
