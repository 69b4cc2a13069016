//! The engine's scheduler: which sequences wait and which run, which waiting sequence is
//! admitted next and on what KV memory, which are refused for waiting too long, and which
//! rows each step runs ([`plan`]). It knows sequences only through [`Schedulable`] and memory
//! only through [`KvRoom`], so every rule here is tested without a model (`tests.rs`).
//!
//! The rules:
//! - **Admission** while `max_num_seqs` slots and KV memory allow (a request for `n` choices
//!   takes `n` slots and their memory at once), fairly: of the adapters with sequences waiting
//!   (the base model counting as one), the one with the fewest slots running goes next, its
//!   oldest waiting sequence first; none beyond `max_running_per_adapter`. No skipping past
//!   the chosen sequence when its memory is not free yet: a long request would starve behind
//!   short ones. Cached prefixes give their memory back before it waits.
//! - **No preemption.** A sequence reserves its prompt plus `max_tokens` of KV when admitted,
//!   so a running sequence never needs memory another holds, and nothing is ever evicted
//!   mid-generation to make room (vLLM allocates blocks as it goes and must preempt, recompute
//!   or swap when they run out; this engine trades some admission headroom for never doing so).
//! - **Expiry**: a sequence still waiting at its deadline is handed back to be refused as
//!   overloaded.
//! - **Steps** ([`plan`]): one decode row for every running sequence whose prompt is cached,
//!   then prompt chunks round-robin by adapter within `max_batch_tokens`; rows of one adapter
//!   side by side.

mod plan;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};

use tokio::time::Instant;

pub(crate) use plan::{StepPlan, plan};

/// What the scheduler needs to know of a sequence.
pub(crate) trait Schedulable {
    /// The adapter it runs with (`None`: the base model): the key of the fair share.
    fn adapter(&self) -> Option<&str>;
    /// A number for the adapter's loaded copy, by which one adapter's rows are put side by
    /// side in a step (`None`: the base model).
    fn adapter_serial(&self) -> Option<u64>;
    /// The sequence slots it takes (its own and those of the choices still to fork from it).
    fn slots(&self) -> usize;
    /// Prompt tokens not yet in its KV cache (0 once it decodes).
    fn prompt_left(&self) -> usize;
    /// The KV bytes it reserves when admitted.
    fn kv_bytes(&self) -> u64;
    /// When it is refused if still waiting.
    fn deadline(&self) -> Instant;
    /// Whether nobody listens to it any more.
    fn is_abandoned(&self) -> bool;
}

/// Where admission finds KV memory for the sequences it admits.
pub(crate) trait KvRoom<S> {
    /// Memory held for one sequence, given back when dropped.
    type Reservation;
    /// `bytes` of memory, if that much is free.
    fn try_reserve(&mut self, bytes: u64) -> Option<Self::Reservation>;
    /// Gives back the memory of one cached prefix; false when none is left.
    fn evict_prefix(&mut self) -> bool;
    /// Starts `s`, just admitted, on its `reservation` (before the next is admitted).
    fn start(&mut self, s: &mut S, reservation: Self::Reservation);
}

/// The scheduler's limits (from [`super::EngineConfig`], which checks them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Slots running at once.
    pub(crate) max_num_seqs: usize,
    /// Slots of one adapter running at once.
    pub(crate) max_running_per_adapter: Option<usize>,
    /// Rows in one step; at least `max_num_seqs`.
    pub(crate) max_batch_tokens: usize,
    /// Sequences waiting beyond which no more are taken in.
    pub(crate) max_waiting: usize,
}

impl From<&super::EngineConfig> for Limits {
    fn from(config: &super::EngineConfig) -> Self {
        Self {
            max_num_seqs: config.max_num_seqs,
            max_running_per_adapter: config.max_running_per_adapter,
            max_batch_tokens: config.max_batch_tokens,
            max_waiting: config.max_waiting,
        }
    }
}

/// How the engine's intake waits for its next command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntakeWait {
    /// Until a command comes, however long: nothing to run, nothing waiting.
    Block,
    /// Until a command comes or this long has passed (only sequences waiting for KV room:
    /// one may expire meanwhile).
    AtMost(std::time::Duration),
    /// Not at all: take what has already come, then step.
    No,
}

/// The longest an idle intake sleeps while sequences wait for room.
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The waiting queue (arrival order) and the running set (admission order).
pub(crate) struct Scheduler<S> {
    limits: Limits,
    waiting: VecDeque<S>,
    running: Vec<S>,
}

impl<S: Schedulable> Scheduler<S> {
    /// An empty scheduler.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// The waiting sequences, oldest first.
    pub(crate) fn waiting(&self) -> &VecDeque<S> {
        &self.waiting
    }

    /// The running sequences, in admission order (the indices a [`StepPlan`] names).
    pub(crate) fn running(&self) -> &[S] {
        &self.running
    }

    /// The running sequences, to feed and sample.
    pub(crate) fn running_mut(&mut self) -> &mut [S] {
        &mut self.running
    }

