//! The load-until-crash harness: SPEC §6.5, a crash at any instant loses
//! no acknowledged write.
//!
//! A [`Load`] runs `clients` tasks, each claiming fresh keys and settling
//! them `completed`, and records in [`Acked`] every grant and receipt the
//! target acknowledged. The test crashes the target under that load
//! (SIGKILL of a process, kill -9 of PostgreSQL, a failover), restarts it,
//! and then [`Acked::verify`] checks that every acknowledged receipt is
//! there, unchanged, and every acknowledged lease is in its record, and
//! [`Acked::fences_go_on`] that a new claim's fence is above every fence
//! granted.
//!
//! The target is any [`Store`], or a remote that answers the same commands
//! (a test implements [`Target`] for it: the server's tests do, over
//! `settle-client`).
//!
//! ```ignore
//! let workload = Workload::new(tenant, "alice", "crash", 8);
//! let acked = Arc::new(Acked::new());
//! let load = Load::start(store.clone(), &workload, acked.clone());
//! acked.progress(300, Duration::from_secs(90), "before the crash").await;
//! crash_the_store();
//! load.finish().await;
//! let store = reopen();
//! acked.verify(&*store, &workload.tenant, "after the crash").await;
//! acked.fences_go_on(&*store, &workload, "probe", "after the crash").await;
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use settle_core::testkit::{binding, claim, committed, completed, key, reconcile, settle, unknown};
use settle_core::{
    Binding, ClaimDecision, Command, Fence, Key, Receipt, Record, Reply, Status, TenantId,
};
use tokio::sync::watch;

use crate::store::{BoxFuture, Store};

/// What a crash test loads and then checks: every [`Store`] is one; a
/// remote server is one through its client.
pub trait Target: Send + Sync + 'static {
    /// Runs one command. `Err` is no answer: nothing was acknowledged.
    fn run<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, String>>;

    /// What the target shows of `key` now (`get`): `Ok(None)` for no record.
    fn look<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Seen>, String>>;
}

impl<S: Store + ?Sized> Target for S {
    fn run<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, String>> {
        Box::pin(async move { self.execute(tenant, cmd).await.map_err(|e| e.to_string()) })
    }

