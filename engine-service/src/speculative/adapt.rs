//! Per-sequence adaptivity: speculation turns itself down where it does not pay.
//!
//! Contract: [`SeqSpecState::shape_now`] gives the tree shape for the sequence's next step, or
//! `None` while speculation is paused for it. The node budget follows an exponential moving
//! average of accepted draft tokens per round (`budget = 2 * avg + 2`, within `2..=N`), so a
//! sequence whose drafts keep failing verifies few extra rows. When the average falls below
//! [`PAUSE_BELOW`], drafting pauses for a number of steps that doubles on every consecutive
//! pause (8 up to 128) and resets once a round accepts something. Only rounds that verified
//! at least one draft count. Decisions depend on the token stream only, never on timing, so
//! runs are reproducible.

use super::TreeShape;

/// Average accepted draft tokens per round under which drafting pauses.
pub const PAUSE_BELOW: f32 = 0.3;
const EMA_WEIGHT: f32 = 0.3;
const FIRST_PAUSE_STEPS: u32 = 8;
const MAX_PAUSE_STEPS: u32 = 128;
/// Rounds before a pause may trigger (the average needs some history).
const MIN_ROUNDS: u32 = 4;

#[derive(Clone, Debug)]
pub struct SeqSpecState {
    shape: TreeShape,
    /// Moving average of accepted draft tokens per round.
    avg_accepted: f32,
    rounds: u32,
    paused_steps: u32,
    next_pause: u32,
}

impl SeqSpecState {
    pub fn new(shape: TreeShape) -> SeqSpecState {
        // Optimistic start: the first rounds get the whole budget.
        SeqSpecState {
            shape,
            avg_accepted: shape.max_nodes as f32,
            rounds: 0,
            paused_steps: 0,
            next_pause: FIRST_PAUSE_STEPS,
        }
    }

    pub fn max_shape(&self) -> TreeShape {
        self.shape
    }

    /// Node budget the average allows now.
    pub fn budget(&self) -> usize {
        ((2.0 * self.avg_accepted).round() as usize + 2).clamp(2, self.shape.max_nodes)
    }

    /// The shape for this step, or `None` while paused (counts the paused step).
    pub fn shape_now(&mut self) -> Option<TreeShape> {
        if self.paused_steps > 0 {
            self.paused_steps -= 1;
            return None;
        }
        Some(TreeShape { max_nodes: self.budget(), ..self.shape })
    }

    /// Records a verification round that had `drafted` draft nodes and accepted `accepted`.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.rounds += 1;
        self.avg_accepted =
            (1.0 - EMA_WEIGHT) * self.avg_accepted.min(self.shape.max_nodes as f32) + EMA_WEIGHT * accepted as f32;
        if accepted > 0 {
            self.next_pause = FIRST_PAUSE_STEPS;
        }
        if self.rounds >= MIN_ROUNDS && self.avg_accepted < PAUSE_BELOW {
            self.paused_steps = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE_STEPS);
            // After the pause, probe with a small tree.
            self.avg_accepted = 1.0;
            self.rounds = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_acceptance_keeps_the_full_budget() {
        let mut s = SeqSpecState::new(TreeShape::SEED);
        for _ in 0..50 {
            assert_eq!(s.shape_now(), Some(TreeShape::SEED));
            s.record(15, 8);
        }
    }

    #[test]
    fn failing_drafts_shrink_the_tree_then_pause_with_backoff() {
        let mut s = SeqSpecState::new(TreeShape::SEED);
        let mut budgets = Vec::new();
        let mut paused = 0;
        for _ in 0..400 {
            match s.shape_now() {
                Some(shape) => {
                    budgets.push(shape.max_nodes);
                    s.record(shape.max_nodes - 1, 0);
                }
                None => paused += 1,
            }
        }
        assert_eq!(budgets[0], 16);
        assert!(budgets.windows(2).take(6).all(|w| w[1] <= w[0]), "{budgets:?}");
        assert!(budgets.iter().all(|&b| (2..=16).contains(&b)));
        assert!(paused > 300, "mostly paused: {paused}");
        // A success ends the backoff.
        while s.shape_now().is_none() {}
        s.record(1, 1);
        assert!(s.budget() >= 2);
    }

    #[test]
    fn rounds_without_drafts_change_nothing() {
        let mut s = SeqSpecState::new(TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 });
        for _ in 0..100 {
            s.record(0, 0);
        }
        assert_eq!(s.shape_now().map(|x| x.max_nodes), Some(4));
    }
}
