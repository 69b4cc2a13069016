//! The cluster's membership as the forwarder knows it: each registered node's address, as its
//! record in etcd names it now. A forwarded request, and with a handle call the cluster's admin
//! token (`Authorization: Bearer`, which runs code on whoever receives it), goes only to the
//! address its node's record names at the moment it is sent: not to one the record named when
//! the request was routed, nor to a node that left.

use std::collections::HashMap;

use http::uri::Authority;
use parking_lot::RwLock;

/// A forwarded request refused before a byte of it was sent: its destination is not the
/// address of a registered node (the node left, or its record names another address now).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{address} is not a registered node's address ({}): the request, and the cluster token a \
     handle call carries, go only to the address a node's record names",
    match .registered { Some(now) => format!("node {} is at {now} now", .node), None => format!("node {} is not a member", .node) }
)]
pub struct NotAMember {
    /// The node the request was for.
    pub node: String,
    /// Where it would have gone.
    pub address: String,
    /// The node's address in the membership now, if it is still a member.
    pub registered: Option<String>,
}

/// Each registered node's address (`host:port`), by node id.
#[derive(Default)]
pub(crate) struct Membership(RwLock<HashMap<String, Authority>>);

impl Membership {
    /// The membership is now `nodes`.
    pub(crate) fn replace(&self, nodes: HashMap<String, Authority>) {
        *self.0.write() = nodes;
    }

    /// `node`'s address, if it is a member.
    pub(crate) fn address(&self, node: &str) -> Option<Authority> {
        self.0.read().get(node).cloned()
    }

    /// Whether a request for `node` may go to `address`: only if it is `node`'s address in the
    /// membership now.
    pub(crate) fn check(&self, node: &str, address: &Authority) -> Result<(), NotAMember> {
        let registered = self.address(node);
        if registered.as_ref() == Some(address) {
            return Ok(());
        }
        Err(NotAMember {
            node: node.to_owned(),
            address: address.to_string(),
            registered: registered.map(|a| a.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authority(s: &str) -> Authority {
        s.parse().unwrap()
    }

    #[test]
    fn only_a_members_own_address_passes() {
        let members = Membership::default();
        let a = authority("10.0.0.1:8000");
        members.replace(HashMap::from([("n1".to_owned(), a.clone())]));
        assert_eq!(members.check("n1", &a), Ok(()));

        // Another address for the same node (its record changed since the request was routed).
        let elsewhere = members
            .check("n1", &authority("203.0.113.9:9000"))
            .unwrap_err();
        assert_eq!(
            elsewhere,
            NotAMember {
                node: "n1".into(),
                address: "203.0.113.9:9000".into(),
                registered: Some("10.0.0.1:8000".into()),
            }
        );
        assert!(
            elsewhere
                .to_string()
                .contains("node n1 is at 10.0.0.1:8000 now")
        );

        // A member's address, but for another node id, does not pass either.
        let borrowed = members.check("n2", &a).unwrap_err();
        assert_eq!(borrowed.registered, None);
        assert!(
            borrowed.to_string().contains("node n2 is not a member"),
            "{borrowed}"
        );

        // A node that left.
        members.replace(HashMap::new());
        assert!(members.check("n1", &a).is_err());
    }
}
