//! vLLM's dynamic adapter API, as vLLM's clients call it: `POST /v1/load_lora_adapter`
//! `{"lora_name", "lora_path", "load_inplace"}` and `POST /v1/unload_lora_adapter`
//! `{"lora_name"}`, answered as vLLM answers them (200 with a line of text; 400 for a name
//! already loaded or a broken adapter, 404 for one that is not there).
//!
//! - Without `lora_path` (or with the path the name has anyway: the repository's
//!   `<dynamic_lora_loading_path>/<name>`, or the source a source-named adapter is), the adapter
//!   is the repository's (or the source's) and loading it again is harmless.
//! - With another `lora_path`, the name is registered for that path
//!   ([`AdapterNames`]), which must lie below `lora_config.allowed_sources`; requests then name
//!   it as `model: "<name>"` or `"<base>:<name>"`. A name registered already is refused unless
//!   `load_inplace` is set: then the name moves to the new files, the old copies are evicted
//!   (requests running on them finish on them) and new requests load the new ones.
//! - Unloading a registered name unregisters it and evicts it; requests naming it afterwards
//!   get 404.
//!
//! A load is placed by the router like a first request (so it lands where that adapter's
//! traffic will go); an unload evicts from every replica of this node.

use bytes::Bytes;
use http::header;
use modelmux_cache::ModelId;
use modelmux_llm::AllowedSources;
use modelmux_serve::{Body, Request, Response, ServeError};

use crate::call::{LlmCall, Op};
use crate::errors::serve_error;
use crate::ingress::OpenAiIngress;
use crate::params::invalid;

/// How long a load's or unload's answer waits for `/v1/models` to list what it did.
const LISTED_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The header a load's answer names the replica it loaded on in.
pub(crate) const LOADED_ON_HEADER: &str = "x-modelmux-loaded-on";

/// `POST /v1/load_lora_adapter`'s body.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadAdapter {
    lora_name: String,
    lora_path: Option<String>,
    #[serde(default)]
    load_inplace: bool,
}

/// `POST /v1/unload_lora_adapter`'s body (`lora_int_id` is vLLM's engine-internal id: taken
/// and ignored, the name says which).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UnloadAdapter {
    lora_name: String,
    #[allow(dead_code)]
    lora_int_id: Option<i64>,
}

/// A control's body (or the replica's answer to one): 64 KiB at most.
async fn small_body(body: Body) -> Result<Bytes, ServeError> {
    body.to_bytes(1 << 16)
        .await
        .map_err(|e| ServeError::BadRequest {
            message: e.to_string(),
        })
}

