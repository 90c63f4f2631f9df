//! The writer's encoder of records: the exact bytes postcard writes for a
//! [`Record`] (value format 2), without serde in between.
//!
//! Every state change re-encodes the whole record into the log frame, on
//! the writer thread (the one thread every command waits for). Through
//! serde, postcard spent ~2,200 instructions on a record (a varint written
//! into a scratch array and then appended by a `memcpy` call, per field):
//! 15 % of the in-process benchmark's instructions, a fifth of the
//! writer's. Writing the fields directly costs a fraction of that.
//!
//! Decoding stays with postcard, and the format stays postcard's: each
//! struct is destructured whole (a field added to a stored type does not
//! compile here until it is encoded), enums are written as their
//! declaration index, and in builds with debug assertions (every test run)
//! each encoding is compared with postcard's (`codec::append_value`); the
//! tests below compare them on arbitrary records, the format fixtures on
//! frozen ones.

use settle_core::record::{
    Attempt, Ended, Lease, Observation, QuarantineEntry, Receipt, Reservation,
};
use settle_core::{Binding, Digest, Outcome, Record, Scopes};

use crate::codec::put_varint as varint;

#[inline]
fn str(out: &mut Vec<u8>, s: &str) {
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

#[inline]
fn flag(out: &mut Vec<u8>, b: bool) {
    out.push(b as u8);
}

#[inline]
fn digest(out: &mut Vec<u8>, d: &Digest) {
    out.push(32);
    out.extend_from_slice(&d.0);
}

/// `None` as 0; `Some(v)` as 1 and then `v`.
#[inline]
fn option<T>(out: &mut Vec<u8>, v: Option<&T>, f: impl FnOnce(&mut Vec<u8>, &T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            f(out, v);
        }
    }
}

/// A unit variant, as its index in declaration order (a one-byte varint:
/// every stored enum has fewer than 128). Callers pass `variant as u8`:
/// the stored enums are fieldless without explicit discriminants, so the
/// cast is the declaration index serde writes, reordering included (a
/// variant with data would not compile there).
#[inline]
fn variant(out: &mut Vec<u8>, index: u8) {
    debug_assert!(index < 0x80);
    out.push(index);
}

fn scopes(out: &mut Vec<u8>, s: &Scopes) {
    let s = s.as_slice();
    varint(out, s.len() as u64);
    for scope in s {
        str(out, scope.as_str());
    }
}

fn binding(out: &mut Vec<u8>, b: &Binding) {
    let Binding {
        principal,
        scopes: sc,
        generation,
    } = b;
    str(out, principal.as_str());
    scopes(out, sc);
    varint(out, *generation);
}

fn reservation(out: &mut Vec<u8>, r: &Reservation) {
    let Reservation {
        fingerprint,
        principal,
        scopes: sc,
        generation,
    } = r;
    digest(out, fingerprint);
    str(out, principal.as_str());
    scopes(out, sc);
    varint(out, *generation);
}

/// `Outcome`'s fields are private to settle-core: read through its
/// accessors, in its declaration order (status, result, response_sha256, error).
fn outcome(out: &mut Vec<u8>, o: &Outcome) {
    variant(out, o.status() as u8);
    option(out, o.result(), |out, r| str(out, r.as_str()));
    option(out, o.response_sha256().as_ref(), digest);
    option(out, o.error(), |out, e| str(out, e.as_str()));
}

fn receipt(out: &mut Vec<u8>, r: &Receipt) {
    let Receipt {
        key,
        fingerprint,
        response_sha256,
        status: st,
        fence,
        committed_at,
        durable,
    } = r;
    str(out, key.as_str());
    digest(out, fingerprint);
    option(out, response_sha256.as_ref(), digest);
    variant(out, *st as u8);
    varint(out, fence.0);
    varint(out, committed_at.0);
    flag(out, *durable);
}