    fn look<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<Seen>, String>> {
        Box::pin(async move {
            match self.get(tenant, key).await {
                Ok(Ok(r)) => Ok(r.as_ref().map(Seen::from)),
                Ok(Err(code)) => Err(format!("the record is refused: {code:?}")),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// The part of a record the checks read.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The record's status (a pending record with a live lease is `Pending`).
    pub status: Status,
    /// The canonical terminal receipt.
    pub receipt: Option<Receipt>,
    /// Each attempt kept, oldest first: its lease's fence and the receipt
    /// it obtained (terminal or `unknown`).
    pub attempts: Vec<(Fence, Option<Receipt>)>,
}

impl From<&Record> for Seen {
    fn from(r: &Record) -> Seen {
        Seen {
            status: r.status,
            receipt: r.receipt.clone(),
            attempts: r
                .attempts
                .iter()
                .map(|a| (a.lease.fence, a.receipt.clone()))
                .collect(),
        }
    }
}

impl Seen {
    /// The receipt of the attempt under `fence` (the newest such attempt),
    /// `None` when no attempt kept has that fence.
    pub fn attempt_for(&self, fence: Fence) -> Option<&Option<Receipt>> {
        self.attempts
            .iter()
            .rev()
            .find(|(f, _)| *f == fence)
            .map(|(_, rc)| rc)
    }
}

/// What a client does when the target fails a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Every client stops (the target is gone for good: a killed process).
    Stop,
    /// Go on with the next key, after this pause when the claim itself
    /// failed (the target comes back: a restarted database).
    Retry(Duration),
}

/// The load: `clients` tasks, each running claim → settle `completed` on
/// keys `{prefix}-{client}-{n}`, fingerprint 1, under `principal` with the
/// scope `pay`.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The tenant every command runs under.
    pub tenant: TenantId,
    /// The principal of every binding (generation 0).
    pub principal: String,
    /// The keys' prefix: fresh keys, so every first claim must execute.
    pub prefix: String,
    /// How many clients run at once.
    pub clients: usize,
    /// What a failed call does.
    pub on_error: OnError,
    /// Every `n`th key of a client is settled `unknown` first, then claimed
    /// again (`reconcile`) and reconciled `committed`.
    pub unknown_every: Option<u64>,
}

impl Workload {
    /// `clients` clients on keys `{prefix}-…`, stopping at the first failed call.
    pub fn new(tenant: TenantId, principal: &str, prefix: &str, clients: usize) -> Workload {
        Workload {
            tenant,
            principal: principal.to_string(),
            prefix: prefix.to_string(),
            clients,
            on_error: OnError::Stop,
            unknown_every: None,
        }
    }

    /// Goes on after a failed call, pausing `pause` after a failed claim.
    pub fn retrying(mut self, pause: Duration) -> Workload {
        self.on_error = OnError::Retry(pause);
        self
    }

    /// Every `n`th key goes through `unknown` and reconciliation.
    pub fn unknown_every(mut self, n: u64) -> Workload {
        assert!(n > 0, "unknown_every(0)");
        self.unknown_every = Some(n);
        self
    }

    /// The binding every command carries.
    pub fn binding(&self) -> Binding {
        binding(&self.principal, 0)
    }
}

/// One acknowledgement, as the load records it.
#[derive(Debug, Clone, Copy)]
pub enum Ack<'a> {
    /// A claim answered with a lease under `fence`.
    Grant {
        /// The claimed key.
        key: &'a str,
        /// The lease's fence.
        fence: Fence,
    },
    /// A settlement or reconciliation answered with this receipt.
    Receipt(&'a Receipt),
}

type Tap = Box<dyn Fn(Ack<'_>) + Send + Sync>;

/// Everything the target acknowledged: per (key, fence) the grant, and the
/// receipt once it came. Filled by a [`Load`] or, when the load ran in
/// another process, by the test from what that process reported.
pub struct Acked {
    /// (key, fence) → the receipt acknowledged for that lease, if any.
    entries: Mutex<BTreeMap<(String, Fence), Option<Receipt>>>,
    max_granted: AtomicU64,
    receipts: watch::Sender<usize>,
    failed_claims: AtomicU64,
    failed_calls: AtomicU64,
    tap: Option<Tap>,
}

impl Default for Acked {
    fn default() -> Acked {
        Acked::new()
    }
}

impl std::fmt::Debug for Acked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acked")
            .field("entries", &self.entries.lock().len())
            .field("receipts", &self.receipts())
            .field("max_granted", &self.max_granted())
            .finish()
    }
}

/// What [`Acked::verify`] checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verified {
    /// Acknowledged receipts found unchanged.
    pub receipts: usize,
    /// Acknowledged leases without a receipt found in their record.
    pub grants: usize,
}

impl Acked {
    /// Nothing acknowledged yet.
    pub fn new() -> Acked {
        Acked {
            entries: Mutex::new(BTreeMap::new()),
            max_granted: AtomicU64::new(0),
            receipts: watch::Sender::new(0),
            failed_claims: AtomicU64::new(0),
            failed_calls: AtomicU64::new(0),
            tap: None,
        }
    }

