//! `modelmux status`: reads a running server's `/-/models` and prints a table.

use serde_json::Value;

use crate::CliError;
use crate::admin_client::{self, AdminToken, Answer};

/// Prints the table of what each replica of the server at `url` holds.
pub async fn run(url: &str, token: Option<&AdminToken>) -> Result<(), CliError> {
    let Answer { status, body } =
        admin_client::call(url, http::Method::GET, "/-/models", token, None).await?;
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
        "{:<12} {:<16} {:<24} {:<10} {:<5} {:>7} {:>8}  {}\n",
        "APP",
        "DEPLOYMENT",
        "REPLICA",
        "NODE",
        "UP",
        "ONGOING",
        "QUEUED",
        "MODELS (id size_mb in_use idle_s [pinned]; another node's: id; loading: ids)"
    );
    let empty = Vec::new();
    let list = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    for app in list(&models["applications"]) {
        for dep in list(&app["deployments"]) {
            for rep in list(&dep["replicas"]) {
                let loaded: Vec<String> = list(&rep["loaded"])
                    .iter()
                    .map(|m| {
                        // Another node's replica: only what its records say (the id).
                        if m.get("size_bytes").is_none() {
                            return m["id"].as_str().unwrap_or("?").to_owned();
                        }
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
                let mut models = loaded.join(", ");
                for what in ["loading", "queued"] {
                    let ids: Vec<String> = list(&rep[what])
                        .iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect();
                    if !ids.is_empty() {
                        models.push_str(&format!("; {what}: {}", ids.join(", ")));
                    }
                }
                let up = match rep["available"].as_bool() {
                    Some(false) => "no",
                    _ => "yes",
                };
                out.push_str(&format!(
                    "{:<12} {:<16} {:<24} {:<10} {:<5} {:>7} {:>8}  {}\n",
                    app["name"].as_str().unwrap_or("?"),
                    dep["name"].as_str().unwrap_or("?"),
                    rep["id"].as_str().unwrap_or("?"),
                    rep["node"].as_str().unwrap_or("-"),
                    up,
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

/// `modelmux deploy`: sends the configuration at `path` to the server at `url` and prints
/// what changed per deployment.
pub async fn deploy(
    url: &str,
    token: Option<&AdminToken>,
    path: &std::path::Path,
) -> Result<(), CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let body = serde_json::json!({ "config": text });
    let post = http::Method::POST;
    let Answer {
        status,
        body: answer,
    } = admin_client::call(url, post, "/-/deploy", token, Some(&body)).await?;
    let answer: Value = serde_json::from_slice(&answer).map_err(|_| {
        format!(
            "{url}/-/deploy answered {status}: {}",
            String::from_utf8_lossy(&answer)
        )
    })?;
    if status != 200 {
        let message = answer["error"]["message"]
            .as_str()
            .map_or_else(|| answer.to_string(), str::to_owned);
        return Err(format!("{url} refused {}: {message}", path.display()).into());
    }
    for d in answer["deployments"].as_array().into_iter().flatten() {
        println!(
            "{}/{}: {}",
            d["application"].as_str().unwrap_or_default(),
            d["deployment"].as_str().unwrap_or_default(),
            d["change"].as_str().unwrap_or_default()
        );
    }
    println!(
        "applied in {:.1} ms",
        answer["took_ms"].as_f64().unwrap_or_default()
    );
    Ok(())
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

    #[test]
    fn another_nodes_replicas_show_their_node_and_whether_they_are_up() {
        let v = serde_json::json!({"applications": [{"name": "default", "deployments": [{"name": "Model", "queued_requests": 0,
            "replicas": [{"id": "Model#abc@n2", "node": "n2", "remote": true, "available": false, "ongoing_requests": 0, "loaded": [{"id": "7"}], "loading": []}]}]}]});
        let table = render(&v);
        let row = table.lines().nth(1).unwrap();
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields[2..5], ["Model#abc@n2", "n2", "no"], "{table}");
        assert!(row.ends_with(" 7"), "{table}");
    }
}
