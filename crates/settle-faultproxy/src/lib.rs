//! settle-faultproxy: a fault-injecting HTTP/1.1 reverse proxy for tests.
//!
//! It sits between an SDK and a real `settle serve` and, per call name
//! (`claim`, `settle`, `get`, ...), key and n-th matching call, forwards the
//! request and drops the answer (the server applied it, the client loses
//! it), cuts the connection before forwarding, answers 429/503 itself, or
//! delays. Rust tests use [`Proxy`] in process; the Python and TypeScript
//! tests run the `settle-faultproxy` binary and drive its control API
//! under `/__faults/` (README.md).
//!
//! ```no_run
//! # async fn demo(upstream: std::net::SocketAddr) -> std::io::Result<()> {
//! use settle_faultproxy::{Action, Call, Proxy, Rule};
//! let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream).await?;
//! // the second claim reaches the server, its answer never reaches the client
//! proxy.set_rules(vec![Rule::new(Call::Claim, Action::DropAnswer).nth(2)]);
//! // ... point a client at proxy.addr() ...
//! let log = proxy.log();
//! proxy.stop().await;
//! # Ok(()) }
//! ```

mod proxy;
mod rules;

pub use crate::proxy::Proxy;
pub use crate::rules::{Action, Call, LoggedCall, Rule, RuleError, Taken};
