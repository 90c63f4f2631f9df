//! `settle-faultproxy --listen ADDR --upstream ADDR`: the fault-injecting
//! proxy as a process, for the Python and TypeScript SDK tests. It prints
//! `listening on HOST:PORT` once bound and serves until killed; rules are
//! set over its control API (README.md).
#![allow(clippy::print_stdout, clippy::print_stderr)] // a CLI prints its address

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use settle_faultproxy::Proxy;

#[derive(Parser)]
#[command(
    name = "settle-faultproxy",
    version,
    about = "A fault-injecting HTTP/1.1 proxy in front of settle serve (tests only)."
)]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The settle server: HOST:PORT or http://HOST:PORT.
    #[arg(long)]
    upstream: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let authority = args
        .upstream
        .strip_prefix("http://")
        .unwrap_or(&args.upstream);
    let authority = authority.trim_end_matches('/');
    let upstream = match tokio::net::lookup_host(authority)
        .await
        .map(|mut a| a.next())
    {
        Ok(Some(addr)) => addr,
        Ok(None) => return fail(&format!("upstream {authority}: no address")),
        Err(e) => return fail(&format!("upstream {authority}: {e}")),
    };
    let proxy = match Proxy::start(args.listen, upstream).await {
        Ok(proxy) => proxy,
        Err(e) => return fail(&format!("listen on {}: {e}", args.listen)),
    };
    println!("listening on {}", proxy.addr());
    if std::io::stdout().flush().is_err() {
        return ExitCode::FAILURE;
    }
    std::future::pending::<()>().await;
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("settle-faultproxy: {message}");
    ExitCode::FAILURE
}