fn lease(out: &mut Vec<u8>, l: &Lease) {
    let Lease {
        fence,
        purpose: p,
        generation,
        granted_at,
        expires_at,
        lease_ms,
        marks_dispatch,
        dispatched,
        worker,
        ended,
        claim_id,
    } = l;
    varint(out, fence.0);
    variant(out, *p as u8);
    varint(out, *generation);
    varint(out, granted_at.0);
    varint(out, expires_at.0);
    varint(out, lease_ms.get());
    flag(out, *marks_dispatch);
    flag(out, *dispatched);
    option(out, worker.as_ref(), |out, w| str(out, w.as_str()));
    option(out, ended.as_ref(), |out, e| {
        let Ended { reason, at } = e;
        variant(out, *reason as u8);
        varint(out, at.0);
    });
    option(out, claim_id.as_ref(), |out, c| str(out, c.as_str()));
}

fn observation(out: &mut Vec<u8>, o: &Observation) {
    let Observation {
        at,
        call: c,
        status: st,
        finding: f,
        response_sha256,
        accepted,
        code,
    } = o;
    varint(out, at.0);
    variant(out, *c as u8);
    option(out, st.as_ref(), |out, s| variant(out, *s as u8));
    option(out, f.as_ref(), |out, f| variant(out, *f as u8));
    option(out, response_sha256.as_ref(), digest);
    flag(out, *accepted);
    option(out, code.as_ref(), |out, c| variant(out, *c as u8));
}

fn attempt(out: &mut Vec<u8>, a: &Attempt) {
    let Attempt {
        number,
        lease: l,
        receipt: r,
        error,
        observations,
        observations_total,
    } = a;
    varint(out, u64::from(*number));
    lease(out, l);
    option(out, r.as_ref(), receipt);
    option(out, error.as_ref(), |out, e| str(out, e.as_str()));
    varint(out, observations.len() as u64);
    for o in observations {
        observation(out, o);
    }
    varint(out, u64::from(*observations_total));
}

fn quarantine_entry(out: &mut Vec<u8>, q: &QuarantineEntry) {
    let QuarantineEntry {
        at,
        fence,
        reason,
        call: c,
        status: st,
        finding: f,
        fingerprint,
        binding: b,
        response_sha256,
    } = q;
    varint(out, at.0);
    varint(out, fence.0);
    variant(out, *reason as u8);
    variant(out, *c as u8);
    option(out, st.as_ref(), |out, s| variant(out, *s as u8));
    option(out, f.as_ref(), |out, f| variant(out, *f as u8));
    option(out, fingerprint.as_ref(), digest);
    option(out, b.as_ref(), binding);
    option(out, response_sha256.as_ref(), digest);
}

