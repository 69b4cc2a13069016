//! Work that several threads hand over at about the same time, run as one: the meeting
//! point of the engines that share one model (see `LlamaModel::forward_shared`).
//!
//! Each thread hands its request over and blocks. The first to arrive while nothing runs
//! leads: it waits, at most the window, for every member of the previous round to hand its
//! next request over, runs all the requests it has as one, and gives each member its result.
//! A member alone never waits (the previous round had only itself). A member that stops
//! handing requests over says so ([`Lockstep::leave`]: an engine with nothing to run, paused
//! or asleep), and nobody waits for it; one that stops without saying so costs the others
//! one window, once.
//!
//! Requests and results travel by value, so nothing here is unsafe: a member's borrowed
//! state (a KV cache) is moved into its request and back out of its result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Rounds of requests `Q`, each member's answered with an `A`.
pub(crate) struct Lockstep<Q, A> {
    /// How long a leader waits for the other members of the previous round.
    window: Duration,
    state: Mutex<State<Q, A>>,
    changed: Condvar,
    /// Rounds run.
    rounds: AtomicU64,
    /// Rounds that started when the window ran out, not when the last round's members were
    /// all there.
    waited_out: AtomicU64,
}

struct State<Q, A> {
    /// Requests handed over and not yet run: (member, ticket, request).
    pending: Vec<(u64, u64, Q)>,
    /// Whether a member is leading (waiting for the others, or running a round).
    leading: bool,
    /// Results by ticket, until their member takes them.
    finished: HashMap<u64, A>,
    /// The members of the last round.
    last: Vec<u64>,
    next_ticket: u64,
    next_member: u64,
}

