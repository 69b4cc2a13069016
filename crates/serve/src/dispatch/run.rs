//! Running a routed request: on a replica of this node (holding its slot, timing it, in the
//! request's trace) or forwarded to another node's replica.

use super::*;

impl DeploymentRouter {
    /// A span of `trace` named `name`, with this deployment's attributes.
    pub(super) fn span(
        &self,
        trace: &modelmux_context::RequestTrace,
        name: &'static str,
    ) -> modelmux_context::Span {
        let mut span = trace.start(name);
        span.attribute("app", self.app.to_string());
        span.attribute("deployment", self.config.name.clone());
        span
    }

    /// Forwards the request to a replica on another node, holding `guard`'s slot; says whether
    /// to try elsewhere (with a copy of the request) when the node could not take it. A handle
    /// call goes as a call of that node's call endpoint, with the token.
    pub(super) async fn forward(
        &self,
        remote: &Arc<RemoteReplica>,
        guard: Ongoing,
        request: Request,
        context: &RequestContext,
        attempt: usize,
        timed: bool,
    ) -> Forwarded {
        // A request that may have to go elsewhere keeps a copy (its body is in memory: the
        // ingress read it whole). The copy is taken before a handle call is rewritten for the
        // wire: should it run here after all, the token must not reach the deployment.
        let spare = (attempt < MAX_ATTEMPTS)
            .then(|| copy_request(&request))
            .flatten();
        let id: Arc<str> = remote.slot.id().into();
        let request = match request.extensions().get::<HandleCall>().cloned() {
            None => with_peer_token(request, self.call_token.get().as_deref()),
            Some(call) => {
                // The router never chooses another node for a handle call without a token:
                // this is the last line, should that ever change.
                let rewritten = match self.call_token.get() {
                    Some(token) => handle_call::for_peer(
                        request,
                        &call,
                        &self.app,
                        self.name(),
                        context,
                        &token,
                    ),
                    None => Err(ServeError::Failed(modelmux_cache::Failure::new(
                        modelmux_cache::ErrorKind::Unavailable,
                        "a handle call may go to another node only with an admin token",
                    ))),
                };
                match rewritten {
                    Ok(request) => request,
                    Err(e) => return Forwarded::Done((Err(e), None)),
                }
            }
        };
        let began = Instant::now();
        match remote.forward(request).await {
            Ok(response) => {
                if timed && response.status().is_success() {
                    remote.slot.observe_service(began.elapsed());
                }
                let hold = Hold::new(guard);
                Forwarded::Done((Ok(hold_until_sent(response, hold)), Some(id)))
            }
            Err(e) => {
                remote.set_unreachable();
                let retry = match e {
                    ForwardError::NotSent { .. } | ForwardError::NotHere { .. } => true,
                    ForwardError::Failed { .. } => self.config.idempotent,
                };
                tracing::warn!(replica = %id, attempt, retry, error = %e, "forwarding failed");
                match spare {
                    Some(spare) if retry => Forwarded::Retry(spare),
                    _ => Forwarded::Done((Err(e.into()), Some(id))),
                }
            }
        }
    }

    /// Runs the request on a replica of this node, holding `guard`'s slot.
    pub(super) async fn run_local(
        &self,
        replica: &Arc<Replica>,
        guard: Ongoing,
        request: Request,
        context: &RequestContext,
        timed: bool,
        start: Instant,
    ) -> (Result<Response, ServeError>, Option<Arc<str>>) {
        // The slot is held by the request and by any blocking work it starts
        // (`modelmux_context::spawn_blocking`), until both are done.
        let hold = Hold::new(guard);
        let began = Instant::now();
        let mut request = request;
        let span = context.trace().map(|t| {
            // The deployment's code (a Python worker's too) sees this process's span as the
            // caller's, to continue the trace in its own spans.
            if let Ok(v) = http::HeaderValue::from_str(&t.traceparent()) {
                request.headers_mut().insert("traceparent", v);
            }
            let mut span = self.span(t, "inference");
            span.attribute("replica", replica.id.to_string());
            span
        });
        let result = replica
            .call(request, context.clone().with_hold(hold.clone()))
            .await;
        if let Some(span) = span {
            span.end(result.is_err());
        }
        // One clock read for both (a read costs tens of nanoseconds on a VM's clock).
        let done = Instant::now();
        if timed {
            replica.slot.observe_service(done - began);
        }
        let status = result
            .as_ref()
            .map_or_else(|e| e.http_status(), |r| r.status());
        replica.metrics.record(status.as_u16(), done - start);
        (
            result.map(|response| hold_until_sent(response, hold)),
            Some(replica.id.clone()),
        )
    }
}

/// The request with the cluster's token in [`PEER_TOKEN_HEADER`](crate::PEER_TOKEN_HEADER),
/// marked sensitive (HPACK never indexes it), when there is one: the peer honours the replica
/// this node chose only then.
fn with_peer_token(mut request: Request, token: Option<&String>) -> Request {
    if let Some(mut value) = token.and_then(|t| http::HeaderValue::from_str(t).ok()) {
        value.set_sensitive(true);
        request
            .headers_mut()
            .insert(crate::PEER_TOKEN_HEADER, value);
    }
    request
}
