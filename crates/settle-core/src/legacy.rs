//! Stored layouts of earlier versions, read and converted to today's types.
//!
//! postcard writes fields by position, so a field added to a stored type
//! changes its bytes (ARCHITECTURE.md, "stored formats"). The engines read
//! rows written before a change through these mirrors: each is the type as
//! it was, field for field, and converts with the new fields at their
//! "absent" value. The engines never write them; the portable format
//! encodes them to check a line of an older export version (settle-portable).

use serde::{Deserialize, Serialize};

use crate::record::{
    Ended, Observation, Outcome, Purpose, QuarantineEntry, Receipt, Reservation, Status,
};
use crate::types::{ErrorText, Fence, Key, LeaseMs, RetentionS, Text, Timestamp};
use crate::{Attempt, Lease, Record};

/// The record before leases kept their `claim_id` (embedded value format
/// 2, PostgreSQL record format 2): every field as today but
/// [`Lease::claim_id`].
pub mod v2 {
    use super::*;

    /// [`crate::Lease`] without `claim_id`.
    #[derive(Serialize, Deserialize)]
    pub struct Lease {
        fence: Fence,
        purpose: Purpose,
        generation: u64,
        granted_at: Timestamp,
        expires_at: Timestamp,
        lease_ms: LeaseMs,
        marks_dispatch: bool,
        dispatched: bool,
        worker: Option<Text>,
        ended: Option<Ended>,
    }

    /// [`crate::Attempt`] holding a [`Lease`] of this version.
    #[derive(Serialize, Deserialize)]
    pub struct Attempt {
        number: u32,
        lease: Lease,
        receipt: Option<Receipt>,
        error: Option<ErrorText>,
        observations: Vec<Observation>,
        observations_total: u32,
    }

    /// [`crate::Record`] holding [`Attempt`]s of this version.
    #[derive(Serialize, Deserialize)]
    pub struct Record {
        key: Key,
        reservation: Reservation,
        status: Status,
        outcome: Option<Outcome>,
        receipt: Option<Receipt>,
        reconcile_required: bool,
        disputed: bool,
        attempts: Vec<Attempt>,
        attempts_total: u32,
        quarantine: Vec<QuarantineEntry>,
        quarantine_total: u64,
        retention_s: RetentionS,
        created_at: Timestamp,
        updated_at: Timestamp,
        settled_at: Option<Timestamp>,
    }

    /// Today's record as this version held it: every `claim_id` dropped.
    impl From<&super::Record> for Record {
        fn from(r: &super::Record) -> Record {
            Record {
                key: r.key.clone(),
                reservation: r.reservation.clone(),
                status: r.status,
                outcome: r.outcome.clone(),
                receipt: r.receipt.clone(),
                reconcile_required: r.reconcile_required,
                disputed: r.disputed,
                attempts: r
                    .attempts
                    .iter()
                    .map(|a| {
                        let l = &a.lease;
                        Attempt {
                            number: a.number,
                            lease: Lease {
                                fence: l.fence,
                                purpose: l.purpose,
                                generation: l.generation,
                                granted_at: l.granted_at,
                                expires_at: l.expires_at,
                                lease_ms: l.lease_ms,
                                marks_dispatch: l.marks_dispatch,
                                dispatched: l.dispatched,
                                worker: l.worker.clone(),
                                ended: l.ended,
                            },
                            receipt: a.receipt.clone(),
                            error: a.error.clone(),
                            observations: a.observations.clone(),
                            observations_total: a.observations_total,
                        }
                    })
                    .collect(),
                attempts_total: r.attempts_total,
                quarantine: r.quarantine.clone(),
                quarantine_total: r.quarantine_total,
                retention_s: r.retention_s,
                created_at: r.created_at,
                updated_at: r.updated_at,
                settled_at: r.settled_at,
            }
        }
    }

    impl From<Lease> for super::Lease {
        fn from(l: Lease) -> super::Lease {
            super::Lease {
                fence: l.fence,
                purpose: l.purpose,
                generation: l.generation,
                granted_at: l.granted_at,
                expires_at: l.expires_at,
                lease_ms: l.lease_ms,
                marks_dispatch: l.marks_dispatch,
                dispatched: l.dispatched,
                worker: l.worker,
                ended: l.ended,
                claim_id: None,
            }
        }
    }

    impl From<Attempt> for super::Attempt {
        fn from(a: Attempt) -> super::Attempt {
            super::Attempt {
                number: a.number,
                lease: a.lease.into(),
                receipt: a.receipt,
                error: a.error,
                observations: a.observations,
                observations_total: a.observations_total,
            }
        }
    }

    impl From<Record> for super::Record {
        fn from(r: Record) -> super::Record {
            super::Record {
                key: r.key,
                reservation: r.reservation,
                status: r.status,
                outcome: r.outcome,
                receipt: r.receipt,
                reconcile_required: r.reconcile_required,
                disputed: r.disputed,
                attempts: r.attempts.into_iter().map(Into::into).collect(),
                attempts_total: r.attempts_total,
                quarantine: r.quarantine,
                quarantine_total: r.quarantine_total,
                retention_s: r.retention_s,
                created_at: r.created_at,
                updated_at: r.updated_at,
                settled_at: r.settled_at,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    /// A record written in format 2 (today's bytes minus each lease's
    /// `claim_id`) reads back as today's record with no `claim_id`.
    #[test]
    fn a_format_2_record_reads_as_today_without_claim_ids() {
        let r = testkit::without_claim_ids(testkit::full_record());
        // Today's encoding of a lease ends with the option tag of
        // `claim_id` (0: none), the last field: format 2 is that byte less.
        let today = postcard::to_allocvec(&r).unwrap();
        let old = strip_claim_ids(&r);
        assert_ne!(today, old);
        assert_eq!(postcard::to_allocvec(&v2::Record::from(&r)).unwrap(), old);
        let back: v2::Record = postcard::from_bytes(&old).unwrap();
        assert_eq!(Record::from(back), r);
    }

    /// Format 2's bytes, built field by field as that build wrote them.
    fn strip_claim_ids(r: &Record) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct L<'a>(
            &'a Fence,
            &'a Purpose,
            u64,
            &'a Timestamp,
            &'a Timestamp,
            &'a LeaseMs,
            bool,
            bool,
            &'a Option<Text>,
            &'a Option<Ended>,
        );
        #[derive(serde::Serialize)]
        struct A<'a>(
            u32,
            L<'a>,
            &'a Option<Receipt>,
            &'a Option<ErrorText>,
            &'a Vec<Observation>,
            u32,
        );
        let attempts: Vec<A<'_>> = r
            .attempts
            .iter()
            .map(|a| {
                let l = &a.lease;
                A(
                    a.number,
                    L(
                        &l.fence,
                        &l.purpose,
                        l.generation,
                        &l.granted_at,
                        &l.expires_at,
                        &l.lease_ms,
                        l.marks_dispatch,
                        l.dispatched,
                        &l.worker,
                        &l.ended,
                    ),
                    &a.receipt,
                    &a.error,
                    &a.observations,
                    a.observations_total,
                )
            })
            .collect();
        postcard::to_allocvec(&(
            &r.key,
            &r.reservation,
            &r.status,
            &r.outcome,
            &r.receipt,
            r.reconcile_required,
            r.disputed,
            attempts,
            r.attempts_total,
            &r.quarantine,
            r.quarantine_total,
            &r.retention_s,
            &r.created_at,
            &r.updated_at,
            &r.settled_at,
        ))
        .unwrap()
    }
}
