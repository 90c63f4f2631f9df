//! Builders for tests and examples. They panic on invalid input, which is
//! what a test wants; production code builds commands from validated input.

use crate::*;

pub fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}
pub fn fp(n: u8) -> Digest {
    Digest([n; 32])
}
pub fn binding(p: &str, generation: u64) -> Binding {
    Binding {
        principal: Principal::new(p).unwrap(),
        scopes: Scopes::from_strs(["pay"]).unwrap(),
        generation,
    }
}
pub fn binding_scopes(p: &str, scopes: &[&str], generation: u64) -> Binding {
    Binding {
        principal: Principal::new(p).unwrap(),
        scopes: Scopes::from_strs(scopes.iter().copied()).unwrap(),
        generation,
    }
}
pub fn claim(k: &str, f: u8, b: Binding) -> Command {
    Command::Claim(Claim::new(key(k), fp(f), b))
}
pub fn claim_with(k: &str, f: u8, b: Binding, lease_ms: u64, marks_dispatch: bool) -> Command {
    let mut c = Claim::new(key(k), fp(f), b);
    c.lease_ms = LeaseMs::new(lease_ms).unwrap();
    c.marks_dispatch = marks_dispatch;
    Command::Claim(c)
}
pub fn completed(n: u8) -> Outcome {
    Outcome::completed(
        ResultJson::from_value(&serde_json::json!({"charge": n}), 1024).unwrap(),
        Digest([100 + n; 32]),
    )
}
pub fn failed(n: u8) -> Outcome {
    Outcome::failed(
        ResultJson::from_value(&serde_json::json!({"declined": n}), 1024).unwrap(),
        Digest([200 + n; 32]),
        None,
    )
}
pub fn unknown() -> Outcome {
    Outcome::unknown(None)
}
pub fn settle(k: &str, fence: Fence, f: u8, b: Binding, outcome: Outcome) -> Command {
    Command::Settle(Settle {
        key: key(k),
        fence,
        fingerprint: fp(f),
        binding: b,
        outcome,
    })
}
pub fn heartbeat(k: &str, fence: Fence, lease_ms: Option<u64>) -> Command {
    Command::Heartbeat(Heartbeat {
        key: key(k),
        fence,
        lease_ms: lease_ms.map(|m| LeaseMs::new(m).unwrap()),
    })
}
pub fn dispatch(k: &str, fence: Fence) -> Command {
    Command::Dispatch(Dispatch { key: key(k), fence })
}
pub fn release(k: &str, fence: Fence) -> Command {
    Command::Release(Release {
        key: key(k),
        fence,
        reason: ReleaseReason::NotDispatched,
    })
}
pub fn release_not_committed(k: &str, fence: Fence) -> Command {
    Command::Release(Release {
        key: key(k),
        fence,
        reason: ReleaseReason::NotCommitted,
    })
}
pub fn reconcile(k: &str, fence: Fence, finding: Finding) -> Command {
    Command::Reconcile(Reconcile {
        key: key(k),
        fence,
        finding,
    })
}
pub fn committed(f: u8, b: Binding, o: Outcome) -> Finding {
    Finding::committed(fp(f), b, o).unwrap()
}
pub fn revoke(p: &str) -> Command {
    Command::Revoke(Revoke {
        principal: Principal::new(p).unwrap(),
    })
}
pub fn refused(r: &Reply) -> Option<RefusalCode> {
    match r {
        Reply::Refused(c) => Some(*c),
        _ => None,
    }
}
pub fn receipt(r: Reply) -> Receipt {
    match r {
        Reply::Receipt(rc) => rc,
        other => panic!("expected a receipt, got {other:?}"),
    }
}
