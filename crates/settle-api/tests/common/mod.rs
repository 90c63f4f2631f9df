//! Real core values for the wire tests: one scenario through the core's
//! reference engine that reaches every reply and every part of a record.

#![allow(dead_code)]

use settle_core::testkit::*;
use settle_core::*;

pub const T0: u64 = 1_700_000_000_000;

pub fn now(ms: u64) -> Timestamp {
    Timestamp(T0 + ms)
}

/// Core values of every response, by name.
pub struct Scenario {
    pub world: World,
    pub tenant: TenantId,
    pub replies: Vec<(&'static str, Reply)>,
    pub records: Vec<(&'static str, Record)>,
    pub warnings: Vec<Warning>,
}

fn grant(r: &Reply) -> Grant {
    match r {
        Reply::Claim(ClaimDecision::Execute(g)) | Reply::Claim(ClaimDecision::Reconcile(g)) => *g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
pub fn scenario() -> Scenario {
    let t = TenantId::default_tenant();
    let mut w = World::default();
    let mut replies = vec![];
    let b = binding("svc-billing", 2);
    let mut run = |w: &mut World, name: &'static str, cmd: Command, at: u64| {
        let r = w.execute(&t, &cmd, now(at)).reply;
        replies.push((name, r.clone()));
        r
    };

    // a: claim with a worker and dispatch marking, heartbeat, dispatch,
    // foreign evidence quarantined, then the holder settles; replay.
    let mut c = Claim::new(key("order-1"), fp(1), b.clone());
    c.worker = Some(Text::new("worker", "w-7").unwrap());
    c.marks_dispatch = true;
    c.lease_ms = LeaseMs::new(10_000).unwrap();
    let g = grant(&run(&mut w, "claim_execute", Command::Claim(c), 0));
    run(&mut w, "claim_in_flight", claim("order-1", 1, b.clone()), 5);
    run(
        &mut w,
        "heartbeat",
        heartbeat("order-1", g.fence, Some(20_000)),
        10,
    );
    run(&mut w, "dispatch", dispatch("order-1", g.fence), 20);
    run(
        &mut w,
        "settle_quarantined",
        settle(
            "order-1",
            Fence(g.fence.0 + 100),
            1,
            b.clone(),
            completed(1),
        ),
        30,
    );
    run(
        &mut w,
        "settle",
        settle("order-1", g.fence, 1, b.clone(), completed(1)),
        40,
    );
    run(&mut w, "claim_replay", claim("order-1", 1, b.clone()), 50);

    // b: an unknown outcome with an error, then reconcile.
    let g = grant(&run(&mut w, "claim_b", claim("order-2", 2, b.clone()), 100));
    let err = ErrorText::new("outcome.error", "upstream reset\nafter 30 s").unwrap();
    run(
        &mut w,
        "settle_unknown",
        settle(
            "order-2",
            g.fence,
            2,
            b.clone(),
            Outcome::unknown_with_response(Some(err), fp(9)),
        ),
        110,
    );
    let g = grant(&run(
        &mut w,
        "claim_reconcile",
        claim("order-2", 2, b.clone()),
        120,
    ));
    run(
        &mut w,
        "reconcile_not_committed",
        reconcile("order-2", g.fence, Finding::NotCommitted),
        130,
    );
    run(&mut w, "release", release("order-2", g.fence), 140);

    // c: reconcile committed with a failed outcome whose result is null.
    let g = grant(&run(&mut w, "claim_c", claim("order-3", 3, b.clone()), 200));
    run(
        &mut w,
        "settle_unknown_c",
        settle("order-3", g.fence, 3, b.clone(), unknown()),
        210,
    );
    let g = grant(&run(
        &mut w,
        "claim_c2",
        claim("order-3", 3, b.clone()),
        220,
    ));
    let null_failed = Outcome::failed(
        ResultJson::from_text("null", 1024).unwrap(),
        fp(7),
        Some(ErrorText::new("outcome.error", "declined").unwrap()),
    );
    run(
        &mut w,
        "reconcile_committed",
        reconcile(
            "order-3",
            g.fence,
            Finding::committed(fp(3), b.clone(), null_failed).unwrap(),
        ),
        230,
    );
    // d: reconcile unavailable.
    let g = grant(&run(&mut w, "claim_d", claim("order-4", 4, b.clone()), 300));
    run(
        &mut w,
        "settle_unknown_d",
        settle("order-4", g.fence, 4, b.clone(), unknown()),
        310,
    );
    let g = grant(&run(
        &mut w,
        "claim_d2",
        claim("order-4", 4, b.clone()),
        320,
    ));
    run(
        &mut w,
        "reconcile_unavailable",
        reconcile("order-4", g.fence, Finding::Unavailable),
        330,
    );
    // e: a running record whose lease expires unsettled.
    run(&mut w, "claim_e", claim("order-5", 5, b.clone()), 400);
    run(&mut w, "revoke", revoke("svc-other"), 500);
    let warn = |detail: Option<&str>| {
        Command::Warn(Warn {
            task: TaskId::new("nightly").unwrap(),
            class: WarningClass::new("slow-upstream").unwrap(),
            detail: detail.map(|d| Text::new("detail", d).unwrap()),
        })
    };
    run(&mut w, "warn", warn(Some("took 40 s")), 600);
    run(&mut w, "warn_again", warn(None), 700);

    let get = |w: &World, k: &str, at: u64| w.get(&t, &key(k), now(at)).unwrap().unwrap();
    let records = vec![
        ("record_completed", get(&w, "order-1", 800)),
        ("record_reconcile", get(&w, "order-2", 800)),
        ("record_failed", get(&w, "order-3", 800)),
        ("record_unavailable", get(&w, "order-4", 800)),
        ("record_running", get(&w, "order-5", 400)),
        ("record_expired", get(&w, "order-5", 60_000)),
    ];
    let warnings = w.warnings(&t, &TaskId::new("nightly").unwrap());
    Scenario {
        world: w,
        tenant: t.clone(),
        replies,
        records,
        warnings,
    }
}

impl Scenario {
    pub fn reply(&self, name: &str) -> &Reply {
        &self
            .replies
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no reply {name}"))
            .1
    }
    pub fn record(&self, name: &str) -> &Record {
        &self
            .records
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no record {name}"))
            .1
    }
}
