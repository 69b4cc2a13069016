//! The scheduler's rules, without a model: sequences are plain records, memory a real
//! [`KvBudget`] with a pretend prefix cache beside it.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::kv::{KvBudget, KvReservation};

#[derive(Debug)]
struct Fake {
    id: usize,
    adapter: Option<String>,
    slots: usize,
    prompt_left: usize,
    kv: u64,
    deadline: Instant,
    abandoned: bool,
    held: Option<KvReservation>,
}

impl Fake {
    fn new(id: usize, adapter: Option<&str>, prompt: usize) -> Self {
        Self {
            id,
            adapter: adapter.map(str::to_owned),
            slots: 1,
            prompt_left: prompt,
            kv: 10,
            deadline: Instant::now() + Duration::from_secs(60),
            abandoned: false,
            held: None,
        }
    }
}

impl Schedulable for Fake {
    fn adapter(&self) -> Option<&str> {
        self.adapter.as_deref()
    }
    fn adapter_serial(&self) -> Option<u64> {
        // A stable number per adapter name, as a loaded adapter's serial is.
        self.adapter.as_ref().map(|a| {
            a.bytes()
                .fold(7u64, |h, b| h.wrapping_mul(31) ^ u64::from(b))
        })
    }
    fn slots(&self) -> usize {
        self.slots
    }
    fn prompt_left(&self) -> usize {
        self.prompt_left
    }
    fn kv_bytes(&self) -> u64 {
        self.kv
    }
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn is_abandoned(&self) -> bool {
        self.abandoned
    }
}

/// A KV budget with cached prefixes holding part of it (each evicted whole).
struct Room {
    budget: KvBudget,
    prefixes: Vec<KvReservation>,
    evictions: usize,
}

impl Room {
    fn new(capacity: u64) -> Self {
        Self {
            budget: KvBudget::new(capacity),
            prefixes: Vec::new(),
            evictions: 0,
        }
    }
}

impl KvRoom<Fake> for Room {
    type Reservation = KvReservation;
    fn try_reserve(&mut self, bytes: u64) -> Option<KvReservation> {
        self.budget.try_reserve(bytes)
    }
    fn evict_prefix(&mut self) -> bool {
        self.evictions += 1;
        self.prefixes.pop().is_some()
    }
    fn start(&mut self, s: &mut Fake, reservation: KvReservation) {
        assert!(s.held.is_none(), "started twice");
        s.held = Some(reservation);
    }
}

fn limits(max_num_seqs: usize, max_batch_tokens: usize) -> Limits {
    Limits {
        max_num_seqs,
        max_running_per_adapter: None,
        max_batch_tokens,
        max_waiting: 1_000,
    }
}

fn scheduler(limits: Limits, waiting: Vec<Fake>) -> Scheduler<Fake> {
    let mut s = Scheduler::new(limits);
    for f in waiting {
        s.enqueue(f);
    }
    s
}

fn ids(seqs: &[Fake]) -> Vec<usize> {
    seqs.iter().map(|s| s.id).collect()
}

#[test]
fn one_adapters_flood_does_not_hold_anothers_request_back() {
    // 100 of A's requests queued before one of B's: B is admitted second, not 101st.
    let mut waiting: Vec<Fake> = (0..100).map(|i| Fake::new(i, Some("a"), 5)).collect();
    waiting.push(Fake::new(100, Some("b"), 5));
    let mut s = scheduler(limits(4, 64), waiting);
    assert_eq!(s.admit(&mut Room::new(1_000)), 4);
    assert_eq!(ids(s.running()), [0, 100, 1, 2]);
}

#[test]
fn the_adapter_with_fewest_running_goes_next_and_arrival_order_breaks_ties() {
    let mut s = scheduler(limits(8, 64), vec![Fake::new(0, Some("a"), 5)]);
    let mut room = Room::new(1_000);
    s.admit(&mut room);
    for (id, adapter) in [(1, Some("a")), (2, None), (3, Some("c")), (4, None)] {
        s.enqueue(Fake::new(id, adapter, 5));
    }
    // a runs one; the base model and c none: the base model's oldest (2), then c's (3),
    // then a and the base model have one each: a's (1) arrived first.
    assert_eq!(s.next_to_admit(), Some(1));
    s.admit(&mut room);
    assert_eq!(ids(s.running()), [0, 2, 3, 1, 4]);
}

