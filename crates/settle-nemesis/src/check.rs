//! The checker: plain functions over what the run recorded — the
//! workload's history (every `run_once` with its times and answer) and the
//! counting remote's log (every effect it applied, every fence it refused).
//! No I/O: the unit tests below feed it histories that break each rule.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One `run_once` as the workload saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Op {
    /// The client that ran it.
    pub client: u32,
    /// The idempotency key.
    pub key: String,
    /// Invocation and completion, ms since the run's start.
    pub start_ms: u64,
    pub end_ms: u64,
    /// The outcome's `id` (the remote's number of the effect it applied)
    /// when the run returned an outcome; `None` when it failed.
    pub outcome_id: Option<u64>,
    /// The outcome was a replay.
    pub replayed: bool,
    /// The fence of the receipt the run returned (`None`: it failed, or
    /// the client could not tell).
    #[serde(default)]
    pub receipt_fence: Option<u64>,
    /// The error's class when it failed.
    pub error: Option<String>,
    /// Run after the nemesis stopped and everything healed.
    pub after_heal: bool,
}

/// One event of the counting remote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RemoteEvent {
    /// An effect applied (never de-duplicated): its number.
    Apply { key: String, fence: u64, id: u64 },
    /// An effect or query refused: its fence is below one seen for the key
    /// (SPEC §1, remote-side fencing; not a violation).
    Fenced { key: String, fence: u64, seen: u64 },
    /// A reconcile query and what it answered.
    Query {
        key: String,
        fence: u64,
        applied: Option<u64>,
    },
}

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Verdict {
    /// Each broken rule, one line each.
    pub violations: Vec<String>,
    /// Keys the history touched.
    pub keys: usize,
    /// Effects the remote applied.
    pub applied: usize,
    /// Effects and queries the remote refused by fence.
    pub fenced: usize,
    /// Keys left without a terminal answer after the heal (liveness).
    pub unresolved: Vec<String>,
}

/// Checks the rules of docs/reliability.md over a run:
///
/// 1. at most one applied effect per key at the remote;
/// 2. every outcome a run returned (executed or replayed) names the
///    effect the remote applied for its key;
/// 3. no acknowledged outcome is lost: after the heal, a key that had one
///    is replayed (never executed again) with the same outcome; and every
///    answer for a key after its first receipt carries that receipt (its
///    fence), before the heal too — a receipt lost and then reconciled
///    names the same effect under another fence;
/// 4. liveness: after the heal every key the history touched gets an
///    outcome (its reconcile hook can always tell here).
pub fn check(history: &[Op], remote: &[RemoteEvent]) -> Verdict {
    let mut v = Verdict::default();
    let mut applied: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for e in remote {
        match e {
            RemoteEvent::Apply { key, id, .. } => {
                v.applied += 1;
                applied.entry(key).or_default().push(*id);
            }
            RemoteEvent::Fenced { .. } => v.fenced += 1,
            RemoteEvent::Query { .. } => {}
        }
    }
    for (key, ids) in &applied {
        if ids.len() > 1 {
            v.violations.push(format!(
                "at most once: key {key} was applied {} times (effects {ids:?})",
                ids.len()
            ));
        }
    }
    let keys: BTreeSet<&str> = history.iter().map(|o| o.key.as_str()).collect();
    v.keys = keys.len();
    let mut acknowledged: BTreeMap<&str, u64> = BTreeMap::new();
    for o in history.iter().filter(|o| !o.after_heal) {
        let Some(id) = o.outcome_id else { continue };
        match applied.get(o.key.as_str()) {
            Some(ids) if ids.contains(&id) => {}
            Some(ids) => v.violations.push(format!(
                "outcome: client {} got effect {id} for key {} at {} ms, the remote applied {ids:?}",
                o.client, o.key, o.end_ms
            )),
            None => v.violations.push(format!(
                "outcome: client {} got effect {id} for key {} at {} ms, the remote applied none",
                o.client, o.key, o.end_ms
            )),
        }
        acknowledged.entry(o.key.as_str()).or_insert(id);
    }
    lost_receipts(history, &mut v.violations);
    let mut resolved: BTreeSet<&str> = BTreeSet::new();
    for o in history.iter().filter(|o| o.after_heal) {
        let Some(id) = o.outcome_id else { continue };
        resolved.insert(o.key.as_str());
        if !applied
            .get(o.key.as_str())
            .is_some_and(|ids| ids.contains(&id))
        {
            v.violations.push(format!(
                "outcome: after the heal key {} answered effect {id}, the remote applied {:?}",
                o.key,
                applied.get(o.key.as_str())
            ));
        }
        if let Some(&before) = acknowledged.get(o.key.as_str()) {
            if !o.replayed {
                v.violations.push(format!(
                    "lost receipt: key {} had effect {before} acknowledged, and ran again after the heal",
                    o.key
                ));
            } else if id != before {
                v.violations.push(format!(
                    "lost receipt: key {} had effect {before} acknowledged, replays {id} after the heal",
                    o.key
                ));
            }
        }
    }
    v.unresolved = keys
        .iter()
        .filter(|k| !resolved.contains(*k))
        .map(|k| (*k).to_string())
        .collect();
    for k in &v.unresolved {
        v.violations
            .push(format!("liveness: key {k} has no outcome after the heal"));
    }
    v
}

