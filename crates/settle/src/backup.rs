//! `settle backup --url URL --to FILE`: a live backup of a running server
//! (SPEC §12). `GET /v1/admin/export` streams one consistent snapshot into
//! `FILE.partial`, which is flushed to disk, verified whole
//! (`settle_portable::verify`: every line's checksum, the order, the
//! trailer's counts and digest) and only then renamed to FILE: a FILE
//! that exists is a whole backup. Nothing is overwritten.

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use settle_client::Download;
use settle_portable::Summary;

use crate::exit::{self, Failure};

/// `settle backup` flags.
#[derive(Args)]
pub struct BackupArgs {
    /// The server's URL.
    #[arg(long, env = "SETTLE_URL", default_value = "http://127.0.0.1:7411")]
    url: String,
    /// The backup file to create; refused if it exists. It is written as
    /// FILE.partial first and renamed to FILE once verified.
    #[arg(long, value_name = "FILE")]
    to: PathBuf,
    /// An admin token (the server's [admin] token_sha256 is its SHA-256);
    /// not needed while the server runs without authentication on loopback.
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of a CA to trust for an https:// URL (besides the system's roots).
    #[arg(long, env = "SETTLE_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// Print a one-line JSON summary on stdout instead of a sentence.
    #[arg(long)]
    json: bool,
}

/// What `--json` prints: where the backup is and what it holds.
#[derive(serde::Serialize)]
struct Report<'a> {
    file: String,
    engine: &'a str,
    records: u64,
    principals: u64,
    warning_tasks: u64,
    max_fence: u64,
    fence_floor: u64,
    bytes: u64,
    /// The trailer's digest: SHA-256 of every byte before the trailer line.
    sha256: &'a str,
    seconds: f64,
}

/// `FILE.partial`, removed unless the backup completed.
struct Partial {
    path: PathBuf,
    keep: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `settle backup`.
pub async fn run(a: BackupArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let client = crate::remote::client_for(&a.url, a.token.as_deref(), a.ca_cert.as_deref())?;
    crate::files::refuse_existing(&a.to)?;
    let partial_path = crate::portable::partial_name(&a.to);
    let file = crate::files::create_exclusive(&partial_path)?;
    let mut partial = Partial {
        path: partial_path,
        keep: false,
    };

    let download = client.export().await.map_err(exit::client_failure)?;
    let streamed = tokio::select! {
        r = receive(download, file, &partial.path) => r,
        _ = tokio::signal::ctrl_c() => Err(Failure::local(format!(
            "interrupted; {} removed, nothing written to {}",
            partial.path.display(),
            a.to.display()
        ))),
    };
    streamed?;

    let path = partial.path.clone();
    let summary = tokio::task::spawn_blocking(move || verify(&path))
        .await
        .map_err(Failure::local)??;
    crate::files::publish(&partial.path, &a.to)?;
    partial.keep = true;

    let seconds = started.elapsed().as_secs_f64();
    print_report(&a, &summary, seconds);
    Ok(())
}

/// Streams the body into `file` and makes it durable; the progress on
/// stderr when it is a terminal.
async fn receive(mut d: Download, file: File, path: &Path) -> Result<(), Failure> {
    let write_error =
        |e: std::io::Error| Failure::local(format!("writing {}: {e}", path.display()));
    let bar = progress();
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut lines: u64 = 0;
    loop {
        let chunk = match d.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                // The server answered and did not finish (its store failed,
                // it shut down, or the connection broke): a server failure.
                bar.finish_and_clear();
                return Err(Failure::new(
                    exit::UNAVAILABLE,
                    format!("error: the export did not arrive whole ({e}); nothing written"),
                ));
            }
        };
        out.write_all(&chunk).map_err(write_error)?;
        lines += newlines(&chunk);
        // The header is the first line; the trailer the last.
        bar.set_message(format!(
            "{} entities  {}",
            lines.saturating_sub(1),
            indicatif::HumanBytes(d.received())
        ));
        bar.tick();
    }
    bar.finish_and_clear();
    let file = out.into_inner().map_err(|e| write_error(e.into_error()))?;
    tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .map_err(Failure::local)?
        .map_err(write_error)
}

fn newlines(b: &[u8]) -> u64 {
    b.iter().filter(|&&c| c == b'\n').count() as u64
}

/// A spinner with the entities and bytes so far, on a terminal only.
fn progress() -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} backup: {msg}  {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Reads the file back whole: its summary if it is a whole export.
fn verify(path: &Path) -> Result<Summary, Failure> {
    let f = File::open(path)
        .map_err(|e| Failure::local(format!("cannot read {}: {e}", path.display())))?;
    settle_portable::verify(BufReader::with_capacity(1 << 20, f))
        .map_err(|e| Failure::local(format!("the backup does not verify ({e}); nothing written")))
}

fn print_report(a: &BackupArgs, s: &Summary, seconds: f64) {
    if a.json {
        let r = Report {
            file: a.to.display().to_string(),
            engine: &s.engine,
            records: s.records,
            principals: s.principals,
            warning_tasks: s.warning_tasks,
            max_fence: s.max_fence,
            fence_floor: s.fence_floor,
            bytes: s.bytes,
            sha256: &s.sha256,
            seconds,
        };
        println!(
            "{}",
            serde_json::to_string(&r).expect("the report serializes")
        );
    } else {
        println!(
            "backed up the {} store to {}: {} records, {} principals, {} warning tasks, {} in {:.1} s (verified; sha256 {})",
            s.engine,
            a.to.display(),
            s.records,
            s.principals,
            s.warning_tasks,
            indicatif::HumanBytes(s.bytes),
            seconds,
            s.sha256
        );
    }
}