#[test]
fn an_adapter_at_its_cap_waits_while_others_are_admitted() {
    let mut l = limits(8, 64);
    l.max_running_per_adapter = Some(2);
    let waiting = (0..5)
        .map(|i| Fake::new(i, Some("a"), 5))
        .chain([Fake::new(5, Some("b"), 5)])
        .collect();
    let mut s = scheduler(l, waiting);
    s.admit(&mut Room::new(1_000));
    assert_eq!(ids(s.running()), [0, 5, 1]);
    assert_eq!(s.waiting().len(), 3);
    // A request for more choices than the cap allows at once waits for the others to end.
    let mut wide = Fake::new(9, Some("b"), 5);
    wide.slots = 2;
    s.enqueue(wide);
    s.admit(&mut Room::new(1_000));
    assert_eq!(s.running().len(), 3);
}

#[test]
fn a_request_whose_memory_is_not_free_is_not_skipped() {
    let mut big = Fake::new(0, None, 5);
    big.kv = 80;
    let small = Fake::new(1, Some("b"), 5);
    let mut s = scheduler(limits(8, 64), vec![big, small]);
    let mut room = Room::new(100);
    let other = room.budget.try_reserve(30).unwrap();
    // The big one is chosen (oldest, no adapter running) and does not fit: nothing is
    // admitted, though the small one would fit, or a long request would starve.
    assert_eq!(s.admit(&mut room), 0);
    drop(other);
    assert_eq!(s.admit(&mut room), 2);
    assert_eq!(room.budget.reserved(), 90);
}

#[test]
fn cached_prefixes_give_their_memory_back_before_a_request_waits() {
    let mut room = Room::new(100);
    room.prefixes = (0..5)
        .map(|_| room.budget.try_reserve(20).unwrap())
        .collect();
    let mut want = Fake::new(0, None, 5);
    want.kv = 50;
    let mut s = scheduler(limits(8, 64), vec![want]);
    assert_eq!(s.admit(&mut room), 1);
    // Three prefixes went (100 - 40 = 60 free >= 50), two are kept.
    assert_eq!(room.prefixes.len(), 2);
    assert_eq!(room.budget.reserved(), 90);
    // With every prefix gone and still no room, it waits.
    let mut more = Fake::new(1, None, 5);
    more.kv = 60;
    s.enqueue(more);
    assert_eq!(s.admit(&mut room), 0);
    assert!(room.prefixes.is_empty());
}

#[test]
fn expired_requests_leave_the_queue_and_the_rest_keep_their_order() {
    let now = Instant::now();
    let mut seqs: Vec<Fake> = (0..5).map(|i| Fake::new(i, None, 5)).collect();
    seqs[1].deadline = now - Duration::from_millis(1);
    seqs[3].deadline = now;
    let mut s = scheduler(limits(1, 64), seqs);
    assert_eq!(s.next_deadline(), Some(now - Duration::from_millis(1)));
    let expired = s.expire(now);
    assert_eq!(ids(&expired), [1, 3]);
    let left: Vec<usize> = s.waiting().iter().map(|f| f.id).collect();
    assert_eq!(left, [0, 2, 4]);
}

#[test]
fn abandoned_sequences_leave_both_queues_and_give_their_memory_back() {
    let mut room = Room::new(1_000);
    let mut s = scheduler(
        limits(2, 64),
        (0..4).map(|i| Fake::new(i, None, 5)).collect(),
    );
    s.admit(&mut room);
    assert_eq!(room.budget.reserved(), 20);
    s.running_mut()[0].abandoned = true;
    s.enqueue(Fake {
        abandoned: true,
        ..Fake::new(9, None, 5)
    });
    s.drop_abandoned();
    assert_eq!(ids(s.running()), [1]);
    assert_eq!(s.waiting().len(), 2);
    assert_eq!(room.budget.reserved(), 10);
}

#[test]
fn retired_sequences_come_out_in_the_order_asked() {
    let mut room = Room::new(1_000);
    let mut s = scheduler(
        limits(5, 64),
        (0..5).map(|i| Fake::new(i, None, 5)).collect(),
    );
    s.admit(&mut room);
    assert_eq!(ids(&s.retire(&[3, 0, 4])), [3, 0, 4]);
    assert_eq!(ids(s.running()), [1, 2]);
}

#[test]
fn a_step_decodes_every_cached_prompt_then_fills_the_rows_left_with_prompt_chunks() {
    let running = vec![
        Fake::new(0, None, 0),
        Fake::new(1, Some("a"), 100),
        Fake::new(2, Some("a"), 0),
        Fake::new(3, None, 3),
    ];
    let plan = plan(&running, 10);
    // Decodes 0 and 2; then the base model's oldest prompt (3, 3 tokens) and a's oldest
    // (1) round-robin, in admission order: 1 first, taking the 8 rows left; 3 gets none.
    let rows: Vec<(usize, usize, bool)> = plan
        .rows
        .iter()
        .map(|r| (r.seq, r.tokens, r.prompt))
        .collect();
    assert!(rows.contains(&(0, 1, false)));
    assert!(rows.contains(&(2, 1, false)));
    assert!(rows.contains(&(1, 8, true)));
    assert_eq!(plan.tokens(), 10);
    assert_eq!(plan.prompt_tokens(), 8);
    // One adapter's rows side by side: the base model's, then a's.
    let order: Vec<usize> = plan.rows.iter().map(|r| r.seq).collect();
    assert_eq!(order, [0, 1, 2]);
}

