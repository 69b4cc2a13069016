//! The first key of a request body that belongs to the other generation endpoint, found by a
//! scan that builds nothing: the values are skipped (`IgnoredAny`), the keys compared where
//! they lie. (The body used to be parsed into a `Map<String, Value>` for this, about 30 bytes
//! of memory per JSON element, before its real parse.)

use std::fmt;

use modelmux_serve::ServeError;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The first key of the JSON object `body`, in the order written, that is one of `fields`.
/// A body that is not one JSON object is refused as a bad request, as the real parse would.
pub(super) fn first_key_in(
    body: &[u8],
    fields: &'static [&'static str],
) -> Result<Option<&'static str>, ServeError> {
    let bad = |e: serde_json::Error| ServeError::BadRequest {
        message: format!("the body is not a valid JSON request: {e}"),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Keys(fields).deserialize(&mut de).map_err(bad)?;
    de.end().map_err(bad)?;
    Ok(found)
}

/// Seeds both the scan of the object and the reading of each key.
#[derive(Clone, Copy)]
struct Keys(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Keys {
    type Value = Option<&'static str>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Keys {
    type Value = Option<&'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut first = None;
        // The whole body is read: a syntax error after the key is still a bad request.
        while let Some(key) = map.next_key_seed(Key(self.0))? {
            map.next_value::<IgnoredAny>()?;
            first = first.or(key);
        }
        Ok(first)
    }
}

/// One key: which of the fields it is, if any.
struct Key(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<&'static str>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Option<&'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().copied().find(|f| *f == key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: &[&str] = &["prompt", "echo"];

    #[test]
    fn the_first_field_written_is_found_and_bad_json_refused() {
        let found = |body: &str| first_key_in(body.as_bytes(), FIELDS);
        assert_eq!(found(r#"{"model": "m", "messages": []}"#).unwrap(), None);
        assert_eq!(
            found(r#"{"echo": null, "model": {"prompt": 1}, "prompt": "x"}"#).unwrap(),
            Some("echo")
        );
        // Escaped keys are compared as the text they stand for.
        assert_eq!(found(r#"{"pro\u006dpt": [1, 2]}"#).unwrap(), Some("prompt"));
        for bad in [
            r#"{"prompt": "x", "model": }"#,
            r#"{"prompt": "x"} trailing"#,
            r#"["prompt"]"#,
            "",
        ] {
            assert!(
                matches!(found(bad), Err(ServeError::BadRequest { .. })),
                "{bad}: {:?}",
                found(bad).map_err(|e| e.to_string())
            );
        }
    }
}
