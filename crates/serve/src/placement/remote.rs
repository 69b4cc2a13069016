//! Feeding a [`ReplicaLedger`] from another node's published state instead of local cache
//! events (cluster mode).

use std::time::Duration;

use tokio::time::Instant;

use modelmux_cache::ModelId;

use super::model_set::{Entry, ROUTER};
use super::{Holding, ReplicaLedger};

/// One model copy a remote replica reports: whether it is loaded (else loading), its size and
/// how long its load took, when known.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyReport {
    /// The model.
    pub id: ModelId,
    /// Loaded (servable now); otherwise loading.
    pub loaded: bool,
    /// Its size in bytes, once loaded, if it reports one.
    pub size_bytes: Option<u64>,
    /// How long its load took, once loaded.
    pub load_time: Option<Duration>,
}

/// The source remote reports are recorded under (a remote replica has no local caches).
const REMOTE: usize = 0;

impl ReplicaLedger {
    /// Replaces what the replica holds with `copies`, as its node last published them. This
    /// router's own pending placements stay (until a report confirms them or they expire), and
    /// a model still reported keeps when it was last routed here.
    pub(crate) fn replace_copies(&self, copies: &[CopyReport]) {
        self.update(|m| {
            let mut before = m.remove_where(|e| e.source != ROUTER);
            let now = Instant::now();
            for copy in copies {
                let holding = if copy.loaded {
                    Holding::Loaded
                } else {
                    Holding::Loading
                };
                let old = before.remove(&copy.id);
                let mut e = Entry::new(holding, REMOTE);
                if let Some(old) = &old {
                    e.routed = old.routed;
                }
                e.load_time = copy.load_time;
                // Since this router first heard it was loaded there.
                e.loaded_at = copy.loaded.then(|| {
                    (old.as_ref())
                        .filter(|o| o.holding == Holding::Loaded)
                        .and_then(|o| o.loaded_at)
                        .unwrap_or(now)
                });
                e.size_bytes = copy.size_bytes;
                m.insert(&copy.id, e);
            }
        });
    }

    /// What the replica holds, as reports (loaded and loading copies; pending placements are
    /// this router's own and left out): what a node publishes of its local replicas.
    pub(crate) fn copies(&self) -> Vec<CopyReport> {
        let mut copies: Vec<CopyReport> = (self.models.read().entries())
            .filter(|(_, e)| e.source != ROUTER)
            .filter_map(|(id, e)| {
                let loaded = match e.holding {
                    Holding::Loaded => true,
                    Holding::Loading => false,
                    Holding::Pending(_) => return None,
                };
                Some(CopyReport {
                    id: id.clone(),
                    loaded,
                    size_bytes: e.size_bytes,
                    load_time: e.load_time,
                })
            })
            .collect();
        copies.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        copies
    }

    /// Its model-count cap and byte cap (summed over its caches), if any.
    pub(crate) fn capacity(&self) -> (Option<usize>, Option<u64>) {
        (self.model_capacity(), self.byte_capacity())
    }
}
