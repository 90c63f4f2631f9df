//! Builders for tests and examples. They panic on invalid input, which is
//! what a test wants; production code builds commands from validated input.

use crate::*;

/// A [`Key`] from `s`.
pub fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}
/// A fingerprint made of the byte `n` 32 times.
pub fn fp(n: u8) -> Digest {
    Digest([n; 32])
}
/// Principal `p` with the scope `pay` at `generation`.
pub fn binding(p: &str, generation: u64) -> Binding {
    Binding {
        principal: Principal::new(p).unwrap(),
        scopes: Scopes::from_strs(["pay"]).unwrap(),
        generation,
    }
}
/// Principal `p` with `scopes` at `generation`.
pub fn binding_scopes(p: &str, scopes: &[&str], generation: u64) -> Binding {
    Binding {
        principal: Principal::new(p).unwrap(),
        scopes: Scopes::from_strs(scopes.iter().copied()).unwrap(),
        generation,
    }
}
/// A claim of key `k` with fingerprint [`fp`]`(f)` and the spec's defaults.
pub fn claim(k: &str, f: u8, b: Binding) -> Command {
    Command::Claim(Claim::new(key(k), fp(f), b))
}
/// [`claim`] with its own `lease_ms` and `marks_dispatch`.
pub fn claim_with(k: &str, f: u8, b: Binding, lease_ms: u64, marks_dispatch: bool) -> Command {
    let mut c = Claim::new(key(k), fp(f), b);
    c.lease_ms = LeaseMs::new(lease_ms).unwrap();
    c.marks_dispatch = marks_dispatch;
    Command::Claim(c)
}
/// A `completed` outcome `{"charge": n}`; its digest differs per `n`.
pub fn completed(n: u8) -> Outcome {
    Outcome::completed(
        ResultJson::from_value(&serde_json::json!({"charge": n}), 1024).unwrap(),
        Digest([100 + n; 32]),
    )
}
/// A `failed` outcome `{"declined": n}`; its digest differs per `n` and from [`completed`]'s.
pub fn failed(n: u8) -> Outcome {
    Outcome::failed(
        ResultJson::from_value(&serde_json::json!({"declined": n}), 1024).unwrap(),
        Digest([200 + n; 32]),
        None,
    )
}
/// An `unknown` outcome with no error.
pub fn unknown() -> Outcome {
    Outcome::unknown(None)
}
/// A settle of key `k` under `fence` with fingerprint [`fp`]`(f)`.
pub fn settle(k: &str, fence: Fence, f: u8, b: Binding, outcome: Outcome) -> Command {
    Command::Settle(Settle {
        key: key(k),
        fence,
        fingerprint: fp(f),
        binding: b,
        outcome,
    })
}
/// A heartbeat; `lease_ms` `None` keeps the lease's own length.
pub fn heartbeat(k: &str, fence: Fence, lease_ms: Option<u64>) -> Command {
    Command::Heartbeat(Heartbeat {
        key: key(k),
        fence,
        lease_ms: lease_ms.map(|m| LeaseMs::new(m).unwrap()),
    })
}
/// A dispatch of key `k` under `fence`.
pub fn dispatch(k: &str, fence: Fence) -> Command {
    Command::Dispatch(Dispatch { key: key(k), fence })
}
/// `release(not_dispatched)`.
pub fn release(k: &str, fence: Fence) -> Command {
    Command::Release(Release {
        key: key(k),
        fence,
        reason: ReleaseReason::NotDispatched,
        forget: false,
    })
}
/// `release(not_committed)`.
pub fn release_not_committed(k: &str, fence: Fence) -> Command {
    Command::Release(Release {
        key: key(k),
        fence,
        reason: ReleaseReason::NotCommitted,
        forget: false,
    })
}
/// `release(reason, forget = true)`.
pub fn release_forget(k: &str, fence: Fence, reason: ReleaseReason) -> Command {
    Command::Release(Release {
        key: key(k),
        fence,
        reason,
        forget: true,
    })
}
/// [`claim`] carrying `claim_id` (claim rule 5a).
pub fn claim_id(k: &str, f: u8, b: Binding, id: &str) -> Command {
    let mut c = Claim::new(key(k), fp(f), b);
    c.claim_id = Some(ClaimId::new(id).unwrap());
    Command::Claim(c)
}
/// `record` as a build before leases kept their `claim_id` stored it
/// (the engines' format-2 fixtures decode to this).
pub fn without_claim_ids(mut record: Record) -> Record {
    for a in &mut record.attempts {
        a.lease.claim_id = None;
    }
    record
}
/// A reconcile of key `k` under `fence`.
pub fn reconcile(k: &str, fence: Fence, finding: Finding) -> Command {
    Command::Reconcile(Reconcile {
        key: key(k),
        fence,
        finding,
    })
}
/// A `committed` finding with fingerprint [`fp`]`(f)`.
pub fn committed(f: u8, b: Binding, o: Outcome) -> Finding {
    Finding::committed(fp(f), b, o).unwrap()
}
/// A revoke of principal `p`.
pub fn revoke(p: &str) -> Command {
    Command::Revoke(Revoke {
        principal: Principal::new(p).unwrap(),
    })
}
/// The refusal code of `r`, or `None` when it is no refusal.
pub fn refused(r: &Reply) -> Option<RefusalCode> {
    match r {
        Reply::Refused(c) => Some(*c),
        _ => None,
    }
}
/// The receipt in `r`; panics on any other reply.
pub fn receipt(r: Reply) -> Receipt {
    match r {
        Reply::Receipt(rc) => rc,
        other => panic!("expected a receipt, got {other:?}"),
    }
}

