//! `settle`: the server, a client for it, an offline inspector and a
//! benchmark. This file is the `clap` front only: each subcommand lives in
//! its own module (`remote`: the client calls; `offline`: inspect and
//! check of a stopped store's data directory; `bench`), and every failure
//! becomes one line on stderr and an exit code (`exit`).
#![allow(clippy::print_stdout, clippy::print_stderr)] // a CLI prints its answers

mod alloc;
mod backup;
#[cfg(feature = "bench")]
mod bench;
mod docs;
mod exit;
mod files;
mod offline;
mod otlp;
mod pg;
mod portable;
mod remote;
mod serve;
#[cfg(feature = "sim")]
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::Failure;

#[derive(Parser)]
#[command(
    name = "settle",
    version,
    about = "A durable ledger that makes retried side effects happen at most once.",
    after_help = "Exit codes: 0 success, 1 local failure, 2 usage error, 3 server unreachable, \
                  4 invalid request (400/401/404/408/413/422), 5 protocol refusal (409), \
                  6 try again later (429 rate_limited/quota_exceeded, 5xx), 7 TLS handshake failed."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the HTTP server (docs/spec.md §7).
    Serve(Box<serve::ServeArgs>),
    /// Reserve a key and ask for permission to execute.
    Claim(remote::ClaimArgs),
    /// Extend a lease.
    Heartbeat(remote::HeartbeatArgs),
    /// Record that the remote write is about to start.
    Dispatch(remote::DispatchArgs),
    /// Record the outcome and release the lease (one durable commit).
    Settle(remote::SettleArgs),
    /// Release an execute lease without a receipt: nothing was sent
    /// (not_dispatched), or the remote definitively refused the effect
    /// (not_committed).
    Release(remote::ReleaseArgs),
    /// Report what reconciliation found out.
    Reconcile(remote::ReconcileArgs),
    /// Show an operation record.
    Get(remote::GetArgs),
    /// Raise a principal's generation (revokes its older leases).
    Revoke(remote::RevokeArgs),
    /// Record a bounded warning.
    Warn(remote::WarnArgs),
    /// List a task's warnings.
    Warnings(remote::WarningsArgs),
    /// List the tenant's operations, live (docs/spec.md §9); one page per call.
    List(remote::ListArgs),
    /// The tenant's counts by status, stuck, disputed, quarantined (live).
    Stats(remote::StatsArgs),
    /// Back up a running server, live (docs/spec.md §12): a consistent
    /// snapshot streamed into FILE.partial, verified, then renamed to FILE.
    Backup(backup::BackupArgs),
    /// Read a stopped embedded store offline.
    Inspect(offline::OfflineArgs),
    /// Check every record of a stopped embedded store against docs/spec.md
    /// §6; exits 1 if any record violates an invariant or is refused.
    Check(offline::OfflineArgs),
    /// Write a store's data to a portable export file (docs/spec.md §12):
    /// a stopped embedded store (--data) or a live PostgreSQL one (--store).
    Export(portable::ExportArgs),
    /// Load an export file into an empty store (--data DIR or --store URL).
    Import(portable::ImportArgs),
    /// Move a stopped store between engines, then check both sides.
    Migrate(portable::MigrateArgs),
    /// Measure claim+settle pairs per second.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, ...).
    Completions(docs::CompletionsArgs),
    /// Print the man page (roff; `settle man | man -l -`), or write a page per
    /// command with --dir.
    Man(docs::ManArgs),
    /// Run the deterministic simulator: --seed S replays one seed, --seeds N
    /// runs many and prints {"seeds", "steps", "faults", "violations"}.
    #[cfg(feature = "sim")]
    Sim(sim::SimArgs),
}

/// mimalloc instead of the system allocator: in the embedded store, values
/// allocated on the writer thread are freed on the checkpointer's (and
/// commands parsed on the server's threads on the writer's), and
/// per-thread free lists make that cheap (glibc's
/// malloc/free were about a tenth of the CPU of a pair in the profile; see
/// docs/performance.md).
#[global_allocator]
static ALLOCATOR: alloc::Mimalloc = alloc::Mimalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.cmd).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if let Some(m) = f.message {
                eprintln!("{m}");
            }
            ExitCode::from(f.code)
        }
    }
}

async fn run(cmd: Cmd) -> Result<(), Failure> {
    match cmd {
        Cmd::Serve(args) => serve(*args).await,
        Cmd::Claim(a) => remote::claim(a).await,
        Cmd::Heartbeat(a) => remote::heartbeat(a).await,
        Cmd::Dispatch(a) => remote::dispatch(a).await,
        Cmd::Settle(a) => remote::settle(a).await,
        Cmd::Release(a) => remote::release(a).await,
        Cmd::Reconcile(a) => remote::reconcile(a).await,
        Cmd::Get(a) => remote::get(a).await,
        Cmd::Revoke(a) => remote::revoke(a).await,
        Cmd::Warn(a) => remote::warn(a).await,
        Cmd::Warnings(a) => remote::warnings(a).await,
        Cmd::List(a) => remote::list(a).await,
        Cmd::Stats(a) => remote::stats(a).await,
        Cmd::Backup(a) => backup::run(a).await,
        Cmd::Inspect(a) => offline::run(a, false),
        Cmd::Check(a) => offline::run(a, true),
        Cmd::Export(a) => portable::export(a).await,
        Cmd::Import(a) => portable::import(a).await,
        Cmd::Migrate(a) => portable::migrate(a).await,
        Cmd::Completions(a) => docs::completions::<Cli>(a),
        Cmd::Man(a) => docs::man::<Cli>(a),
        #[cfg(feature = "bench")]
        Cmd::Bench(a) => bench::run(a).await,
        #[cfg(feature = "sim")]
        Cmd::Sim(a) => sim::run(a),
    }
}

/// `settle serve` (engine selection and logging live in `serve.rs`).
async fn serve(args: serve::ServeArgs) -> Result<(), Failure> {
    serve::serve_main(args).await.map_err(Failure::local)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument and option of every subcommand says what it is
    /// (`<KEY>`, `--fence`, `--lease-ms`, ...).
    #[test]
    fn every_argument_has_help_text() {
        let cli = super::Cli::command();
        let mut bare = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && arg.get_help().is_none() && !arg.is_hide_set() {
                    bare.push(format!("settle {} {id}", sub.get_name()));
                }
            }
        }
        assert!(bare.is_empty(), "no help text: {bare:?}");
    }

    /// `settle serve --help` shows the default of every setting.
    #[test]
    fn serve_help_shows_every_default() {
        let mut cli = super::Cli::command();
        let serve = cli.find_subcommand_mut("serve").unwrap();
        let help = serve.render_long_help().to_string();
        let mut missing = Vec::new();
        for arg in serve.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || arg.is_hide_set() {
                continue;
            }
            let text = arg.get_long_help().or(arg.get_help()).unwrap().to_string();
            if !text.contains("[default:") {
                missing.push(id.to_string());
            }
        }
        assert!(missing.is_empty(), "no default shown: {missing:?}\n{help}");
        assert!(help.contains("[default: 127.0.0.1:7411]"), "{help}");
    }
}
