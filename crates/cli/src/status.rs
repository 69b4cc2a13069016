//! `modelmux status`: reads a running server's `/-/models` and prints a table.

use serde_json::Value;

use crate::CliError;
use crate::bench::http_get;

/// Prints the table of what each replica of the server at `url` holds.
pub async fn run(url: &str, token: Option<&str>) -> Result<(), CliError> {
    let (status, body) = http_get(url, "/-/models", token).await?;
    if status != 200 {
        return Err(format!(
            "{url}/-/models answered {status}: {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    let models: Value = serde_json::from_slice(&body)?;
    crate::say(format_args!("{}", render(&models)));
    Ok(())
}

fn render(models: &Value) -> String {
    let mut out = format!(
        "{:<12} {:<16} {:<20} {:>7} {:>8}  {}\n",
        "APP",
        "DEPLOYMENT",
        "REPLICA",
        "ONGOING",
        "QUEUED",
        "MODELS (id size_mb in_use idle_s [pinned]; loading: ids)"
    );
    let empty = Vec::new();
    let list = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    for app in list(&models["applications"]) {
        for dep in list(&app["deployments"]) {
            for rep in list(&dep["replicas"]) {
                let loaded: Vec<String> = list(&rep["loaded"])
                    .iter()
                    .map(|m| {
                        let mb = m["size_bytes"]
                            .as_f64()
                            .map_or("?".into(), |b| format!("{:.1}", b / 1048576.0));
                        let pinned = if m["pinned"].as_bool() == Some(true) {
                            " pinned"
                        } else {
                            ""
                        };
                        format!(
                            "{} {mb} {} {:.0}{pinned}",
                            m["id"].as_str().unwrap_or("?"),
                            m["in_use"],
                            m["idle_seconds"].as_f64().unwrap_or(0.0)
                        )
                    })
                    .collect();
                let loading: Vec<String> = list(&rep["loading"])
                    .iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect();
                let mut models = loaded.join(", ");
                if !loading.is_empty() {
                    models.push_str(&format!("; loading: {}", loading.join(", ")));
                }
                out.push_str(&format!(
                    "{:<12} {:<16} {:<20} {:>7} {:>8}  {}\n",
                    app["name"].as_str().unwrap_or("?"),
                    dep["name"].as_str().unwrap_or("?"),
                    rep["id"].as_str().unwrap_or("?"),
                    rep["ongoing_requests"].as_u64().unwrap_or(0),
                    dep["queued_requests"].as_u64().unwrap_or(0),
                    if models.is_empty() {
                        "-".to_string()
                    } else {
                        models
                    }
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_per_replica_with_its_models() {
        let v = serde_json::json!({"applications": [{"name": "default", "deployments": [{"name": "Model", "queued_requests": 0,
            "replicas": [{"id": "Model#abc", "ongoing_requests": 1, "loaded": [{"id": "7", "size_bytes": 16777216, "in_use": 1, "pinned": true, "idle_seconds": 0.0}], "loading": ["8"]}]}]}]});
        let table = render(&v);
        assert!(table.contains("Model#abc"), "{table}");
        assert!(table.contains("7 16.0 1 0 pinned; loading: 8"), "{table}");
    }
}
