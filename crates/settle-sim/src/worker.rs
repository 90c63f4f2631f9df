//! The simulator-side worker client: SPEC §11's `run_once` as an event
//! driven state machine (claim, its retransmissions carrying the same
//! `claim_id`; execute with background heartbeats, dispatch when
//! `marks_dispatch`, the effect at the remote under key and fence, settle
//! with retries of the same fence; reconcile through the remote's query;
//! in_flight waits; replay returns; refusals end the run; 503 and
//! transport errors back off and retry until the deadline; a dispatch
//! never answered by then is handed back as §11.11 says).

use settle_core::{
    Binding, Claim, ClaimDecision, ClaimId, Command, Digest, Dispatch, Fence, Finding, Heartbeat,
    LeaseMs, Outcome, Purpose, Reconcile, RefusalCode, Release, ReleaseReason, Reply, ResultJson,
    Scopes, Settle, Text,
};

use crate::remote::{QueryResult, Response, WriteResult};
use crate::world::{Ev, RemoteOp, RemoteRes, World};

/// Who a worker is and what it was asked to do.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// The key's index.
    pub key: usize,
    /// The principal's index.
    pub principal: usize,
    /// Its principal's name.
    pub principal_name: settle_core::Principal,
    /// Scopes it claims with.
    pub scopes: Scopes,
    /// The request's fingerprint.
    pub fingerprint: Digest,
    /// The binding generation it authenticated with.
    pub generation: u64,
    /// Claims with `marks_dispatch`.
    pub marks_dispatch: bool,
    /// Its lease length.
    pub lease_ms: u64,
    /// When it starts (simulated ms).
    pub start: u64,
    /// When `run_once` gives up (simulated ms).
    pub deadline: u64,
    /// A reconciler (SPEC §11.10), not a caller: it asks the hook and
    /// reports, and hands back any execute lease instead of running the
    /// effect (it does not hold the request).
    pub reconciler: bool,
}

impl WorkerSpec {
    /// Its binding at generation `g`.
    pub fn binding(&self, g: u64) -> Binding {
        Binding {
            principal: self.principal_name.clone(),
            scopes: self.scopes.clone(),
            generation: g,
        }
    }
}

#[derive(Clone, Debug)]
enum Pending {
    Ledger(Command),
    Remote(RemoteOp),
}

/// A worker's state.
#[derive(Debug)]
pub struct Worker {
    /// Its number.
    pub id: usize,
    /// The key's index.
    pub key: usize,
    /// What it was asked to do.
    pub spec: WorkerSpec,
    call: u64,
    pending: Option<Pending>,
    epoch: u64,
    hb_epoch: u64,
    lease: Option<(Fence, Purpose)>,
    paused_until: u64,
    reauths: u32,
    /// The fences whose write the remote refused definitively: the only
    /// word on which this worker attests `not_committed`.
    pub refused: Vec<Fence>,
    /// Cleanup after the deadline (SPEC §11.11: a dispatch never answered
    /// is handed back): calls go on until this simulated time.
    cleanup_until: Option<u64>,
    /// How `run_once` ended, once it did.
    pub done: Option<String>,
}

impl Worker {
    /// A worker that has not started.
    pub fn new(id: usize, spec: WorkerSpec) -> Worker {
        Worker {
            id,
            key: spec.key,
            spec,
            call: 0,
            pending: None,
            epoch: 0,
            hb_epoch: 0,
            lease: None,
            paused_until: 0,
            reauths: 0,
            refused: Vec::new(),
            cleanup_until: None,
            done: None,
        }
    }
}

/// The outcome a worker settles for the remote's response.
pub fn outcome_for(key: usize, r: Response) -> Outcome {
    let result =
        ResultJson::from_value(&serde_json::json!({ "op": key }), 1024).expect("small JSON");
    if r.completed {
        Outcome::completed(result, r.digest)
    } else {
        Outcome::failed(result, r.digest, None)
    }
}

impl World {
    /// Delivers an event to worker `w` (paused workers get it when they wake).
    pub fn worker_event(&mut self, w: usize, ev: Ev) {
        if self.workers[w].done.is_some() {
            return;
        }
        let paused_until = self.workers[w].paused_until;
        if paused_until > self.now {
            self.at(paused_until, ev);
            return;
        }
        if !matches!(ev, Ev::Heartbeat { .. }) && self.chance(self.knobs.pause) {
            self.pause(w);
            self.at(self.workers[w].paused_until, ev);
            return;
        }
        match ev {
            Ev::Wake { epoch, .. } if epoch == self.workers[w].epoch => self.on_timer(w),
            Ev::Heartbeat { epoch, .. } if epoch == self.workers[w].hb_epoch => self.heartbeat(w),
            Ev::FromLedger { call, reply, .. } if call == self.workers[w].call => {
                if let Some(Pending::Ledger(cmd)) = self.workers[w].pending.take() {
                    self.workers[w].epoch += 1;
                    self.on_ledger(w, cmd, reply);
                }
            }
            Ev::FromRemote { call, res, .. } if call == self.workers[w].call => {
                if let Some(Pending::Remote(op)) = self.workers[w].pending.take() {
                    self.workers[w].epoch += 1;
                    self.on_remote(w, op, res);
                }
            }
            _ => {}
        }
    }

