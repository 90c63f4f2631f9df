//! `settle-nemesis`: black-box fault runs of a deployed settle
//! (docs/reliability.md). `run` (as root) builds the topology, runs the
//! workload under a seeded nemesis, heals, checks the history and prints
//! the report; `remote` and `workload` are the parts it starts inside
//! the namespaces.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool
#![allow(missing_docs)]

mod check;
mod remote;
mod rng;
mod run;
mod topology;
mod workload;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "settle-nemesis",
    about = "Black-box fault runs of a deployed settle"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One run: topology, workload, nemesis, heal, check; the report as JSON.
    Run(run::RunArgs),
    /// The counting remote (started by `run` in its namespace).
    Remote {
        #[arg(long)]
        listen: String,
        #[arg(long)]
        log: std::path::PathBuf,
    },
    /// The workload (started by `run` in the clients' namespace).
    Workload(workload::WorkloadArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SETTLE_LOG")
                .unwrap_or_else(|_| "warn,settle_faultproxy=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    match cli.cmd {
        Cmd::Run(a) => match run::run(&a) {
            Ok(report) => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("a report serializes")
                );
                if report.verdict.violations.is_empty() {
                    std::process::ExitCode::SUCCESS
                } else {
                    std::process::ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("settle-nemesis: {e}");
                std::process::ExitCode::from(2)
            }
        },
        Cmd::Remote { listen, log } => match rt().block_on(remote::serve(&listen, &log)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("settle-nemesis remote: {e}");
                std::process::ExitCode::from(2)
            }
        },
        Cmd::Workload(a) => match rt().block_on(workload::run(a)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("settle-nemesis workload: {e}");
                std::process::ExitCode::from(2)
            }
        },
    }
}
