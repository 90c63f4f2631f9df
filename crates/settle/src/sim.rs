//! `settle sim`: the deterministic simulator (crates/settle-sim).
//!
//! `settle sim --seed S` replays one seed and, when it fails, prints the
//! violation and the failing key's trimmed history; `settle sim --seeds N`
//! runs seeds `--first .. --first + N` and prints one JSON object
//! `{"seeds", "steps", "faults", "violations"}` (`--json`: only that).
//! Exits 1 when any seed finds a violation.

use std::time::Instant;

use clap::{Args, ValueEnum};
use settle_sim::{EngineKind, SeedReport, run_seed};

use crate::exit::{Failure, LOCAL, USAGE};

#[derive(Clone, Copy, ValueEnum)]
pub enum EngineArg {
    /// The in-memory store.
    Memory,
    /// The embedded engine's log and recovery on a simulated disk.
    Embedded,
}

#[derive(Args)]
pub struct SimArgs {
    /// Replay this one seed and print its history if it fails.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Force one engine (default: one seed in four on the in-memory store,
    /// the others on the embedded engine).
    #[arg(long, value_enum)]
    engine: Option<EngineArg>,
    /// Print only the JSON summary.
    #[arg(long)]
    json: bool,
}

fn engine(a: Option<EngineArg>) -> Option<EngineKind> {
    a.map(|e| match e {
        EngineArg::Memory => EngineKind::Memory,
        EngineArg::Embedded => EngineKind::Embedded,
    })
}

fn print_failure(r: &SeedReport, history: bool) {
    let Some(v) = &r.violation else { return };
    eprintln!(
        "seed {} ({}): violation {}: {}",
        r.seed,
        r.engine.name(),
        v.check,
        v.detail
    );
    if history {
        eprintln!("history of the failing key (and the global faults):");
        for line in &r.history {
            eprintln!("  {line}");
        }
    }
    eprintln!(
        "replay: settle sim --seed {} --engine {}",
        r.seed,
        r.engine.name()
    );
}

pub fn run(a: SimArgs) -> Result<(), Failure> {
    let forced = engine(a.engine);
    if let Some(seed) = a.seed {
        let r = run_seed(seed, forced);
        let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k}={n}")).collect();
        println!(
            "seed {seed} ({}): {} steps, faults: {}",
            r.engine.name(),
            r.steps,
            if faults.is_empty() {
                "none".into()
            } else {
                faults.join(" ")
            }
        );
        if r.violation.is_some() {
            print_failure(&r, true);
            return Err(Failure::silent(LOCAL));
        }
        println!("no violations");
        return Ok(());
    }
    let Some(n) = a.seeds else {
        return Err(Failure::new(
            USAGE,
            "settle sim needs --seed S or --seeds N",
        ));
    };
    let started = Instant::now();
    let mut s = settle_sim::Summary::default();
    for seed in a.first..a.first.saturating_add(n) {
        s.add(run_seed(seed, forced));
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{}", s.to_json());
    if !a.json {
        eprintln!(
            "{} seeds in {secs:.1} s ({:.0} seeds/s)",
            s.seeds,
            s.seeds as f64 / secs.max(1e-9)
        );
    }
    for r in &s.failing {
        print_failure(r, false);
    }
    if s.violations > 0 {
        return Err(Failure::silent(LOCAL));
    }
    Ok(())
}