/// A record with every part filled, the fixture of the stored-format tests:
/// disputed and settled (`completed`), an execute attempt that settled
/// `unknown` with an error (its lease dispatched, with a worker), a
/// reconcile attempt that committed the canonical outcome and then met a
/// disagreeing settle (refused, kept as an observation), and quarantined
/// evidence. The default values are those the engines' frozen format
/// fixtures hold ([`full_record`]); the values are parameters so that every
/// pinned copy of this record is built here, each with its own values.
/// Times are milliseconds after `t0`; a digest `n` is the byte `n` 32 times.
#[derive(Debug, Clone)]
pub struct FullRecord {
    /// The instant every other time counts from, in ms since the epoch.
    pub t0: u64,
    /// The record's key.
    pub key: &'static str,
    /// The reservation's fingerprint (also the receipts' and the quarantined evidence's).
    pub fingerprint: u8,
    /// The reservation's principal.
    pub principal: &'static str,
    /// The reservation's scopes.
    pub scopes: &'static [&'static str],
    /// The reservation's generation (also both leases').
    pub generation: u64,
    /// Both leases' length.
    pub lease_ms: u64,
    /// The canonical result (compact JSON) ...
    pub result: &'static str,
    /// ... and its response digest.
    pub response_sha256: u8,
    /// Attempt 1.
    pub execute: FullExecute,
    /// Attempt 2.
    pub reconcile: FullReconcile,
    /// The one quarantine entry kept.
    pub quarantined: FullQuarantined,
    /// The record's retention.
    pub retention_s: u64,
    /// The record's last change.
    pub updated_at: u64,
}

/// Attempt 1 of a [`FullRecord`]: an execute lease, dispatched, settled `unknown`.
#[derive(Debug, Clone)]
pub struct FullExecute {
    /// Its lease's fence.
    pub fence: u64,
    /// When its lease was granted.
    pub granted_at: u64,
    /// Its lease's worker.
    pub worker: &'static str,
    /// When it settled `unknown` (the lease's end, the observation).
    pub settled_at: u64,
    /// The `unknown` receipt's response digest ...
    pub receipt_sha256: u8,
    /// ... and commit time.
    pub receipt_at: u64,
    /// The observation's response digest.
    pub observed_sha256: Option<u8>,
    /// The attempt's error text.
    pub error: &'static str,
    /// Its lease's `claim_id` (none in the format-2 fixtures).
    pub claim_id: Option<&'static str>,
}

/// Attempt 2 of a [`FullRecord`]: a reconcile lease that committed the outcome.
#[derive(Debug, Clone)]
pub struct FullReconcile {
    /// Its lease's fence.
    pub fence: u64,
    /// When its lease was granted.
    pub granted_at: u64,
    /// Its lease's `marks_dispatch` and `dispatched`.
    pub dispatched: bool,
    /// Its lease's worker.
    pub worker: Option<&'static str>,
    /// When the `committed` finding was observed.
    pub observed_at: u64,
    /// When it committed the canonical outcome (the lease's end, the
    /// receipt, the record's `settled_at`).
    pub committed_at: u64,
    /// When the disagreeing settle came ...
    pub refused_at: u64,
    /// ... with this status ...
    pub refused_status: OutcomeStatus,
    /// ... and this response digest.
    pub refused_sha256: u8,
    /// How many observations the attempt has had (two are kept).
    pub observations_total: u32,
}

/// The quarantined evidence of a [`FullRecord`]: a settle with a status of
/// `failed` from another binding.
#[derive(Debug, Clone)]
pub struct FullQuarantined {
    /// When it came.
    pub at: u64,
    /// Under which fence.
    pub fence: u64,
    /// Why it was refused.
    pub reason: RefusalCode,
    /// Its binding's principal ...
    pub principal: &'static str,
    /// ... scopes ...
    pub scopes: &'static [&'static str],
    /// ... and generation.
    pub generation: u64,
    /// Its response digest.
    pub response_sha256: u8,
    /// How many entries the record has had quarantined (one is kept).
    pub total: u64,
}