/// Appends postcard's encoding of `r` (its fields in declaration order).
pub fn record(out: &mut Vec<u8>, r: &Record) {
    let Record {
        key,
        reservation: res,
        status: st,
        outcome: oc,
        receipt: rc,
        reconcile_required,
        disputed,
        attempts,
        attempts_total,
        quarantine,
        quarantine_total,
        retention_s,
        created_at,
        updated_at,
        settled_at,
    } = r;
    str(out, key.as_str());
    reservation(out, res);
    variant(out, *st as u8);
    option(out, oc.as_ref(), outcome);
    option(out, rc.as_ref(), receipt);
    flag(out, *reconcile_required);
    flag(out, *disputed);
    varint(out, attempts.len() as u64);
    for a in attempts {
        attempt(out, a);
    }
    varint(out, u64::from(*attempts_total));
    varint(out, quarantine.len() as u64);
    for q in quarantine {
        quarantine_entry(out, q);
    }
    varint(out, *quarantine_total);
    varint(out, retention_s.get());
    varint(out, created_at.0);
    varint(out, updated_at.0);
    option(out, settled_at.as_ref(), |out, t| varint(out, t.0));
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use settle_core::record::{
        Attempt, Call, Ended, FindingKind, Lease, LeaseEnd, Observation, OutcomeStatus, Purpose,
        QuarantineEntry, Receipt, Reservation, Status,
    };
    use settle_core::{
        Binding, ClaimId, Digest, ErrorText, Fence, Key, LeaseMs, Outcome, Principal, Record,
        RefusalCode, ResultJson, RetentionS, Scopes, Text, Timestamp,
    };

    use crate::codec::Value;

    fn postcard_bytes(r: &Record) -> Vec<u8> {
        postcard::to_allocvec(&Value::Record(r.clone())).unwrap()
    }

    fn ours(r: &Record) -> Vec<u8> {
        let mut out = vec![crate::codec::VALUE_RECORD];
        super::record(&mut out, r);
        out
    }

    // Integers across every varint length, strings across the one- and
    // two-byte length prefixes.
    fn int() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..200, 100u64..100_000, any::<u64>()]
    }
    fn token() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z0-9]{1,8}", "[!-~]{120,200}"]
    }
    fn digest() -> impl Strategy<Value = Digest> {
        any::<[u8; 32]>().prop_map(Digest)
    }
    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[ -~]{1,10}", "[ -~é]{130,300}"]
    }
    fn status() -> impl Strategy<Value = Status> {
        prop_oneof![
            Just(Status::Pending),
            Just(Status::Unknown),
            Just(Status::Conflict),
            Just(Status::Failed),
            Just(Status::Completed)
        ]
    }
    fn outcome_status() -> impl Strategy<Value = OutcomeStatus> {
        prop_oneof![
            Just(OutcomeStatus::Completed),
            Just(OutcomeStatus::Failed),
            Just(OutcomeStatus::Unknown)
        ]
    }
    fn finding() -> impl Strategy<Value = FindingKind> {
        prop_oneof![
            Just(FindingKind::Committed),
            Just(FindingKind::NotCommitted),
            Just(FindingKind::Unavailable)
        ]
    }
    fn call() -> impl Strategy<Value = Call> {
        prop_oneof![Just(Call::Settle), Just(Call::Reconcile)]
    }
    fn refusal() -> impl Strategy<Value = RefusalCode> {
        (0..RefusalCode::ALL.len()).prop_map(|i| RefusalCode::ALL[i])
    }
    fn ts() -> impl Strategy<Value = Timestamp> {
        int().prop_map(Timestamp)
    }
    fn scopes() -> impl Strategy<Value = Scopes> {
        proptest::collection::vec(token(), 0..4).prop_map(|v| Scopes::from_strs(v).unwrap())
    }
    fn binding() -> impl Strategy<Value = Binding> {
        (token(), scopes(), int()).prop_map(|(p, scopes, generation)| Binding {
            principal: Principal::new(p).unwrap(),
            scopes,
            generation,
        })
    }
    fn error_text() -> impl Strategy<Value = Option<ErrorText>> {
        proptest::option::of(text().prop_map(|t| ErrorText::new("error", t).unwrap()))
    }
    fn outcome() -> impl Strategy<Value = Outcome> {
        let result = prop_oneof![
            Just("null".to_string()),
            "[a-z]{0,200}".prop_map(|s| format!("{{\"r\":\"{s}\"}}"))
        ]
        .prop_map(|t| ResultJson::from_text(&t, 65_536).unwrap());
        prop_oneof![
            (result.clone(), digest()).prop_map(|(r, d)| Outcome::completed(r, d)),
            (result, digest(), error_text()).prop_map(|(r, d, e)| Outcome::failed(r, d, e)),
            error_text().prop_map(Outcome::unknown),
            (error_text(), digest()).prop_map(|(e, d)| Outcome::unknown_with_response(e, d)),
        ]
    }
    fn receipt() -> impl Strategy<Value = Receipt> {
        (
            token(),
            digest(),
            proptest::option::of(digest()),
            status(),
            int(),
            ts(),
            any::<bool>(),
        )
            .prop_map(
                |(k, fingerprint, response_sha256, status, f, committed_at, durable)| Receipt {
                    key: Key::new(k).unwrap(),
                    fingerprint,
                    response_sha256,
                    status,
                    fence: Fence(f),
                    committed_at,
                    durable,
                },
            )
    }
    fn lease() -> impl Strategy<Value = Lease> {
        let end = (0usize..7).prop_map(|i| {
            [
                LeaseEnd::Expired,
                LeaseEnd::Revoked,
                LeaseEnd::Settled,
                LeaseEnd::Refused,
                LeaseEnd::Released,
                LeaseEnd::Unavailable,
                LeaseEnd::NotCommitted,
            ][i]
        });
        (
            (int(), any::<bool>(), int(), ts(), ts()),
            (100u64..=3_600_000, any::<bool>(), any::<bool>()),
            proptest::option::of(text().prop_map(|t| Text::new("worker", t).unwrap())),
            proptest::option::of((end, ts()).prop_map(|(reason, at)| Ended { reason, at })),
            proptest::option::of("[A-Za-z0-9_-]{16,64}".prop_map(|c| ClaimId::new(c).unwrap())),
        )
            .prop_map(
                |(
                    (f, reconcile, generation, granted_at, expires_at),
                    (ms, md, d),
                    worker,
                    ended,
                    claim_id,
                )| {
                    Lease {
                        fence: Fence(f),
                        purpose: if reconcile {
                            Purpose::Reconcile
                        } else {
                            Purpose::Execute
                        },
                        generation,
                        granted_at,
                        expires_at,
                        lease_ms: LeaseMs::new(ms).unwrap(),
                        marks_dispatch: md,
                        dispatched: d,
                        worker,
                        ended,
                        claim_id,
                    }
                },
            )
    }
    fn observation() -> impl Strategy<Value = Observation> {
        (
            ts(),
            call(),
            proptest::option::of(outcome_status()),
            proptest::option::of(finding()),
            proptest::option::of(digest()),
            any::<bool>(),
            proptest::option::of(refusal()),
        )
            .prop_map(
                |(at, call, status, finding, response_sha256, accepted, code)| Observation {
                    at,
                    call,
                    status,
                    finding,
                    response_sha256,
                    accepted,
                    code,
                },
            )
    }
    fn attempt() -> impl Strategy<Value = Attempt> {
        (
            any::<u32>(),
            lease(),
            proptest::option::of(receipt()),
            error_text(),
            proptest::collection::vec(observation(), 0..3),
            any::<u32>(),
        )
            .prop_map(
                |(number, lease, receipt, error, observations, observations_total)| Attempt {
                    number,
                    lease,
                    receipt,
                    error,
                    observations,
                    observations_total,
                },
            )
    }
    fn quarantine_entry() -> impl Strategy<Value = QuarantineEntry> {
        (
            (ts(), int(), refusal(), call()),
            proptest::option::of(outcome_status()),
            proptest::option::of(finding()),
            proptest::option::of(digest()),
            proptest::option::of(binding()),
            proptest::option::of(digest()),
        )
            .prop_map(
                |(
                    (at, f, reason, call),
                    status,
                    finding,
                    fingerprint,
                    binding,
                    response_sha256,
                )| {
                    QuarantineEntry {
                        at,
                        fence: Fence(f),
                        reason,
                        call,
                        status,
                        finding,
                        fingerprint,
                        binding,
                        response_sha256,
                    }
                },
            )
    }
    fn record() -> impl Strategy<Value = Record> {
        (
            (token(), digest(), binding(), status()),
            proptest::option::of(outcome()),
            proptest::option::of(receipt()),
            (any::<bool>(), any::<bool>()),
            proptest::collection::vec(attempt(), 0..3),
            (
                any::<u32>(),
                proptest::collection::vec(quarantine_entry(), 0..3),
                int(),
            ),
            (1u64..=31_536_000, ts(), ts(), proptest::option::of(ts())),
        )
            .prop_map(
                |(
                    (key, fingerprint, b, status),
                    outcome,
                    receipt,
                    (reconcile_required, disputed),
                    attempts,
                    (attempts_total, quarantine, quarantine_total),
                    (retention, created_at, updated_at, settled_at),
                )| Record {
                    key: Key::new(key).unwrap(),
                    reservation: Reservation {
                        fingerprint,
                        principal: b.principal,
                        scopes: b.scopes,
                        generation: b.generation,
                    },
                    status,
                    outcome,
                    receipt,
                    reconcile_required,
                    disputed,
                    attempts,
                    attempts_total,
                    quarantine,
                    quarantine_total,
                    retention_s: RetentionS::new(retention).unwrap(),
                    created_at,
                    updated_at,
                    settled_at,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        /// The encoder writes exactly postcard's bytes for any record (it
        /// need not be a state the rules can reach: the format is the same).
        #[test]
        fn writes_postcards_bytes_for_any_record(r in record()) {
            prop_assert_eq!(ours(&r), postcard_bytes(&r));
        }
    }
}