    /// The process stops (GC pause, VM migration): sometimes for longer
    /// than its lease, so it wakes up as a zombie.
    fn pause(&mut self, w: usize) {
        let lease = self.workers[w].spec.lease_ms;
        let ms = if self.chance(600) {
            lease * self.between(12, 40) / 10
        } else {
            self.between(10, lease / 2)
        };
        if ms > lease {
            self.tally.fault("zombie_pause");
        }
        self.workers[w].paused_until = self.now + ms;
        let key = self.workers[w].key;
        self.log(Some(key), format!("w{w} pauses {ms} ms (lease {lease} ms)"));
    }

    /// A timer fired: a request timed out, or a wait ended.
    fn on_timer(&mut self, w: usize) {
        let now = self.now;
        let wk = &self.workers[w];
        let deadline = wk.cleanup_until.unwrap_or(wk.spec.deadline);
        match self.workers[w].pending.take() {
            // SPEC §11.11: a dispatch that no answer confirmed by the
            // deadline is handed back with `not_dispatched`, and the ledger
            // decides (`receipt_required` when the mark was recorded:
            // then settle `unknown`); never `not_committed` on inference.
            Some(Pending::Ledger(Command::Dispatch(d)))
                if now >= deadline && self.workers[w].cleanup_until.is_none() =>
            {
                let lease = self.workers[w].spec.lease_ms;
                self.workers[w].cleanup_until = Some(now + lease);
                self.log(
                    Some(self.workers[w].key),
                    format!("w{w}'s dispatch was never answered: handing the lease back"),
                );
                let cmd = Command::Release(Release {
                    key: d.key,
                    fence: d.fence,
                    reason: ReleaseReason::NotDispatched,
                    forget: false,
                });
                self.call(w, Pending::Ledger(cmd));
            }
            Some(p) if now >= deadline => {
                let _ = p;
                self.finish(w, "gave up at its deadline");
            }
            Some(Pending::Ledger(cmd)) => self.transmit(w, Pending::Ledger(cmd)),
            Some(Pending::Remote(op)) => self.on_remote(w, op, RemoteRes::Timeout),
            None if now >= deadline => self.finish(w, "gave up at its deadline"),
            None => self.claim(w),
        }
    }

    fn finish(&mut self, w: usize, why: &str) {
        let key = self.workers[w].key;
        self.log(Some(key), format!("w{w} run_once ends: {why}"));
        let wk = &mut self.workers[w];
        wk.done = Some(why.to_string());
        wk.pending = None;
        wk.lease = None;
        wk.hb_epoch += 1;
        wk.epoch += 1;
    }

    /// Sends a new call (a new call number; retransmissions keep it).
    fn call(&mut self, w: usize, p: Pending) {
        self.workers[w].call += 1;
        self.transmit(w, p);
    }

    fn transmit(&mut self, w: usize, p: Pending) {
        let (key, call) = (self.workers[w].key, self.workers[w].call);
        let ev = match &p {
            Pending::Ledger(cmd) => Ev::ToLedger {
                w,
                call,
                cmd: cmd.clone(),
            },
            Pending::Remote(op) => Ev::ToRemote { w, call, op: *op },
        };
        let what = match &p {
            Pending::Ledger(cmd) => cmd.name().to_string(),
            Pending::Remote(op) => format!("{op:?}"),
        };
        self.send(ev, key, &format!("w{w}'s {what}"));
        self.workers[w].pending = Some(p);
        self.timer(w, 300, 1_500);
    }

    fn timer(&mut self, w: usize, lo: u64, hi: u64) {
        let d = self.between(lo, hi);
        self.workers[w].epoch += 1;
        let epoch = self.workers[w].epoch;
        self.at(self.now + d, Ev::Wake { w, epoch });
    }