/// The [`FullRecord`] of the engines' frozen format fixtures
/// (`settle-pg/tests/fixtures`, `settle-embedded/tests/fixtures`).
pub fn full_record() -> Record {
    FullRecord::default().build()
}

/// The open record of the engines' frozen format fixtures: pending, holding
/// an open execute lease (alice at generation 2, fence 8).
pub fn fixture_open_record() -> Record {
    Record {
        key: Key::new("order-2").unwrap(),
        reservation: Reservation {
            fingerprint: Digest([2; 32]),
            principal: Principal::new("alice").unwrap(),
            scopes: Scopes::from_strs(["pay", "refund"]).unwrap(),
            generation: 2,
        },
        status: Status::Pending,
        outcome: None,
        receipt: None,
        reconcile_required: false,
        disputed: false,
        attempts: vec![Attempt {
            number: 1,
            lease: Lease {
                fence: Fence(8),
                purpose: Purpose::Execute,
                generation: 2,
                granted_at: fixture_t(3_000),
                expires_at: fixture_t(33_000),
                lease_ms: LeaseMs::new(30_000).unwrap(),
                marks_dispatch: false,
                dispatched: false,
                worker: None,
                ended: None,
                claim_id: None,
            },
            receipt: None,
            error: None,
            observations: Vec::new(),
            observations_total: 0,
        }],
        attempts_total: 1,
        quarantine: Vec::new(),
        quarantine_total: 0,
        retention_s: RetentionS::new(86_400).unwrap(),
        created_at: fixture_t(3_000),
        updated_at: fixture_t(3_000),
        settled_at: None,
    }
}

/// The warning set of the engines' frozen format fixtures: one saturated
/// class, one not.
pub fn fixture_warnings() -> Vec<Warning> {
    let task = TaskId::new("nightly-export").unwrap();
    vec![
        Warning {
            task: task.clone(),
            class: WarningClass::new("slow-remote").unwrap(),
            count: 3,
            detail: Some(Text::new("detail", "p99 above 2 s").unwrap()),
            first_at: fixture_t(100),
            last_at: fixture_t(900),
            saturated: false,
        },
        Warning {
            task,
            class: WarningClass::new("retry-storm").unwrap(),
            count: 1_000,
            detail: None,
            first_at: fixture_t(200),
            last_at: fixture_t(800),
            saturated: true,
        },
    ]
}

/// The principal state of the engines' frozen format fixtures: bob at
/// generation 3, with the two moves that brought him there.
pub fn fixture_principal() -> PrincipalState {
    PrincipalState::with_moves(
        3,
        fixture_t(1_400),
        &[
            Move {
                left: 1,
                at: fixture_t(50),
            },
            Move {
                left: 2,
                at: fixture_t(1_400),
            },
        ],
    )
}

/// `ms` after the fixtures' epoch ([`FullRecord`]'s `t0`).
fn fixture_t(ms: u64) -> Timestamp {
    Timestamp(FullRecord::default().t0 + ms)
}

impl Default for FullRecord {
    fn default() -> FullRecord {
        FullRecord {
            t0: 1_764_460_800_000, // 2025-11-30T00:00:00Z
            key: "order-1",
            fingerprint: 1,
            principal: "alice",
            scopes: &["pay", "refund"],
            generation: 2,
            lease_ms: 30_000,
            result: r#"{"charge":"ch_1","amount":1250}"#,
            response_sha256: 101,
            execute: FullExecute {
                fence: 5,
                granted_at: 0,
                worker: "w-1",
                settled_at: 1_000,
                receipt_sha256: 150,
                receipt_at: 1_000,
                observed_sha256: Some(150),
                error: "connection reset after send",
                claim_id: Some("c1aim-1d_0f-attempt-1"),
            },
            reconcile: FullReconcile {
                fence: 7,
                granted_at: 1_500,
                dispatched: false,
                worker: None,
                observed_at: 2_000,
                committed_at: 2_000,
                refused_at: 2_500,
                refused_status: OutcomeStatus::Completed,
                refused_sha256: 102,
                // One older observation is no longer kept.
                observations_total: 3,
            },
            quarantined: FullQuarantined {
                at: 1_200,
                fence: 4,
                reason: RefusalCode::StaleFence,
                principal: "bob",
                scopes: &["pay"],
                generation: 0,
                response_sha256: 103,
                total: 2,
            },
            retention_s: 604_800,
            updated_at: 2_500,
        }
    }
}

