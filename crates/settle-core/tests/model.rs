//! Model-based test: random sequences of every operation, with random clock
//! advances, principals, generations, tenants and mismatched callers, driven
//! through the pure world. Every SPEC §6 invariant that the rules own is
//! checked after every step.
//!
//! `PROPTEST_CASES` overrides the number of cases (default 10 000).

mod common;

use std::collections::HashMap;

use proptest::prelude::*;
use settle_core::invariants::{check_record, check_transition};
use settle_core::record::MAX_MOVES;
use settle_core::*;

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const WHO: [&str; 2] = ["alice", "bob"];
const SCOPES: [&[&str]; 2] = [&["pay"], &["pay", "refund"]];

#[derive(Clone, Debug)]
enum GenSel {
    Current,
    Above,
    Below,
}

#[derive(Clone, Debug)]
enum FenceSel {
    Current,
    Earlier(u8),
    Bogus(u64),
}

#[derive(Clone, Debug)]
struct Req {
    fp: u8,
    who: u8,
    scopes: u8,
    generation: GenSel,
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Claim {
        tenant: u8,
        key: u8,
        req: Req,
        lease_ms: u64,
        marks_dispatch: bool,
        retention_s: u64,
        claim_id: Option<u8>,
    },
    Heartbeat {
        tenant: u8,
        key: u8,
        fence: FenceSel,
        lease_ms: Option<u64>,
    },
    Dispatch {
        tenant: u8,
        key: u8,
        fence: FenceSel,
    },
    Settle {
        tenant: u8,
        key: u8,
        fence: FenceSel,
        req: Req,
        outcome: u8,
    },
    Release {
        tenant: u8,
        key: u8,
        fence: FenceSel,
        not_committed: bool,
        forget: bool,
    },
    Reconcile {
        tenant: u8,
        key: u8,
        fence: FenceSel,
        finding: u8,
        req: Req,
        outcome: u8,
    },
    Revoke {
        tenant: u8,
        who: u8,
    },
    Expire {
        tenant: u8,
        key: u8,
    },
    Collect {
        tenant: u8,
        key: u8,
    },
    Warn {
        tenant: u8,
        class: u8,
    },
}

fn gen_sel() -> impl Strategy<Value = GenSel> {
    prop_oneof![6 => Just(GenSel::Current), 1 => Just(GenSel::Above), 1 => Just(GenSel::Below)]
}
fn fence_sel() -> impl Strategy<Value = FenceSel> {
    prop_oneof![
        8 => Just(FenceSel::Current),
        2 => (0u8..4).prop_map(FenceSel::Earlier),
        1 => (0u64..40).prop_map(FenceSel::Bogus),
    ]
}
fn req() -> impl Strategy<Value = Req> {
    (
        prop_oneof![6 => Just(0u8), 1 => Just(1u8)],
        prop_oneof![6 => Just(0u8), 1 => Just(1u8)],
        prop_oneof![8 => Just(0u8), 1 => Just(1u8)],
        gen_sel(),
    )
        .prop_map(|(fp, who, scopes, generation)| Req {
            fp,
            who,
            scopes,
            generation,
        })
}
fn tenant() -> impl Strategy<Value = u8> {
    prop_oneof![6 => Just(0u8), 1 => Just(1u8)]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..3;
    prop_oneof![
        3 => prop_oneof![
            4 => 0u64..300,
            2 => 300u64..3000,
            1 => 3000u64..20_000,
        ].prop_map(Op::Advance),
        5 => (tenant(), key.clone(), req(), 100u64..3000, any::<bool>(), 1u64..30, proptest::option::of(0u8..2)).prop_map(
            |(tenant, key, req, lease_ms, marks_dispatch, retention_s, claim_id)| Op::Claim {
                tenant, key, req, lease_ms, marks_dispatch, retention_s, claim_id
            }
        ),
        1 => (tenant(), key.clone(), fence_sel(), proptest::option::of(100u64..3000))
            .prop_map(|(tenant, key, fence, lease_ms)| Op::Heartbeat { tenant, key, fence, lease_ms }),
        2 => (tenant(), key.clone(), fence_sel()).prop_map(|(tenant, key, fence)| Op::Dispatch { tenant, key, fence }),
        5 => (tenant(), key.clone(), fence_sel(), req(), 0u8..5)
            .prop_map(|(tenant, key, fence, req, outcome)| Op::Settle { tenant, key, fence, req, outcome }),
        2 => (tenant(), key.clone(), fence_sel(), any::<bool>(), proptest::bool::weighted(0.25)).prop_map(|(tenant, key, fence, not_committed, forget)| Op::Release { tenant, key, fence, not_committed, forget }),
        3 => (tenant(), key.clone(), fence_sel(), 0u8..3, req(), 0u8..3).prop_map(
            |(tenant, key, fence, finding, req, outcome)| Op::Reconcile { tenant, key, fence, finding, req, outcome }
        ),
        1 => (tenant(), 0u8..2).prop_map(|(tenant, who)| Op::Revoke { tenant, who }),
        1 => (tenant(), key.clone()).prop_map(|(tenant, key)| Op::Expire { tenant, key }),
        1 => (tenant(), key).prop_map(|(tenant, key)| Op::Collect { tenant, key }),
        1 => (tenant(), 0u8..3).prop_map(|(tenant, class)| Op::Warn { tenant, class }),
    ]
}