    fn claim(&mut self, w: usize) {
        let s = &self.workers[w].spec;
        let mut c = Claim::new(
            self.keys[s.key].clone(),
            s.fingerprint,
            s.binding(s.generation),
        );
        // One id per claim (the call number the claim is sent under);
        // retransmissions resend the same command, so the same id.
        let call = self.workers[w].call + 1;
        c.claim_id = Some(ClaimId::new(format!("sim-w{w:05}-call{call:010}")).expect("valid id"));
        c.lease_ms = LeaseMs::new(s.lease_ms).expect("valid lease");
        c.marks_dispatch = s.marks_dispatch;
        c.retention_s = settle_core::RetentionS::new(settle_core::RetentionS::MAX).expect("valid");
        let role = if self.workers[w].spec.reconciler {
            "reconciler"
        } else {
            "w"
        };
        c.worker = Text::new("worker", format!("{role}{w}")).ok();
        self.call(w, Pending::Ledger(Command::Claim(c)));
    }

    fn hold(&mut self, w: usize, fence: Fence, purpose: Purpose) {
        self.workers[w].lease = Some((fence, purpose));
        self.workers[w].hb_epoch += 1;
        let epoch = self.workers[w].hb_epoch;
        let every = self.workers[w].spec.lease_ms / 3;
        self.at(self.now + every, Ev::Heartbeat { w, epoch });
    }

    fn drop_lease(&mut self, w: usize) {
        self.workers[w].lease = None;
        self.workers[w].hb_epoch += 1;
    }

    /// The background heartbeat at a third of the lease (fire and forget).
    fn heartbeat(&mut self, w: usize) {
        let Some((fence, _)) = self.workers[w].lease else {
            return;
        };
        let key = self.workers[w].key;
        let cmd = Command::Heartbeat(Heartbeat {
            key: self.keys[key].clone(),
            fence,
            lease_ms: None,
        });
        self.send(
            Ev::ToLedger { w, call: 0, cmd },
            key,
            &format!("w{w}'s heartbeat"),
        );
        let every = self.workers[w].spec.lease_ms / 3;
        let epoch = self.workers[w].hb_epoch;
        self.at(self.now + every, Ev::Heartbeat { w, epoch });
    }

    /// Waits (back-off or retry-after, with jitter), then claims again.
    fn wait_then_claim(&mut self, w: usize, ms: u64) {
        self.drop_lease(w);
        let jitter = self.between(0, ms / 2 + 10);
        self.workers[w].epoch += 1;
        let epoch = self.workers[w].epoch;
        self.at(self.now + ms + jitter, Ev::Wake { w, epoch });
    }

    fn on_ledger(&mut self, w: usize, cmd: Command, reply: Result<Reply, String>) {
        let Ok(reply) = reply else {
            // 503: back off, then the same call again.
            self.workers[w].pending = Some(Pending::Ledger(cmd));
            self.timer(w, 50, 500);
            return;
        };
        match (&cmd, reply) {
            (Command::Claim(_), Reply::Claim(d)) => self.on_claim(w, d),
            (Command::Dispatch(d), Reply::Dispatched(_)) => {
                self.call(w, Pending::Remote(RemoteOp::Write(d.fence)));
            }
            // The dispatch's answers were lost but it was recorded: the
            // ledger refuses the hand-back, and the record says `unknown`.
            (
                Command::Release(Release {
                    key,
                    fence,
                    reason: ReleaseReason::NotDispatched,
                    ..
                }),
                Reply::Refused(RefusalCode::ReceiptRequired),
            ) => {
                let s = self.workers[w].spec.clone();
                let cmd = Command::Settle(Settle {
                    key: key.clone(),
                    fence: *fence,
                    fingerprint: s.fingerprint,
                    binding: s.binding(s.generation),
                    outcome: Outcome::unknown(None),
                });
                self.call(w, Pending::Ledger(cmd));
            }
            (Command::Reconcile(_), Reply::Claim(ClaimDecision::Execute(g)))
                if self.workers[w].spec.reconciler =>
            {
                // The reconciler never runs the effect: it hands the lease
                // back (nothing was dispatched under it).
                self.release_unused(w, g.fence);
            }
            (Command::Reconcile(_), Reply::Claim(ClaimDecision::Execute(g))) => {
                self.hold(w, g.fence, Purpose::Execute);
                self.execute(w, g.fence);
            }
            (_, Reply::Receipt(rc)) => {
                self.finish(
                    w,
                    &format!(
                        "settled: receipt {} fence {}",
                        rc.status.as_str(),
                        rc.fence.0
                    ),
                );
            }
            (_, Reply::Released { .. }) if self.workers[w].spec.reconciler => {
                self.finish(w, "the reconciler handed the lease back");
            }
            // run_once: a hook that cannot tell ends the run with
            // ReconcileRequired (the record waits for the reconciler).
            (Command::Reconcile(_), Reply::Released { .. }) => {
                self.finish(w, "reconcile required: the hook cannot tell");
            }
            (_, Reply::Released { .. }) => self.wait_then_claim(w, 200),
            (Command::Claim(_), Reply::Refused(RefusalCode::StaleBinding))
                if self.workers[w].reauths < 3 =>
            {
                // The caller re-authenticates and runs again.
                self.workers[w].reauths += 1;
                let p = self.workers[w].spec.principal;
                self.workers[w].spec.generation = self.generation(p);
                self.wait_then_claim(w, 50);
            }
            (_, Reply::Refused(code)) => self.finish(w, &format!("refused: {}", code.code())),
            (_, other) => {
                let key = self.workers[w].key;
                self.check.fail(
                    Some(key),
                    "protocol",
                    format!("{} answered {other:?}", cmd.name()),
                );
            }
        }
    }