/// A 200 answer of one line of text, as vLLM's.
fn text(message: String) -> Response {
    let mut response = Response::new(Body::from(message));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl OpenAiIngress {
    /// `/v1/load_lora_adapter` (`load`) or `/v1/unload_lora_adapter`.
    pub(crate) async fn adapter_control(
        &self,
        request: Request,
        load: bool,
    ) -> Result<Response, ServeError> {
        self.admin.authorize(request.headers(), true)?;
        let body = small_body(request.into_body()).await?;
        if load {
            self.load_adapter(crate::params::parse_body(&body)?).await
        } else {
            self.unload_adapter(crate::params::parse_body(&body)?).await
        }
    }

    /// The adapter id `lora_name` names: its name less the base model's prefix.
    fn control_id(&self, lora_name: &str) -> Result<ModelId, ServeError> {
        if self.adapters.is_none() {
            return Err(invalid(
                "lora_name",
                format!(
                    "this server serves '{}' without adapters (no lora_config)",
                    self.base
                ),
            ));
        }
        let name = lora_name
            .strip_prefix(&format!("{}:", self.base))
            .unwrap_or(lora_name);
        if name.is_empty() || name == self.base {
            return Err(invalid(
                "lora_name",
                "the base model cannot be loaded or unloaded",
            ));
        }
        let id = ModelId::new(name).map_err(|e| {
            invalid(
                "lora_name",
                format!("'{lora_name}' cannot name an adapter: {e}"),
            )
        })?;
        if AllowedSources::is_source(name) {
            self.sources.check(name).map_err(|e| serve_error(&e))?;
        } else {
            id.as_relative_path().map_err(|e| {
                invalid(
                    "lora_name",
                    format!("'{lora_name}' cannot name an adapter: {e}"),
                )
            })?;
        }
        Ok(id)
    }

    async fn load_adapter(&self, control: LoadAdapter) -> Result<Response, ServeError> {
        let id = self.control_id(&control.lora_name)?;
        let path = control
            .lora_path
            .as_deref()
            .map(|p| p.trim_end_matches('/'))
            .filter(|p| !p.is_empty());
        // The path the name has anyway: the source itself, or the repository's directory.
        let own = if AllowedSources::is_source(id.as_str()) {
            id.to_string()
        } else {
            let repository = self.adapters.as_ref().map(|r| r.url()).unwrap_or_default();
            format!("{}/{id}", repository.trim_end_matches('/'))
        };
        let registered = self.names.get(id.as_str());
        let Some(path) = path.filter(|p| *p != own || registered.is_some()) else {
            let replica = self.load_on_a_replica(&id).await?;
            return Ok(self.loaded(&id, &replica));
        };
        if AllowedSources::is_source(id.as_str()) {
            return Err(invalid(
                "lora_path",
                format!("'{id}' names its source already: lora_path must be absent or '{own}'"),
            ));
        }
        if registered.is_some() && !control.load_inplace {
            return Err(invalid(
                "lora_name",
                format!(
                    "adapter '{id}' is loaded already (from '{}'): unload it first, or set load_inplace to replace it",
                    registered.unwrap_or_default()
                ),
            ));
        }
        // Checked before the name changes hands: nothing is registered for a refused path.
        self.sources.check(path).map_err(|e| serve_error(&e))?;
        let previous = self
            .names
            .insert(id.as_str(), path)
            .map_err(|e| invalid("lora_name", e.to_string()))?;
        // The old files' copies go (a request running on one finishes on it); every request
        // from now on loads the new files.
        self.llm.evict_model(id.as_str());
        match self.load_on_a_replica(&id).await {
            Ok(replica) => {
                tracing::info!(adapter = %id, path, ?previous, "adapter registered");
                Ok(self.loaded(&id, &replica))
            }
            Err(e) => {
                // A load that failed leaves the name as it was.
                match &previous {
                    Some(old) => {
                        let _ = self.names.insert(id.as_str(), old);
                    }
                    None => {
                        self.names.remove(id.as_str());
                    }
                }
                Err(e)
            }
        }
    }

    /// Loads adapter `id` where the router places it; the replica it loaded on. An adapter
    /// that cannot be used (a broken `adapter_config.json` or weights, made for another base
    /// model) is a 400 here, as vLLM answers a failed load, not the 422 a request naming it
    /// gets.
    async fn load_on_a_replica(&self, id: &ModelId) -> Result<String, ServeError> {
        let response = self
            .forward(
                Op::LoadAdapter,
                Bytes::new(),
                LlmCall::LoadAdapter,
                Some(id.clone()),
            )
            .await
            .map_err(|e| {
                if e.http_status() == http::StatusCode::UNPROCESSABLE_ENTITY {
                    ServeError::BadRequest {
                        message: e.to_string(),
                    }
                } else {
                    e
                }
            })?;
        let body = small_body(response.into_body()).await?;
        let answer: serde_json::Value =
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        let replica = answer["replica"].as_str().unwrap_or_default().to_owned();
        if !replica.is_empty() {
            self.until_listed(id, Some(&replica)).await;
        }
        Ok(replica)
    }

    /// Waits until the router's view (what `/v1/models` lists) says `id` is loaded on
    /// `replica` (or, for `None`, on no replica), at most [`LISTED_WITHIN`]. The cache has
    /// done the load or the eviction already; its event reaches the router's view on another
    /// task, a moment later, and a client that reads `/v1/models` after the answer must see
    /// what the answer said (vLLM's listing is updated before it answers). A replica this
    /// node does not run (the load went to another node) is not waited for.
    async fn until_listed(&self, id: &ModelId, replica: Option<&str>) {
        if replica.is_some_and(|r| !self.llm.held_models().iter().any(|(id, _)| id == r)) {
            return;
        }
        let listed = || {
            let held = self.llm.held_models();
            let mut loaded_on = (held.iter())
                .filter(|(_, models)| {
                    (models.iter()).any(|(m, h)| m == id && *h == modelmux_serve::Holding::Loaded)
                })
                .map(|(r, _)| r.as_str());
            match replica {
                Some(replica) => loaded_on.any(|r| r == replica),
                None => loaded_on.next().is_none(),
            }
        };
        let deadline = tokio::time::Instant::now() + LISTED_WITHIN;
        while !listed() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    fn loaded(&self, id: &ModelId, replica: &str) -> Response {
        let mut response = text(format!(
            "Success: adapter '{id}' loaded successfully on replica {replica}."
        ));
        if let Ok(value) = http::HeaderValue::from_str(replica) {
            response.headers_mut().insert(LOADED_ON_HEADER, value);
        }
        response
    }

    async fn unload_adapter(&self, control: UnloadAdapter) -> Result<Response, ServeError> {
        let id = self.control_id(&control.lora_name)?;
        let registered = self.names.remove(id.as_str());
        let evicted = self.llm.evict_model(id.as_str());
        if registered.is_none() && evicted.is_empty() {
            return Err(ServeError::NotFound {
                what: format!("adapter '{id}' is not loaded on any replica"),
            });
        }
        self.until_listed(&id, None).await;
        Ok(text(format!(
            "Success: adapter '{id}' unloaded successfully from {} replica(s).",
            evicted.len()
        )))
    }
}
