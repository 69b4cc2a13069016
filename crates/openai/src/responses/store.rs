//! Stored responses: one embedded database (redb) per node and LLM application, in a file
//! (kept across restarts) or in memory, bounded by count, bytes and age. Past a bound the
//! oldest go first, counted by why in `modelmux_responses_evicted_total`.
//!
//! Each record holds what a later turn needs to continue the conversation without walking a
//! chain: the items before this turn (`context`), this turn's input, and the response with its
//! output. A record is written before the response is answered (or its stream completed), so
//! a client that chains at once always finds it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use modelmux_cache::Failure;
use modelmux_serve::{
    MetricFamily, MetricKind, MetricSample, MetricValue, MetricsSource, ServeError,
};
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Records by response id.
const RESPONSES: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("responses");
/// Response ids by the order they were stored in (oldest first).
const ORDER: TableDefinition<'static, u64, &str> = TableDefinition::new("order");

/// A place in the order: its seq, the id there and that id's record, if it is still kept.
type Place = (u64, String, Option<Vec<u8>>);

/// How much the store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreLimits {
    /// Responses kept at most.
    pub(crate) max_responses: u64,
    /// Bytes of records kept at most.
    pub(crate) max_bytes: u64,
    /// How long a response is kept.
    pub(crate) max_age: Duration,
}

/// One stored response and the conversation it continues.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Stored {
    /// The response object.
    pub(crate) response: Value,
    /// The items before this turn (earlier turns' inputs and outputs), canonical.
    pub(crate) context: Vec<Value>,
    /// This turn's input items, canonical, each with an id.
    pub(crate) input: Vec<Value>,
}

impl Stored {
    /// The conversation a next turn continues: the context, this turn's input, its output.
    pub(crate) fn conversation(self) -> Vec<Value> {
        let mut items = self.context;
        items.extend(self.input);
        if let Some(Value::Array(output)) = self.response.get("output").cloned() {
            items.extend(output);
        }
        items
    }
}

#[derive(Serialize, Deserialize)]
struct Record {
    seq: u64,
    /// Seconds since the Unix epoch.
    stored_at: u64,
    stored: Stored,
}

/// Why a record went.
#[derive(Clone, Copy)]
enum Eviction {
    Count = 0,
    Bytes = 1,
    Age = 2,
}

const EVICTION_REASONS: [&str; 3] = ["count", "bytes", "age"];

#[derive(Default)]
struct Totals {
    count: u64,
    bytes: u64,
    next_seq: u64,
}

/// The stored responses of one node's LLM application.
pub(crate) struct ResponseStore {
    db: Database,
    limits: StoreLimits,
    totals: Mutex<Totals>,
    evicted: [AtomicU64; 3],
}

fn failed(e: impl std::fmt::Display) -> ServeError {
    ServeError::Failed(Failure::internal(format!("the response store failed: {e}")))
}

fn now_s() -> u64 {
    crate::protocol::unix_now()
}