fn outcome(n: u8) -> Outcome {
    match n {
        0 => common::completed(1),
        1 => common::completed(2),
        2 => common::failed(1),
        3 => common::unknown(),
        _ => common::failed(2),
    }
}

struct Model {
    w: World,
    now: u64,
    tenants: [TenantId; 2],
    /// Every fence granted so far, per record, to pick "earlier" fences from.
    fences: HashMap<(TenantId, Key), Vec<Fence>>,
    max_fence: Option<Fence>,
    /// Terminal receipts handed out: (record created_at, receipt).
    acked: HashMap<(TenantId, Key), (Timestamp, Receipt)>,
    /// Every move of every principal's generation: (generation left, when).
    moves: HashMap<(TenantId, Principal), Vec<(u64, Timestamp)>>,
}

impl Model {
    fn new() -> Model {
        Model {
            w: World::default(),
            now: common::T0,
            tenants: [TenantId::new("t0").unwrap(), TenantId::new("t1").unwrap()],
            fences: HashMap::new(),
            max_fence: None,
            acked: HashMap::new(),
            moves: HashMap::new(),
        }
    }

    fn binding(&self, t: &TenantId, r: &Req) -> Binding {
        let principal = Principal::new(WHO[r.who as usize]).unwrap();
        let cur = self.w.generation(t, &principal);
        let generation = match r.generation {
            GenSel::Current => cur,
            GenSel::Above => cur + 1,
            GenSel::Below => cur.saturating_sub(1),
        };
        Binding {
            principal,
            scopes: Scopes::from_strs(SCOPES[r.scopes as usize].iter().copied()).unwrap(),
            generation,
        }
    }

    fn fence(&self, t: &TenantId, k: &Key, sel: &FenceSel) -> Fence {
        let id = (t.clone(), k.clone());
        match sel {
            FenceSel::Current => self
                .w
                .records
                .get(&id)
                .and_then(|r| r.last_fence())
                .unwrap_or(Fence(1)),
            FenceSel::Earlier(i) => {
                let fs = self.fences.get(&id).cloned().unwrap_or_default();
                if fs.is_empty() {
                    Fence(1)
                } else {
                    fs[fs.len().saturating_sub(1 + *i as usize).min(fs.len() - 1)]
                }
            }
            FenceSel::Bogus(n) => Fence(*n),
        }
    }