    /// Also calls `tap` with each acknowledgement as it is recorded (the
    /// embedded engine's crash child prints them for its parent).
    pub fn tapped(tap: impl Fn(Ack<'_>) + Send + Sync + 'static) -> Acked {
        Acked {
            tap: Some(Box::new(tap)),
            ..Acked::new()
        }
    }

    /// Records a lease granted under `fence` on `key`.
    pub fn grant(&self, key: &str, fence: Fence) {
        self.entries
            .lock()
            .entry((key.to_string(), fence))
            .or_insert(None);
        self.max_granted.fetch_max(fence.0, Ordering::SeqCst);
        if let Some(tap) = &self.tap {
            tap(Ack::Grant { key, fence });
        }
    }

    /// Records an acknowledged receipt (its key and fence name the lease).
    pub fn receipt(&self, rc: Receipt) {
        assert!(rc.durable, "{}: a receipt that is not durable", rc.key);
        self.max_granted.fetch_max(rc.fence.0, Ordering::SeqCst);
        if let Some(tap) = &self.tap {
            tap(Ack::Receipt(&rc));
        }
        let k = rc.key.as_str().to_string();
        let fence = rc.fence;
        let previous = self.entries.lock().insert((k.clone(), fence), Some(rc));
        if let Some(Some(old)) = previous {
            panic!("{k}: a second receipt under {fence:?} (the first: {old:?})");
        }
        self.receipts.send_modify(|n| *n += 1);
    }

    fn failed(&self, claim: bool) {
        self.failed_calls.fetch_add(1, Ordering::SeqCst);
        if claim {
            self.failed_claims.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many receipts were acknowledged.
    pub fn receipts(&self) -> usize {
        *self.receipts.borrow()
    }

    /// How many leases were acknowledged (with a receipt or not).
    pub fn leases(&self) -> usize {
        self.entries.lock().len()
    }

    /// The highest fence acknowledged (0 before any).
    pub fn max_granted(&self) -> Fence {
        Fence(self.max_granted.load(Ordering::SeqCst))
    }

    /// Calls of the load that failed (no answer), claims or not.
    pub fn failed_calls(&self) -> u64 {
        self.failed_calls.load(Ordering::SeqCst)
    }

    /// Claims of the load that failed: nothing was acknowledged for their key.
    pub fn failed_claims(&self) -> u64 {
        self.failed_claims.load(Ordering::SeqCst)
    }

    /// Waits until `n` receipts in all were acknowledged; panics after
    /// `within` ("no progress `what`").
    pub async fn reached(&self, n: usize, within: Duration, what: &str) {
        let mut count = self.receipts.subscribe();
        let wait = count.wait_for(|c| *c >= n);
        match tokio::time::timeout(within, wait).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => unreachable!("the sender lives in self"),
            Err(_) => panic!(
                "no progress {what}: {} receipts after {within:?}, waiting for {n}",
                self.receipts()
            ),
        }
    }

    /// Waits until `n` more receipts were acknowledged; panics after `within`.
    pub async fn progress(&self, n: usize, within: Duration, what: &str) {
        self.reached(self.receipts() + n, within, what).await;
    }

    /// [`Acked::verify_where`] over everything acknowledged.
    pub async fn verify<T: Target + ?Sized>(
        &self,
        target: &T,
        tenant: &TenantId,
        what: &str,
    ) -> Verified {
        self.verify_where(target, tenant, what, |_| true).await
    }

    /// Checks each acknowledgement whose key `keep` accepts against what the
    /// target shows now; panics with `what` on the first one lost.
    ///
    /// * a terminal receipt is the record's receipt, and the record has its status;
    /// * an `unknown` receipt is on the attempt of its fence, and the record
    ///   is at `unknown` or above;
    /// * a lease without a receipt is an attempt of its record.
    pub async fn verify_where<T: Target + ?Sized>(
        &self,
        target: &T,
        tenant: &TenantId,
        what: &str,
        mut keep: impl FnMut(&str) -> bool,
    ) -> Verified {
        let chosen: Vec<((String, Fence), Option<Receipt>)> = self
            .entries
            .lock()
            .iter()
            .filter(|((k, _), _)| keep(k))
            .map(|(e, rc)| (e.clone(), rc.clone()))
            .collect();
        let mut verified = Verified::default();
        for ((k, fence), rc) in chosen {
            let seen = target
                .look(tenant, &key(&k))
                .await
                .unwrap_or_else(|e| panic!("{what}: {k}: {e}"))
                .unwrap_or_else(|| panic!("{what}: acknowledged {k} is gone"));
            match rc {
                Some(rc) => {
                    check_receipt(&seen, &rc, what);
                    verified.receipts += 1;
                }
                None => {
                    assert!(
                        seen.attempt_for(fence).is_some(),
                        "{what}: {k}: the granted lease {fence:?} is not in the record: {seen:?}"
                    );
                    verified.grants += 1;
                }
            }
        }
        verified
    }

    /// Every acknowledged terminal receipt is what a retry of its claim
    /// learns (`replay`); returns how many were replayed.
    pub async fn replays<T: Target + ?Sized>(
        &self,
        target: &T,
        workload: &Workload,
        what: &str,
    ) -> usize {
        let terminal: Vec<Receipt> = self
            .entries
            .lock()
            .values()
            .flatten()
            .filter(|rc| rc.status.is_terminal())
            .cloned()
            .collect();
        for rc in &terminal {
            let k = rc.key.as_str();
            let again = claim(k, 1, workload.binding());
            match target.run(&workload.tenant, again).await {
                Ok(Reply::Claim(ClaimDecision::Replay { receipt, .. })) => {
                    assert_eq!(&receipt, rc, "{what}: {k}: the replayed receipt");
                }
                other => panic!("{what}: {k}: an acknowledged receipt was lost: {other:?}"),
            }
        }
        terminal.len()
    }

    /// A claim of the fresh key `probe` executes under a fence above every
    /// fence acknowledged so far (fences keep increasing across the crash);
    /// records that grant too, and returns its fence.
    pub async fn fences_go_on<T: Target + ?Sized>(
        &self,
        target: &T,
        workload: &Workload,
        probe: &str,
        what: &str,
    ) -> Fence {
        let above = self.max_granted();
        let cmd = claim(probe, 1, workload.binding());
        match target.run(&workload.tenant, cmd).await {
            Ok(Reply::Claim(ClaimDecision::Execute(g))) => {
                assert!(
                    g.fence > above,
                    "{what}: fence {} reused (granted up to {})",
                    g.fence.0,
                    above.0
                );
                self.grant(probe, g.fence);
                g.fence
            }
            other => panic!("{what}: the claim of {probe}: {other:?}"),
        }
    }
}

/// `rc` was acknowledged: `seen` must still hold it.
fn check_receipt(seen: &Seen, rc: &Receipt, what: &str) {
    let k = &rc.key;
    if rc.status.is_terminal() {
        assert_eq!(seen.receipt.as_ref(), Some(rc), "{what}: {k}: the receipt");
        assert_eq!(seen.status, rc.status, "{what}: {k}: the status");
    } else {
        let on_attempt = seen
            .attempt_for(rc.fence)
            .unwrap_or_else(|| panic!("{what}: {k}: the attempt of {:?} is gone", rc.fence));
        assert_eq!(on_attempt.as_ref(), Some(rc), "{what}: {k}: the receipt");
        assert!(
            seen.status.rank() >= Status::Unknown.rank(),
            "{what}: {k}: {:?} after an unknown receipt",
            seen.status
        );
    }
}

/// A running load (see [`Load::start`]).
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<String>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts `workload.clients` clients on `target`, recording into `acked`.
    pub fn start<T: Target + ?Sized>(
        target: Arc<T>,
        workload: &Workload,
        acked: Arc<Acked>,
    ) -> Load {
        Load::start_each(workload, acked, |_| target.clone())
    }

    /// Like [`Load::start`], with a target of its own for each client
    /// (e.g. a connection each).
    pub fn start_each<T: Target + ?Sized>(
        workload: &Workload,
        acked: Arc<Acked>,
        mut target_for: impl FnMut(usize) -> Arc<T>,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let workload = Arc::new(workload.clone());
        let clients = (0..workload.clients)
            .map(|c| {
                let client = Client {
                    target: target_for(c),
                    workload: workload.clone(),
                    acked: acked.clone(),
                    stop: stop.clone(),
                    error: error.clone(),
                    number: c,
                };
                tokio::spawn(client.run())
            })
            .collect();
        Load {
            stop,
            error,
            clients,
        }
    }

    /// Stops the clients (each after the call it is in) and waits for them.
    /// Returns the error that stopped them, if one did ([`OnError::Stop`]).
    /// A client's panic (a wrong answer) is passed on.
    pub async fn finish(self) -> Option<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.ended().await
    }

