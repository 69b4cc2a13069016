//! The routing rules on scripted replicas.

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
    full: Option<Duration>,
    waiting_for_load: usize,
    loaded_for: Duration,
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
        full: None,
        waiting_for_load: 0,
        loaded_for: Duration::from_secs(3600),
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
    fn full_for(&self, _now: Instant) -> Option<Duration> {
        self.full.filter(|_| self.is_saturated())
    }
    fn waiting_for_load(&self, _model: &ModelId) -> usize {
        self.waiting_for_load
    }
    fn loaded_for(&self, id: &ModelId, _now: Instant) -> Option<Duration> {
        (self.models.get(id) == Some(&Holding::Loaded)).then_some(self.loaded_for)
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
async fn a_holder_full_for_longer_than_the_load_gets_a_copy_measured_or_not() {
    let ms = Duration::from_millis;
    let mut rs = vec![fake("a"), fake("b")];
    rs[0].models.insert(id("m"), Holding::Loaded);
    rs[0].ongoing = 5;
    rs[0].load = Some(ms(10));
    let mut rng = Rng::new(5);
    let at = |rs: &[Fake], rng: &mut Rng| choose_with(rs, Some(&id("m")), Instant::now(), rng, 0);
    // Nothing measured, full for 5 ms of a 10 ms load: wait for the holder.
    rs[0].full = Some(ms(5));
    assert_eq!(at(&rs, &mut rng), Choice::Wait);
    // Full for 3 s with nothing freeing (one long request ahead): a copy on the other replica,
    // though no request has finished yet (Ray falls back to any replica after a second or two).
    rs[0].full = Some(ms(3000));
    assert_eq!(at(&rs, &mut rng), Choice::Replica(1, Reason::NewCopy));
    // Cheap requests measured (2 ms) but the holder stuck for 50 ms: the stall decides.
    rs[0].service = Some(ms(2));
    rs[0].full = Some(ms(50));
    assert_eq!(at(&rs, &mut rng), Choice::Replica(1, Reason::NewCopy));
    // ...and a holder that just filled waits, as before.
    rs[0].full = Some(ms(1));
    assert_eq!(at(&rs, &mut rng), Choice::Wait);
    // Full since before its load ended (the requests that waited for the load hold the slots,
    // as a forwarding node sees another's replica): only the time since it loaded counts.
    rs[0].full = Some(ms(3000));
    rs[0].loaded_for = ms(5);
    assert_eq!(at(&rs, &mut rng), Choice::Wait);
    rs[0].loaded_for = ms(50);
    assert_eq!(at(&rs, &mut rng), Choice::Replica(1, Reason::NewCopy));
}

#[tokio::test]
async fn a_loading_holders_slots_count_the_requests_waiting_for_its_load() {
    let mut rs = vec![fake("a"), fake("b")];
    rs[0].models.insert(id("m"), Holding::Loading);
    rs[0].max = 1;
    rs[0].waiting_for_load = 1;
    let mut rng = Rng::new(7);
    // Its one slot is given back while the load runs, but the request waiting for the load
    // takes it back first: a second request sent there would queue inside the replica.
    assert_eq!(pick(&rs, Some("m"), &mut rng), Choice::Wait);
    // With a slot to spare after that request, the holder takes it.
    rs[0].max = 2;
    assert_eq!(
        pick(&rs, Some("m"), &mut rng),
        Choice::Replica(0, Reason::Holder)
    );
    // Loaded, but its waiter has not taken its slot back yet: still spoken for.
    rs[0].models.insert(id("m"), Holding::Loaded);
    rs[0].max = 1;
    assert!(!matches!(
        pick(&rs, Some("m"), &mut rng),
        Choice::Replica(0, _)
    ));
    // Once it has, it is ongoing like any other.
    rs[0].waiting_for_load = 0;
    assert_eq!(
        pick(&rs, Some("m"), &mut rng),
        Choice::Replica(0, Reason::Holder)
    );
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
    use crate::placement::ReplicaLedger;
    use modelmux_cache::{ModelEvent, ModelEventKind};
    let slots = [
        ReplicaLedger::new("a".into(), 4, 1, Some(2)),
        ReplicaLedger::new("b".into(), 4, 1, Some(2)),
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
