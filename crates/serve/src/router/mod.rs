//! The routing rules, as a pure function over the replicas' views (no I/O, no waiting), so each
//! rule can be tested on scripted replicas. Dispatching (queueing, retries) is in `dispatch.rs`.
//!
//! For a request naming model `m`:
//! 1. Replicas holding `m` (loaded, loading, or just placed there by this router) with spare
//!    capacity (counting the requests there that wait for `m`'s load, which take their slots
//!    back first): the less loaded of two picked at random (power of two
//!    choices).
//! 2. Holders all saturated, but one is still loading `m`: wait for it. A second copy started
//!    now would be ready no sooner, and a burst of first requests must trigger one load.
//! 3. Holders all saturated with `m` loaded: a further copy only if it pays, that is if the
//!    expected wait for a holder (its recent service time, scaled by the requests already
//!    queued per holder slot, or how long the holders have been full without a slot freeing,
//!    whichever is longer) is longer than loading `m` took. Bursts of cheap requests then
//!    wait for the holder instead of loading copies that take other models' slots; a hot
//!    model with slow requests still gets copies, and a request queued behind a long one is
//!    placed again once its wait has outgrown the load.
//! 4. No holder, or a copy pays: place `m` on the best other replica: one with a free model
//!    slot, then the fewest models, then the highest rendezvous hash of `(m, replica)`. The
//!    hash makes the choice deterministic, so every router (and every ingress process) with
//!    the same view sends `m`'s first requests to the same replica. Replicas where `m` failed
//!    to load recently are passed over while another can take it, so one replica's transient
//!    failure does not take the model offline.
//! 5. Nothing has room: wait (the dispatcher queues, bounded).
//!
//! A request naming no model goes to the less loaded of two random available replicas.

use std::time::Duration;

use modelmux_cache::ModelId;
use tokio::time::Instant;

use crate::placement::ReplicaView;

/// Where a request should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// To the replica at this index, for this reason.
    Replica(usize, Reason),
    /// Nowhere yet: wait for a replica to free up.
    Wait,
}

/// Why a replica was chosen (logged, and counted in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No model named: the less loaded of two.
    LeastLoaded,
    /// It holds the model.
    Holder,
    /// It holds no copy, and no replica held one: the model's first placement.
    Placed,
    /// Every holder was saturated: a further copy.
    NewCopy,
}

/// A small, fast random source for the power of two choices (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value; zero is mapped to a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A stable 64-bit hash of `(model, replica)` for rendezvous placement: FNV-1a, then a
/// finaliser so that similar replica names score independently. Stable across processes and
/// Rust versions (std's hasher is neither promised).
pub(crate) fn rendezvous_score(model: &str, replica: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in model.bytes().chain([0xff]).chain(replica.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The less loaded of two distinct random candidates (the only one, if there is one).
fn power_of_two<R: ReplicaView>(
    replicas: &[R],
    candidates: &[usize],
    rng: &mut Rng,
) -> Option<usize> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        n => {
            let a = rng.below(n);
            let b = (a + 1 + rng.below(n - 1)) % n;
            let (a, b) = (candidates[a], candidates[b]);
            Some(if replicas[b].ongoing() < replicas[a].ongoing() {
                b
            } else {
                a
            })
        }
    }
}

/// How good a place for a new model a replica is, the rendezvous score aside: a free slot,
/// fewer models, an older least recently used model (greater is better).
type PlacementKey = (bool, std::cmp::Reverse<usize>, u64);

/// The best replica to load `model` on among those `eligible` says yes to: a free model slot
/// first, then the fewest models, then (when full) the oldest least-recently-used model, then
/// the highest rendezvous score (hashed only to break a tie: it costs more than the rest).
fn best_placement<R: ReplicaView>(
    replicas: &[R],
    model: &ModelId,
    now: Instant,
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    let key = |r: &R| {
        let free = r.has_free_slot(now);
        // Among full replicas, the one whose least recently used model is oldest: loading
        // there evicts what a single global LRU would (ModelMesh's rule).
        let older_victim = if free { 0 } else { u64::MAX - r.oldest_use() };
        (free, std::cmp::Reverse(r.model_count(now)), older_victim)
    };
    let mut best: Option<(usize, PlacementKey)> = None;
    for i in (0..replicas.len()).filter(|&i| eligible(i)) {
        let k = key(&replicas[i]);
        let better = match &best {
            None => true,
            Some((b, bk)) => {
                k > *bk
                    || (k == *bk
                        && rendezvous_score(model, replicas[i].id())
                            >= rendezvous_score(model, replicas[*b].id()))
            }
        };
        if better {
            best = Some((i, k));
        }
    }
    best.map(|(i, _)| i)
}

/// Where an operator's prewarm of `model` should go, whatever the load: a replica that already
/// holds it (loaded first), else where its first request would be placed.
pub fn place<R: ReplicaView>(replicas: &[R], model: &ModelId, now: Instant) -> Option<usize> {
    let available = |i: usize| replicas[i].is_available();
    (0..replicas.len())
        .filter(|&i| available(i) && replicas[i].holds(model, now))
        .max_by_key(|&i| replicas[i].holds_loaded(model))
        .or_else(|| best_placement(replicas, model, now, available))
}

/// Applies the rules above, with nothing queued.
pub fn choose<R: ReplicaView>(
    replicas: &[R],
    model: Option<&ModelId>,
    now: Instant,
    rng: &mut Rng,
) -> Choice {
    choose_with(replicas, model, now, rng, 0)
}