    #[allow(clippy::too_many_lines)] // one scenario, kept whole
    fn command(&self, op: &Op) -> Option<(TenantId, Command)> {
        let t = |i: &u8| self.tenants[*i as usize].clone();
        let k = |i: &u8| Key::new(KEYS[*i as usize]).unwrap();
        Some(match op {
            Op::Advance(_) => return None,
            Op::Claim {
                tenant,
                key,
                req,
                lease_ms,
                marks_dispatch,
                retention_s,
                claim_id,
            } => {
                let tn = t(tenant);
                let mut c = Claim::new(k(key), common::fp(req.fp), self.binding(&tn, req));
                c.lease_ms = LeaseMs::new(*lease_ms).unwrap();
                c.marks_dispatch = *marks_dispatch;
                c.retention_s = RetentionS::new(*retention_s).unwrap();
                // Two ids, so that retries (rule 5a) and other claims both occur.
                c.claim_id =
                    claim_id.map(|i| ClaimId::new(format!("model-claim-id-{i:04}")).unwrap());
                (tn, Command::Claim(c))
            }
            Op::Heartbeat {
                tenant,
                key,
                fence,
                lease_ms,
            } => {
                let tn = t(tenant);
                let fence = self.fence(&tn, &k(key), fence);
                (
                    tn,
                    Command::Heartbeat(Heartbeat {
                        key: k(key),
                        fence,
                        lease_ms: lease_ms.map(|m| LeaseMs::new(m).unwrap()),
                    }),
                )
            }
            Op::Dispatch { tenant, key, fence } => {
                let tn = t(tenant);
                let fence = self.fence(&tn, &k(key), fence);
                (tn, Command::Dispatch(Dispatch { key: k(key), fence }))
            }
            Op::Settle {
                tenant,
                key,
                fence,
                req,
                outcome: o,
            } => {
                let tn = t(tenant);
                let fence = self.fence(&tn, &k(key), fence);
                let binding = self.binding(&tn, req);
                (
                    tn,
                    Command::Settle(Settle {
                        key: k(key),
                        fence,
                        fingerprint: common::fp(req.fp),
                        binding,
                        outcome: outcome(*o),
                    }),
                )
            }
            Op::Release {
                tenant,
                key,
                fence,
                not_committed,
                forget,
            } => {
                let tn = t(tenant);
                let fence = self.fence(&tn, &k(key), fence);
                (
                    tn,
                    Command::Release(Release {
                        key: k(key),
                        fence,
                        reason: if *not_committed {
                            ReleaseReason::NotCommitted
                        } else {
                            ReleaseReason::NotDispatched
                        },
                        forget: *forget,
                    }),
                )
            }
            Op::Reconcile {
                tenant,
                key,
                fence,
                finding,
                req,
                outcome: o,
            } => {
                let tn = t(tenant);
                let fence = self.fence(&tn, &k(key), fence);
                let finding = match finding {
                    0 => Finding::committed(
                        common::fp(req.fp),
                        self.binding(&tn, req),
                        outcome(if *o == 2 { 4 } else { *o }),
                    )
                    .unwrap(),
                    1 => Finding::NotCommitted,
                    _ => Finding::Unavailable,
                };
                (
                    tn,
                    Command::Reconcile(Reconcile {
                        key: k(key),
                        fence,
                        finding,
                    }),
                )
            }
            Op::Revoke { tenant, who } => (
                t(tenant),
                Command::Revoke(Revoke {
                    principal: Principal::new(WHO[*who as usize]).unwrap(),
                }),
            ),
            Op::Expire { tenant, key } => (t(tenant), Command::Expire { key: k(key) }),
            Op::Collect { tenant, key } => (t(tenant), Command::Collect { key: k(key) }),
            Op::Warn { tenant, class } => (
                t(tenant),
                Command::Warn(Warn {
                    task: TaskId::new("task").unwrap(),
                    class: WarningClass::new(format!("c{class}")).unwrap(),
                    detail: None,
                }),
            ),
        })
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        if let Op::Advance(ms) = op {
            self.now += ms;
            return Ok(());
        }
        let (tn, cmd) = self.command(op).expect("not an advance");
        let now = Timestamp(self.now);
        let before = self.w.clone();
        let applied = self.w.execute(&tn, &cmd, now);
        for (id, st) in &self.w.principals {
            let was = before.principals.get(id).copied().unwrap_or_default();
            if st.generation != was.generation {
                self.moves
                    .entry(id.clone())
                    .or_default()
                    .push((was.generation, now));
            }
        }
        self.check(&before, &tn, &cmd, &applied, now)
    }

