//! The routing rules, as a pure function over the replicas' views (no I/O, no waiting), so each
//! rule can be tested on scripted replicas. Dispatching (queueing, retries) is in `dispatch.rs`.
//!
//! For a request naming model `m`:
//! 1. Replicas holding `m` (loaded, loading, or just placed there by this router) with spare
//!    capacity: the less loaded of two picked at random (power of two choices).
//! 2. Holders all saturated, but one is still loading `m`: wait for it. A second copy started
//!    now would be ready no sooner, and a burst of first requests must trigger one load.
//! 3. Holders all saturated with `m` loaded: a further copy only if it pays, that is if the
//!    expected wait for a holder (its recent service time, scaled by the requests already
//!    queued per holder slot) is longer than loading `m` took. Bursts of cheap requests then
//!    wait for the holder instead of loading copies that take other models' slots; a hot
//!    model with slow requests still gets copies.
//! 4. No holder, or a copy pays: place `m` on the best other replica: one with a free model
//!    slot, then the fewest models, then the highest rendezvous hash of `(m, replica)`. The
//!    hash makes the choice deterministic, so every router (and every ingress process) with
//!    the same view sends `m`'s first requests to the same replica. Replicas where `m` failed
//!    to load recently are passed over while another can take it, so one replica's transient
//!    failure does not take the model offline.
//! 5. Nothing has room: wait (the dispatcher queues, bounded).
//!
//! A request naming no model goes to the less loaded of two random available replicas.

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
pub fn rendezvous_score(model: &str, replica: &str) -> u64 {
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

/// The best replica to load `model` on among those `eligible` says yes to: a free model slot
/// first, then the fewest models, then (when full) the oldest least-recently-used model, then
/// the highest rendezvous score.
fn best_placement<R: ReplicaView>(
    replicas: &[R],
    model: &ModelId,
    now: Instant,
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    (0..replicas.len())
        .filter(|&i| eligible(i))
        .max_by_key(|&i| {
            let r = &replicas[i];
            let free = r.has_free_slot(now);
            // Among full replicas, the one whose least recently used model is oldest: loading
            // there evicts what a single global LRU would (ModelMesh's rule).
            let older_victim = if free { 0 } else { u64::MAX - r.oldest_use() };
            (
                free,
                std::cmp::Reverse(r.model_count(now)),
                older_victim,
                rendezvous_score(model, r.id()),
            )
        })
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
/// holder is longer than a load of it took. With no request measured yet on the holders, it
/// waits for the first measurement (the requests of a first burst finish in about one service
/// time, and copying then would race the holder's drain); with no load time known, a copy is
/// made, as before any measurement.
fn copy_pays<R: ReplicaView>(
    replicas: &[R],
    holders: &[usize],
    model: &ModelId,
    waiting: usize,
) -> bool {
    let Some(load) = holders
        .iter()
        .filter_map(|&i| replicas[i].load_time(model))
        .max()
    else {
        return true;
    };
    let Some(service) = holders
        .iter()
        .filter_map(|&i| replicas[i].service_time())
        .min()
    else {
        return false;
    };
    let slots: usize = holders.iter().map(|&i| replicas[i].max_ongoing()).sum();
    let wait = service.mul_f64(1.0 + waiting as f64 / slots.max(1) as f64);
    wait > load
}

/// Applies the rules above, with `waiting` requests already queued in front of this one.
pub fn choose_with<R: ReplicaView>(
    replicas: &[R],
    model: Option<&ModelId>,
    now: Instant,
    rng: &mut Rng,
    waiting: usize,
) -> Choice {
    let open = |r: &R| r.is_available() && !r.is_saturated();
    let Some(model) = model else {
        let candidates: Vec<usize> = (0..replicas.len())
            .filter(|&i| open(&replicas[i]))
            .collect();
        return power_of_two(replicas, &candidates, rng)
            .map_or(Choice::Wait, |i| Choice::Replica(i, Reason::LeastLoaded));
    };

    let mut holders = Vec::new();
    let mut open_holders = Vec::new();
    for (i, r) in replicas.iter().enumerate() {
        if r.is_available() && r.holds(model, now) {
            holders.push(i);
            if !r.is_saturated() {
                open_holders.push(i);
            }
        }
    }
    if let Some(i) = power_of_two(replicas, &open_holders, rng) {
        return Choice::Replica(i, Reason::Holder);
    }
    if holders
        .iter()
        .any(|&i| replicas[i].holds_loading(model, now))
    {
        return Choice::Wait;
    }
    if !holders.is_empty() && !copy_pays(replicas, &holders, model, waiting) {
        return Choice::Wait;
    }
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
mod tests {
    use std::collections::HashMap;

    use std::time::Duration;

    use super::*;
    use crate::placement::Holding;

    /// A scripted replica.
    #[derive(Debug, Clone)]
    struct Fake {
        id: String,
        ongoing: usize,
        max: usize,
        available: bool,
        models: HashMap<ModelId, Holding>,
        capacity: Option<usize>,
        oldest: u64,
        service: Option<Duration>,
        load: Option<Duration>,
        failed: Vec<ModelId>,
    }

    fn fake(id: &str) -> Fake {
        Fake {
            id: id.to_string(),
            ongoing: 0,
            max: 5,
            available: true,
            models: HashMap::new(),
            capacity: Some(3),
            oldest: u64::MAX,
            service: None,
            load: None,
            failed: Vec::new(),
        }
    }

    impl ReplicaView for Fake {
        fn id(&self) -> &str {
            &self.id
        }
        fn ongoing(&self) -> usize {
            self.ongoing
        }
        fn max_ongoing(&self) -> usize {
            self.max
        }
        fn is_available(&self) -> bool {
            self.available
        }
        fn holds(&self, id: &ModelId, _now: Instant) -> bool {
            self.models.contains_key(id)
        }
        fn holds_loaded(&self, id: &ModelId) -> bool {
            self.models.get(id) == Some(&Holding::Loaded)
        }
        fn holds_loading(&self, id: &ModelId, _now: Instant) -> bool {
            matches!(
                self.models.get(id),
                Some(Holding::Loading | Holding::Pending(_))
            )
        }
        fn model_count(&self, _now: Instant) -> usize {
            self.models.len()
        }
        fn has_free_slot(&self, now: Instant) -> bool {
            self.capacity.is_none_or(|c| self.model_count(now) < c)
        }
        fn oldest_use(&self) -> u64 {
            self.oldest
        }
        fn service_time(&self) -> Option<Duration> {
            self.service
        }
        fn load_time(&self, id: &ModelId) -> Option<Duration> {
            self.models.contains_key(id).then_some(self.load).flatten()
        }
        fn backing_off(&self, id: &ModelId, _now: Instant) -> bool {
            self.failed.contains(id)
        }
    }

    #[tokio::test]
    async fn a_copy_is_loaded_only_when_waiting_for_the_holder_would_take_longer() {
        let ms = Duration::from_millis;
        let mut rs = vec![fake("a"), fake("b")];
        rs[0].models.insert(id("m"), Holding::Loaded);
        rs[0].ongoing = 5;
        rs[0].load = Some(ms(100));
        let mut rng = Rng::new(3);
        let at = |rs: &[Fake], waiting: usize, rng: &mut Rng| {
            choose_with(rs, Some(&id("m")), Instant::now(), rng, waiting)
        };
        // Cheap requests (2 ms each) on a model that took 100 ms to load: wait for the holder,
        // even with a queue of 100 (2 ms x (1 + 100/5) = 42 ms).
        rs[0].service = Some(ms(2));
        assert_eq!(at(&rs, 0, &mut rng), Choice::Wait);
        assert_eq!(at(&rs, 100, &mut rng), Choice::Wait);
        // ...but a queue of 300 would wait 122 ms: a copy pays.
        assert_eq!(at(&rs, 300, &mut rng), Choice::Replica(1, Reason::NewCopy));
        // Slow requests (a second each) on the same model: a copy pays at once.
        rs[0].service = Some(ms(1000));
        assert_eq!(at(&rs, 0, &mut rng), Choice::Replica(1, Reason::NewCopy));
        // No request measured yet: wait for the first to finish.
        rs[0].service = None;
        assert_eq!(at(&rs, 0, &mut rng), Choice::Wait);
        // No load time known: copy, as before any measurement.
        rs[0].load = None;
        assert_eq!(at(&rs, 0, &mut rng), Choice::Replica(1, Reason::NewCopy));
    }

    #[tokio::test]
    async fn a_replica_backing_off_a_model_is_passed_over_while_another_can_take_it() {
        let mut rs = vec![fake("a"), fake("b"), fake("c")];
        let m = id("m");
        let first = match pick(&rs, Some("m"), &mut Rng::new(1)) {
            Choice::Replica(i, Reason::Placed) => i,
            other => panic!("{other:?}"),
        };
        rs[first].failed.push(m.clone());
        let second = match pick(&rs, Some("m"), &mut Rng::new(1)) {
            Choice::Replica(i, Reason::Placed) => i,
            other => panic!("{other:?}"),
        };
        assert_ne!(second, first, "placed again where it just failed");
        // Backing off everywhere: placed anyway (the replica answers with its backoff).
        for r in &mut rs {
            r.failed.push(m.clone());
        }
        assert!(matches!(
            pick(&rs, Some("m"), &mut Rng::new(1)),
            Choice::Replica(_, Reason::Placed)
        ));
    }

    fn id(s: &str) -> ModelId {
        ModelId::new(s).unwrap()
    }

    fn pick(replicas: &[Fake], model: Option<&str>, rng: &mut Rng) -> Choice {
        choose(replicas, model.map(id).as_ref(), Instant::now(), rng)
    }

    #[tokio::test]
    async fn requests_without_a_model_go_to_the_less_loaded_of_two() {
        let mut rs = vec![fake("a"), fake("b")];
        rs[0].ongoing = 4;
        let mut rng = Rng::new(7);
        for _ in 0..50 {
            assert_eq!(
                pick(&rs, None, &mut rng),
                Choice::Replica(1, Reason::LeastLoaded)
            );
        }
        rs[1].ongoing = 5;
        assert_eq!(
            pick(&rs, None, &mut rng),
            Choice::Replica(0, Reason::LeastLoaded),
            "b is saturated"
        );
        rs[0].ongoing = 5;
        assert_eq!(pick(&rs, None, &mut rng), Choice::Wait);
        rs[0].ongoing = 0;
        rs[0].available = false;
        assert_eq!(
            pick(&rs, None, &mut rng),
            Choice::Wait,
            "an unavailable replica takes nothing"
        );
    }

    #[tokio::test]
    async fn holders_are_chosen_despite_longer_queues() {
        let mut rs = vec![fake("a"), fake("b"), fake("c")];
        rs[1].models.insert(id("m"), Holding::Loaded);
        rs[1].ongoing = 4;
        let mut rng = Rng::new(1);
        for _ in 0..50 {
            assert_eq!(
                pick(&rs, Some("m"), &mut rng),
                Choice::Replica(1, Reason::Holder)
            );
        }
        // A loading (not yet loaded) holder attracts the model's requests too.
        rs[1].models.insert(id("m"), Holding::Loading);
        assert_eq!(
            pick(&rs, Some("m"), &mut rng),
            Choice::Replica(1, Reason::Holder)
        );
    }

    #[tokio::test]
    async fn among_holders_the_less_loaded_wins() {
        let mut rs = vec![fake("a"), fake("b")];
        for r in &mut rs {
            r.models.insert(id("m"), Holding::Loaded);
        }
        rs[0].ongoing = 3;
        let mut rng = Rng::new(3);
        assert_eq!(
            pick(&rs, Some("m"), &mut rng),
            Choice::Replica(1, Reason::Holder)
        );
    }

    #[tokio::test]
    async fn a_burst_of_first_requests_lands_on_one_replica() {
        let mut rs: Vec<Fake> = (0..4).map(|i| fake(&format!("r{i}"))).collect();
        for r in &mut rs {
            r.max = 1000;
        }
        let mut rng = Rng::new(11);
        let mut chosen = Vec::new();
        for _ in 0..100 {
            match pick(&rs, Some("cold"), &mut rng) {
                Choice::Replica(i, reason) => {
                    if reason == Reason::Placed {
                        // What the dispatcher does: record the placement at once.
                        rs[i]
                            .models
                            .insert(id("cold"), Holding::Pending(Instant::now()));
                    }
                    rs[i].ongoing += 1;
                    chosen.push((i, reason));
                }
                Choice::Wait => panic!("there is room"),
            }
        }
        let first = chosen[0].0;
        assert!(chosen.iter().all(|(i, _)| *i == first), "{chosen:?}");
        assert_eq!(
            chosen.iter().filter(|(_, r)| *r == Reason::Placed).count(),
            1,
            "one placement, one load"
        );
    }

    /// Places `cold`, then an unrelated model finishes loading on the same replica before
    /// `cold`'s own `Loading` arrives: where does `cold`'s next request go?
    fn second_request_after_unrelated_load(record_pending: bool) -> (usize, usize) {
        let mut rs = vec![fake("a"), fake("b")];
        let mut rng = Rng::new(21);
        let Choice::Replica(first, Reason::Placed) = pick(&rs, Some("cold"), &mut rng) else {
            panic!("placed")
        };
        if record_pending {
            rs[first]
                .models
                .insert(id("cold"), Holding::Pending(Instant::now()));
        }
        rs[first].models.insert(id("unrelated"), Holding::Loaded);
        let Choice::Replica(second, _) = pick(&rs, Some("cold"), &mut rng) else {
            panic!("there is room")
        };
        (first, second)
    }

    #[tokio::test]
    async fn a_placement_is_followed_even_when_the_view_changes_before_the_replica_reports() {
        let (first, second) = second_request_after_unrelated_load(true);
        assert_eq!(
            first, second,
            "the pending entry keeps the model's requests together"
        );
        // Without it, "fewest models" now points elsewhere: a second load of the same model.
        let (first, second) = second_request_after_unrelated_load(false);
        assert_ne!(first, second);
    }

    #[tokio::test]
    async fn the_burst_waits_for_a_loading_holder_instead_of_copying() {
        let mut rs = vec![fake("a"), fake("b")];
        rs[0].models.insert(id("m"), Holding::Loading);
        rs[0].ongoing = 5;
        let mut rng = Rng::new(5);
        assert_eq!(pick(&rs, Some("m"), &mut rng), Choice::Wait);
    }

    #[tokio::test]
    async fn saturated_holders_get_a_second_copy() {
        let mut rs = vec![fake("a"), fake("b"), fake("c")];
        rs[0].models.insert(id("hot"), Holding::Loaded);
        rs[0].ongoing = 5;
        rs[1].models.insert(id("x"), Holding::Loaded);
        let mut rng = Rng::new(9);
        // `c` has no models at all: fewest models wins.
        assert_eq!(
            pick(&rs, Some("hot"), &mut rng),
            Choice::Replica(2, Reason::NewCopy)
        );
        // Everyone saturated: wait.
        rs[1].ongoing = 5;
        rs[2].ongoing = 5;
        assert_eq!(pick(&rs, Some("hot"), &mut rng), Choice::Wait);
    }

    #[tokio::test]
    async fn cold_models_prefer_free_slots_then_fewest_models() {
        let mut rs = vec![fake("a"), fake("b"), fake("c")];
        for m in ["1", "2", "3"] {
            rs[0].models.insert(id(m), Holding::Loaded); // full
        }
        rs[1].models.insert(id("4"), Holding::Loaded);
        rs[1].models.insert(id("5"), Holding::Loaded);
        rs[2].models.insert(id("6"), Holding::Loaded);
        let mut rng = Rng::new(2);
        for cold in ["p", "q", "r", "s"] {
            assert_eq!(
                pick(&rs, Some(cold), &mut rng),
                Choice::Replica(2, Reason::Placed),
                "{cold}"
            );
        }
        // With equal counts, the rendezvous hash decides, differently for different models,
        // and identically for every router.
        let even = vec![fake("a"), fake("b"), fake("c"), fake("d")];
        let spread: std::collections::HashSet<usize> = (0..40)
            .map(
                |k| match pick(&even, Some(&format!("model-{k}")), &mut rng) {
                    Choice::Replica(i, Reason::Placed) => i,
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        assert_eq!(spread.len(), 4, "cold models spread over every replica");
        let again = pick(&even, Some("model-7"), &mut Rng::new(999));
        assert_eq!(
            again,
            pick(&even, Some("model-7"), &mut Rng::new(1)),
            "deterministic"
        );
    }

    #[tokio::test]
    async fn when_every_replica_is_full_the_one_with_the_oldest_model_takes_the_new_one() {
        let mut rs = vec![fake("a"), fake("b"), fake("c")];
        for (r, (oldest, prefix)) in rs.iter_mut().zip([(500, "a"), (100, "b"), (900, "c")]) {
            for k in 0..3 {
                r.models
                    .insert(id(&format!("{prefix}{k}")), Holding::Loaded);
            }
            r.oldest = oldest;
        }
        let mut rng = Rng::new(8);
        for cold in ["x", "y", "z", "w"] {
            assert_eq!(
                pick(&rs, Some(cold), &mut rng),
                Choice::Replica(1, Reason::Placed),
                "{cold}"
            );
        }
    }

    #[tokio::test]
    async fn failed_loads_no_longer_attract_traffic() {
        // A failed load is retracted from the view (placement.rs): the replica holds nothing.
        let mut rs = vec![fake("a"), fake("b")];
        rs[0].models.insert(id("broken"), Holding::Loading);
        let mut rng = Rng::new(4);
        assert_eq!(
            pick(&rs, Some("broken"), &mut rng),
            Choice::Replica(0, Reason::Holder)
        );
        rs[0].models.remove(&id("broken"));
        // Now it is placed afresh by the cold rules, not sent to `a` as a holder.
        assert!(matches!(
            pick(&rs, Some("broken"), &mut rng),
            Choice::Replica(_, Reason::Placed)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_load_reported_by_its_cache_no_longer_attracts_traffic() {
        // The real path: replica slots fed the cache's own events (as the replica's feed task
        // does), not a hand-edited view.
        use crate::placement::ReplicaSlot;
        use modelmux_cache::{ModelEvent, ModelEventKind};
        let slots = [
            ReplicaSlot::new("a".into(), 4, 1, Some(2)),
            ReplicaSlot::new("b".into(), 4, 1, Some(2)),
        ];
        let broken = id("broken");
        let event = |kind| ModelEvent {
            seq: 0,
            id: broken.clone(),
            kind,
        };
        slots[0].apply(0, &event(ModelEventKind::Loading));
        let mut rng = Rng::new(4);
        let now = Instant::now();
        assert_eq!(
            choose(&slots, Some(&broken), now, &mut rng),
            Choice::Replica(0, Reason::Holder)
        );
        let error = modelmux_cache::Error::LoadTimeout {
            id: broken.clone(),
            after: std::time::Duration::from_secs(1),
        };
        slots[0].apply(0, &event(ModelEventKind::Failed { error }));
        assert!(
            slots[0].holdings().is_empty(),
            "the failure retracts the load"
        );
        assert!(matches!(
            choose(&slots, Some(&broken), now, &mut rng),
            Choice::Replica(_, Reason::Placed)
        ));
    }

    #[test]
    fn rendezvous_scores_are_stable() {
        // Golden values, computed by an independent implementation (Python: FNV-1a 64 over
        // model, 0xff, replica; then murmur3's fmix64). Every router of a cluster must agree on
        // them, across versions: a change here moves every model's placement in running
        // clusters.
        for (model, replica, score) in [
            ("m", "r1", 0xb8d7_1b81_1745_524c_u64),
            ("m", "r2", 0x62ee_0d59_968b_2743),
            ("customer-1", "Classifier#a1b2c3", 0xc1ee_a919_0f7b_0cae),
            ("ab", "c", 0x7b42_09ec_cab7_f7c3),
            ("a", "bc", 0x300b_ffd2_a90e_cf20),
            ("", "", 0x1bbd_5c81_3c69_a8d7),
        ] {
            assert_eq!(
                rendezvous_score(model, replica),
                score,
                "{model:?} on {replica:?}"
            );
        }
    }
}
