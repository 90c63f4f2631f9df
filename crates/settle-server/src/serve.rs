//! The accept loop, the sweep, graceful shutdown. The store arrives open
//! (the binary picks and opens the engine); this module only needs the
//! `Store` trait.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use settle_ledger::Store;
use tokio::net::TcpListener;
use tower::Service;
use tracing::{error, info, warn};

use crate::config::{AuthConfig, Config};
use crate::http::{AppState, router};

/// An open store and how to close it gracefully (the `Store` trait has no close).
pub struct OpenedStore {
    /// The store to serve.
    pub store: Arc<dyn Store>,
    close: Box<dyn FnOnce() + Send>,
}

impl OpenedStore {
    /// `store`, and `close` to run at shutdown.
    pub fn new(store: Arc<dyn Store>, close: impl FnOnce() + Send + 'static) -> OpenedStore {
        OpenedStore {
            store,
            close: Box::new(close),
        }
    }
    /// Lets in-flight commits finish and flushes.
    pub fn close(self) {
        (self.close)()
    }
}

/// The start-up lines about authentication: on, and for how many tenants,
/// or a warning that it is off (only allowed on a loopback address); and
/// who may call the admin endpoints.
pub fn log_auth(config: &Config, addr: SocketAddr) {
    match &config.auth {
        AuthConfig::Off => warn!(
            "AUTHENTICATION IS OFF: no [[tenants]] are configured, so every caller on this \
             machine is tenant `default`. This is only allowed on a loopback address ({addr}). \
             Configure [[tenants]] before exposing the server."
        ),
        AuthConfig::Tenants(t) => info!(
            tenants = t.len(),
            "authentication is on: bearer tokens of {} tenant{}",
            t.len(),
            if t.len() == 1 { "" } else { "s" }
        ),
    }
    let admins = config.admin_tokens.len();
    match (&config.auth, admins) {
        (AuthConfig::Off, 0) => warn!(
            "the admin endpoints (/v1/admin/…) are open too: authentication is off and no \
             [admin] token_sha256 is configured"
        ),
        (_, 0) => info!(
            "no [admin] token_sha256 is configured: the admin endpoints (/v1/admin/…) refuse \
             every call"
        ),
        (_, n) => info!(
            admin_tokens = n,
            "the admin endpoints (/v1/admin/…) need one of {n} admin token{}",
            if n == 1 { "" } else { "s" }
        ),
    }
}

/// A start-up warning for each deprecated setting that was given
/// ([`Config::deprecated`]): it is ignored, and refused from the next release.
pub fn log_deprecated(config: &Config) {
    for key in &config.deprecated {
        warn!(
            setting = key,
            "the setting {key} (--{}) is deprecated and ignored; it will be removed in the next release",
            key.replace('_', "-")
        );
    }
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish
/// and closes the store.
pub async fn run(
    config: Config,
    opened: OpenedStore,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) {
    let state = Arc::new(AppState::new(opened.store.clone(), &config));
    let app = router(state.clone());
    let sweep = tokio::spawn(sweep_loop(
        opened.store.clone(),
        Duration::from_millis(config.sweep_interval_ms),
        state.metrics.clone(),
    ));

    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(config.request_timeout_ms))
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let app = app.clone();
            async move { Ok::<_, std::convert::Infallible>(answer(app, req.map(Body::new)).await) }
        });
        let stream = crate::target::ProblemFor414::new(stream);
        let conn = http.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }

    info!("shutting down: finishing in-flight requests");
    state.ready.store(false, Ordering::Relaxed);
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        warn!("some connections did not finish within 30 s");
    }
    sweep.abort();
    let _ = sweep.await;
    drop(app);
    tokio::task::spawn_blocking(move || opened.close())
        .await
        .unwrap_or_else(|e| error!(error = %e, "closing the store panicked"));
    info!("store closed");
}

/// The server's answer to one request, as `run` gives it on a connection:
/// an over-long target is refused before routing (SPEC §7, 414). The
/// in-process bindings (crates/settle-local) answer through here too.
pub async fn answer(mut app: Router, req: axum::http::Request<Body>) -> axum::response::Response {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    match crate::target::too_long(target) {
        Some(p) => crate::http::finish(crate::http::Route::Unmatched, Err(p)),
        None => match app.call(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        },
    }
}

/// Every `every`, ends lapsed leases and collects expired records (SPEC
/// §4 retention), counting both; runs until aborted.
pub async fn sweep_loop(
    store: Arc<dyn Store>,
    every: Duration,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.sweep().await {
            Ok(r) => {
                if r.expired > 0 || r.collected > 0 {
                    tracing::debug!(expired = r.expired, collected = r.collected, "sweep");
                }
                metrics::counter!(crate::metrics::SWEEP_EXPIRED).increment(r.expired);
                metrics::counter!(crate::metrics::SWEEP_COLLECTED).increment(r.collected);
            }
            Err(e) => warn!(error = %e, "sweep failed"),
        }
        // Histograms must be drained now and then even if nobody scrapes.
        if let Some(h) = &metrics {
            h.run_upkeep();
        }
    }
}

/// SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    info!("shutdown signal received");
}
