//! `settle export`, `settle import` and `settle migrate` (SPEC §12): a
//! store's data in the portable format, out of a stopped embedded store or
//! a live PostgreSQL one, into an empty store of either engine, and from
//! one engine to the other with both sides checked after.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{Value, json};
use settle_ledger::export::{ImportReport, export_to};
use settle_portable::Summary;

use crate::exit::Failure;

/// The default of `--fence-margin`: fences a live source may have granted
/// after its snapshot, never handed out again by the target.
pub const FENCE_MARGIN: u64 = 1_000_000_000;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["data", "store"])))]
pub struct ExportArgs {
    /// Directory of a stopped embedded store.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// A PostgreSQL store (postgres://USER@HOST:PORT/DB), exported live from
    /// one consistent snapshot.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// The file to write (refused if it exists; written whole or not at all).
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
    /// Print one JSON object instead of a summary line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["data", "store"])))]
pub struct ImportArgs {
    /// The export file.
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// An embedded store's directory: absent or empty.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// A PostgreSQL store (postgres://…) holding no records, principals or warnings.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Added to the highest fence the file saw to make the target's first
    /// fence: room for fences a live source granted after its snapshot
    /// (at most 2^50; the resulting floor at most 2^53 - 1 - 2^32).
    #[arg(long, value_name = "N", default_value_t = FENCE_MARGIN, value_parser = margin())]
    pub fence_margin: u64,
    /// Print one JSON object instead of a summary line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("direction").required(true).args(["from_data", "from_store"])))]
pub struct MigrateArgs {
    /// A stopped embedded store to move to PostgreSQL (with --to-store).
    #[arg(
        long,
        value_name = "DIR",
        requires = "to_store",
        conflicts_with = "to_data"
    )]
    pub from_data: Option<PathBuf>,
    /// The empty PostgreSQL store to move it to.
    #[arg(long, value_name = "URL")]
    pub to_store: Option<String>,
    /// A PostgreSQL store, its servers stopped, to move to an embedded
    /// store (with --to-data).
    #[arg(
        long,
        value_name = "URL",
        requires = "to_data",
        conflicts_with = "to_store"
    )]
    pub from_store: Option<String>,
    /// The embedded store's directory: absent or empty.
    #[arg(long, value_name = "DIR")]
    pub to_data: Option<PathBuf>,
    /// As for `settle import`.
    #[arg(long, value_name = "N", default_value_t = FENCE_MARGIN, value_parser = margin())]
    pub fence_margin: u64,
    /// Print one JSON object instead of a summary line.
    #[arg(long)]
    pub json: bool,
}

/// `--fence-margin`: refused over 2^50 before any work (SPEC §12).
fn margin() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(..=settle_portable::MAX_FENCE_MARGIN)
}

/// What the margin means, for the output: fences stay unique only for as
/// many claims as it covers on the source after the file was taken.
fn margin_words(s: &Summary, margin: u64) -> String {
    format!(
        "the margin of {margin} fences covers at least {} claims made on the source after its \
         snapshot ({} fences per claim at most on {})",
        s.claims_covered(margin),
        s.fences_per_claim_max,
        s.engine
    )
}

