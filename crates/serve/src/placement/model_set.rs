//! [`ModelSet`]: the models one replica holds as the router sees them, with the counts the
//! routing rules ask for on every decision (models held, known bytes, copies still draining)
//! kept up to date as events arrive, so that no question costs a scan of the set.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use modelmux_cache::ModelId;
use tokio::time::Instant;

use super::{Holding, PENDING_TTL};

/// The source of the entries the router itself adds (pending placements).
pub(super) const ROUTER: usize = usize::MAX;

/// A model in a replica's set: how it is held, who reported it, when it was last routed here.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) holding: Holding,
    /// Which of the replica's caches reported it (`ROUTER` for a pending placement).
    pub(super) source: usize,
    /// Coarse monotonic ticks of the last routing here.
    pub(super) routed: u64,
    /// How long the load took, once loaded.
    pub(super) load_time: Option<Duration>,
    /// When this router learned it was loaded.
    pub(super) loaded_at: Option<Instant>,
    /// Its size, once loaded (if it reports one).
    pub(super) size_bytes: Option<u64>,
    /// Which placement made it, while it is pending (a number the set gives each).
    placement: u64,
    /// While it is pending: whether the request that placed it is still in flight (it cannot
    /// be answered before the replica has loaded the model, so the replica is loading it or
    /// about to, however long its report takes to arrive).
    pub(super) placing: bool,
}

impl Entry {
    pub(super) fn new(holding: Holding, source: usize) -> Self {
        Self {
            holding,
            source,
            routed: modelmux_cache::coarse_clock::ticks(),
            load_time: None,
            loaded_at: None,
            size_bytes: None,
            placement: 0,
            placing: false,
        }
    }
}

/// Whether a holding counts: a pending placement only until [`PENDING_TTL`] has passed.
pub(super) fn live(h: &Holding, now: Instant) -> bool {
    match h {
        Holding::Pending(at) => now.duration_since(*at) <= PENDING_TTL,
        Holding::Loading | Holding::Loaded => true,
    }
}

/// One replica's models, and the sums over them the rules read (and their order by routing).
///
/// Every change goes through a method here, which takes the changed entry's share out of the
/// sums before the change and puts it back after, so the sums always match the map.
#[derive(Debug, Default)]
pub(super) struct ModelSet {
    /// foldhash, randomly seeded (as the caches' index): ids are the clients' choice.
    map: HashMap<ModelId, Entry, foldhash::fast::RandomState>,
    sums: Sums,
    /// The last placement's number.
    placements: u64,
    /// Evicted copies whose unload has not run yet (still in use, or unloading), per cache and
    /// id: how many, and their bytes. They hold capacity a new load cannot have.
    draining: HashMap<(usize, ModelId), (usize, u64)>,
    /// The sums of `draining`.
    drained: (usize, u64),
}

/// What the rules read of a [`ModelSet`]'s entries, kept as they change.
#[derive(Debug, Default)]
struct Sums {
    /// Entries loading or loaded (every one of them counts as held).
    settled: usize,
    /// Of the entries, those whose size is known: how many, and their bytes.
    known: (usize, u64),
    /// Entries that are pending placements.
    pending: usize,
    /// The pending placements by number, with when each was made: oldest first (the times
    /// never decrease, for they are taken under the write lock). An entry that stops being
    /// pending leaves it.
    placed: BTreeMap<u64, (Instant, ModelId)>,
    /// The loaded entries by when they were last routed to, least recently first.
    lru: BTreeSet<(u64, ModelId)>,
}