    fn on_claim(&mut self, w: usize, d: ClaimDecision) {
        match d {
            // Resolved meanwhile: the reconciler never executes.
            ClaimDecision::Execute(g) if self.workers[w].spec.reconciler => {
                self.release_unused(w, g.fence);
            }
            ClaimDecision::Execute(g) => {
                self.hold(w, g.fence, Purpose::Execute);
                self.execute(w, g.fence);
            }
            ClaimDecision::Reconcile(g) => {
                self.hold(w, g.fence, Purpose::Reconcile);
                self.call(w, Pending::Remote(RemoteOp::Query(g.fence)));
            }
            ClaimDecision::InFlight { .. } if self.workers[w].spec.reconciler => {
                self.finish(w, "skipped: a live lease holds it");
            }
            ClaimDecision::InFlight { retry_after_ms, .. } => {
                self.wait_then_claim(w, retry_after_ms);
            }
            ClaimDecision::Replay { .. } => self.finish(w, "replayed"),
        }
    }

    /// A reconciler hands back an execute lease it never used.
    fn release_unused(&mut self, w: usize, fence: Fence) {
        let key = self.workers[w].key;
        self.drop_lease(w);
        let cmd = Command::Release(Release {
            key: self.keys[key].clone(),
            fence,
            reason: ReleaseReason::NotDispatched,
            forget: false,
        });
        self.call(w, Pending::Ledger(cmd));
    }

    /// `execute`: dispatch first when `marks_dispatch`, then the write.
    fn execute(&mut self, w: usize, fence: Fence) {
        let key = self.workers[w].key;
        if !self.workers[w].spec.marks_dispatch {
            self.call(w, Pending::Remote(RemoteOp::Write(fence)));
            return;
        }
        if self.chance(50) {
            // The effect fails before anything is sent.
            let k = self.keys[key].clone();
            let cmd = Command::Release(Release {
                key: k,
                fence,
                reason: ReleaseReason::NotDispatched,
                forget: false,
            });
            self.call(w, Pending::Ledger(cmd));
            return;
        }
        let cmd = Command::Dispatch(Dispatch {
            key: self.keys[key].clone(),
            fence,
        });
        self.call(w, Pending::Ledger(cmd));
    }

    fn on_remote(&mut self, w: usize, op: RemoteOp, res: RemoteRes) {
        let key = self.workers[w].key;
        let k = self.keys[key].clone();
        let s = self.workers[w].spec.clone();
        let binding = s.binding(s.generation);
        let cmd = match (op, res) {
            (RemoteOp::Write(fence), RemoteRes::Write(WriteResult::Applied(r))) => {
                Command::Settle(Settle {
                    key: k,
                    fence,
                    fingerprint: s.fingerprint,
                    binding,
                    outcome: outcome_for(key, r),
                })
            }
            (RemoteOp::Write(fence), RemoteRes::Write(_)) => {
                // The remote definitively refused: nothing was applied.
                self.workers[w].refused.push(fence);
                Command::Release(Release {
                    key: k,
                    fence,
                    reason: ReleaseReason::NotCommitted,
                    forget: false,
                })
            }
            (RemoteOp::Write(fence), _) => Command::Settle(Settle {
                key: k,
                fence,
                fingerprint: s.fingerprint,
                binding,
                outcome: Outcome::unknown(None),
            }),
            (RemoteOp::Query(fence), res) => {
                let finding = match res {
                    RemoteRes::Query(QueryResult::Committed(r)) => {
                        Finding::committed(s.fingerprint, binding, outcome_for(key, r))
                            .expect("terminal")
                    }
                    RemoteRes::Query(QueryResult::NotCommitted) => Finding::NotCommitted,
                    _ => Finding::Unavailable,
                };
                Command::Reconcile(Reconcile {
                    key: k,
                    fence,
                    finding,
                })
            }
        };
        self.call(w, Pending::Ledger(cmd));
    }
}
