//! Model ids: validated once at the edge, then cheap to clone and hash.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The longest model id accepted, in bytes.
///
/// Long enough for LoRA ids such as `meta-llama/Llama-3.1-8B-Instruct:customer-42:v3`,
/// short enough that an id can never be used to make a replica allocate without bound.
pub const MAX_MODEL_ID_LEN: usize = 256;

/// A validated model id: non-empty, at most [`MAX_MODEL_ID_LEN`] bytes, and none of the
/// characters a terminal, a log viewer or a browser would act on rather than show
/// ([`is_unsafe_in_text`]: controls, line and paragraph separators, bidirectional formatting).
///
/// Cloning is an atomic increment (the text is shared), so ids can be passed around freely.
///
/// ```
/// use modelmux_types::ModelId;
///
/// let id = ModelId::new("customer-42").unwrap();
/// assert_eq!(id.as_str(), "customer-42");
/// assert!(ModelId::new("").is_err());
/// assert!(ModelId::new("bad\nid").is_err());
/// assert!(ModelId::new("evil\u{202E}txt.onnx").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(Arc<str>);

/// Why a string is not a valid [`ModelId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidModelId {
    /// The id is the empty string.
    #[error("model id is empty")]
    Empty,
    /// The id is longer than [`MAX_MODEL_ID_LEN`].
    #[error("model id is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Length of the rejected id in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The id contains a character [`is_unsafe_in_text`] refuses: a control character
    /// (newline, NUL, escape, U+009B, ...), a line or paragraph separator, or a bidirectional
    /// formatting character (U+202E, ...).
    #[error(
        "model id contains a control character (U+{code:04X}: a C0 or C1 control, a line or \
         paragraph separator, or a bidirectional control) at byte {index}"
    )]
    ControlCharacter {
        /// Byte offset of the character.
        index: usize,
        /// Its code point.
        code: u32,
    },
    /// The id cannot be used as a relative path inside a model repository.
    #[error("model id '{id}' cannot be used as a path inside a model repository: {reason}")]
    NotAPath {
        /// The rejected id.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl ModelId {
    /// Validates `id` and wraps it.
    pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidModelId> {
        let id = id.as_ref();
        validate(id)?;
        Ok(Self(Arc::from(id)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Checks that the id is safe to use as a relative path below a model repository, and
    /// returns it.
    ///
    /// Ids may contain `/` (LoRA ids often look like `org/model:adapter`), but no segment may
    /// be empty, `.` or `..`, and backslashes and a leading `/` are refused, so
    /// `<repository>/<id>` can never address anything outside the repository.
    ///
    /// ```
    /// use modelmux_types::ModelId;
    ///
    /// assert!(ModelId::new("org/adapter-1").unwrap().as_relative_path().is_ok());
    /// assert!(ModelId::new("../etc").unwrap().as_relative_path().is_err());
    /// ```
    pub fn as_relative_path(&self) -> Result<&str, InvalidModelId> {
        let reason = if self.0.contains('\\') {
            Some("it contains a backslash")
        } else if self.0.starts_with('/') {
            Some("it starts with '/'")
        } else if self.0.split('/').any(|s| s.is_empty()) {
            Some("it has an empty path segment")
        } else if self.0.split('/').any(|s| s == "." || s == "..") {
            Some("it has a '.' or '..' path segment")
        } else {
            None
        };
        match reason {
            None => Ok(&self.0),
            Some(reason) => Err(InvalidModelId::NotAPath {
                id: self.0.to_string(),
                reason,
            }),
        }
    }
}

fn validate(id: &str) -> Result<(), InvalidModelId> {
    if id.is_empty() {
        return Err(InvalidModelId::Empty);
    }
    if id.len() > MAX_MODEL_ID_LEN {
        return Err(InvalidModelId::TooLong {
            len: id.len(),
            max: MAX_MODEL_ID_LEN,
        });
    }
    if let Some((index, c)) = id.char_indices().find(|&(_, c)| is_unsafe_in_text(c)) {
        return Err(InvalidModelId::ControlCharacter {
            index,
            code: c as u32,
        });
    }
    Ok(())
}

/// Whether `c` is a character a terminal, a log viewer or a browser acts on rather than shows,
/// so that text holding it raw can forge or hide what a reader sees: the C0 and C1 controls
/// and DEL (escape sequences, U+009B's 8-bit CSI, U+0085's next line), the line and paragraph
/// separators U+2028 and U+2029 (line breaks to JavaScript and many viewers), and the
/// bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A-U+202E,
/// U+2066-U+2069), which reorder what follows them. Model ids refuse them and the access log
/// escapes them.
///
/// ```
/// use modelmux_types::is_unsafe_in_text;
///
/// assert!(is_unsafe_in_text('\u{9b}') && is_unsafe_in_text('\u{202e}'));
/// assert!(!is_unsafe_in_text('ü') && !is_unsafe_in_text(' '));
/// ```
pub fn is_unsafe_in_text(c: char) -> bool {
    matches!(
        c,
        '\0'..='\x1f'
            | '\x7f'..='\u{9f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

impl Deref for ModelId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ModelId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ModelId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TryFrom<&str> for ModelId {
    type Error = InvalidModelId;
    fn try_from(id: &str) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

impl TryFrom<String> for ModelId {
    type Error = InvalidModelId;
    fn try_from(id: String) -> Result<Self, Self::Error> {
        validate(&id)?;
        Ok(Self(Arc::from(id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_ids() {
        for id in [
            "1",
            "customer-42",
            "base:org/adapter:v3",
            "ünïcode",
            " padded ",
        ] {
            assert_eq!(ModelId::new(id).unwrap().as_str(), id);
        }
        let longest = "x".repeat(MAX_MODEL_ID_LEN);
        assert!(ModelId::new(&longest).is_ok());
    }

    #[test]
    fn rejects_bad_ids_with_a_reason() {
        assert_eq!(ModelId::new(""), Err(InvalidModelId::Empty));
        assert_eq!(
            ModelId::new("x".repeat(MAX_MODEL_ID_LEN + 1)),
            Err(InvalidModelId::TooLong {
                len: MAX_MODEL_ID_LEN + 1,
                max: MAX_MODEL_ID_LEN
            })
        );
        assert_eq!(
            ModelId::new("a\u{0}b"),
            Err(InvalidModelId::ControlCharacter { index: 1, code: 0 })
        );
        let err = ModelId::try_from("line\nbreak".to_string()).unwrap_err();
        assert!(err.to_string().contains("U+000A"), "{err}");
    }

    #[test]
    fn rejects_c1_controls_separators_and_bidi_overrides_naming_the_char() {
        let refused = [
            '\u{7f}', '\u{80}', '\u{85}', '\u{9b}', '\u{9f}', '\u{2028}', '\u{2029}', '\u{61c}',
            '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
            '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ];
        for c in refused {
            let id = format!("ab{c}cd");
            let err = ModelId::new(&id).unwrap_err();
            assert_eq!(
                err,
                InvalidModelId::ControlCharacter {
                    index: 2,
                    code: c as u32
                },
                "U+{:04X}",
                c as u32
            );
            assert!(
                err.to_string().contains(&format!("U+{:04X}", c as u32)),
                "{err}"
            );
            assert!(ModelId::try_from(id).is_err());
        }
        // Their neighbours, and other text, stay ids.
        for ok in [
            "\u{a0}x",
            "x\u{2027}",
            "\u{202f}",
            "\u{2065}\u{206a}",
            "\u{200d}",
            "日本語",
        ] {
            assert!(ModelId::new(ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn relative_paths_cannot_escape() {
        for ok in ["1", "org/model", "a.b/c..d"] {
            assert!(ModelId::new(ok).unwrap().as_relative_path().is_ok(), "{ok}");
        }
        for bad in ["..", "../x", "a/../b", "/abs", "a//b", "a/", "./a", "a\\b"] {
            let err = ModelId::new(bad).unwrap().as_relative_path().unwrap_err();
            assert!(matches!(err, InvalidModelId::NotAPath { .. }), "{bad}");
        }
    }
}