impl ResponseStore {
    /// Opens (or creates) the store in `path`, or in memory without one.
    pub(crate) fn open(path: Option<&Path>, limits: StoreLimits) -> Result<Self, String> {
        let db = match path {
            Some(p) => {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                }
                Database::create(p).map_err(|e| format!("cannot open {}: {e}", p.display()))?
            }
            None => Database::builder()
                .create_with_backend(redb::backends::InMemoryBackend::new())
                .map_err(|e| e.to_string())?,
        };
        let store = Self {
            db,
            limits,
            totals: Mutex::default(),
            evicted: Default::default(),
        };
        store.recount().map_err(|e| e.to_string())?;
        // Bounds may have shrunk since the file was written.
        store.evict().map_err(|e| e.to_string())?;
        Ok(store)
    }

    /// Counts what the file holds (once, at open).
    fn recount(&self) -> Result<(), redb::Error> {
        let write = self.db.begin_write()?;
        {
            // Opening the tables creates them in a new file.
            let responses = write.open_table(RESPONSES)?;
            let order = write.open_table(ORDER)?;
            let mut totals = self.totals.lock();
            totals.count = responses.len()?;
            totals.bytes = 0;
            for entry in responses.iter()? {
                let (k, v) = entry?;
                totals.bytes += (k.value().len() + v.value().len()) as u64;
            }
            totals.next_seq = order.last()?.map_or(0, |(k, _)| k.value() + 1);
        }
        write.commit()?;
        Ok(())
    }

    /// Stores `stored` under `id` (on the blocking pool), then evicts past the bounds.
    pub(crate) async fn put(
        self: &Arc<Self>,
        id: String,
        stored: Stored,
    ) -> Result<(), ServeError> {
        let store = self.clone();
        modelmux_context::spawn_blocking(move || store.put_now(&id, stored))
            .await
            .map_err(failed)?
    }

    fn put_now(&self, id: &str, stored: Stored) -> Result<(), ServeError> {
        let seq = {
            let mut totals = self.totals.lock();
            totals.next_seq += 1;
            totals.next_seq - 1
        };
        let record = serde_json::to_vec(&Record {
            seq,
            stored_at: now_s(),
            stored,
        })
        .map_err(failed)?;
        let write = self.db.begin_write().map_err(failed)?;
        let mut responses = write.open_table(RESPONSES).map_err(failed)?;
        let mut order = write.open_table(ORDER).map_err(failed)?;
        order.insert(seq, id).map_err(failed)?;
        let replaced = responses
            .insert(id, record.as_slice())
            .map_err(failed)?
            .map(|old| old.value().len());
        drop((responses, order));
        write.commit().map_err(failed)?;
        {
            let mut totals = self.totals.lock();
            match replaced {
                Some(len) => totals.bytes -= (id.len() + len) as u64,
                None => totals.count += 1,
            }
            totals.bytes += (id.len() + record.len()) as u64;
        }
        self.evict().map_err(failed)
    }

    /// Removes the oldest records while the store is past a bound (each looked at in a read
    /// transaction first: a write, and its sync, only when one goes).
    fn evict(&self) -> Result<(), redb::Error> {
        let oldest_kept = now_s().saturating_sub(self.limits.max_age.as_secs());
        loop {
            let over = {
                let totals = self.totals.lock();
                if totals.count > self.limits.max_responses {
                    Some(Eviction::Count)
                } else if totals.bytes > self.limits.max_bytes {
                    Some(Eviction::Bytes)
                } else {
                    None
                }
            };
            let Some((seq, id, record)) = self.oldest()? else {
                return Ok(());
            };
            let parsed = record
                .as_deref()
                .and_then(|r| serde_json::from_slice::<Record>(r).ok());
            // A place whose record was deleted or replaced: dropped, and the next looked at.
            let stale = parsed.as_ref().is_none_or(|r| r.seq != seq);
            let expired = parsed.as_ref().is_some_and(|r| r.stored_at < oldest_kept);
            let reason = over.or(expired.then_some(Eviction::Age));
            if reason.is_none() && !stale {
                return Ok(());
            }
            let write = self.db.begin_write()?;
            {
                write.open_table(ORDER)?.remove(seq)?;
                if !stale {
                    write.open_table(RESPONSES)?.remove(id.as_str())?;
                }
            }
            write.commit()?;
            if let (false, Some(reason)) = (stale, reason) {
                let mut totals = self.totals.lock();
                totals.count -= 1;
                totals.bytes -= (id.len() + record.map_or(0, |r| r.len())) as u64;
                self.evicted[reason as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The oldest place in the order: its seq, its id and the record there (if any).
    fn oldest(&self) -> Result<Option<Place>, redb::Error> {
        let read = self.db.begin_read()?;
        let order = read.open_table(ORDER)?;
        let Some((seq, id)) = order
            .first()?
            .map(|(k, v)| (k.value(), v.value().to_owned()))
        else {
            return Ok(None);
        };
        let responses = read.open_table(RESPONSES)?;
        let record = responses.get(id.as_str())?.map(|v| v.value().to_vec());
        Ok(Some((seq, id, record)))
    }

    /// The response stored under `id`, if it is still kept (on the blocking pool).
    pub(crate) async fn get(self: &Arc<Self>, id: String) -> Result<Option<Stored>, ServeError> {
        let store = self.clone();
        modelmux_context::spawn_blocking(move || store.get_now(&id))
            .await
            .map_err(failed)?
    }

    fn get_now(&self, id: &str) -> Result<Option<Stored>, ServeError> {
        let read = self.db.begin_read().map_err(failed)?;
        let responses = read.open_table(RESPONSES).map_err(failed)?;
        let Some(bytes) = responses.get(id).map_err(failed)? else {
            return Ok(None);
        };
        let record: Record = serde_json::from_slice(bytes.value()).map_err(failed)?;
        let oldest_kept = now_s().saturating_sub(self.limits.max_age.as_secs());
        if record.stored_at < oldest_kept {
            drop((bytes, responses, read));
            self.evict().map_err(failed)?;
            return Ok(None);
        }
        Ok(Some(record.stored))
    }

    /// Deletes the response stored under `id`; whether there was one (on the blocking pool).
    pub(crate) async fn delete(self: &Arc<Self>, id: String) -> Result<bool, ServeError> {
        let store = self.clone();
        modelmux_context::spawn_blocking(move || store.delete_now(&id))
            .await
            .map_err(failed)?
    }

    fn delete_now(&self, id: &str) -> Result<bool, ServeError> {
        let write = self.db.begin_write().map_err(failed)?;
        let mut responses = write.open_table(RESPONSES).map_err(failed)?;
        let removed = responses
            .remove(id)
            .map_err(failed)?
            .map(|v| v.value().len());
        drop(responses);
        write.commit().map_err(failed)?;
        if let Some(len) = removed {
            // Its place in ORDER goes when eviction reaches it (a stale seq).
            let mut totals = self.totals.lock();
            totals.count -= 1;
            totals.bytes -= (id.len() + len) as u64;
        }
        Ok(removed.is_some())
    }

    /// Responses and bytes held now.
    pub(crate) fn held(&self) -> (u64, u64) {
        let t = self.totals.lock();
        (t.count, t.bytes)
    }

    /// Responses evicted so far, by why: `count`, `bytes`, `age`.
    pub(crate) fn evicted(&self) -> [(&'static str, u64); 3] {
        std::array::from_fn(|i| (EVICTION_REASONS[i], self.evicted[i].load(Ordering::Relaxed)))
    }
}

impl MetricsSource for ResponseStore {
    fn collect(&self) -> Vec<MetricFamily> {
        let (count, bytes) = self.held();
        let number = |v: u64| MetricValue::Number(v as f64);
        vec![
            MetricFamily::single(
                "modelmux_responses_stored",
                "Responses the Responses API keeps for previous_response_id on this node.",
                MetricKind::Gauge,
                number(count),
            ),
            MetricFamily::single(
                "modelmux_responses_stored_bytes",
                "Bytes of the stored responses on this node.",
                MetricKind::Gauge,
                number(bytes),
            ),
            MetricFamily {
                name: "modelmux_responses_evicted_total",
                help: "Stored responses evicted (oldest first) past a bound of the store, by the bound: count, bytes or age.",
                kind: MetricKind::Counter,
                samples: self
                    .evicted()
                    .into_iter()
                    .map(|(reason, n)| MetricSample {
                        labels: vec![("reason", reason.to_owned())],
                        value: number(n),
                    })
                    .collect(),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> Stored {
        Stored {
            response: json!({"output": [{"type": "message", "content": [{"text": text}]}]}),
            context: vec![],
            input: vec![json!({"type": "message", "role": "user", "content": text})],
        }
    }

    fn limits(max_responses: u64, max_bytes: u64) -> StoreLimits {
        StoreLimits {
            max_responses,
            max_bytes,
            max_age: Duration::from_secs(3600),
        }
    }

    #[test]
    fn past_its_count_the_oldest_go_first_and_are_counted() {
        let store = ResponseStore::open(None, limits(3, u64::MAX)).unwrap();
        for i in 0..5 {
            store.put_now(&format!("r{i}"), stored("x")).unwrap();
        }
        assert!(store.get_now("r0").unwrap().is_none());
        assert!(store.get_now("r1").unwrap().is_none());
        for i in 2..5 {
            assert!(store.get_now(&format!("r{i}")).unwrap().is_some(), "r{i}");
        }
        assert_eq!(store.held().0, 3);
        assert_eq!(store.evicted()[0], ("count", 2));
    }

    #[test]
    fn past_its_bytes_the_oldest_go_and_a_deleted_one_frees_its_bytes() {
        let one = serde_json::to_vec(&Record {
            seq: 0,
            stored_at: 0,
            stored: stored(&"y".repeat(1000)),
        })
        .unwrap()
        .len() as u64;
        let store = ResponseStore::open(None, limits(100, one * 2 + 40)).unwrap();
        for i in 0..4 {
            store
                .put_now(&format!("r{i}"), stored(&"y".repeat(1000)))
                .unwrap();
        }
        let (count, bytes) = store.held();
        assert_eq!(count, 2);
        assert!(bytes <= one * 2 + 40, "{bytes}");
        assert_eq!(store.evicted()[1], ("bytes", 2));
        assert!(store.delete_now("r3").unwrap());
        assert!(!store.delete_now("r3").unwrap());
        assert_eq!(store.held().0, 1);
        // The deleted one's place is skipped when eviction reaches it.
        for i in 4..7 {
            store
                .put_now(&format!("r{i}"), stored(&"y".repeat(1000)))
                .unwrap();
        }
        assert_eq!(store.held().0, 2);
        assert!(store.get_now("r6").unwrap().is_some());
    }

    #[test]
    fn a_file_keeps_its_responses_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/responses.redb");
        {
            let store = ResponseStore::open(Some(&path), limits(10, u64::MAX)).unwrap();
            store.put_now("a", stored("kept")).unwrap();
            store.put_now("b", stored("kept too")).unwrap();
        }
        let store = ResponseStore::open(Some(&path), limits(10, u64::MAX)).unwrap();
        assert_eq!(store.held().0, 2);
        let a = store.get_now("a").unwrap().unwrap();
        assert_eq!(a.conversation().len(), 2);
        // Reopened with a smaller bound: the oldest goes at once.
        drop(store);
        let store = ResponseStore::open(Some(&path), limits(1, u64::MAX)).unwrap();
        assert!(store.get_now("a").unwrap().is_none());
        assert!(store.get_now("b").unwrap().is_some());
    }

    #[test]
    fn an_old_response_is_gone() {
        let store = ResponseStore::open(
            None,
            StoreLimits {
                max_responses: 10,
                max_bytes: u64::MAX,
                max_age: Duration::ZERO,
            },
        )
        .unwrap();
        // Stored a second ago or more is past an age of zero: write one as if it were.
        let record = serde_json::to_vec(&Record {
            seq: 0,
            stored_at: now_s() - 2,
            stored: stored("old"),
        })
        .unwrap();
        let write = store.db.begin_write().unwrap();
        {
            write
                .open_table(RESPONSES)
                .unwrap()
                .insert("old", record.as_slice())
                .unwrap();
            write.open_table(ORDER).unwrap().insert(0, "old").unwrap();
        }
        write.commit().unwrap();
        store.recount().unwrap();
        assert!(store.get_now("old").unwrap().is_none());
        assert_eq!(store.evicted()[2], ("age", 1));
        assert_eq!(store.held().0, 0);
    }
}
