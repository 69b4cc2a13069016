//! A request about a response another node of the cluster stored (a turn that continues its
//! conversation, or a `GET`, `DELETE` or `input_items` of it): the response id names its node,
//! and the request goes there, whole and as it came, to that node's ingress (through the
//! router, as any request to another node goes), which answers it from its own store. Only a
//! node that is gone (or cannot be reached) makes it a 404.

use bytes::Bytes;
use modelmux_cache::ErrorKind;
use modelmux_serve::{Body, Response, ServeError};

use crate::ingress::OpenAiIngress;
use crate::responses::{node_of, not_stored};

impl OpenAiIngress {
    /// The node that stored `previous`, when that is another node of the cluster.
    pub(crate) fn stored_elsewhere(&self, previous: Option<&str>) -> Option<String> {
        let here = self.node.as_deref()?;
        let node = node_of(previous?)?;
        (node != here).then_some(node)
    }

    /// Sends the request (`head` and `body`) about response `id` (named by the request's
    /// `param`, or by its path) to this deployment's replicas on `node`.
    pub(crate) async fn on_node(
        &self,
        node: &str,
        id: &str,
        param: Option<&str>,
        head: &http::request::Parts,
        body: Bytes,
    ) -> Result<Response, ServeError> {
        let gone = || not_stored(id, param);
        let Some(own) = &self.own else {
            return Err(gone());
        };
        let mut request = http::Request::builder()
            .method(head.method.clone())
            .uri(head.uri.clone())
            .body(Body::from(body))
            .map_err(|e| ServeError::BadRequest {
                message: e.to_string(),
            })?;
        *request.headers_mut() = head.headers.clone();
        match own.options().on_node(node).call(request).await {
            Err(ServeError::Failed(f)) if f.kind() == ErrorKind::Unavailable => Err(gone()),
            Err(ServeError::Forward(modelmux_serve::ForwardError::NotSent { .. })) => Err(gone()),
            other => other,
        }
    }
}
