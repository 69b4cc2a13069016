//! Running a request: its route (a handle call's checked), a slot on a replica (queued for if
//! need be), the run on a replica of this node (holding its slot, timing it, in the request's
//! trace) or forwarded to another node's replica, again elsewhere when that is safe, and the
//! call's log line.

use super::*;

impl DeploymentRouter {
    /// Routes `request` to a replica and runs it there (or forwards it to the node that
    /// has it). Returns the response (or the error) and the replica that served it, if one was
    /// reached. With `record_model`, a response to a call that named a model carries it
    /// ([`ServedModel`](crate::dispatch::ServedModel)) for the access line of the HTTP request
    /// around it; the front's own call does not need that (it knows the header's model).
    pub(crate) async fn run(
        self: &Arc<Self>,
        request: Request,
        context: RequestContext,
        route: Route,
        record_model: bool,
    ) -> Dispatched {
        let start = Instant::now();
        let model = context.multiplexed_model_id().cloned();
        let route = match self.call_route(&request, route) {
            Ok(route) => route,
            Err(e) => return (Err(e), None),
        };
        let (result, replica) = self
            .attempts(request, &context, &route, model.as_ref(), start)
            .await;
        // The access line is the front's, one per HTTP request (it reads the model from
        // here); each call to a deployment, a handle's too, is a debug line.
        let mut result = result;
        record_served_model(&mut result, model.as_ref(), record_model);
        self.log_call(&context, model.as_ref(), &result, replica.as_deref(), start);
        (result, replica)
    }

    /// The route a request takes: a handle call's pickle goes to another node only with the
    /// token that node checks, so without one it stays here (or is refused if nothing runs
    /// here); any other request keeps `route`.
    fn call_route(&self, request: &Request, route: Route) -> Result<Route, ServeError> {
        let is_call = request.extensions().get::<HandleCall>().is_some();
        if !is_call {
            return Ok(route);
        }
        let runs_here = !self.targets.load().local.is_empty();
        let can_forward = self.call_token.is_set();
        handle_call::route_for(route, true, can_forward, runs_here, self.name())
    }

    /// Runs the request on the replica it is routed to, and again on another (routed afresh,
    /// at most [`MAX_ATTEMPTS`] times in all) while an attempt ends where running it again is
    /// safe.
    async fn attempts(
        self: &Arc<Self>,
        request: Request,
        context: &RequestContext,
        route: &Route,
        model: Option<&ModelId>,
        start: Instant,
    ) -> Dispatched {
        let mut request = Some(request);
        let mut attempt = 1;
        loop {
            let (guard, reason) = match self.acquire_traced(model, route, context).await {
                Err(e) => return (Err(e), None),
                Ok(found) => found,
            };
            let Some(this) = request.take() else {
                return (Err(ServeError::ShuttingDown), None);
            };
            tracing::trace!(replica = guard.target.slot().id(), ?reason, "routed");
            // Service time is measured on requests whose model was loaded when they were
            // routed: one that waited for a load would count the load as service.
            let timed = model.is_none_or(|m| guard.target.slot().holds_loaded(m));
            let attempted = match guard.target.clone() {
                Target::Local(replica) => {
                    self.attempt_local(&replica, guard, this, context, attempt, timed, start)
                        .await
                }
                Target::Remote(remote) => {
                    self.attempt_remote(&remote, guard, this, context, attempt, timed)
                        .await
                }
            };
            match attempted {
                Attempted::Done(done) => return done,
                Attempted::Retry(spare) => {
                    request = Some(spare);
                    attempt += 1;
                }
            }
        }
    }

    /// [`acquire`](Self::acquire), the wait a `queue_wait` span of the request's trace.
    async fn acquire_traced(
        self: &Arc<Self>,
        model: Option<&ModelId>,
        route: &Route,
        context: &RequestContext,
    ) -> Result<(Ongoing, Reason), ServeError> {
        let queued = context.trace().map(|t| self.span(t, "queue_wait"));
        let acquired = self.acquire(model, route).await;
        if let Some(span) = queued {
            span.end(acquired.is_err());
        }
        acquired
    }

