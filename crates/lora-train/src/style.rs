//! The demo adapters' styles, as rewrites of the base model's own answers: the dataset of an
//! adapter is the base model's answer to each prompt, rewritten. What the adapter learns is
//! then the style alone, not new facts a 135M model could not hold.
//!
//! - `pirate`: pirate speech, an opening "Arr, matey!" (or a variant), pirate words for common
//!   ones ("you" → "ye", "is" → "be", "my" → "me", ...), and "Yo ho ho!" at the end.
//! - `brief`: the answer's first sentence only.

use crate::{Error, Result};

/// A style an adapter is trained for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Pirate speech.
    Pirate,
    /// One sentence.
    Brief,
}

impl Style {
    /// The style named `name` (`pirate`, `brief`).
    pub fn named(name: &str) -> Result<Self> {
        match name {
            "pirate" => Ok(Style::Pirate),
            "brief" => Ok(Style::Brief),
            _ => Err(Error::Invalid(format!(
                "unknown style `{name}`; known: pirate, brief"
            ))),
        }
    }

    /// `answer` rewritten in this style; `index` varies the wording from one example to the
    /// next. `None` when the answer has no complete sentence to rewrite.
    pub fn rewrite(self, answer: &str, index: usize) -> Option<String> {
        let sentences = sentences(answer);
        match self {
            Style::Brief => sentences.first().map(|s| s.to_string()),
            Style::Pirate => {
                if sentences.is_empty() {
                    return None;
                }
                const OPENINGS: [&str; 4] =
                    ["Arr, matey!", "Ahoy, matey!", "Arr!", "Shiver me timbers!"];
                let body: Vec<String> = sentences.iter().take(3).map(|s| pirate_words(s)).collect();
                Some(format!(
                    "{} {} Yo ho ho!",
                    OPENINGS[index % OPENINGS.len()],
                    body.join(" ")
                ))
            }
        }
    }
}

/// The complete sentences of `text`, in order, trimmed; a trailing fragment cut off by the
/// token limit is dropped. Markdown emphasis is removed and a list's lines count as
/// sentences of their own.
pub fn sentences(text: &str) -> Vec<String> {
    let text = text.replace("**", "");
    let mut out = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == '\n' {
            push_sentence(&mut out, &mut current, false);
            continue;
        }
        current.push(c);
        let at_end = chars.get(i + 1).is_none_or(|n| n.is_whitespace());
        if matches!(c, '.' | '!' | '?') && at_end && !is_abbreviation(&current) {
            push_sentence(&mut out, &mut current, true);
        }
    }
    out
}

fn push_sentence(out: &mut Vec<String>, current: &mut String, complete: bool) {
    let s = current.trim();
    let ends = s.ends_with(['.', '!', '?']);
    // A list item ("1. Paris") without its own end is not a sentence either.
    let bare_number = s.trim_end_matches('.').chars().all(|c| c.is_ascii_digit());
    if !s.is_empty() && (complete || ends) && !bare_number {
        out.push(s.to_owned());
    }
    current.clear();
}

/// Whether the period just pushed ends an abbreviation or a list number, not a sentence.
fn is_abbreviation(current: &str) -> bool {
    let word = current
        .trim_end_matches('.')
        .rsplit(|c: char| c.is_whitespace())
        .next()
        .unwrap_or("");
    const SHORT: [&str; 8] = ["e.g", "i.e", "etc", "Dr", "Mr", "Mrs", "St", "vs"];
    SHORT.contains(&word)
        || word.chars().all(|c| c.is_ascii_digit())
        || (word.len() == 1 && word.chars().all(|c| c.is_uppercase()))
}

/// Common words swapped for a pirate's, keeping a leading capital.
fn pirate_words(sentence: &str) -> String {
    let mut out = String::with_capacity(sentence.len() + 16);
    let mut word = String::new();
    for c in sentence.chars().chain(std::iter::once(' ')) {
        if c.is_alphabetic() || (c == '\'' && !word.is_empty()) {
            word.push(c);
            continue;
        }
        out.push_str(&swap(&word));
        word.clear();
        out.push(c);
    }
    out.pop();
    out
}

fn swap(word: &str) -> String {
    let lower = word.to_lowercase();
    let pirate = match lower.as_str() {
        "hello" | "hi" => "ahoy",
        "you" => "ye",
        "your" => "yer",
        "yours" => "yers",
        "you're" => "ye be",
        "is" | "are" | "am" => "be",
        "my" => "me",
        "friend" => "matey",
        "friends" => "mateys",
        "yes" => "aye",
        "for" => "fer",
        "of" => "o'",
        "money" => "doubloons",
        "everyone" => "all hands",
        "stop" => "avast",
        _ => return word.to_owned(),
    };
    if word.chars().next().is_some_and(char::is_uppercase) {
        let mut c = pirate.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect())
            .unwrap_or_default()
    } else {
        pirate.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_drop_the_cut_off_tail_and_keep_abbreviations_and_numbers_inside() {
        let s = sentences("Paris is big, e.g. 2.1 million people. It is old! And then the");
        assert_eq!(s, ["Paris is big, e.g. 2.1 million people.", "It is old!"]);
        let s = sentences("Steps:\n1. Boil water.\n2. Add tea.\nDone");
        assert_eq!(s, ["1. Boil water.", "2. Add tea."]);
    }

    #[test]
    fn pirate_swaps_words_keeping_capitals_and_punctuation() {
        let out = Style::Pirate
            .rewrite(
                "You are my friend. Yes, the capital of France is Paris. More",
                0,
            )
            .unwrap();
        assert_eq!(
            out,
            "Arr, matey! Ye be me matey. Aye, the capital o' France be Paris. Yo ho ho!"
        );
    }

    #[test]
    fn brief_keeps_the_first_sentence_and_refuses_nothing_complete() {
        assert_eq!(
            Style::Brief
                .rewrite("Paris. It is the capital.", 3)
                .as_deref(),
            Some("Paris.")
        );
        assert_eq!(Style::Brief.rewrite("a sentence without an end", 0), None);
    }
}
