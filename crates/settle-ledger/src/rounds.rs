//! How the default [`Store::execute_batch`](crate::Store::execute_batch)
//! splits a §10 batch into rounds that may run concurrently and still
//! answer exactly what the calls answer one by one, in order (SPEC §10).
//!
//! Two commands commute when they touch distinct records and neither
//! changes what the other reads. Every record command reads principal
//! generations (its binding's and its record owner's), and only two
//! commands change one: `revoke`, and a `claim` whose binding generation is
//! above the principal's current one (claim rules 2 and 4 raise it, which
//! also revokes that principal's older leases on every record). So a round
//! is split where a key repeats, where a task repeats, and around every
//! command that may change a generation: a revoke, or a claim above the
//! generation this batch already knows the principal to have.
//!
//! What is known is a lower bound per principal, learned from answers: a
//! claim that was decided (execute, reconcile, in flight, replay) passed
//! claim rule 1 and left the principal at exactly its binding's generation;
//! a `stale_binding` means the principal is above it. A lower bound is
//! safe: a claim at or below it cannot raise anything (generations never
//! decrease, whatever runs concurrently), and a claim above it only costs
//! a round of its own. A batch whose claims all carry generation 0 (the
//! common case) is never split for generations.

use std::collections::{HashMap, HashSet};

use settle_core::{Command, Key, Principal, RefusalCode, Reply, Target, TaskId};

/// Where the next command of a batch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Into the current round, beside the commands already there.
    Join,
    /// The current round ends first; the command opens the next one.
    NextRound,
    /// The current round ends first; the command runs alone, and its
    /// answer is learned (see [`Rounds::learn`]) before anything after it.
    Alone,
}

/// The planner of one batch: feed it the commands in order.
#[derive(Debug, Default)]
pub struct Rounds {
    keys: HashSet<Key>,
    tasks: HashSet<TaskId>,
    /// Lower bounds of principals' generations learned in this batch.
    known: HashMap<Principal, u64>,
}

impl Rounds {
    /// An empty plan (every principal's generation known to be at least 0).
    pub fn new() -> Rounds {
        Rounds::default()
    }

    /// Where `cmd` goes, given the commands placed before it. Call
    /// [`end_round`](Self::end_round) when a round is flushed.
    pub fn place(&mut self, cmd: &Command) -> Placement {
        if self.may_change_a_generation(cmd) {
            self.end_round();
            return Placement::Alone;
        }
        let fresh = match cmd.target() {
            Target::Record(k) => self.keys.insert(k.clone()),
            Target::Task(t) => self.tasks.insert(t.clone()),
            Target::Principal(_) => unreachable!("a principal command changes a generation"),
        };
        if fresh {
            return Placement::Join;
        }
        self.end_round();
        match cmd.target() {
            Target::Record(k) => self.keys.insert(k.clone()),
            Target::Task(t) => self.tasks.insert(t.clone()),
            Target::Principal(_) => unreachable!(),
        };
        Placement::NextRound
    }

    /// The current round is complete: what comes next starts afresh.
    pub fn end_round(&mut self) {
        self.keys.clear();
        self.tasks.clear();
    }

    /// Learns from the answer to a command placed [`Placement::Alone`].
    pub fn learn(&mut self, cmd: &Command, reply: &Reply) {
        let Command::Claim(c) = cmd else { return };
        let decided = matches!(
            reply,
            Reply::Claim(_) | Reply::Refused(RefusalCode::StaleBinding)
        );
        if decided {
            let g = self.known.entry(c.binding.principal.clone()).or_insert(0);
            *g = (*g).max(c.binding.generation);
        }
    }

    fn may_change_a_generation(&self, cmd: &Command) -> bool {
        match cmd {
            Command::Revoke(_) => true,
            Command::Claim(c) => {
                let known = self.known.get(&c.binding.principal).copied().unwrap_or(0);
                c.binding.generation > known
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_core::testkit::*;
    use settle_core::{ClaimDecision, Fence, Grant, Timestamp};

    fn execute() -> Reply {
        Reply::Claim(ClaimDecision::Execute(Grant {
            fence: Fence(1),
            lease_expires_at: Timestamp(0),
            attempt: 1,
        }))
    }

    #[test]
    fn distinct_records_at_generation_zero_share_a_round() {
        let mut r = Rounds::new();
        for k in ["a", "b", "c"] {
            assert_eq!(r.place(&claim(k, 1, binding("p", 0))), Placement::Join);
        }
        assert_eq!(
            r.place(&claim("a", 1, binding("p", 0))),
            Placement::NextRound
        );
        // The repeated key opened the new round: it is in it.
        assert_eq!(
            r.place(&claim("a", 1, binding("p", 0))),
            Placement::NextRound
        );
        assert_eq!(r.place(&claim("b", 1, binding("p", 0))), Placement::Join);
    }

    #[test]
    fn a_claim_that_may_raise_a_generation_runs_alone_until_learned() {
        let mut r = Rounds::new();
        assert_eq!(r.place(&claim("a", 1, binding("p", 0))), Placement::Join);
        let raise = claim("b", 1, binding("p", 1));
        assert_eq!(r.place(&raise), Placement::Alone);
        // Not learned yet (say, a fingerprint mismatch): still alone.
        r.learn(&raise, &Reply::Refused(RefusalCode::FingerprintMismatch));
        assert_eq!(r.place(&claim("c", 1, binding("p", 1))), Placement::Alone);
        r.learn(&claim("c", 1, binding("p", 1)), &execute());
        assert_eq!(r.place(&claim("d", 1, binding("p", 1))), Placement::Join);
        assert_eq!(r.place(&claim("e", 1, binding("p", 0))), Placement::Join);
        assert_eq!(r.place(&claim("f", 1, binding("q", 1))), Placement::Alone);
        r.learn(
            &claim("g", 1, binding("p", 3)),
            &Reply::Refused(RefusalCode::StaleBinding),
        );
        assert_eq!(r.place(&claim("h", 1, binding("p", 3))), Placement::Join);
        assert_eq!(r.place(&claim("i", 1, binding("p", 4))), Placement::Alone);
    }

    #[test]
    fn a_revoke_runs_alone_and_tasks_split_only_when_repeated() {
        let mut r = Rounds::new();
        assert_eq!(r.place(&claim("a", 1, binding("p", 0))), Placement::Join);
        assert_eq!(r.place(&revoke("p")), Placement::Alone);
        // The revoke ended the round: the same key joins the next one.
        assert_eq!(r.place(&claim("a", 1, binding("p", 0))), Placement::Join);
        assert_eq!(
            r.place(&settle("b", Fence(1), 1, binding("p", 0), completed(1))),
            Placement::Join
        );
    }
}
