//! `response_format`: OpenAI's structured output, on chat and completion requests.
//!
//! `{"type": "text"}` is free text; `{"type": "json_object"}` any JSON object;
//! `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}` a
//! value valid against `schema`. Both JSON kinds are enforced token by token (see
//! `modelmux-grammar`), whatever `strict` says: OpenAI's non-strict mode only hopes for a
//! match, which is no use to a program that parses the answer.

use modelmux_llm::Constraint;
use modelmux_serve::ServeError;
use serde::Deserialize;
use serde_json::Value;

use crate::params::{check_name, invalid};

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    // Braces, so that unknown fields beside `type` are refused.
    Text {},
    JsonObject {},
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    name: String,
    #[serde(default)]
    schema: Option<Value>,
    #[allow(dead_code)] // every schema is enforced
    #[serde(default)]
    strict: Option<bool>,
    #[allow(dead_code)] // for the model's prompt in OpenAI's API; not shown here
    #[serde(default)]
    description: Option<String>,
}

/// The constraint `response_format` asks for, or `None` for free text.
pub(crate) fn response_format(value: Option<Value>) -> Result<Option<Constraint>, ServeError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let format: ResponseFormat = serde_json::from_value(value).map_err(|e| {
        invalid(
            "response_format",
            format!(
                "response_format: {e} (expected {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {{\"type\": \"json_schema\", \"json_schema\": {{\"name\": ..., \"schema\": {{...}}}}}})"
            ),
        )
    })?;
    match format {
        ResponseFormat::Text {} => Ok(None),
        ResponseFormat::JsonObject {} => Ok(Some(Constraint::JsonObject)),
        ResponseFormat::JsonSchema { json_schema } => {
            check_name("response_format.json_schema.name", &json_schema.name)?;
            match json_schema.schema {
                // No schema: any JSON value.
                None => Ok(Some(Constraint::JsonSchema(Value::Object(
                    Default::default(),
                )))),
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Constraint::JsonSchema(schema)))
                }
                Some(other) => Err(invalid(
                    "response_format.json_schema.schema",
                    format!(
                        "response_format.json_schema.schema must be a JSON schema object, got {other}"
                    ),
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_three_shapes_and_their_errors() {
        assert_eq!(response_format(None).unwrap(), None);
        assert_eq!(
            response_format(Some(json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(
            response_format(Some(json!({"type": "json_object"}))).unwrap(),
            Some(Constraint::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            response_format(Some(json!({"type": "json_schema", "json_schema": {"name": "a_b-1", "schema": schema, "strict": true}}))).unwrap(),
            Some(Constraint::JsonSchema(schema))
        );
        for (bad, param) in [
            (json!({"type": "yaml"}), "response_format"),
            (json!({"type": "json_schema"}), "response_format"),
            (
                json!({"type": "json_object", "extra": 1}),
                "response_format",
            ),
            (json!("json"), "response_format"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
                "response_format.json_schema.schema",
            ),
        ] {
            match response_format(Some(bad.clone())) {
                Err(ServeError::InvalidParameter { param: p, .. }) => assert_eq!(p, param, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
