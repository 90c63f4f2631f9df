//! The wire types serialize exactly like the server did before they
//! existed (the core's own JSON serialization and the server's bodies).
//! Temporary: removed when the core stops speaking JSON; the golden files
//! that this test proves equal to the old wire stay.

mod common;

use serde_json::json;
use settle_api as api;
use settle_core::*;

use common::*;

fn old_body(reply: &Reply) -> String {
    let v = match reply {
        Reply::Claim(d) => serde_json::to_value(d).unwrap(),
        Reply::Heartbeat(l) => serde_json::to_value(l).unwrap(),
        Reply::Dispatched(l) => {
            json!({"fence": l.fence, "lease_expires_at": l.lease_expires_at, "dispatched": true})
        }
        Reply::Receipt(r) => json!({"receipt": r}),
        Reply::Released { fence } => json!({"fence": fence, "released": true}),
        Reply::Revoked {
            principal,
            generation,
        } => json!({"principal": principal, "generation": generation}),
        Reply::Warning(w) => serde_json::to_value(w).unwrap(),
        Reply::Refused(c) => {
            let p = api::Problem::refusal(*c);
            let mut v = json!({"type": format!("urn:settle:problem:{}", p.code), "title": p.title,
                "status": p.status, "detail": c.to_string(), "code": p.code.as_str()});
            if let Some(f) = p.field {
                v["field"] = json!(f);
            }
            v
        }
        other => panic!("{other:?}"),
    };
    serde_json::to_string(&v).unwrap()
}

#[test]
fn the_wire_types_serialize_like_the_old_server() {
    let sc = scenario();
    for (name, reply) in &sc.replies {
        let new = golden_body(reply);
        assert_eq!(new, old_body(reply), "{name}");
    }
    for (name, r) in &sc.records {
        let old = serde_json::to_string(&r.view()).unwrap();
        let new = serde_json::to_string(&api::RecordView::from(r)).unwrap();
        assert_eq!(new, old, "{name}");
    }
}

fn golden_body(reply: &Reply) -> String {
    fn s<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }
    match reply {
        Reply::Claim(d) => s(&api::ClaimDecision::from(d)),
        Reply::Heartbeat(l) => s(&api::LeaseInfo::from(l)),
        Reply::Dispatched(l) => s(&api::Dispatched::from(l)),
        Reply::Receipt(r) => s(&api::ReceiptResponse { receipt: r.into() }),
        Reply::Released { fence } => s(&api::Released::new(*fence)),
        Reply::Revoked {
            principal,
            generation,
        } => s(&api::Revoked {
            principal: principal.to_string(),
            generation: *generation,
        }),
        Reply::Warning(w) => s(&api::Warning::from(w)),
        Reply::Refused(c) => s(&api::Problem::refusal(*c)),
        other => panic!("{other:?}"),
    }
}