    #[allow(clippy::too_many_lines)] // one scenario, kept whole
    fn check(
        &mut self,
        before: &World,
        tn: &TenantId,
        cmd: &Command,
        applied: &Applied,
        now: Timestamp,
    ) -> Result<(), TestCaseError> {
        let margin = before.limits.lease_margin_ms;
        // An invalid command changes nothing at all.
        if let Reply::Invalid(_) = &applied.reply {
            prop_assert!(!applied.changed && !applied.fence_used);
            prop_assert_eq!(&self.w.records, &before.records);
            prop_assert_eq!(&self.w.principals, &before.principals);
            prop_assert_eq!(self.w.next_fence, before.next_fence);
            return Ok(());
        }
        // A lease must outlast the margin (SPEC §4 claim), so every valid
        // lease_ms leaves a usable lease.
        if let Command::Claim(c) = cmd {
            prop_assert!(c.lease_ms.get() > margin);
        }
        // §6.8: nothing of another tenant changed.
        for ((t, k), r) in &before.records {
            if t != tn {
                prop_assert_eq!(self.w.records.get(&(t.clone(), k.clone())), Some(r));
            }
        }
        // §6.3: fences strictly increase across the whole store.
        if applied.fence_used {
            let g = match &applied.reply {
                Reply::Claim(d) => *d.grant().expect("a grant"),
                other => return Err(TestCaseError::fail(format!("fence used by {other:?}"))),
            };
            prop_assert!(self.max_fence.is_none_or(|m| g.fence > m));
            self.max_fence = Some(g.fence);
        }
        // Every record keeps the per-record invariants.
        for r in self.w.records.values() {
            if let Err(v) = check_record(r) {
                return Err(TestCaseError::fail(format!("{v} in {r:#?}")));
            }
        }

        let Target::Record(key) = cmd.target() else {
            return Ok(());
        };
        let id = (tn.clone(), key.clone());
        let b = before.records.get(&id);
        let a = self.w.records.get(&id);
        if let Some(g) = match &applied.reply {
            Reply::Claim(d) => d.grant(),
            _ => None,
        } {
            self.fences.entry(id.clone()).or_default().push(g.fence);
        }
        let recreated = match (b, a) {
            (Some(b), Some(a)) => b.created_at != a.created_at,
            _ => true,
        };
        // The "before" as the rules saw it: lazy expiry applied at `now`.
        let b_live = b.filter(|r| !r.is_collectable(now)).map(|r| {
            let mut r = r.clone();
            let mut ps = Principals::new();
            ps.insert(
                r.reservation.principal.clone(),
                before
                    .principals
                    .get(&(tn.clone(), r.reservation.principal.clone()))
                    .copied()
                    .unwrap_or_default(),
            );
            rules::end_lapsed_lease(&mut r, &ps, now);
            r
        });

        if let (Some(b), Some(a), false) = (b, a, recreated)
            && let Err(v) = check_transition(b, a)
        {
            return Err(TestCaseError::fail(format!("{v}: {cmd:?}")));
        }

        // §6.2: completed/failed only from matching evidence of the current, unexpired lease.
        if let Some(a) = a
            && a.status.is_terminal()
            && b_live.as_ref().is_none_or(|b| !b.status.is_terminal())
        {
            let b = b_live.as_ref().expect("a terminal record existed before");
            let (fence, fingerprint, binding, purpose) = match cmd {
                Command::Settle(s) => (s.fence, &s.fingerprint, &s.binding, Purpose::Execute),
                Command::Reconcile(Reconcile {
                    fence,
                    finding: Finding::Committed(f),
                    ..
                }) => (*fence, f.fingerprint(), f.binding(), Purpose::Reconcile),
                other => return Err(TestCaseError::fail(format!("terminal via {other:?}"))),
            };
            let pgen = before
                .principals
                .get(&(tn.clone(), binding.principal.clone()))
                .copied()
                .unwrap_or_default()
                .generation;
            prop_assert!(b.reservation.mismatch(fingerprint, binding).is_none());
            prop_assert_eq!(binding.generation, b.reservation.generation);
            prop_assert_eq!(binding.generation, pgen);
            let l = b.open_lease().expect("settled by the open lease");
            prop_assert_eq!(l.fence, fence);
            prop_assert_eq!(l.purpose, purpose);
            prop_assert!(now.plus_ms(margin) <= l.expires_at);
        }

        // §6.4: a lease released without a receipt only by release(not_dispatched).
        if let (Some(b), Some(a)) = (b_live.as_ref(), a)
            && !recreated
            && let Some(bl) = b.open_lease()
            && let Some(att) = a.attempt_for(bl.fence)
            && let Some(end) = att.lease.ended
        {
            match end.reason {
                LeaseEnd::Settled => prop_assert!(att.receipt.is_some()),
                LeaseEnd::Released => {
                    let by_release = matches!(
                        cmd,
                        Command::Release(Release {
                            reason: ReleaseReason::NotDispatched,
                            ..
                        })
                    );
                    prop_assert!(by_release);
                    prop_assert!(!bl.may_have_dispatched());
                }
                LeaseEnd::NotCommitted => {
                    // The holder's attestation: status and flag stay as they were.
                    let by_release = matches!(
                        cmd,
                        Command::Release(Release {
                            reason: ReleaseReason::NotCommitted,
                            ..
                        })
                    );
                    prop_assert!(by_release);
                    prop_assert_eq!(bl.purpose, Purpose::Execute);
                    prop_assert_eq!(a.status, b.status);
                    prop_assert_eq!(a.reconcile_required, b.reconcile_required);
                }
                LeaseEnd::Refused => prop_assert!(matches!(
                    applied.reply,
                    Reply::Refused(RefusalCode::FingerprintMismatch | RefusalCode::BindingMismatch)
                )),
                LeaseEnd::Unavailable => prop_assert!(matches!(cmd, Command::Reconcile(_))),
                LeaseEnd::Expired | LeaseEnd::Revoked => {
                    // Only a claim rule 4 revokes inside a step; time ended the rest earlier.
                    prop_assert!(
                        matches!(cmd, Command::Claim(_)) && end.reason == LeaseEnd::Revoked
                    );
                }
            }
        }

        // Revocation is dated by the move that ended the lease (the first
        // move off its generation), not by the principal's latest move;
        // checked whenever that move is among the newest the store keeps.
        if let (Some(b), Some(a), false) = (b, a, recreated) {
            for att in &a.attempts {
                let Some(end) = att.lease.ended.filter(|e| e.reason == LeaseEnd::Revoked) else {
                    continue;
                };
                let newly = b
                    .attempt_for(att.lease.fence)
                    .is_none_or(|x| x.lease.ended.is_none());
                if !newly {
                    continue;
                }
                let hist = self
                    .moves
                    .get(&(tn.clone(), a.reservation.principal.clone()))
                    .cloned()
                    .unwrap_or_default();
                let Some(i) = hist.iter().position(|m| m.0 >= att.lease.generation) else {
                    return Err(TestCaseError::fail("revoked without a move"));
                };
                if hist.len() - i <= MAX_MOVES {
                    prop_assert_eq!(end.at, hist[i].1.min(now));
                }
            }
        }

        // Quarantine is not progress: refused evidence leaves `updated_at`
        // as the rules found it, unless the holder's own mismatched
        // evidence ended its lease (settle rule 2).
        if let (Some(b), Some(a), false) = (b_live.as_ref(), a, recreated)
            && applied.reply.quarantined(cmd)
        {
            let ended_by_rule2 = b.open_lease().is_some_and(|l| {
                a.attempt_for(l.fence)
                    .and_then(|x| x.lease.ended)
                    .is_some_and(|e| e.reason == LeaseEnd::Refused)
            });
            if !ended_by_rule2 {
                prop_assert_eq!(a.updated_at, b.updated_at);
            }
        }

        // A repeated reconcile(not_committed) whose lease is already the
        // execute lease it granted returns that grant and changes nothing.
        if let (Command::Reconcile(rc), Reply::Claim(ClaimDecision::Execute(g)), Some(b)) =
            (cmd, &applied.reply, b_live.as_ref())
            && b.open_lease()
                .is_some_and(|l| l.purpose == Purpose::Execute && l.fence == rc.fence)
        {
            prop_assert_eq!(a, Some(b));
            let l = b.open_lease().expect("checked");
            prop_assert_eq!((g.fence, g.lease_expires_at), (l.fence, l.expires_at));
        }

        // Claim rule 5a: a grant without a new fence is a retry of the claim
        // that was granted the live lease: the same grant as first answered,
        // and nothing changed.
        if let (Command::Claim(c), Reply::Claim(d)) = (cmd, &applied.reply)
            && let Some(g) = d.grant()
            && !applied.fence_used
        {
            let b = b_live.as_ref().expect("a retry finds the record");
            let l = b.open_lease().expect("a retry finds the live lease");
            prop_assert!(c.claim_id.is_some() && l.claim_id == c.claim_id);
            prop_assert_eq!(
                (g.fence, g.lease_expires_at),
                (l.fence, l.granted_at.plus_ms(l.lease_ms.get()))
            );
            prop_assert_eq!(a, Some(b));
        }
        // A claim carrying the live lease's claim_id never gets in_flight.
        if let (Command::Claim(c), Some(b)) = (cmd, b_live.as_ref())
            && c.claim_id.is_some()
            && b.reservation.mismatch(&c.fingerprint, &c.binding).is_none()
            && c.binding.generation == b.reservation.generation
            && b.open_lease().is_some_and(|l| l.claim_id == c.claim_id)
        {
            prop_assert!(
                !matches!(applied.reply, Reply::Claim(ClaimDecision::InFlight { .. })),
                "{:?}",
                applied.reply
            );
        }
        // release(forget): a record removed only when it was pending with
        // nothing recorded but leases; a refused forget changes nothing.
        if let Command::Release(rl) = cmd
            && rl.forget
        {
            match (&applied.reply, b_live.as_ref()) {
                (Reply::Released { .. }, Some(b))
                    if b.open_lease().is_some_and(|l| l.fence == rl.fence) =>
                {
                    prop_assert!(a.is_none(), "a forgotten record is gone");
                    prop_assert_eq!(b.status, Status::Pending);
                    prop_assert!(b.receipt.is_none() && !b.reconcile_required && !b.disputed);
                    prop_assert_eq!(b.quarantine_total, 0);
                }
                (Reply::Refused(_), Some(b)) => prop_assert_eq!(a, Some(b)),
                _ => {}
            }
        }
        // A repeated release or reconcile(unavailable) of a lease that
        // call already ended is answered 200 and changes nothing.
        if let (Reply::Released { fence }, Some(b)) = (&applied.reply, b_live.as_ref())
            && b.attempt_for(*fence)
                .is_some_and(|x| x.lease.ended.is_some())
        {
            prop_assert_eq!(a, Some(b));
        }

        // Reply::quarantined says exactly when evidence was quarantined.
        if let (Some(b), Some(a), false) = (b_live.as_ref(), a, recreated) {
            let added = a.quarantine_total - b.quarantine_total;
            prop_assert_eq!(
                added == 1,
                applied.reply.quarantined(cmd),
                "{:?}",
                applied.reply
            );
            prop_assert!(added <= 1);
        }

        // §6.7: a mismatched claim gets no lease and no result.
        if let (Command::Claim(c), Some(b)) = (cmd, b_live.as_ref())
            && b.reservation.mismatch(&c.fingerprint, &c.binding).is_some()
        {
            prop_assert!(
                matches!(applied.reply, Reply::Refused(_)),
                "{:?}",
                applied.reply
            );
        }

        // §6.10: an execute grant only without reconcile_required.
        if let Reply::Claim(ClaimDecision::Execute(_)) = &applied.reply {
            let a = a.expect("granted on a record");
            prop_assert!(!a.reconcile_required);
        }

        // Terminal receipts handed out are the canonical one.
        match &applied.reply {
            Reply::Receipt(rc) if rc.status.is_terminal() => {
                let a = a.expect("a receipt for a record");
                prop_assert_eq!(a.receipt.as_ref(), Some(rc));
                self.acked.insert(id.clone(), (a.created_at, rc.clone()));
            }
            _ => {}
        }
        // §6.6: after a receipt, the next matching claim sees it.
        if let (Command::Claim(c), Some((created, rc))) = (cmd, self.acked.get(&id))
            && let Some(b) = b_live.as_ref()
            && b.created_at == *created
            && b.reservation.mismatch(&c.fingerprint, &c.binding).is_none()
            && !matches!(applied.reply, Reply::Refused(RefusalCode::StaleBinding))
        {
            match &applied.reply {
                Reply::Claim(ClaimDecision::Replay { receipt, .. }) => prop_assert_eq!(receipt, rc),
                other => {
                    return Err(TestCaseError::fail(format!(
                        "expected replay, got {other:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn model_every_invariant_after_every_step(ops in proptest::collection::vec(op(), 1..60)) {
        let mut m = Model::new();
        for op in &ops {
            m.step(op)?;
        }
    }
}

proptest! {
    #[test]
    fn lattice_merge_never_lowers_rank(a in 0u8..5, b in 0u8..5) {
        let all = [Status::Pending, Status::Unknown, Status::Conflict, Status::Failed, Status::Completed];
        let (a, b) = (all[a as usize], all[b as usize]);
        let m = a.merge(b);
        prop_assert!(m.rank() >= a.rank() && m.rank() >= b.rank());
        prop_assert_eq!(m.rank(), a.rank().max(b.rank()));
        prop_assert_eq!(m, b.merge(a).merge(a));
    }

    #[test]
    fn no_operation_sequence_lowers_a_records_rank(ops in proptest::collection::vec(op(), 1..80)) {
        let mut m = Model::new();
        let mut ranks: HashMap<(TenantId, Key), (Timestamp, u8)> = HashMap::new();
        for op in &ops {
            m.step(op)?;
            for (id, r) in &m.w.records {
                if let Some((created, rank)) = ranks.get(id)
                    && *created == r.created_at
                {
                    prop_assert!(r.status.rank() >= *rank);
                }
                ranks.insert(id.clone(), (r.created_at, r.status.rank()));
            }
        }
    }

    #[test]
    fn fences_strictly_increase(ops in proptest::collection::vec(op(), 1..80)) {
        let mut m = Model::new();
        let mut last: Option<Fence> = None;
        for op in &ops {
            m.step(op)?;
            if let Some(f) = m.max_fence {
                prop_assert!(last.is_none_or(|l| f >= l));
                last = Some(f);
            }
        }
        prop_assert_eq!(m.w.next_fence, m.max_fence.map(|f| f.0 + 1).unwrap_or(1));
    }
}
