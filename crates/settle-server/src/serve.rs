//! The accept loop, the sweep, graceful shutdown. The store arrives open
//! (the binary picks and opens the engine); this module only needs the
//! `Store` trait.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use settle_ledger::Store;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::Service;
use tracing::{Instrument as _, error, info, warn};

use crate::config::{AuthConfig, Config, ConfigError};
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
/// ([`Config::deprecated`]: it is ignored, and refused from the next
/// release) and each setting given that this configuration does not use
/// ([`Config::unused`]).
pub fn log_deprecated(config: &Config) {
    for key in &config.deprecated {
        warn!(
            setting = key,
            "the setting {key} (--{}) is deprecated and ignored; it will be removed in the next release",
            key.replace('_', "-")
        );
    }
    for sentence in &config.unused {
        warn!("{sentence}");
    }
}

/// How the configuration is read again on SIGHUP (the file named at start,
/// with the flags given at start winning, as then).
pub type LoadConfig = Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// The service edge of [`run_edge`]: HTTPS and reload.
#[derive(Default, Clone)]
pub struct Edge {
    /// Serve HTTPS with this acceptor (built from `config.tls`).
    pub tls: Option<TlsAcceptor>,
    /// Re-read the configuration on SIGHUP with this (none: SIGHUP is not handled).
    pub reload: Option<LoadConfig>,
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish
/// and closes the store. Plain HTTP, no reload (tests, the benchmarks).
pub async fn run(
    config: Config,
    opened: OpenedStore,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) {
    run_edge(config, opened, listener, Edge::default(), shutdown).await
}

/// [`run`] with HTTPS and reload on SIGHUP as `edge` says.
pub async fn run_edge(
    config: Config,
    opened: OpenedStore,
    listener: TcpListener,
    edge: Edge,
    shutdown: impl Future<Output = ()> + Send,
) {
    let state = Arc::new(AppState::new(opened.store.clone(), &config));
    let app = router(state.clone());
    let sweep = tokio::spawn(sweep_loop(
        opened.store.clone(),
        Duration::from_millis(config.sweep_interval_ms),
        state.metrics.clone(),
    ));
    let tls = Arc::new(ArcSwapOption::from(edge.tls.map(Arc::new)));
    let reloads = edge.reload.map(|load| {
        tokio::spawn(reload_on_sighup(
            state.clone(),
            tls.clone(),
            config.clone(),
            load,
        ))
    });

    let (http, https) = connection_builders(&config);
    let handshake_timeout = Duration::from_millis(config.request_timeout_ms);
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
        match tls.load_full() {
            None => {
                let stream = crate::target::ProblemFor414::new(stream);
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            Some(acceptor) => {
                // The handshake runs on the connection's own task, so a slow
                // client never holds up the accept loop.
                let https = https.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(
                        handshake_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("TLS handshake timed out");
                            return;
                        }
                    };
                    let stream = crate::target::ProblemFor414::new(stream);
                    let conn = https.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }

    info!("shutting down: finishing in-flight requests");
    state.ready.store(false, Ordering::Relaxed);
    drop(listener);
    if let Some(r) = reloads {
        r.abort();
    }
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

/// The connection builders: HTTP/1.1 for plain connections; HTTP/1.1 or
/// HTTP/2 (as ALPN chose) over TLS. A request head must arrive within
/// `request_timeout_ms` (slow clients).
fn connection_builders(
    config: &Config,
) -> (
    hyper::server::conn::http1::Builder,
    hyper_util::server::conn::auto::Builder<TokioExecutor>,
) {
    let head = Duration::from_millis(config.request_timeout_ms);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(head)
        .keep_alive(true);
    let mut https = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    https
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(head)
        .keep_alive(true);
    https.http2().timer(TokioTimer::new());
    (http, https)
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The new configuration is in force; these settings changed in the
    /// file but are fixed until a restart (logged), and kept as they were.
    Applied {
        /// The settings that need a restart.
        kept: Vec<&'static str>,
    },
    /// The new configuration did not validate: nothing changed.
    Refused(String),
}

/// Reads the configuration again and, when it validates whole (and its
/// TLS files load), swaps it in; otherwise the running one stays. Logged
/// and counted (`settle_config_reloads_total{result}`).
pub fn reload(
    state: &AppState,
    tls: Option<&ArcSwapOption<TlsAcceptor>>,
    started: &Config,
    load: &LoadConfig,
) -> Reloaded {
    let outcome = (|| {
        let new = load().map_err(|e| e.to_string())?;
        let acceptor = match (tls.and(started.tls.as_ref()), &new.tls) {
            (Some(_), Some(files)) => Some(crate::tls::acceptor(files).map_err(|e| e.to_string())?),
            _ => None,
        };
        let kept = fixed_until_restart(started, &new);
        state.reload(&new);
        if let (Some(slot), Some(a)) = (tls, acceptor) {
            slot.store(Some(Arc::new(a)));
        }
        Ok::<_, String>(kept)
    })();
    match outcome {
        Ok(kept) => {
            metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => "applied").increment(1);
            for setting in &kept {
                warn!(
                    setting,
                    "configuration reloaded, but {setting} changed and is fixed until a restart: \
                     the running value stays"
                );
            }
            info!(
                "configuration reloaded: tenants, tokens, [admin], limits, quotas{} in force",
                if started.tls.is_some() {
                    " and the TLS certificate"
                } else {
                    ""
                }
            );
            Reloaded::Applied { kept }
        }
        Err(reason) => {
            metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => "refused").increment(1);
            error!(
                %reason,
                "configuration reload refused: the running configuration stays"
            );
            Reloaded::Refused(reason)
        }
    }
}

/// The settings that differ between `a` and `b` and are not reloadable:
/// the listen address, the engine and its directory, the rule book's
/// limits the store was opened with, and the server's own loops.
fn fixed_until_restart(a: &Config, b: &Config) -> Vec<&'static str> {
    let same = [
        ("listen", a.listen == b.listen),
        ("data/store", a.store == b.store),
        ("lease_margin_ms", a.lease_margin_ms == b.lease_margin_ms),
        ("warning_cap", a.warning_cap == b.warning_cap),
        ("max_result_bytes", a.max_result_bytes == b.max_result_bytes),
        (
            "sweep_interval_ms",
            a.sweep_interval_ms == b.sweep_interval_ms,
        ),
        (
            "request_timeout_ms",
            a.request_timeout_ms == b.request_timeout_ms,
        ),
        (
            "metrics_refresh_ms",
            a.metrics_refresh_ms == b.metrics_refresh_ms,
        ),
        (
            "engine tuning (max_queue, segment_bytes, pg_*)",
            a.tuning == b.tuning,
        ),
        (
            "tls_cert/tls_key (TLS on or off)",
            a.tls.is_some() == b.tls.is_some(),
        ),
        ("behind_proxy", a.behind_proxy == b.behind_proxy),
        ("otlp_endpoint", a.otlp_endpoint == b.otlp_endpoint),
    ];
    same.into_iter()
        .filter_map(|(name, same)| (!same).then_some(name))
        .collect()
}