/// A progress line on stderr, drawn only when stderr is a terminal.
fn spinner(what: &'static str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.set_message(what);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

fn progress(pb: &indicatif::ProgressBar, what: &str) -> impl FnMut(u64, u64) + Send + use<> {
    let pb = pb.clone();
    let what = what.to_string();
    move |entities, bytes| {
        pb.set_message(format!("{what}: {entities} entities, {} MiB", bytes >> 20));
    }
}

/// Writes `file` through `write` as `file.partial`, synced, then renamed:
/// a file under the final name is always whole.
pub fn write_whole<T>(
    file: &Path,
    write: impl FnOnce(BufWriter<File>) -> Result<(BufWriter<File>, T), Failure>,
) -> Result<T, Failure> {
    crate::files::refuse_existing(file)?;
    let partial = partial_name(file);
    let out = crate::files::create_exclusive(&partial)?;
    match write(BufWriter::new(out)) {
        Ok((w, t)) => {
            write_whole_after(&partial, file, w)?;
            Ok(t)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// `FILE.partial`, beside it.
pub fn partial_name(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// The JSON summary of a file.
pub fn summary_json(file: &Path, s: &Summary, seconds: f64) -> Value {
    let entities = s.records + s.principals + s.warning_tasks;
    json!({
        "file": file.display().to_string(),
        "engine": s.engine,
        "records": s.records,
        "principals": s.principals,
        "warning_tasks": s.warning_tasks,
        "max_fence": s.max_fence,
        "fence_floor": s.fence_floor,
        "fences_per_claim_max": s.fences_per_claim_max,
        "bytes": s.bytes,
        "sha256": s.sha256,
        "seconds": round3(seconds),
        "entities_per_s": round3(entities as f64 / seconds.max(1e-9)),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn say(v: Value, json: bool, human: String) {
    if json {
        println!("{v}");
    } else {
        println!("{human}");
    }
}

/// `settle export`.
pub async fn export(a: ExportArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let pb = spinner("exporting");
    let summary = match (&a.data, &a.store) {
        (Some(dir), _) => {
            let (dir, to) = (dir.clone(), a.to.clone());
            let mut tick = progress(&pb, "exported");
            tokio::task::spawn_blocking(move || {
                write_whole(&to, |w| {
                    settle_embedded::export_dir(&dir, w, &mut tick).map_err(Failure::local)
                })
            })
            .await
            .map_err(Failure::local)??
        }
        (None, Some(url)) => {
            let store = crate::pg::connect(url).await?;
            let tick = progress(&pb, "exported");
            let to = a.to.clone();
            // The snapshot streams from the database while this task
            // writes the file (small blocking writes into a buffer).
            let result = export_store(&store, &to, tick).await;
            store.close();
            result?
        }
        (None, None) => unreachable!("clap requires --data or --store"),
    };
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let v = summary_json(&a.to, &summary, secs);
    say(
        v,
        a.json,
        format!(
            "exported {} records, {} principals, {} warning tasks ({} bytes) to {} in {secs:.1} s",
            summary.records,
            summary.principals,
            summary.warning_tasks,
            summary.bytes,
            a.to.display()
        ),
    );
    Ok(())
}

/// Writes a live store's snapshot to `to`, whole or not at all.
async fn export_store(
    store: &dyn settle_ledger::Store,
    to: &Path,
    tick: impl FnMut(u64, u64),
) -> Result<Summary, Failure> {
    crate::files::refuse_existing(to)?;
    let partial = partial_name(to);
    let out = crate::files::create_exclusive(&partial)?;
    let r = export_to(store, BufWriter::new(out), tick).await;
    let (w, summary) = match r {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(Failure::local(e));
        }
    };
    write_whole_after(&partial, to, w)?;
    Ok(summary)
}

/// Syncs a written `partial` and publishes it as `to`.
fn write_whole_after(partial: &Path, to: &Path, w: BufWriter<File>) -> Result<(), Failure> {
    let f = w.into_inner().map_err(|e| Failure::local(e.error()))?;
    f.sync_all().map_err(Failure::local)?;
    crate::files::publish(partial, to)
}

fn import_json(
    report: &ImportReport,
    file: &Path,
    target: &str,
    margin: u64,
    seconds: f64,
) -> Value {
    let mut v = summary_json(file, &report.summary, seconds);
    v["target"] = json!(target);
    v["target_fence_floor"] = json!(report.fence_floor);
    v["fence_margin"] = json!(margin);
    v["claims_covered"] = json!(report.summary.claims_covered(margin));
    v
}

/// `settle import`.
pub async fn import(a: ImportArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let pb = spinner("importing");
    let (report, target) = match (&a.data, &a.store) {
        (Some(dir), _) => {
            let name = dir.display().to_string();
            let (dir, from, margin) = (dir.clone(), a.from.clone(), a.fence_margin);
            let tick = progress(&pb, "imported");
            let r = tokio::task::spawn_blocking(move || {
                settle_embedded::import(&dir, &from, margin, tick)
            })
            .await
            .map_err(Failure::local)?
            .map_err(Failure::local)?;
            (r, name)
        }
        (None, Some(url)) => {
            let tick = progress(&pb, "imported");
            let r = crate::pg::import(url, &a.from, a.fence_margin, tick).await?;
            (r, crate::pg::redacted(url))
        }
        (None, None) => unreachable!("clap requires --data or --store"),
    };
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let s = &report.summary;
    say(
        import_json(&report, &a.from, &target, a.fence_margin, secs),
        a.json,
        format!(
            "imported {} records, {} principals, {} warning tasks into {target} in {secs:.1} s; \
             its next fence is {}: {}",
            s.records,
            s.principals,
            s.warning_tasks,
            report.fence_floor,
            margin_words(s, a.fence_margin)
        ),
    );
    Ok(())
}

/// `settle migrate`: export, import, then both sides exported again and
/// compared (counts and per-tenant digests).
pub async fn migrate(a: MigrateArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let pb = spinner("migrating");
    // A directory of its own (random name, mode 0700), removed with what
    // is in it: nothing is written through a name someone could plant.
    let tmp_dir = tempfile::Builder::new()
        .prefix("settle-migrate-")
        .tempdir()
        .map_err(|e| Failure::local(format!("cannot create a temporary directory: {e}")))?;
    let tmp = tmp_dir.path().join("migrate.settle");
    let result = migrate_through(&a, &tmp, &pb).await;
    drop(tmp_dir);
    let (source, report, target, target_name) = result?;
    pb.finish_and_clear();
    if source.tenants != target.tenants
        || (source.records, source.principals, source.warning_tasks)
            != (target.records, target.principals, target.warning_tasks)
    {
        return Err(Failure::local(format!(
            "the target does not hold what the source held (source: {} records, {} principals, \
             {} warning tasks; target: {}, {}, {}; per-tenant digests {}): do not use it",
            source.records,
            source.principals,
            source.warning_tasks,
            target.records,
            target.principals,
            target.warning_tasks,
            if source.tenants == target.tenants {
                "equal"
            } else {
                "differ"
            }
        )));
    }
    let secs = started.elapsed().as_secs_f64();
    let v = json!({
        "source": summary_json(Path::new(""), &source, secs),
        "target": target_name,
        "target_fence_floor": report.fence_floor,
        "fence_margin": a.fence_margin,
        "claims_covered": source.claims_covered(a.fence_margin),
        "records": source.records,
        "principals": source.principals,
        "warning_tasks": source.warning_tasks,
        "tenants": source.tenants.len(),
        "checked": true,
        "seconds": round3(secs),
    });
    say(
        v,
        a.json,
        format!(
            "moved {} records, {} principals, {} warning tasks of {} tenants to {target_name} in \
             {secs:.1} s; both sides checked (counts and per-tenant digests equal); its next \
             fence is {} (the source's highest plus --fence-margin {}, so that no fence is \
             handed out twice should the source have granted more)",
            source.records,
            source.principals,
            source.warning_tasks,
            source.tenants.len(),
            report.fence_floor,
            a.fence_margin
        ),
    );
    Ok(())
}

async fn migrate_through(
    a: &MigrateArgs,
    tmp: &Path,
    pb: &indicatif::ProgressBar,
) -> Result<(Summary, ImportReport, Summary, String), Failure> {
    match (&a.from_data, &a.to_store, &a.from_store, &a.to_data) {
        (Some(dir), Some(url), _, _) => {
            let (d, t) = (dir.clone(), tmp.to_path_buf());
            let mut tick = progress(pb, "exported");
            let source = tokio::task::spawn_blocking(move || {
                write_whole(&t, |w| {
                    settle_embedded::export_dir(&d, w, &mut tick).map_err(Failure::local)
                })
            })
            .await
            .map_err(Failure::local)??;
            let report =
                crate::pg::import(url, tmp, a.fence_margin, progress(pb, "imported")).await?;
            let store = crate::pg::connect(url).await?;
            let check = export_to(&store, std::io::sink(), progress(pb, "checked")).await;
            store.close();
            let (_, target) = check.map_err(Failure::local)?;
            Ok((source, report, target, crate::pg::redacted(url)))
        }
        (_, _, Some(url), Some(dir)) => {
            let store = crate::pg::connect(url).await?;
            let source = export_store(&store, tmp, progress(pb, "exported")).await;
            store.close();
            let source = source?;
            let (d, t, margin) = (dir.clone(), tmp.to_path_buf(), a.fence_margin);
            let tick = progress(pb, "imported");
            let report =
                tokio::task::spawn_blocking(move || settle_embedded::import(&d, &t, margin, tick))
                    .await
                    .map_err(Failure::local)?
                    .map_err(Failure::local)?;
            let d = dir.clone();
            let mut tick = progress(pb, "checked");
            let (_, target) = tokio::task::spawn_blocking(move || {
                settle_embedded::export_dir(&d, std::io::sink(), &mut tick)
            })
            .await
            .map_err(Failure::local)?
            .map_err(Failure::local)?;
            Ok((source, report, target, dir.display().to_string()))
        }
        _ => Err(Failure::usage(
            "give --from-data DIR --to-store URL, or --from-store URL --to-data DIR",
        )),
    }
}
