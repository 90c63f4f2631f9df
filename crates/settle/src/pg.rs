//! The PostgreSQL side of `settle export`, `settle import` and `settle
//! migrate`: a connection with the command's name, and URLs shown without
//! their password.

use std::path::Path;

use settle_ledger::export::ImportReport;
use settle_pg::{PgOptions, PgStore};

use crate::exit::Failure;

/// A store on `url`, named after the running command in `pg_stat_activity`.
pub async fn connect(url: &str) -> Result<PgStore, Failure> {
    PgStore::connect(
        url,
        PgOptions {
            application_name: "settle export".into(),
            ..PgOptions::default()
        },
    )
    .await
    .map_err(|e| Failure::local(format!("{}: {e}", redacted(url))))
}

/// Imports `file` into the empty store on `url`.
pub async fn import(
    url: &str,
    file: &Path,
    margin: u64,
    progress: impl FnMut(u64, u64),
) -> Result<ImportReport, Failure> {
    let opts = PgOptions {
        application_name: "settle import".into(),
        ..PgOptions::default()
    };
    settle_pg::import(url, opts, file, margin, progress)
        .await
        .map_err(|e| Failure::local(format!("{}: {e}", redacted(url))))
}

/// `url` without its password (for messages and summaries).
pub use settle_server::config::redact_url as redacted;
