//! OpenAI's Responses API over the same models and adapters: `POST /v1/responses` becomes the
//! chat it is (`items.rs`, `request.rs`) and goes down the one engine path; its answer comes
//! back as a response object (`output.rs`) or its events (`events.rs`). Stored responses
//! (`store.rs`) let a later request continue the conversation with `previous_response_id`;
//! `GET` / `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items` read them.
//!
//! A response id names the node that stored it (`resp_<node>.<random>`, the node's id in hex,
//! or `resp_<random>` outside a cluster).

mod elsewhere;
mod events;
mod items;
mod output;
mod request;
mod store;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header;
use modelmux_context::RequestId;
use modelmux_serve::{Body, Response, ServeError, json_response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::call::{LlmCall, Op};
use crate::chat_reply::{ChatEvents, ChatReply};
use crate::ingress::OpenAiIngress;
use crate::params::{Endpoint, invalid};

pub(crate) use request::renamed;
pub(crate) use store::{ResponseStore, StoreLimits};

/// `responses_store`: where and how much the Responses API keeps.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesStoreConfig {
    /// The database file (kept across restarts); none: in memory, gone with the process.
    #[serde(default)]
    pub path: Option<std::path::PathBuf>,
    /// Responses kept at most (oldest evicted first).
    #[serde(default = "default_max_responses")]
    pub max_responses: u64,
    /// Bytes of stored responses kept at most.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// How long a response is kept, in seconds.
    #[serde(default = "default_max_age")]
    pub max_age_s: f64,
}

fn default_max_responses() -> u64 {
    10_000
}
fn default_max_bytes() -> u64 {
    256 << 20
}
fn default_max_age() -> f64 {
    30.0 * 24.0 * 3600.0
}

impl Default for ResponsesStoreConfig {
    fn default() -> Self {
        Self {
            path: None,
            max_responses: default_max_responses(),
            max_bytes: default_max_bytes(),
            max_age_s: default_max_age(),
        }
    }
}

impl ResponsesStoreConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_responses == 0 || self.max_bytes == 0 {
            return Err("responses_store: max_responses and max_bytes must be at least 1".into());
        }
        if !(self.max_age_s > 0.0 && self.max_age_s <= 3.2e8) {
            return Err(
                "responses_store.max_age_s must be a positive number of seconds, at most ten years"
                    .into(),
            );
        }
        Ok(())
    }

    /// The store's bounds.
    pub(crate) fn limits(&self) -> StoreLimits {
        StoreLimits {
            max_responses: self.max_responses,
            max_bytes: self.max_bytes,
            max_age: Duration::from_secs_f64(self.max_age_s),
        }
    }
}

/// The process's store, opened by its first ingress replica (which registers its metrics);
/// the others share it.
pub(crate) fn shared_store(
    slot: &parking_lot::Mutex<Option<Arc<ResponseStore>>>,
    config: &ResponsesStoreConfig,
    ctx: &modelmux_serve::ReplicaContext,
) -> Result<Arc<ResponseStore>, String> {
    let mut slot = slot.lock();
    if let Some(store) = &*slot {
        return Ok(store.clone());
    }
    let store = Arc::new(ResponseStore::open(
        config.path.as_deref(),
        config.limits(),
    )?);
    ctx.register_metrics(store.clone());
    *slot = Some(store.clone());
    Ok(store)
}

/// What one turn stores once its response is done.
pub(crate) struct Turn {
    /// The store, unless the request said `store: false`.
    store: Option<Arc<ResponseStore>>,
    context: Vec<Value>,
    input: Vec<Value>,
}

impl Turn {
    /// Stores the finished `response` (with the conversation it continues).
    pub(crate) async fn keep(self, response: &Value) -> Result<(), ServeError> {
        let Some(store) = self.store else {
            return Ok(());
        };
        let id = response["id"].as_str().unwrap_or_default().to_owned();
        let stored = store::Stored {
            response: response.clone(),
            context: self.context,
            input: self.input,
        };
        store.put(id, stored).await
    }
}

