//! The checkers: run after every step that touched a key, after every
//! restart, and at the end of a run.

use settle_core::invariants::{check_record, check_transition};
use settle_core::{Binding, ClaimDecision, Digest, Receipt, Record, Status};

/// A broken promise: what, and on which key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The key's index, if the violation concerns one key.
    pub key: Option<usize>,
    /// The checker that fired.
    pub check: &'static str,
    /// What it saw.
    pub detail: String,
}

/// What the checkers remember between steps.
#[derive(Default)]
pub struct Checker {
    /// Per key: the first terminal receipt the ledger answered with.
    canonical: Vec<Option<Receipt>>,
    /// Per key: every receipt the ledger answered with (terminal or `unknown`).
    acked: Vec<Vec<Receipt>>,
    /// Per key: the record as last seen.
    last: Vec<Option<Record>>,
    /// The highest fence the ledger granted by a claim and acknowledged.
    max_grant: u64,
    /// The store's `lease_margin_ms`.
    margin_ms: u64,
    /// Everything found so far.
    pub violations: Vec<Violation>,
}

impl Checker {
    /// A checker for `keys` keys under a lease margin of `margin_ms`.
    pub fn new(keys: usize, margin_ms: u64) -> Checker {
        Checker {
            canonical: vec![None; keys],
            acked: vec![Vec::new(); keys],
            last: vec![None; keys],
            margin_ms,
            ..Checker::default()
        }
    }

    /// Records a violation.
    pub fn fail(&mut self, key: Option<usize>, check: &'static str, detail: impl Into<String>) {
        self.violations.push(Violation {
            key,
            check,
            detail: detail.into(),
        });
    }

    /// A claim granted a lease: fences strictly increase, also across
    /// restarts (SPEC §2 lease, §6.3).
    pub fn on_grant(&mut self, key: usize, d: &ClaimDecision) {
        if let Some(g) = d.grant() {
            if g.fence.0 <= self.max_grant {
                self.fail(
                    Some(key),
                    "6.3-fence-reused",
                    format!(
                        "granted fence {} after fence {} was acknowledged",
                        g.fence.0, self.max_grant
                    ),
                );
            }
            self.max_grant = self.max_grant.max(g.fence.0);
        }
    }

    /// The ledger answered with a receipt to a caller with `fingerprint`.
    pub fn on_receipt(&mut self, key: usize, fingerprint: &Digest, rc: &Receipt) {
        if &rc.fingerprint != fingerprint {
            self.fail(
                Some(key),
                "6.7-mismatch-got-result",
                format!("a receipt for another request: {rc:?}"),
            );
        }
        if rc.status.is_terminal() {
            match &self.canonical[key] {
                None => self.canonical[key] = Some(rc.clone()),
                Some(c) if c != rc => {
                    let detail = format!("receipt {rc:?} after canonical {c:?}");
                    self.fail(Some(key), "one-true-outcome", detail);
                }
                Some(_) => {}
            }
        }
        if !self.acked[key].contains(rc) {
            self.acked[key].push(rc.clone());
        }
    }

    /// A claim was answered `replay`: it must be the canonical receipt.
    pub fn on_replay(
        &mut self,
        key: usize,
        fingerprint: &Digest,
        outcome_digest: Option<Digest>,
        rc: &Receipt,
    ) {
        if &rc.fingerprint != fingerprint {
            self.fail(
                Some(key),
                "6.7-mismatch-got-result",
                format!("replayed to another request: {rc:?}"),
            );
        }
        if outcome_digest != rc.response_sha256 || !rc.status.is_terminal() {
            self.fail(
                Some(key),
                "replay-equals-receipt",
                format!("outcome digest {outcome_digest:?} with {rc:?}"),
            );
        }
        match &self.canonical[key] {
            // Committed but never acknowledged (the power went during its
            // sync and the write survived): the first sighting is canonical.
            None => self.canonical[key] = Some(rc.clone()),
            Some(c) if c != rc => {
                let detail = format!("replayed {rc:?}, acknowledged {c:?}");
                self.fail(Some(key), "replay-equals-receipt", detail);
            }
            Some(_) => {}
        }
    }

    /// A caller with `fingerprint`/`binding` got a result (replay or
    /// receipt): the record's reservation must be theirs (SPEC §6.7).
    pub fn result_owner(
        &mut self,
        key: usize,
        r: &Record,
        fingerprint: &Digest,
        binding: &Binding,
    ) {
        if let Some(code) = r.reservation.mismatch(fingerprint, binding) {
            self.fail(
                Some(key),
                "6.7-mismatch-got-result",
                format!("{} caller got a result", code.code()),
            );
        }
    }

    /// The record of `key` as `get` shows it now (`None`: absent).
    pub fn record(&mut self, key: usize, r: Option<&Record>) {
        let Some(r) = r else {
            if self.canonical[key].is_some()
                || !self.acked[key].is_empty()
                || self.last[key].is_some()
            {
                self.fail(
                    Some(key),
                    "6.5-acknowledged-record-lost",
                    "the record is gone",
                );
            }
            return;
        };
        if let Err(v) = check_record(r) {
            self.fail(Some(key), "6-invariants", v.to_string());
        }
        if let Some(prev) = &self.last[key]
            && let Err(v) = check_transition(prev, r)
        {
            self.fail(Some(key), "6-transition", v.to_string());
        }
        if let Some(c) = &self.canonical[key]
            && r.receipt.as_ref() != Some(c)
        {
            let detail = format!("acknowledged {c:?}, stored {:?}", r.receipt);
            self.fail(Some(key), "6.5-receipt-unchanged", detail);
        }
        if let (Some(o), Some(rc)) = (&r.outcome, &r.receipt)
            && o.response_sha256() != rc.response_sha256
        {
            self.fail(
                Some(key),
                "outcome-matches-receipt",
                format!("{o:?} vs {rc:?}"),
            );
        }
        self.acked_unknown_receipts(key, r);
        self.margins(key, r);
        self.last[key] = Some(r.clone());
    }

    /// `unknown` receipts stay on their attempt (while it is kept).
    fn acked_unknown_receipts(&mut self, key: usize, r: &Record) {
        let mut bad = Vec::new();
        for rc in self.acked[key]
            .iter()
            .filter(|rc| rc.status == Status::Unknown)
        {
            if let Some(a) = r.attempt_for(rc.fence)
                && a.receipt.as_ref() != Some(rc)
            {
                bad.push(format!(
                    "acknowledged {rc:?}, attempt holds {:?}",
                    a.receipt
                ));
            }
        }
        for b in bad {
            self.fail(Some(key), "6.5-receipt-unchanged", b);
        }
    }

    /// SPEC §4 settle rule 1: every receipt was committed with at least
    /// the lease margin left on its lease.
    fn margins(&mut self, key: usize, r: &Record) {
        let mut bad = Vec::new();
        for a in &r.attempts {
            if let Some(rc) = &a.receipt
                && rc.committed_at.plus_ms(self.margin_ms) > a.lease.expires_at
            {
                bad.push(format!(
                    "fence {} committed at {} ms with its lease expiring at {} ms (margin {} ms)",
                    rc.fence.0, rc.committed_at.0, a.lease.expires_at.0, self.margin_ms
                ));
            }
        }
        for b in bad {
            self.fail(Some(key), "4-settle-margin", b);
        }
    }

    /// The record last seen for `key`.
    pub fn last(&self, key: usize) -> Option<&Record> {
        self.last[key].as_ref()
    }

    /// Whether anything was ever acknowledged on `key`.
    pub fn touched(&self, key: usize) -> bool {
        self.last[key].is_some()
    }
}
