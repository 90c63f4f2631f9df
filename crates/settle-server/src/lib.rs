//! # settle-server: the HTTP binding of SPEC §7
//!
//! An axum router over any [`settle_ledger::Store`]: bearer-token tenants,
//! problem+json errors, Prometheus metrics, a generated OpenAPI document,
//! a background sweep and graceful shutdown. The handlers only translate
//! between the wire and the core's commands; the rules decide everything.
//!
//! The server needs only the `Store` trait: the `settle` binary picks and
//! opens the engine, reads flags into [`Settings`], and calls [`run`].
//! Decisions the spec leaves open are written down in `docs/http-api.md`.

pub mod admin;
pub mod auth;
pub mod batch;
pub mod config;
pub mod http;
pub mod inspect;
pub mod live;
pub mod metrics;
pub mod openapi;
pub mod problem;
pub mod quota;
pub mod serve;
pub mod target;
pub mod tls;
pub mod trace;
pub mod wire;

pub use config::{Config, ConfigError, Settings};
pub use http::{AppState, router};
pub use serve::{
    Edge, LoadConfig, OpenedStore, Reloaded, answer, log_auth, log_deprecated, reload, run,
    run_edge, shutdown_signal, sweep_loop,
};