    /// One attempt on a replica of this node. An idempotent deployment's request keeps a
    /// copy, to run again elsewhere should its replica stop under it.
    #[allow(clippy::too_many_arguments)]
    async fn attempt_local(
        &self,
        replica: &Arc<Replica>,
        guard: Ongoing,
        request: Request,
        context: &RequestContext,
        attempt: usize,
        timed: bool,
        start: Instant,
    ) -> Attempted {
        let spare = (self.config.idempotent && attempt < MAX_ATTEMPTS)
            .then(|| copy_request(&request))
            .flatten();
        let done = self
            .run_local(replica, guard, request, context, timed, start)
            .await;
        match (&done.0, spare) {
            (Err(e), Some(spare)) if replica_stopped(e) => {
                tracing::warn!(replica = %replica.id, attempt, error = %e, "the replica stopped under the request; running it again");
                Attempted::Retry(spare)
            }
            _ => Attempted::Done(done),
        }
    }

    /// One attempt forwarded to another node's replica, a `forward` span of the request's
    /// trace (the other node's spans hang under it).
    async fn attempt_remote(
        &self,
        remote: &Arc<RemoteReplica>,
        guard: Ongoing,
        request: Request,
        context: &RequestContext,
        attempt: usize,
        timed: bool,
    ) -> Attempted {
        // Kept out of line (and off this future's size, which every local request pays for
        // in copies): only cluster mode forwards.
        let mut request = request;
        // The other node's spans hang under this node's root span.
        let span = self.child_span(context, &mut request, "forward", &remote.slot.id());
        let forwarded =
            Box::pin(self.forward(remote, guard, request, context, attempt, timed)).await;
        if let Some(span) = span {
            span.end(matches!(forwarded, Attempted::Done((Err(_), _))));
        }
        forwarded
    }

    /// The call's debug line (`modelmux::dispatch`): deployment, replica, model, status,
    /// milliseconds since `start` and the error's type.
    fn log_call(
        &self,
        context: &RequestContext,
        model: Option<&ModelId>,
        result: &Result<Response, ServeError>,
        replica: Option<&str>,
        start: Instant,
    ) {
        let status = result
            .as_ref()
            .map_or_else(|e| e.http_status(), |r| r.status());
        tracing::debug!(
            target: "modelmux::dispatch",
            request_id = context.request_id().map_or("-", |r| r.as_str()),
            app = %self.app,
            deployment = %self.config.name,
            replica = replica.unwrap_or("-"),
            model_id = model.map_or("-", |m| m.as_str()),
            status = status.as_u16(),
            ms = format_args!("{:.2}", start.elapsed().as_secs_f64() * 1e3),
            error = result.as_ref().err().map(|e| e.error_type()),
        );
    }

    /// A span of `trace` named `name`, with this deployment's attributes.
    /// The span `name` of this call on `replica`, if the request is traced; its
    /// `traceparent` goes on `request`, so whoever handles it continues the trace under it.
    fn child_span(
        &self,
        context: &RequestContext,
        request: &mut Request,
        name: &'static str,
        replica: &dyn std::fmt::Display,
    ) -> Option<modelmux_context::Span> {
        context.trace().map(|t| {
            if let Ok(v) = http::HeaderValue::from_str(&t.traceparent()) {
                request.headers_mut().insert("traceparent", v);
            }
            let mut span = self.span(t, name);
            span.attribute("replica", replica.to_string());
            span
        })
    }

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
    ) -> Attempted {
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
                    Err(e) => return Attempted::Done((Err(e), None)),
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
                Attempted::Done((Ok(hold_until_sent(response, hold)), Some(id)))
            }
            Err(e) => {
                remote.set_unreachable();
                let retry = match e {
                    ForwardError::NotSent { .. } | ForwardError::NotHere { .. } => true,
                    ForwardError::Failed { .. } => self.config.idempotent,
                };
                tracing::warn!(replica = %id, attempt, retry, error = %e, "forwarding failed");
                match spare {
                    Some(spare) if retry => Attempted::Retry(spare),
                    _ => Attempted::Done((Err(e.into()), Some(id))),
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
        // The deployment's code (a Python worker's too) sees this process's span as the
        // caller's, to continue the trace in its own spans.
        let span = self.child_span(context, &mut request, "inference", &replica.id);
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

/// With `record_model`, marks a response to a call that named a model with it
/// ([`ServedModel`](crate::dispatch::ServedModel)) for the access line of the HTTP request around
/// it, unless the response names one already or access lines are off.
fn record_served_model(
    result: &mut Result<Response, ServeError>,
    model: Option<&ModelId>,
    record_model: bool,
) {
    if let (Ok(response), Some(model)) = (result, model)
        && record_model
        && crate::dispatch::access_log_on()
        && response
            .extensions()
            .get::<crate::dispatch::ServedModel>()
            .is_none()
    {
        response
            .extensions_mut()
            .insert(crate::dispatch::ServedModel(model.clone()));
    }
}