/// Rule 3's second half: per key, in the order the answers arrived, every
/// receipt after the first is that one (a key's receipt never changes).
fn lost_receipts(history: &[Op], violations: &mut Vec<String>) {
    let mut answers: Vec<&Op> = history
        .iter()
        .filter(|o| o.outcome_id.is_some() && o.receipt_fence.is_some())
        .collect();
    answers.sort_by_key(|o| o.end_ms);
    let mut first: BTreeMap<&str, &Op> = BTreeMap::new();
    for o in answers {
        let f = *first.entry(o.key.as_str()).or_insert(o);
        // A receipt's answer may arrive after a later run's started: only
        // a run that began after the first receipt was acknowledged must
        // see it.
        if o.receipt_fence != f.receipt_fence && o.start_ms > f.end_ms {
            violations.push(format!(
                "lost receipt: key {} had the receipt of fence {} (effect {}) acknowledged at {} ms, \
                 a run from {} ms got fence {} (effect {})",
                o.key,
                f.receipt_fence.unwrap_or(0),
                f.outcome_id.unwrap_or(0),
                f.end_ms,
                o.start_ms,
                o.receipt_fence.unwrap_or(0),
                o.outcome_id.unwrap_or(0),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, id: Option<u64>, replayed: bool, after_heal: bool) -> Op {
        Op {
            client: 0,
            key: key.into(),
            start_ms: 0,
            end_ms: 1,
            outcome_id: id,
            replayed,
            receipt_fence: id,
            error: id.is_none().then(|| "unavailable".into()),
            after_heal,
        }
    }

    fn apply(key: &str, id: u64) -> RemoteEvent {
        RemoteEvent::Apply {
            key: key.into(),
            fence: id,
            id,
        }
    }

    #[test]
    fn a_clean_run_passes() {
        let h = [
            op("a", Some(1), false, false),
            op("a", Some(1), true, false),
            op("a", None, false, false),
            op("a", Some(1), true, true),
            op("b", None, false, false),
            op("b", Some(2), false, true),
        ];
        let v = check(&h, &[apply("a", 1), apply("b", 2)]);
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!((v.keys, v.applied), (2, 2));
    }

    #[test]
    fn a_second_applied_effect_is_a_violation() {
        let h = [op("a", Some(1), false, false), op("a", Some(1), true, true)];
        let v = check(&h, &[apply("a", 1), apply("a", 2)]);
        assert!(v.violations[0].starts_with("at most once: key a"), "{v:?}");
    }

    #[test]
    fn an_outcome_the_remote_never_applied_is_a_violation() {
        let h = [op("a", Some(7), false, false), op("a", Some(7), true, true)];
        let v = check(&h, &[apply("a", 1)]);
        assert!(
            v.violations.iter().any(|l| l.starts_with("outcome:")),
            "{v:?}"
        );
    }

    #[test]
    fn a_receipt_lost_across_the_heal_is_a_violation() {
        // Acknowledged, then executed again after the heal: the remote
        // shows two effects, and the history a run that was not a replay.
        let h = [
            op("a", Some(1), false, false),
            op("a", Some(2), false, true),
        ];
        let v = check(&h, &[apply("a", 1), apply("a", 2)]);
        assert!(
            v.violations
                .iter()
                .any(|l| l.starts_with("lost receipt: key a")),
            "{v:?}"
        );
    }

    #[test]
    fn a_receipt_replaced_before_the_heal_is_a_violation() {
        // Acknowledged with fence 3, then (the receipt lost, the effect
        // reconciled under fence 5) the same effect under another receipt.
        let mut first = op("a", Some(1), false, false);
        first.receipt_fence = Some(3);
        let mut later = op("a", Some(1), false, false);
        (later.start_ms, later.end_ms, later.receipt_fence) = (5, 6, Some(5));
        let mut healed = op("a", Some(1), true, true);
        (healed.start_ms, healed.end_ms, healed.receipt_fence) = (7, 8, Some(5));
        let v = check(&[first.clone(), later.clone(), healed], &[apply("a", 1)]);
        assert!(
            v.violations
                .iter()
                .any(|l| l.starts_with("lost receipt: key a had the receipt of fence 3")),
            "{v:?}"
        );
        // Overlapping runs that both end with the one receipt are fine,
        // and so is a run that started before the receipt was answered.
        later.receipt_fence = Some(3);
        let mut early = op("a", Some(1), false, false);
        (early.start_ms, early.end_ms, early.receipt_fence) = (0, 9, Some(3));
        let mut healed = op("a", Some(1), true, true);
        (healed.start_ms, healed.end_ms, healed.receipt_fence) = (10, 11, Some(3));
        let v = check(&[first, later, early, healed], &[apply("a", 1)]);
        assert_eq!(v.violations, Vec::<String>::new());
    }

    #[test]
    fn a_key_without_an_outcome_after_the_heal_is_a_violation() {
        let h = [op("a", None, false, false), op("a", None, false, true)];
        let v = check(&h, &[]);
        assert_eq!(v.unresolved, vec!["a".to_string()]);
        assert!(v.violations[0].starts_with("liveness"), "{v:?}");
    }

    #[test]
    fn fenced_refusals_are_counted_not_reported() {
        let h = [op("a", Some(1), false, true)];
        let fenced = RemoteEvent::Fenced {
            key: "a".into(),
            fence: 1,
            seen: 2,
        };
        let v = check(&h, &[fenced, apply("a", 1)]);
        assert_eq!((v.violations.len(), v.fenced), (0, 1));
    }
}