#[test]
fn every_adapters_oldest_prompt_gets_a_chunk_before_any_adapters_second() {
    let running = vec![
        Fake::new(0, Some("a"), 4),
        Fake::new(1, Some("a"), 4),
        Fake::new(2, Some("a"), 4),
        Fake::new(3, Some("b"), 4),
    ];
    let plan = plan(&running, 9);
    let mut got: Vec<(usize, usize)> = plan.rows.iter().map(|r| (r.seq, r.tokens)).collect();
    got.sort_unstable();
    assert_eq!(got, [(0, 4), (1, 1), (3, 4)]);
}

/// Sequences of up to four adapters (and the base model), some decoding, some prompting.
fn running_set(max: usize) -> impl Strategy<Value = Vec<Fake>> {
    prop::collection::vec((0..5usize, 0..40usize), 0..max).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(id, (adapter, prompt))| {
                let name = ["a", "b", "c", "d"].get(adapter).copied();
                Fake::new(id, name, prompt)
            })
            .collect()
    })
}

/// Each prompting sequence's turn: how many prompting sequences of its adapter run before it.
fn turns(running: &[Fake]) -> HashMap<usize, usize> {
    let mut seen: HashMap<Option<&str>, usize> = HashMap::new();
    let mut turns = HashMap::new();
    for (i, s) in running.iter().enumerate() {
        if s.prompt_left > 0 {
            let t = seen.entry(s.adapter()).or_default();
            turns.insert(i, *t);
            *t += 1;
        }
    }
    turns
}

/// A request that arrives at an idle engine is taken at once: the intake blocks on the
/// channel (woken by the command itself), and once one command has come it waits for no
/// more. The intake once waited up to 50 ms for more commands after the first whenever
/// nothing ran, which started every request to an idle engine 50 ms late.
#[test]
fn an_idle_engine_takes_a_request_at_once_and_waits_for_no_more() {
    let now = Instant::now();
    let mut s = scheduler(limits(4, 64), Vec::new());
    assert_eq!(s.intake_wait(true, now), IntakeWait::Block);
    assert_eq!(s.intake_wait(false, now), IntakeWait::No);
    // Only sequences waiting for room: sleep until the first deadline, at most 50 ms.
    let mut soon = Fake::new(0, None, 5);
    soon.deadline = now + Duration::from_millis(20);
    s.enqueue(soon);
    assert_eq!(
        s.intake_wait(true, now),
        IntakeWait::AtMost(Duration::from_millis(20))
    );
    assert_eq!(s.intake_wait(false, now), IntakeWait::No);
    let far = scheduler(limits(4, 64), vec![Fake::new(1, None, 5)]);
    assert_eq!(
        far.intake_wait(true, now),
        IntakeWait::AtMost(Duration::from_millis(50))
    );
    // Something running: never wait, the next step is due.
    s.extend_running([Fake::new(2, None, 0)]);
    assert_eq!(s.intake_wait(true, now), IntakeWait::No);
}