    /// Waits until the clients stop by themselves ([`OnError::Stop`]: at
    /// the first failed call); returns that call's error.
    pub async fn ended(self) -> Option<String> {
        for c in self.clients {
            if let Err(e) = c.await {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        self.error.lock().take()
    }
}

/// A call of the load failed: the error, and whether it was the claim
/// (then nothing was acknowledged for the key).
struct Failed {
    error: String,
    claim: bool,
}

struct Client<T: Target + ?Sized> {
    target: Arc<T>,
    workload: Arc<Workload>,
    acked: Arc<Acked>,
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<String>>>,
    number: usize,
}

impl<T: Target + ?Sized> Client<T> {
    async fn run(self) {
        let w = &*self.workload;
        let mut n = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            let k = format!("{}-{}-{n}", w.prefix, self.number);
            let unknown_first = w.unknown_every.is_some_and(|e| n % e == e - 1);
            n += 1;
            let Err(failed) = self.pair(&k, unknown_first).await else {
                continue;
            };
            self.acked.failed(failed.claim);
            match w.on_error {
                OnError::Stop => {
                    self.error.lock().get_or_insert(failed.error);
                    self.stop.store(true, Ordering::SeqCst);
                }
                // Do not spin while the target is down.
                OnError::Retry(pause) if failed.claim => tokio::time::sleep(pause).await,
                OnError::Retry(_) => {}
            }
        }
    }

    async fn call(&self, cmd: Command, claim: bool) -> Result<Reply, Failed> {
        self.target
            .run(&self.workload.tenant, cmd)
            .await
            .map_err(|error| Failed { error, claim })
    }

    /// One fresh key: claim, then settle `completed`, or settle `unknown`,
    /// claim again and reconcile `committed`. Every answer is recorded as it
    /// comes; an answer no fresh key can get is a panic.
    async fn pair(&self, k: &str, unknown_first: bool) -> Result<(), Failed> {
        let b = self.workload.binding();
        let fence = match self.call(claim(k, 1, b.clone()), true).await? {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            // A fresh key: anything else means a claim ran twice after its
            // first run had committed.
            other => panic!("{k}: a first claim answered {other:?}"),
        };
        self.acked.grant(k, fence);
        if !unknown_first {
            let done = self.call(settle(k, fence, 1, b, completed(1)), false);
            self.acked.receipt(receipt(k, done.await?));
            return Ok(());
        }
        let timed_out = self.call(settle(k, fence, 1, b.clone(), unknown()), false);
        self.acked.receipt(receipt(k, timed_out.await?));
        let g = match self.call(claim(k, 1, b.clone()), false).await? {
            Reply::Claim(ClaimDecision::Reconcile(g)) => g,
            other => panic!("{k}: a claim after an unknown receipt answered {other:?}"),
        };
        self.acked.grant(k, g.fence);
        let found = committed(1, b, completed(1));
        let reconciled = self.call(reconcile(k, g.fence, found), false);
        self.acked.receipt(receipt(k, reconciled.await?));
        Ok(())
    }
}

fn receipt(k: &str, reply: Reply) -> Receipt {
    match reply {
        Reply::Receipt(rc) => rc,
        other => panic!("{k}: the settlement answered {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;

    fn acme() -> TenantId {
        TenantId::new("acme").unwrap()
    }

    /// Runs `w` on a fresh in-memory store until `receipts` receipts were
    /// acknowledged, then stops it.
    async fn ran(w: &Workload, acked: Acked, receipts: usize) -> (Arc<MemStore>, Arc<Acked>) {
        let store = Arc::new(MemStore::default());
        let acked = Arc::new(acked);
        let load = Load::start(store.clone(), w, acked.clone());
        (acked.progress(receipts, Duration::from_secs(30), "in memory")).await;
        assert_eq!(load.finish().await, None);
        (store, acked)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_acknowledgement_of_a_load_is_verified() {
        let w = Workload::new(acme(), "alice", "t", 4).unknown_every(3);
        let (store, acked) = ran(&w, Acked::new(), 200).await;
        let v = acked.verify(&*store, &w.tenant, "in memory").await;
        assert!(v.receipts >= 200, "{v:?}");
        assert_eq!(v.receipts, acked.receipts());
        // Every lease got its receipt; every third key has two (unknown,
        // then reconciled), and only terminal receipts replay.
        assert_eq!((v.receipts, v.grants), (acked.leases(), 0));
        let unknowns = (acked.entries.lock().values().flatten())
            .filter(|rc| rc.status == Status::Unknown)
            .count();
        assert!(unknowns > 0);
        assert_eq!(
            acked.replays(&*store, &w, "in memory").await,
            v.receipts - unknowns
        );
        let before = acked.max_granted();
        let f = acked.fences_go_on(&*store, &w, "probe", "in memory").await;
        assert!(f > before);
        assert_eq!(acked.max_granted(), f);
        assert_eq!((acked.failed_calls(), acked.failed_claims()), (0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tap_sees_each_acknowledgement_as_it_is_recorded() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tap = {
            let seen = seen.clone();
            move |a: Ack<'_>| {
                seen.lock().push(match a {
                    Ack::Grant { key, fence } => format!("grant {key} {}", fence.0),
                    Ack::Receipt(rc) => format!("receipt {} {}", rc.key, rc.fence.0),
                })
            }
        };
        let w = Workload::new(acme(), "alice", "tap", 1).unknown_every(2);
        let (_, acked) = ran(&w, Acked::tapped(tap), 3).await;
        let seen = seen.lock();
        // tap-0-0 settles completed; tap-0-1 goes through unknown.
        assert_eq!(
            seen[..5],
            [
                "grant tap-0-0 1",
                "receipt tap-0-0 1",
                "grant tap-0-1 2",
                "receipt tap-0-1 2",
                "grant tap-0-1 3",
            ]
        );
        assert_eq!(seen[5], "receipt tap-0-1 3");
        assert_eq!(seen.len(), acked.leases() + acked.receipts());
    }

    /// An empty store, and a lease on `k` under fence 1 acknowledged
    /// before a crash that (here) lost everything.
    fn lost_lease(k: &str) -> (MemStore, Workload, Acked) {
        let acked = Acked::new();
        acked.grant(k, Fence(1));
        let w = Workload::new(acme(), "alice", "after", 1);
        (MemStore::default(), w, acked)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "acknowledged lost-0-0 is gone")]
    async fn a_lost_acknowledgement_is_caught() {
        let (store, w, acked) = lost_lease("lost-0-0");
        acked.verify(&store, &w.tenant, "empty store").await;
    }

    /// Verifies, against a store that ran the load, one of its receipts
    /// of `status` as if it had been acknowledged committed a moment later.
    async fn verify_a_changed_receipt(status: Status) {
        let w = Workload::new(acme(), "alice", "changed", 1).unknown_every(1);
        let (store, acked) = ran(&w, Acked::new(), 2).await;
        let mut rc = (acked.entries.lock().values().flatten())
            .find(|rc| rc.status == status)
            .cloned()
            .unwrap();
        rc.committed_at.0 += 1;
        let changed = Acked::new();
        changed.receipt(rc);
        changed.verify(&*store, &w.tenant, "in memory").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "the receipt")]
    async fn a_changed_receipt_is_caught() {
        verify_a_changed_receipt(Status::Completed).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "the receipt")]
    async fn a_changed_unknown_receipt_is_caught() {
        verify_a_changed_receipt(Status::Unknown).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "fence 1 reused")]
    async fn a_reused_fence_is_caught() {
        let (store, w, acked) = lost_lease("gone");
        acked.fences_go_on(&store, &w, "probe", "empty store").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopping_load_ends_at_the_first_failure() {
        /// A target that never answers.
        struct Down;
        impl Target for Down {
            fn run<'a>(
                &'a self,
                _: &'a TenantId,
                _: Command,
            ) -> BoxFuture<'a, Result<Reply, String>> {
                Box::pin(async { Err("down".to_string()) })
            }
            fn look<'a>(
                &'a self,
                _: &'a TenantId,
                _: &'a Key,
            ) -> BoxFuture<'a, Result<Option<Seen>, String>> {
                Box::pin(async { Err("down".to_string()) })
            }
        }
        let w = Workload::new(acme(), "alice", "down", 3);
        let acked = Arc::new(Acked::new());
        let load = Load::start(Arc::new(Down), &w, acked.clone());
        assert_eq!(load.ended().await.as_deref(), Some("down"));
        assert!(acked.failed_claims() >= 1);
        assert_eq!(acked.leases(), 0);
    }
}