/// Whether another copy of `model` pays, with every holder saturated: the expected wait for a
/// holder is longer than a load of it took. The wait is the larger of two estimates: the
/// holders' recent service time scaled by the requests queued per holder slot, and how long
/// the holders have been full with no slot freeing (a request that has run that long is
/// expected to run as long again; it is also the only estimate before any request finished).
/// So a burst of cheap requests waits for its holder, while a request queued behind a long
/// one gets a copy as soon as the wait has outgrown the load, whether it just arrived or has
/// waited since before (the dispatcher asks again for queued requests). With no load time
/// known, a copy is made, as before any measurement.
fn copy_pays<R: ReplicaView>(
    replicas: &[R],
    holders: &[usize],
    model: &ModelId,
    now: Instant,
    waiting: usize,
) -> bool {
    let Some(load) = holders
        .iter()
        .filter_map(|&i| replicas[i].load_time(model))
        .max()
    else {
        return true;
    };
    let slots: usize = holders.iter().map(|&i| replicas[i].max_ongoing()).sum();
    let measured = holders
        .iter()
        .filter_map(|&i| replicas[i].service_time())
        .min()
        .map(|service| service.mul_f64(1.0 + waiting as f64 / slots.max(1) as f64));
    // Only the time since the holder loaded the model counts: the requests that waited for
    // its load fill its slots from before then (on a forwarding node, whose slots for another
    // node's replica are taken when it forwards), and the load was paid for already.
    let stalled = holders
        .iter()
        .map(|&i| {
            let r = &replicas[i];
            let loaded = r.loaded_for(model, now).unwrap_or(Duration::ZERO);
            r.full_for(now).map(|full| full.min(loaded))
        })
        .min()
        .flatten();
    measured.max(stalled).is_some_and(|wait| wait > load)
}

/// Replica indices, on the stack up to 16 (a choice is made for every request; two heap
/// allocations for it were an eighth of a trivial request's).
pub(crate) type Indices = smallvec::SmallVec<[usize; 16]>;

/// Applies the rules above, with `waiting` requests already queued in front of this one.
pub(crate) fn choose_with<R: ReplicaView>(
    replicas: &[R],
    model: Option<&ModelId>,
    now: Instant,
    rng: &mut Rng,
    waiting: usize,
) -> Choice {
    match triage(replicas, model, now, rng, waiting) {
        Triage::Decided(choice) => choice,
        Triage::Place(holders) => place_copy(
            replicas,
            model.expect("only a model is placed"),
            now,
            &holders,
        ),
    }
}

/// What rules 1-3 make of a request.
pub(crate) enum Triage {
    /// They decide (or nothing is open to place it on: rule 5).
    Decided(Choice),
    /// Rule 4 decides: place the model; these replicas hold it already.
    Place(Indices),
}

/// Rules 1-3 (and 5 when nothing is open): the choice they make, or, where rule 4 decides
/// (placing the model on a replica that does not hold it), the holders, for [`place_copy`]. A
/// dispatcher triages without a lock and places under its placement lock, so the placement,
/// the dearer step, is worked out once.
pub(crate) fn triage<R: ReplicaView>(
    replicas: &[R],
    model: Option<&ModelId>,
    now: Instant,
    rng: &mut Rng,
    waiting: usize,
) -> Triage {
    let open = |r: &R| r.is_available() && !r.is_saturated();
    let Some(model) = model else {
        let candidates: Indices = (0..replicas.len())
            .filter(|&i| open(&replicas[i]))
            .collect();
        return Triage::Decided(
            power_of_two(replicas, &candidates, rng)
                .map_or(Choice::Wait, |i| Choice::Replica(i, Reason::LeastLoaded)),
        );
    };

    let mut holders = Indices::new();
    let mut open_holders = Indices::new();
    for (i, r) in replicas.iter().enumerate() {
        if r.is_available() && r.holds(model, now) {
            holders.push(i);
            // The requests waiting there for this model's load have given their slots back
            // but take them back first when it is done: a request sent there now would
            // queue behind them inside the replica, where nothing can place it again.
            // (Requests waiting for other models' loads do not count: the slot is free for
            // this model's requests meanwhile.)
            if r.ongoing() + r.waiting_for_load(model) < r.max_ongoing() {
                open_holders.push(i);
            }
        }
    }
    if let Some(i) = power_of_two(replicas, &open_holders, rng) {
        return Triage::Decided(Choice::Replica(i, Reason::Holder));
    }
    if holders
        .iter()
        .any(|&i| replicas[i].holds_loading(model, now))
    {
        return Triage::Decided(Choice::Wait);
    }
    if !holders.is_empty() && !copy_pays(replicas, &holders, model, now, waiting) {
        return Triage::Decided(Choice::Wait);
    }
    let any_open = (0..replicas.len()).any(|i| open(&replicas[i]) && !holders.contains(&i));
    if !any_open {
        return Triage::Decided(Choice::Wait);
    }
    Triage::Place(holders)
}

/// Rule 4: where to load another copy of `model` (its first, if `holders` is empty).
pub(crate) fn place_copy<R: ReplicaView>(
    replicas: &[R],
    model: &ModelId,
    now: Instant,
    holders: &[usize],
) -> Choice {
    let open = |r: &R| r.is_available() && !r.is_saturated();
    let candidate = |i: usize| open(&replicas[i]) && !holders.contains(&i);
    let best = best_placement(replicas, model, now, |i| {
        candidate(i) && !replicas[i].backing_off(model, now)
    })
    .or_else(|| best_placement(replicas, model, now, candidate));
    match best {
        Some(i) if holders.is_empty() => Choice::Replica(i, Reason::Placed),
        Some(i) => Choice::Replica(i, Reason::NewCopy),
        None => Choice::Wait,
    }
}

#[cfg(test)]
mod tests;