proptest! {
    #[test]
    fn a_plan_stays_within_its_budget_and_shares_it_round_robin(
        running in running_set(16),
        extra in 0..64usize,
    ) {
        // The configuration keeps max_batch_tokens at least max_num_seqs.
        let budget = running.len().max(1) + extra;
        let plan = plan(&running, budget);
        prop_assert!(plan.tokens() <= budget);
        let mut seen = vec![false; running.len()];
        for r in &plan.rows {
            prop_assert!(!std::mem::replace(&mut seen[r.seq], true), "a sequence twice");
            let s = &running[r.seq];
            if r.prompt {
                prop_assert!(r.tokens >= 1 && r.tokens <= s.prompt_left);
            } else {
                prop_assert_eq!((r.tokens, s.prompt_left), (1, 0));
            }
        }
        // Every decode has its row.
        for (i, s) in running.iter().enumerate() {
            if s.prompt_left == 0 {
                prop_assert!(seen[i]);
            }
        }
        // The prompts served are a prefix of the (turn, admission order) order, and only
        // the last of them may get less than its whole prompt.
        let turns = turns(&running);
        let mut order: Vec<usize> = turns.keys().copied().collect();
        order.sort_by_key(|i| (turns[i], *i));
        let served: Vec<bool> = order.iter().map(|&i| seen[i]).collect();
        let k = served.iter().take_while(|&&b| b).count();
        prop_assert!(served[k..].iter().all(|&b| !b), "round robin skipped a turn");
        for &i in order.iter().take(k.saturating_sub(1)) {
            let row = plan.rows.iter().find(|r| r.seq == i).unwrap();
            prop_assert_eq!(row.tokens, running[i].prompt_left);
        }
        // Rows of one adapter are side by side.
        let serials: Vec<Option<u64>> =
            plan.rows.iter().map(|r| running[r.seq].adapter_serial()).collect();
        prop_assert!(serials.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn no_prompt_starves_however_many_arrive_after_it(
        arrivals in prop::collection::vec((0..5usize, 1..30usize, 0..3usize), 1..60),
        max_num_seqs in 1..8usize,
        extra in 0..8usize,
    ) {
        // Each step, one sequence may be admitted (if a slot is free) and every decoding
        // sequence ends after its decode count. A sequence admitted with B prompt tokens
        // left in it and in every older prompting sequence finishes its prompt within B
        // steps: the oldest prompt of all gets a chunk every step.
        let budget = max_num_seqs + extra;
        let mut running: Vec<(Fake, usize)> = Vec::new();
        let mut bounds: HashMap<usize, usize> = HashMap::new();
        let mut arrivals = arrivals.into_iter().enumerate().peekable();
        let mut step = 0;
        while arrivals.peek().is_some() || !running.is_empty() {
            step += 1;
            prop_assert!(step < 10_000);
            if running.len() < max_num_seqs && let Some((id, (a, prompt, decodes))) = arrivals.next() {
                let name = ["a", "b", "c", "d"].get(a).copied();
                let ahead: usize = running.iter().map(|(f, _)| f.prompt_left).sum();
                bounds.insert(id, step + ahead + prompt);
                running.push((Fake::new(id, name, prompt), decodes));
            }
            let seqs: Vec<Fake> = running.iter().map(|(f, _)| Fake::new(f.id, f.adapter(), f.prompt_left)).collect();
            let plan = plan(&seqs, budget);
            prop_assert!(plan.tokens() <= budget);
            for r in &plan.rows {
                let (f, decodes) = &mut running[r.seq];
                if r.prompt {
                    f.prompt_left -= r.tokens;
                    if f.prompt_left == 0 {
                        prop_assert!(step <= bounds[&f.id], "sequence {} starved", f.id);
                    }
                } else {
                    *decodes = decodes.saturating_sub(1);
                }
            }
            running.retain(|(f, decodes)| f.prompt_left > 0 || *decodes > 0);
        }
    }

    #[test]
    fn admission_keeps_slots_and_memory_within_their_limits(
        waiting in prop::collection::vec((0..5usize, 1..4usize, 1..40u64), 0..40),
        max_num_seqs in 1..10usize,
        cap in prop::option::of(1..5usize),
        capacity in 1..200u64,
        rounds in 1..6usize,
    ) {
        let mut l = limits(max_num_seqs, 64);
        l.max_running_per_adapter = cap;
        let mut s = Scheduler::new(l);
        for (id, (a, slots, kv)) in waiting.into_iter().enumerate() {
            let name = ["a", "b", "c", "d"].get(a).copied();
            s.enqueue(Fake { slots, kv, ..Fake::new(id, name, 3) });
        }
        let mut room = Room::new(capacity);
        for round in 0..rounds {
            s.admit(&mut room);
            let used: usize = s.running().iter().map(|f| f.slots).sum();
            prop_assert!(used <= max_num_seqs);
            prop_assert!(room.budget.reserved() <= capacity);
            let held: u64 = s.running().iter().map(|f| f.held.as_ref().unwrap().bytes()).sum();
            prop_assert_eq!(held, room.budget.reserved());
            if let Some(cap) = cap {
                let mut per: HashMap<Option<&str>, usize> = HashMap::new();
                for f in s.running() {
                    *per.entry(f.adapter()).or_default() += f.slots;
                }
                prop_assert!(per.values().all(|&n| n <= cap));
            }
            // Nothing admissible is left behind with a slot and memory for it: the next
            // candidate, if any, does not fit.
            if let Some(next) = s.next_to_admit() {
                let f = &s.waiting()[next];
                prop_assert!(
                    used + f.slots > max_num_seqs || room.budget.capacity() - room.budget.reserved() < f.kv
                );
            }
            // Some finish between rounds.
            let done: Vec<usize> = (0..s.running().len()).filter(|i| (i + round) % 2 == 0).collect();
            drop(s.retire(&done));
        }
    }
}
