//! A request's way to the worker and its response's way back: the `REQUEST` head built from
//! the HTTP request, the body sent in frames, and the response rebuilt from the worker's
//! `START` / `BODY` / `END` (streamed when the worker streams).

use std::sync::Arc;

use http_body_util::BodyExt;
use modelmux_cache::{ErrorKind, Failure};
use modelmux_serve::{Body, HandleCall, Request, Response};

use crate::conn::{Conn, Event, RequestStream};
use crate::wire::{self, RequestHead, StartHead};

/// Sends `request` to the worker on `conn`; `root_path` is the application's route prefix
/// (`""` for `/`). `keep` is held until the response has ended (the model guard).
pub(crate) async fn forward(
    conn: &Arc<Conn>,
    request: Request,
    root_path: &str,
    keep: impl Send + 'static,
) -> Result<Response, Failure> {
    let (parts, body) = request.into_parts();
    let model_id = modelmux_context::multiplexed_model_id();
    let request_id = modelmux_context::request_id()
        .map(|id| id.to_string())
        .unwrap_or_default();
    let handle_call = parts.extensions.get::<HandleCall>();
    let call = handle_call.map(|c| c.method.as_str());
    let stream = handle_call.is_some_and(|c| c.stream);
    let headers = parts
        .headers
        .iter()
        // ASGI's header bytes, as latin-1 text (every byte one character).
        .map(|(name, value)| {
            (
                name.as_str(),
                value.as_bytes().iter().map(|&b| b as char).collect(),
            )
        })
        .collect();
    // ASGI's `path` is percent-decoded; `raw_path` keeps the bytes the client sent.
    let path = percent_encoding::percent_decode_str(parts.uri.path()).decode_utf8_lossy();
    let full = body.full_bytes();
    let first_len = full.as_ref().map_or(0, |b| b.len().min(wire::CHUNK));
    let head = RequestHead {
        method: parts.method.as_str(),
        scheme: "http",
        path: &path,
        raw_path: parts.uri.path(),
        query_string: parts.uri.query().unwrap_or(""),
        root_path,
        headers,
        client: None,
        http_version: match parts.version {
            http::Version::HTTP_10 => "1.0",
            http::Version::HTTP_2 => "2",
            _ => "1.1",
        },
        model_id: model_id.as_ref().map(|id| id.as_str()),
        request_id: &request_id,
        call,
        stream,
        more: full.as_ref().is_none_or(|b| b.len() > first_len),
    };
    let first = full.as_ref().map_or(&b""[..], |b| &b[..first_len]);
    let stream = conn
        .open_request(&head, first)
        .map_err(|reason| Failure::new(ErrorKind::Unavailable, reason))?;
    match full {
        Some(bytes) if bytes.len() > first_len => {
            conn.send_body_chunk(stream.id(), &bytes[first_len..]);
            conn.send_body_end(stream.id());
        }
        Some(_) => {}
        None => {
            let (conn, id) = (conn.clone(), stream.id());
            tokio::spawn(async move {
                let mut body = body;
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(frame) => {
                            if let Ok(data) = frame.into_data() {
                                conn.send_body_chunk(id, &data);
                            }
                        }
                        // The worker keeps waiting for the rest until the request ends
                        // (its response is then cancelled).
                        Err(_) => return,
                    }
                }
                conn.send_body_end(id);
            });
        }
    }
    respond(stream, keep).await
}

async fn respond(
    mut stream: RequestStream,
    keep: impl Send + 'static,
) -> Result<Response, Failure> {
    let (start, first) = match stream.next().await {
        Event::Start(start, first) => (start, first),
        Event::Error(e) => return Err(Failure::internal(e.to_string())),
        Event::Gone(reason) => return Err(Failure::new(ErrorKind::Unavailable, reason)),
        Event::Body(_) | Event::End => {
            return Err(Failure::internal(
                "the worker sent a body before its response's start",
            ));
        }
    };
    let more = start.more;
    let mut response = head_of(start)?;
    if !more {
        stream.finish();
        *response.body_mut() = Body::from(first);
        return Ok(response);
    }
    let (sender, body) = Body::channel(16);
    *response.body_mut() = body;
    tokio::spawn(async move {
        let _keep = keep;
        if !first.is_empty() && sender.send(first).await.is_err() {
            return; // the client left: dropping the stream cancels the request
        }
        loop {
            // A reader that leaves while the worker makes nothing (a generator between items)
            // cancels the request now: dropping the stream sends `CANCEL`.
            let event = tokio::select! {
                event = stream.next() => event,
                () = sender.closed() => return,
            };
            match event {
                Event::Body(chunk) => {
                    if sender.send(chunk).await.is_err() {
                        return;
                    }
                }
                Event::End => return,
                Event::Error(e) => return sender.abort(Failure::internal(e.to_string())).await,
                Event::Gone(reason) => return sender.abort(reason).await,
                Event::Start(..) => {
                    return sender.abort("the worker started its response twice").await;
                }
            }
        }
    });
    Ok(response)
}

fn head_of(start: StartHead) -> Result<Response, Failure> {
    let mut builder = http::Response::builder().status(start.status);
    for (name, value) in &start.headers {
        let bytes: Vec<u8> = value.chars().map(|c| c as u32 as u8).collect();
        let value = http::HeaderValue::from_bytes(&bytes).map_err(|e| {
            Failure::internal(format!(
                "the deployment answered with an invalid header value for '{name}': {e}"
            ))
        })?;
        builder = builder.header(name.as_str(), value);
    }
    builder.body(Body::empty()).map_err(|e| {
        Failure::internal(format!(
            "the deployment answered with an invalid status or header: {e}"
        ))
    })
}