impl<Q, A> Lockstep<Q, A> {
    /// A lockstep whose leaders wait at most `window` for the previous round's members.
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            state: Mutex::new(State {
                pending: Vec::new(),
                leading: false,
                finished: HashMap::new(),
                last: Vec::new(),
                next_ticket: 0,
                next_member: 0,
            }),
            changed: Condvar::new(),
            rounds: AtomicU64::new(0),
            waited_out: AtomicU64::new(0),
        }
    }

    /// A new member's number, naming it from round to round.
    pub(crate) fn member(&self) -> u64 {
        let mut state = self.state.lock();
        state.next_member += 1;
        state.next_member
    }

    /// `member` hands nothing over until its next request: no leader waits for it.
    pub(crate) fn leave(&self, member: u64) {
        let mut state = self.state.lock();
        if let Some(i) = state.last.iter().position(|m| *m == member) {
            state.last.swap_remove(i);
            self.changed.notify_all();
        }
    }

    /// Rounds run so far.
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Rounds so far that started when the window ran out.
    #[cfg(test)]
    pub(crate) fn waited_out(&self) -> u64 {
        self.waited_out.load(Ordering::Relaxed)
    }

    /// Hands `request` over as `member`'s and blocks until the round it joined is done.
    /// `round` runs a round: the requests in, one result for each, in the same order, out
    /// (it runs on the leader's thread, and must not panic: a panic there leaves the others
    /// waiting).
    pub(crate) fn meet(&self, member: u64, request: Q, round: impl FnOnce(Vec<Q>) -> Vec<A>) -> A {
        let mut state = self.state.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.pending.push((member, ticket, request));
        self.changed.notify_all();
        let mut round = Some(round);
        loop {
            if let Some(answer) = state.finished.remove(&ticket) {
                return answer;
            }
            if state.leading {
                self.changed.wait(&mut state);
                continue;
            }
            // Only the member whose request is still pending can lead: this one.
            let round = round
                .take()
                .expect("a member leads at most once per request");
            self.lead(&mut state, round);
        }
    }

    fn lead(&self, state: &mut MutexGuard<'_, State<Q, A>>, round: impl FnOnce(Vec<Q>) -> Vec<A>) {
        state.leading = true;
        let deadline = tokio::time::Instant::now() + self.window;
        while !state
            .last
            .iter()
            .all(|m| state.pending.iter().any(|(member, _, _)| member == m))
        {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || self.changed.wait_for(state, left).timed_out() {
                self.waited_out.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        let (who, requests): (Vec<(u64, u64)>, Vec<Q>) = std::mem::take(&mut state.pending)
            .into_iter()
            .map(|(member, ticket, request)| ((member, ticket), request))
            .unzip();
        self.rounds.fetch_add(1, Ordering::Relaxed);
        let answers = MutexGuard::unlocked(state, || round(requests));
        assert_eq!(answers.len(), who.len(), "one answer per request");
        state.last = who.iter().map(|(member, _)| *member).collect();
        state
            .finished
            .extend(who.into_iter().map(|(_, ticket)| ticket).zip(answers));
        state.leading = false;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// Members hammering one lockstep from their own threads: each gets the answer to its own
    /// request, every time, and their requests share rounds.
    #[test]
    fn every_member_gets_its_own_answer_and_rounds_are_shared() {
        const MEMBERS: u64 = 4;
        const TIMES: u64 = 200;
        // A window long enough that members held up by a busy machine are waited for.
        let window = Duration::from_secs(1);
        let lockstep = Arc::new(Lockstep::<(u64, u64), (u64, u64, usize)>::new(window));
        let start = Arc::new(Barrier::new(MEMBERS as usize));
        let threads: Vec<_> = (0..MEMBERS)
            .map(|_| {
                let (lockstep, start) = (lockstep.clone(), start.clone());
                std::thread::spawn(move || {
                    let me = lockstep.member();
                    start.wait();
                    for i in 0..TIMES {
                        let answer = lockstep.meet(me, (me, i), |requests| {
                            // A round takes time, as a forward pass does: a member that
                            // got no CPU at first is there for the next one.
                            std::thread::sleep(Duration::from_millis(1));
                            let n = requests.len();
                            requests.into_iter().map(|(m, i)| (m, i, n)).collect()
                        });
                        assert_eq!((answer.0, answer.1), (me, i), "another member's answer");
                        assert!(answer.2 <= MEMBERS as usize);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a member panicked");
        }
        let requests = MEMBERS * TIMES;
        // In lockstep, about one round per `MEMBERS` requests; alone, one per request.
        assert!(
            lockstep.rounds() < requests / 2,
            "{} rounds for {requests} requests: the members did not share rounds",
            lockstep.rounds()
        );
    }

    /// One member alone never waits for anyone; a member that stops without a word costs the
    /// other one window, not one per round; one that leaves costs nothing.
    #[test]
    fn nobody_waits_for_a_member_that_is_gone() {
        let lockstep = Arc::new(Lockstep::<u32, u32>::new(Duration::from_millis(20)));
        let double = |requests: Vec<u32>| requests.into_iter().map(|r| 2 * r).collect();
        let alone = lockstep.member();
        for i in 0..50 {
            assert_eq!(lockstep.meet(alone, i, double), 2 * i);
        }
        assert_eq!(
            lockstep.waited_out(),
            0,
            "a member alone waited for the window"
        );

        let start = Arc::new(Barrier::new(2));
        let leaving = {
            let (lockstep, start) = (lockstep.clone(), start.clone());
            std::thread::spawn(move || {
                let me = lockstep.member();
                start.wait();
                assert_eq!(lockstep.meet(me, 7, double), 14);
            })
        };
        start.wait();
        for i in 0..50 {
            assert_eq!(lockstep.meet(alone, i, double), 2 * i);
        }
        leaving.join().expect("the leaving member panicked");
        assert!(
            lockstep.waited_out() <= 2,
            "{} rounds waited out the window after one member left",
            lockstep.waited_out()
        );

        // Two members in step; one leaves, saying so: the other goes on without waiting.
        let (other, start) = (lockstep.member(), Arc::new(Barrier::new(2)));
        let before = lockstep.waited_out();
        let in_step = {
            let (lockstep, start) = (lockstep.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                assert_eq!(lockstep.meet(other, 1, double), 2);
                lockstep.leave(other);
            })
        };
        start.wait();
        assert_eq!(lockstep.meet(alone, 3, double), 6);
        in_step.join().expect("the other member panicked");
        for i in 0..20 {
            assert_eq!(lockstep.meet(alone, i, double), 2 * i);
        }
        assert!(
            lockstep.waited_out() - before <= 1,
            "{} rounds waited for a member that had left",
            lockstep.waited_out() - before
        );
    }
}