impl FullRecord {
    /// The record.
    pub fn build(&self) -> Record {
        let q = &self.quarantined;
        Record {
            key: key(self.key),
            reservation: Reservation {
                fingerprint: fp(self.fingerprint),
                principal: Principal::new(self.principal).unwrap(),
                scopes: Scopes::from_strs(self.scopes.iter().copied()).unwrap(),
                generation: self.generation,
            },
            status: Status::Completed,
            outcome: Some(Outcome::completed(
                ResultJson::from_text(self.result, 1024).unwrap(),
                fp(self.response_sha256),
            )),
            receipt: Some(self.settled()),
            reconcile_required: false,
            disputed: true,
            attempts: vec![self.executed(), self.reconciled()],
            attempts_total: 2,
            quarantine: vec![QuarantineEntry {
                at: self.t(q.at),
                fence: Fence(q.fence),
                reason: q.reason,
                call: Call::Settle,
                status: Some(OutcomeStatus::Failed),
                finding: None,
                fingerprint: Some(fp(self.fingerprint)),
                binding: Some(binding_scopes(q.principal, q.scopes, q.generation)),
                response_sha256: Some(fp(q.response_sha256)),
            }],
            quarantine_total: q.total,
            retention_s: RetentionS::new(self.retention_s).unwrap(),
            created_at: self.t(0),
            updated_at: self.t(self.updated_at),
            settled_at: Some(self.t(self.reconcile.committed_at)),
        }
    }

    fn t(&self, ms: u64) -> Timestamp {
        Timestamp(self.t0 + ms)
    }

    /// A lease of the reservation's generation, dispatched, without a
    /// worker, that ended settled.
    fn lease(&self, fence: u64, purpose: Purpose, granted_at: u64, ended_at: u64) -> Lease {
        Lease {
            fence: Fence(fence),
            purpose,
            generation: self.generation,
            granted_at: self.t(granted_at),
            expires_at: self.t(granted_at + self.lease_ms),
            lease_ms: LeaseMs::new(self.lease_ms).unwrap(),
            marks_dispatch: true,
            dispatched: true,
            worker: None,
            ended: Some(Ended {
                reason: LeaseEnd::Settled,
                at: self.t(ended_at),
            }),
            claim_id: None,
        }
    }

    fn receipt(&self, sha: u8, status: Status, fence: u64, at: u64) -> Receipt {
        Receipt {
            key: key(self.key),
            fingerprint: fp(self.fingerprint),
            response_sha256: Some(fp(sha)),
            status,
            fence: Fence(fence),
            committed_at: self.t(at),
            durable: true,
        }
    }

    /// The canonical receipt, the reconcile attempt's.
    fn settled(&self) -> Receipt {
        let r = &self.reconcile;
        self.receipt(
            self.response_sha256,
            Status::Completed,
            r.fence,
            r.committed_at,
        )
    }

    fn executed(&self) -> Attempt {
        let e = &self.execute;
        Attempt {
            number: 1,
            lease: Lease {
                worker: Some(Text::new("worker", e.worker).unwrap()),
                claim_id: e.claim_id.map(|c| ClaimId::new(c).unwrap()),
                ..self.lease(e.fence, Purpose::Execute, e.granted_at, e.settled_at)
            },
            receipt: Some(self.receipt(e.receipt_sha256, Status::Unknown, e.fence, e.receipt_at)),
            error: Some(ErrorText::new("error", e.error).unwrap()),
            observations: vec![Observation {
                at: self.t(e.settled_at),
                call: Call::Settle,
                status: Some(OutcomeStatus::Unknown),
                finding: None,
                response_sha256: e.observed_sha256.map(fp),
                accepted: true,
                code: None,
            }],
            observations_total: 1,
        }
    }

    fn reconciled(&self) -> Attempt {
        let r = &self.reconcile;
        Attempt {
            number: 2,
            lease: Lease {
                marks_dispatch: r.dispatched,
                dispatched: r.dispatched,
                worker: r.worker.map(|w| Text::new("worker", w).unwrap()),
                ..self.lease(r.fence, Purpose::Reconcile, r.granted_at, r.committed_at)
            },
            receipt: Some(self.settled()),
            error: None,
            observations: vec![
                Observation {
                    at: self.t(r.observed_at),
                    call: Call::Reconcile,
                    status: Some(OutcomeStatus::Completed),
                    finding: Some(FindingKind::Committed),
                    response_sha256: Some(fp(self.response_sha256)),
                    accepted: true,
                    code: None,
                },
                Observation {
                    at: self.t(r.refused_at),
                    call: Call::Settle,
                    status: Some(r.refused_status),
                    finding: None,
                    response_sha256: Some(fp(r.refused_sha256)),
                    accepted: false,
                    code: Some(RefusalCode::ResultMismatch),
                },
            ],
            observations_total: r.observations_total,
        }
    }
}
