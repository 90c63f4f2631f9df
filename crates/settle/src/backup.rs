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
    /// Read the export at most this fast, in bytes per second; a suffix k or
    /// M multiplies by 1024 or 1024² (as curl's --limit-rate). The server
    /// encodes only as fast as the backup reads, so a throttled backup
    /// takes less of its CPU from the writes [default: unlimited].
    #[arg(long, value_name = "BYTES_PER_S", value_parser = parse_rate)]
    max_rate: Option<u64>,
    /// Print a one-line JSON summary on stdout instead of a sentence.
    #[arg(long)]
    json: bool,
}

/// `--max-rate`: a positive whole number of bytes per second, with an
/// optional `k`/`K` (×1024) or `m`/`M` (×1024²).
fn parse_rate(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1024),
        Some((i, 'm' | 'M')) => (&s[..i], 1024 * 1024),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0 && digits.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| {
            format!("{s:?} is not a rate: a positive whole number of bytes per second, optionally with k or M (e.g. 500k, 20M)")
        })
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
    /// `--max-rate` in bytes per second; null: unlimited.
    max_rate: Option<u64>,
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
        r = receive(download, file, &partial.path, a.max_rate) => r,
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
async fn receive(
    mut d: Download,
    file: File,
    path: &Path,
    max_rate: Option<u64>,
) -> Result<(), Failure> {
    let started = Instant::now();
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
        if let Some(rate) = max_rate {
            // Pacing, not synchronisation: no faster than `rate` on average
            // since the start; the server's bounded pipeline then waits.
            let due = Duration::from_secs_f64(d.received() as f64 / rate as f64);
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(ahead).await;
            }
        }
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
            max_rate: a.max_rate,
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_rate_is_bytes_per_second_with_k_or_m() {
        for (given, rate) in [
            ("1", 1),
            ("500k", 500 * 1024),
            ("500K", 500 * 1024),
            ("20M", 20 * 1024 * 1024),
            ("3m", 3 * 1024 * 1024),
        ] {
            assert_eq!(super::parse_rate(given), Ok(rate), "{given}");
        }
        for bad in [
            "",
            "0",
            "0k",
            "k",
            "-5",
            "+5",
            "1.5M",
            "10G",
            "5 k",
            "99999999999999999999M",
        ] {
            let e = super::parse_rate(bad).unwrap_err();
            assert!(e.contains("not a rate"), "{bad}: {e}");
        }
    }
}