impl ModelSet {
    pub(super) fn get(&self, id: &ModelId) -> Option<&Entry> {
        self.map.get(id)
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = (&ModelId, &Entry)> {
        self.map.iter()
    }

    /// Models held at `now`: loading, loaded, or placed here within [`PENDING_TTL`].
    pub(super) fn held(&self, now: Instant) -> usize {
        self.sums.settled + self.sums.pending - self.expired(now)
    }

    /// Held models of known size: how many, and their bytes.
    pub(super) fn known(&self) -> (usize, u64) {
        self.sums.known
    }

    /// Copies still draining: how many, and their bytes.
    pub(super) fn draining(&self) -> (usize, u64) {
        self.drained
    }

    /// When the least recently routed loaded model was last routed to (`u64::MAX`: none).
    pub(super) fn oldest_use(&self) -> u64 {
        self.sums
            .lru
            .first()
            .map_or(u64::MAX, |(routed, _)| *routed)
    }

    /// Records that a request for `id` was routed here at `tick` (if it holds `id`).
    pub(super) fn routed(&mut self, id: &ModelId, tick: u64) {
        if self.map.get(id).is_some_and(|e| e.routed != tick) {
            self.modify(id, |e| e.routed = tick);
        }
    }

    /// Pending placements past their time that no change has dropped yet: the first few of
    /// `placed` (changes drop them).
    fn expired(&self, now: Instant) -> usize {
        (self.sums.placed.values())
            .take_while(|(at, _)| now.duration_since(*at) > PENDING_TTL)
            .count()
    }

    /// Changes `id`'s entry in place with `f`, keeping the sums; false if there is none.
    fn modify(&mut self, id: &ModelId, f: impl FnOnce(&mut Entry)) -> bool {
        let Some(e) = self.map.get_mut(id) else {
            return false;
        };
        self.sums.share(id, e, false);
        f(e);
        self.sums.share(id, e, true);
        true
    }

    /// Puts `e` in as `id`'s entry, in place of any there, keeping the sums.
    pub(super) fn insert(&mut self, id: &ModelId, e: Entry) {
        if let Some(old) = self.map.insert(id.clone(), e) {
            self.sums.share(id, &old, false);
        }
        let e = self.map.get(id).expect("just inserted");
        self.sums.share(id, e, true);
    }

    /// Takes `id`'s entry out, keeping the sums.
    fn remove(&mut self, id: &ModelId) -> Option<Entry> {
        let e = self.map.remove(id)?;
        self.sums.share(id, &e, false);
        Some(e)
    }

    /// Drops the pending placements the replica never confirmed within [`PENDING_TTL`].
    /// Called before each change, so an expired entry cannot stand in for a new one.
    pub(super) fn expire(&mut self, now: Instant) {
        while let Some((_, (at, id))) = self.sums.placed.first_key_value() {
            if now.duration_since(*at) <= PENDING_TTL {
                break;
            }
            let id = id.clone();
            self.remove(&id);
        }
    }

    /// Records a pending placement of `id` at `now`, unless the replica holds it already:
    /// its number, for [`Self::placement_ended`], if it made one.
    pub(super) fn place(&mut self, id: &ModelId, now: Instant) -> Option<u64> {
        if self.map.contains_key(id) {
            return None;
        }
        self.placements += 1;
        let mut e = Entry::new(Holding::Pending(now), ROUTER);
        e.placement = self.placements;
        e.placing = true;
        self.insert(id, e);
        Some(self.placements)
    }

    /// The request that made placement number `placement` of `id` has ended (answered or
    /// not): if the replica has still not reported the model, the placement is no longer
    /// vouched for by a request in flight.
    pub(super) fn placement_ended(&mut self, id: &ModelId, placement: u64) {
        if (self.map.get(id)).is_some_and(|e| e.placement == placement && e.placing) {
            self.modify(id, |e| e.placing = false);
        }
    }

    /// Sets how `id` is held and by which cache, keeping its routing time and facts.
    pub(super) fn set(&mut self, id: &ModelId, holding: Holding, source: usize) {
        let found = self.modify(id, |e| {
            e.holding = holding;
            e.source = source;
        });
        if !found {
            self.insert(id, Entry::new(holding, source));
        }
    }

    /// Records that `id` (reported by cache `source`) is loaded, with its load's facts.
    pub(super) fn loaded(
        &mut self,
        id: &ModelId,
        source: usize,
        load_time: Duration,
        size_bytes: Option<u64>,
    ) {
        let loaded = |e: &mut Entry| {
            e.holding = Holding::Loaded;
            e.source = source;
            e.load_time = Some(load_time);
            e.size_bytes = size_bytes;
            e.loaded_at.get_or_insert_with(Instant::now);
        };
        if !self.modify(id, loaded) {
            let mut e = Entry::new(Holding::Loaded, source);
            loaded(&mut e);
            self.insert(id, e);
        }
    }

    /// Removes and returns the entries that `leave` says go.
    pub(super) fn remove_where(
        &mut self,
        leave: impl Fn(&Entry) -> bool,
    ) -> HashMap<ModelId, Entry> {
        let ids: Vec<ModelId> = (self.map.iter())
            .filter(|(_, e)| leave(e))
            .map(|(id, _)| id.clone())
            .collect();
        let mut removed = HashMap::with_capacity(ids.len());
        for id in ids {
            if let Some(e) = self.remove(&id) {
                removed.insert(id, e);
            }
        }
        removed
    }

    /// Removes `id` if cache `source` reported it or it is only the router's placement
    /// (another cache's entry for the same id stays).
    pub(super) fn retract(&mut self, id: &ModelId, source: usize) {
        if self
            .map
            .get(id)
            .is_some_and(|e| e.source == source || e.source == ROUTER)
        {
            self.remove(id);
        }
    }

    /// Removes every entry cache `source` reported, and what it had draining (a resync).
    pub(super) fn forget_source(&mut self, source: usize) {
        self.remove_where(|e| e.source == source);
        self.draining.retain(|(s, _), _| *s != source);
        self.drained = self
            .draining
            .values()
            .fold((0, 0), |(n, b), &(dn, db)| (n + dn, b.saturating_add(db)));
    }

    /// A copy of `id` from cache `source` was evicted: it drains (holding its room) until its
    /// unload runs.
    pub(super) fn evicting(&mut self, id: &ModelId, source: usize) {
        let bytes = (self.map.get(id))
            .filter(|e| e.source == source)
            .and_then(|e| e.size_bytes)
            .unwrap_or(0);
        let copies = self.draining.entry((source, id.clone())).or_default();
        *copies = (copies.0 + 1, copies.1.saturating_add(bytes));
        self.drained = (self.drained.0 + 1, self.drained.1.saturating_add(bytes));
    }

    /// An evicted copy of `id` from cache `source` was unloaded: its room is free.
    pub(super) fn unloaded(&mut self, id: &ModelId, source: usize) {
        let key = (source, id.clone());
        let Some(&(n, bytes)) = self.draining.get(&key) else {
            return;
        };
        // Copies of one id are about the same size: release an even share.
        let released = if n <= 1 {
            self.draining.remove(&key);
            bytes
        } else {
            let released = bytes / n as u64;
            self.draining.insert(key, (n - 1, bytes - released));
            released
        };
        self.drained = (self.drained.0 - 1, self.drained.1.saturating_sub(released));
    }
}

impl Sums {
    /// Takes `e`'s share out of the sums, or puts it in.
    fn share(&mut self, id: &ModelId, e: &Entry, add: bool) {
        let step = |n: &mut usize| *n = if add { *n + 1 } else { *n - 1 };
        if let Holding::Pending(at) = e.holding {
            step(&mut self.pending);
            if add {
                self.placed.insert(e.placement, (at, id.clone()));
            } else {
                self.placed.remove(&e.placement);
            }
        } else {
            step(&mut self.settled);
        }
        if e.holding == Holding::Loaded {
            if add {
                self.lru.insert((e.routed, id.clone()));
            } else {
                self.lru.remove(&(e.routed, id.clone()));
            }
        }
        if let Some(bytes) = e.size_bytes {
            step(&mut self.known.0);
            self.known.1 = if add {
                self.known.1.saturating_add(bytes)
            } else {
                self.known.1.saturating_sub(bytes)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The sums, worked out from scratch.
    fn recount(s: &ModelSet, now: Instant) -> (usize, (usize, u64), (usize, u64), u64) {
        let held = (s.map.values()).filter(|e| live(&e.holding, now)).count();
        let sizes: Vec<u64> = s.map.values().filter_map(|e| e.size_bytes).collect();
        let known = (sizes.len(), sizes.iter().sum());
        let draining = (s.draining.values()).fold((0, 0), |(n, b), &(dn, db)| (n + dn, b + db));
        let oldest = (s.map.values())
            .filter(|e| e.holding == Holding::Loaded)
            .map(|e| e.routed)
            .min()
            .unwrap_or(u64::MAX);
        (held, known, draining, oldest)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Place(u8),
        Loading(u8, usize),
        Loaded(u8, usize, u64),
        Retract(u8, usize),
        Evicting(u8, usize),
        Unloaded(u8, usize),
        Forget(usize),
        Routed(u8, u64),
        Report(u8, bool),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let id = 0u8..6;
        let source = 0usize..2;
        prop_oneof![
            id.clone().prop_map(Op::Place),
            (id.clone(), source.clone()).prop_map(|(i, s)| Op::Loading(i, s)),
            (id.clone(), source.clone(), 1u64..1000).prop_map(|(i, s, b)| Op::Loaded(i, s, b)),
            (id.clone(), source.clone()).prop_map(|(i, s)| Op::Retract(i, s)),
            (id.clone(), source.clone()).prop_map(|(i, s)| Op::Evicting(i, s)),
            (id, source.clone()).prop_map(|(i, s)| Op::Unloaded(i, s)),
            source.prop_map(Op::Forget),
            (0u8..6, 0u64..50).prop_map(|(i, t)| Op::Routed(i, t)),
            (0u8..6, any::<bool>()).prop_map(|(i, l)| Op::Report(i, l)),
            (0u64..4000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Whatever the order of events, placements, routings and expiries, the kept sums
        /// (and the oldest routing) equal those counted from the map, before and after expired placements are dropped.
        #[test]
        fn the_sums_always_match_the_map(ops in proptest::collection::vec(op(), 1..80)) {
            let origin = Instant::now();
            let mut now = origin;
            let mut s = ModelSet::default();
            for op in ops {
                let id = |i: u8| ModelId::new(format!("m{i}")).unwrap();
                match op {
                    Op::Place(i) => {
                        if let Some(n) = s.place(&id(i), now) {
                            s.placement_ended(&id(i), n);
                        }
                    }
                    Op::Loading(i, src) => s.set(&id(i), Holding::Loading, src),
                    Op::Loaded(i, src, b) => s.loaded(&id(i), src, Duration::ZERO, Some(b)),
                    Op::Retract(i, src) => s.retract(&id(i), src),
                    Op::Evicting(i, src) => s.evicting(&id(i), src),
                    Op::Unloaded(i, src) => s.unloaded(&id(i), src),
                    Op::Forget(src) => s.forget_source(src),
                    Op::Routed(i, tick) => s.routed(&id(i), tick),
                    // As a remote report does: a new entry in place, its routing time kept.
                    Op::Report(i, loaded) => {
                        let holding = if loaded { Holding::Loaded } else { Holding::Loading };
                        let mut e = Entry::new(holding, 0);
                        if let Some(old) = s.get(&id(i)) {
                            e.routed = old.routed;
                        }
                        s.insert(&id(i), e);
                    }
                    Op::Wait(ms) => now += Duration::from_millis(ms),
                }
                let (held, known, draining, oldest) = recount(&s, now);
                prop_assert_eq!(s.held(now), held);
                prop_assert_eq!(s.known(), known);
                prop_assert_eq!(s.draining(), draining);
                prop_assert_eq!(s.oldest_use(), oldest);
                s.expire(now);
                prop_assert_eq!(s.held(now), held);
                prop_assert_eq!(s.sums.pending + s.sums.settled, s.map.len());
            }
        }
    }
}
