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
    })
}
/// `release(not_committed)`.
pub fn release_not_committed(k: &str, fence: Fence) -> Command {
    Command::Release(Release {
        key: key(k),
        fence,
        reason: ReleaseReason::NotCommitted,
    })
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