#[cfg(unix)]
async fn reload_on_sighup(
    state: Arc<AppState>,
    tls: Arc<ArcSwapOption<TlsAcceptor>>,
    started: Config,
    load: LoadConfig,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot handle SIGHUP: reload needs a restart");
            return;
        }
    };
    while hup.recv().await.is_some() {
        info!("SIGHUP: reloading the configuration");
        // The file is read off the async workers (a slow disk must not stall requests).
        let (st, t, s, l) = (state.clone(), tls.clone(), started.clone(), load.clone());
        let _ = tokio::task::spawn_blocking(move || reload(&st, Some(&t), &s, &l)).await;
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(
    _state: Arc<AppState>,
    _tls: Arc<ArcSwapOption<TlsAcceptor>>,
    _started: Config,
    _load: LoadConfig,
) {
}

/// The server's answer to one request, as `run` gives it on a connection:
/// an over-long target is refused before routing (SPEC §7, 414). The
/// in-process bindings (crates/settle-local) answer through here too.
pub async fn answer(mut app: Router, req: axum::http::Request<Body>) -> axum::response::Response {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if let Some(p) = crate::target::too_long(target) {
        return crate::http::finish(crate::http::Route::Unmatched, Err(p));
    }
    if !crate::trace::on() {
        return match app.call(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
    }
    let span = crate::trace::request_span(req.method(), req.uri().path(), req.headers());
    let resp = match app.call(req).instrument(span.clone()).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    let status = resp.status().as_u16();
    span.record("status", status);
    span.record("http.response.status_code", status);
    resp
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
