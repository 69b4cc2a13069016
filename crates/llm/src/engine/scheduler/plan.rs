//! The step plan: which running sequences take part in the next forward pass, and with how
//! many tokens.

use std::collections::HashMap;

use super::Schedulable;

/// One sequence's part in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    /// Its index among the running sequences.
    pub(crate) seq: usize,
    /// How many tokens it feeds: 1 for a decode, the chunk's length for a prompt.
    pub(crate) tokens: usize,
    /// Whether they are prompt tokens (else its last generated token).
    pub(crate) prompt: bool,
}

/// The rows of one step, one adapter's side by side (base model first), each sequence once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepPlan {
    /// In the order the forward pass takes them.
    pub(crate) rows: Vec<Row>,
}

impl StepPlan {
    /// Prompt tokens the step feeds.
    pub(crate) fn prompt_tokens(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.prompt)
            .map(|r| r.tokens)
            .sum()
    }

    /// Tokens the step feeds, decodes and prompt chunks.
    #[cfg(test)]
    pub(crate) fn tokens(&self) -> usize {
        self.rows.iter().map(|r| r.tokens).sum()
    }
}

/// The next step over `running`, within `max_batch_tokens` rows: a decode row for every
/// sequence whose prompt is cached (at most `max_num_seqs` of them, which the configuration
/// keeps within `max_batch_tokens`), then prompt chunks in the rows left, round-robin by
/// adapter: every adapter's oldest prompt before any adapter's second, and so on (admission
/// order between equals). So the oldest prompt of all always gets a chunk, a flood of one
/// adapter's prompts cannot hold another's back, and a long prompt is prefilled over several
/// steps without stalling the sequences already decoding.
pub(crate) fn plan<S: Schedulable>(running: &[S], max_batch_tokens: usize) -> StepPlan {
    let mut budget = max_batch_tokens;
    let mut rows = Vec::with_capacity(running.len());
    for (seq, s) in running.iter().enumerate() {
        if s.prompt_left() == 0 {
            rows.push(Row {
                seq,
                tokens: 1,
                prompt: false,
            });
            budget = budget.saturating_sub(1);
        }
    }
    let mut turns: HashMap<Option<&str>, usize> = HashMap::new();
    let mut prompts: Vec<(usize, usize)> = Vec::new();
    for (seq, s) in running.iter().enumerate() {
        if s.prompt_left() > 0 {
            let turn = turns.entry(s.adapter()).or_default();
            prompts.push((*turn, seq));
            *turn += 1;
        }
    }
    prompts.sort_unstable();
    for (_, seq) in prompts {
        if budget == 0 {
            break;
        }
        let tokens = running[seq].prompt_left().min(budget);
        rows.push(Row {
            seq,
            tokens,
            prompt: true,
        });
        budget -= tokens;
    }
    // Rows of one adapter side by side, so each adapter runs once per projection.
    rows.sort_by_key(|r| (running[r.seq].adapter_serial(), r.seq));
    StepPlan { rows }
}