/// A new response id, naming `node`.
fn new_id(node: Option<&str>) -> String {
    let random = RequestId::generate();
    match node {
        Some(node) => format!("resp_{}.{}", hex(node), random.as_str()),
        None => format!("resp_{}", random.as_str()),
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The node a response id names, if any.
pub(crate) fn node_of(id: &str) -> Option<String> {
    let (node, _) = id.strip_prefix("resp_")?.split_once('.')?;
    let bytes: Option<Vec<u8>> = (0..node.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(node.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

pub(crate) fn not_stored(id: &str, param: Option<&str>) -> ServeError {
    let why = match node_of(id) {
        Some(node) => {
            format!("it was stored by node '{node}', which no longer keeps it or cannot be reached")
        }
        None => "it was never stored, was stored with store: false, was deleted, or was evicted"
            .to_owned(),
    };
    let what = match param {
        Some(p) => format!("{p}: no response '{id}' is stored ({why})"),
        None => format!("no response '{id}' is stored ({why})"),
    };
    ServeError::NotFound { what }
}

/// Gives `input` items the ids they lack (`msg_<response>_in<i>`).
fn with_ids(mut input: Vec<Value>, response_id: &str) -> Vec<Value> {
    let suffix = response_id.strip_prefix("resp_").unwrap_or(response_id);
    for (i, item) in input.iter_mut().enumerate() {
        if item.get("id").is_none() {
            let kind = match item["type"].as_str() {
                Some("function_call") => "fc",
                Some("function_call_output") => "fco",
                _ => "msg",
            };
            item["id"] = format!("{kind}_{suffix}_in{i}").into();
        }
    }
    input
}

impl OpenAiIngress {
    /// `POST /v1/responses` (`head` is the request's, for a turn another node stored the
    /// conversation of, which goes there as it came).
    pub(crate) async fn create_response(
        &self,
        head: &http::request::Parts,
        body: Bytes,
    ) -> Result<Response, ServeError> {
        let b = request::parse(&body)?;
        if let Some(node) = self.stored_elsewhere(b.previous_response_id.as_deref()) {
            let previous = b.previous_response_id.as_deref().unwrap_or_default();
            let param = Some("previous_response_id");
            return self.on_node(&node, previous, param, head, body).await;
        }
        let store = self.responses.clone();
        let context = match &b.previous_response_id {
            Some(id) => store
                .get(id.clone())
                .await?
                .ok_or_else(|| not_stored(id, Some("previous_response_id")))?
                .conversation(),
            None => Vec::new(),
        };
        let input = b
            .input
            .clone()
            .map(items::input_items)
            .transpose()?
            .unwrap_or_default();
        if context.len() + input.len() > items::MAX_ITEMS {
            return Err(invalid(
                "input",
                format!(
                    "the conversation would hold {} items: at most {}",
                    context.len() + input.len(),
                    items::MAX_ITEMS
                ),
            ));
        }
        let all: Vec<&Value> = context.iter().chain(&input).collect();
        let messages = items::chat_messages(b.instructions.as_deref(), &all);
        let (job, chat_body) = request::chat_job(&b, messages)?;
        let adapter = self.adapter_for(&b.model)?;
        let shell = output::Shell::new(new_id(self.node.as_deref()), &b);
        let turn = Turn {
            store: (b.store != Some(false)).then_some(store),
            context,
            input: with_ids(input, &shell.id),
        };
        let stream = job.stream;
        let call = LlmCall::Generate(Endpoint::Chat, Box::new(job));
        let answer = self
            .forward(Op::Generate(Endpoint::Chat), chat_body, call, adapter)
            .await?;
        let (mut head, body) = split(answer);
        if stream {
            return Ok(events::streamed(shell, turn, ChatEvents::new(body), head));
        }
        let reply = ChatReply::read(body).await?;
        let output = shell.output(&reply);
        let response = shell.finished(&output, reply.finish, reply.tokens);
        turn.keep(&response).await?;
        *head.body_mut() = Body::json(&response);
        Ok(head)
    }

    /// `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and
    /// `GET /v1/responses/{id}/input_items`.
    pub(crate) async fn stored_response(
        &self,
        op: Op,
        id: &str,
        query: Option<&str>,
    ) -> Result<Response, ServeError> {
        let store = &self.responses;
        match op {
            Op::DeleteResponse => {
                if store.delete(id.to_owned()).await? {
                    Ok(json_response(
                        &json!({"id": id, "object": "response", "deleted": true}),
                    ))
                } else {
                    Err(not_stored(id, None))
                }
            }
            Op::InputItems => {
                let stored = store
                    .get(id.to_owned())
                    .await?
                    .ok_or_else(|| not_stored(id, None))?;
                Ok(json_response(&input_items_page(stored.input, query)?))
            }
            _ => {
                let stored = store
                    .get(id.to_owned())
                    .await?
                    .ok_or_else(|| not_stored(id, None))?;
                Ok(json_response(&stored.response))
            }
        }
    }
}

/// A response's head with its body apart (the head keeps what the dispatch put on it, for
/// the access line).
pub(crate) fn split(answer: Response) -> (Response, Body) {
    let (mut parts, body) = answer.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    (Response::from_parts(parts, Body::empty()), body)
}

/// One page of input items: `order` (`desc`, the default, or `asc`), `limit` (1 to 100,
/// default 20) and `after` (an item id).
fn input_items_page(mut items: Vec<Value>, query: Option<&str>) -> Result<Value, ServeError> {
    let (mut limit, mut after, mut desc) = (20usize, None, true);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        invalid("limit", "limit must be a whole number from 1 to 100")
                    })?;
            }
            "order" => {
                desc = match v {
                    "desc" => true,
                    "asc" => false,
                    _ => return Err(invalid("order", "order must be asc or desc")),
                };
            }
            "after" => after = Some(v.to_owned()),
            // The client's own (`include[]`): nothing more to include here.
            _ => {}
        }
    }
    if desc {
        items.reverse();
    }
    if let Some(after) = after {
        let at = items
            .iter()
            .position(|i| i["id"].as_str() == Some(after.as_str()))
            .ok_or_else(|| invalid("after", format!("after: no item '{after}' in this list")))?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    Ok(json!({
        "object": "list",
        "data": items,
        "first_id": items.first().map(|i| i["id"].clone()),
        "last_id": items.last().map(|i| i["id"].clone()),
        "has_more": has_more,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_id_names_its_node() {
        let id = new_id(Some("node-b"));
        assert_eq!(node_of(&id).as_deref(), Some("node-b"));
        assert!(id.starts_with("resp_"), "{id}");
        assert_eq!(node_of(&new_id(None)), None);
        assert_eq!(node_of("resp_zz.1"), None);
        assert_eq!(node_of("nonsense"), None);
        assert_ne!(new_id(None), new_id(None));
    }

    #[test]
    fn input_items_page_by_order_limit_and_after() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("i{i}")})).collect();
        let ids = |v: &Value| -> Vec<String> {
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_owned())
                .collect()
        };
        let page = input_items_page(items.clone(), None).unwrap();
        assert_eq!(ids(&page), ["i4", "i3", "i2", "i1", "i0"]);
        let page = input_items_page(items.clone(), Some("order=asc&limit=2")).unwrap();
        assert_eq!(ids(&page), ["i0", "i1"]);
        assert_eq!(page["has_more"], true);
        let page = input_items_page(items.clone(), Some("order=asc&after=i1")).unwrap();
        assert_eq!(ids(&page), ["i2", "i3", "i4"]);
        assert!(input_items_page(items, Some("limit=0")).is_err());
    }
}