    /// Whether no more sequences should be taken in (`max_waiting` wait already).
    pub(crate) fn is_full(&self) -> bool {
        self.waiting.len() >= self.limits.max_waiting
    }

    /// Queues `s` behind every sequence waiting.
    pub(crate) fn enqueue(&mut self, s: S) {
        self.waiting.push_back(s);
    }

    /// Adds sequences that start running without admission (choices forked from a running
    /// sequence, on its slots and memory).
    pub(crate) fn extend_running(&mut self, born: impl IntoIterator<Item = S>) {
        self.running.extend(born);
    }

    /// Drops the sequences nobody listens to any more, waiting or running (their memory and
    /// adapter lease go with them).
    pub(crate) fn drop_abandoned(&mut self) {
        self.running.retain(|s| !s.is_abandoned());
        self.waiting.retain(|s| !s.is_abandoned());
    }

    /// Takes out the waiting sequences whose deadline is at or before `now`, to be refused.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<S> {
        let (expired, kept): (Vec<_>, Vec<_>) =
            self.waiting.drain(..).partition(|s| s.deadline() <= now);
        self.waiting = kept.into();
        expired
    }

    /// The earliest deadline of a waiting sequence.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.waiting.iter().map(Schedulable::deadline).min()
    }

    /// How the intake waits for a command at `now`: only the first receive of a turn may
    /// wait (`first`), and only when nothing runs. A request that arrives at an idle engine is
    /// therefore taken at once, and once a command has come the intake takes only what is
    /// already there (a wait for more once delayed every request's first token by 50 ms).
    pub(crate) fn intake_wait(&self, first: bool, now: Instant) -> IntakeWait {
        if !first || !self.running.is_empty() {
            return IntakeWait::No;
        }
        match self.next_deadline() {
            None => IntakeWait::Block,
            Some(d) => IntakeWait::AtMost(d.saturating_duration_since(now).min(IDLE_WAIT)),
        }
    }

    /// Takes out the running sequences at `indices` (each once, any order), in that order.
    pub(crate) fn retire(&mut self, indices: &[usize]) -> Vec<S> {
        let mut order: Vec<usize> = (0..indices.len()).collect();
        order.sort_by_key(|&k| std::cmp::Reverse(indices[k]));
        let mut taken: Vec<Option<S>> = (0..indices.len()).map(|_| None).collect();
        for k in order {
            taken[k] = Some(self.running.remove(indices[k]));
        }
        taken.into_iter().flatten().collect()
    }

    /// Takes out every sequence, running then waiting (the engine stops).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = S> + '_ {
        self.running.drain(..).chain(self.waiting.drain(..))
    }

    /// Takes out the running sequences (a step failed).
    pub(crate) fn drain_running(&mut self) -> impl Iterator<Item = S> + '_ {
        self.running.drain(..)
    }

    /// Admits waiting sequences while slots and `room` allow (see the module's rules), each
    /// started by `room` as it is admitted. Returns how many were admitted.
    pub(crate) fn admit<R: KvRoom<S>>(&mut self, room: &mut R) -> usize {
        let mut used: usize = self.running.iter().map(Schedulable::slots).sum();
        let mut admitted = 0;
        while used < self.limits.max_num_seqs {
            let Some(next) = self.next_to_admit() else {
                break;
            };
            let candidate = &self.waiting[next];
            if used + candidate.slots() > self.limits.max_num_seqs {
                break;
            }
            let bytes = candidate.kv_bytes();
            let reservation = loop {
                if let Some(r) = room.try_reserve(bytes) {
                    break Some(r);
                }
                if !room.evict_prefix() {
                    break None;
                }
            };
            let Some(reservation) = reservation else {
                break;
            };
            let mut s = self.waiting.remove(next).expect("index in range");
            used += s.slots();
            room.start(&mut s, reservation);
            self.running.push(s);
            admitted += 1;
        }
        admitted
    }

    /// The waiting sequence to admit next: of the adapters with sequences waiting, the one
    /// with the fewest slots running, its oldest waiting sequence (arrival order between
    /// equals); none that would go over `max_running_per_adapter`.
    pub(crate) fn next_to_admit(&self) -> Option<usize> {
        let mut running: HashMap<Option<&str>, usize> = HashMap::new();
        for s in &self.running {
            *running.entry(s.adapter()).or_default() += s.slots();
        }
        let mut best: Option<(usize, usize)> = None;
        for (index, s) in self.waiting.iter().enumerate() {
            let n = running.get(&s.adapter()).copied().unwrap_or(0);
            if self
                .limits
                .max_running_per_adapter
                .is_some_and(|cap| n + s.slots() > cap)
            {
                continue;
            }
            if best.is_none_or(|(fewest, _)| n < fewest) {
                best = Some((n, index));
            }
        }
        best.map(|(_, index)| index)
    }

    /// The rows of the next step over the running sequences.
    pub(crate) fn plan(&self) -> StepPlan {
        plan(&self.running, self.limits.max_batch_tokens)
    }
}
