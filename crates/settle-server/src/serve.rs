//! Opening the store, the accept loop, the sweep, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::{Clock, Store, StoreError};
use tokio::net::TcpListener;
use tower::Service;
use tracing::{error, info, warn};

use crate::config::{Config, ConfigError, ServeArgs, StoreConfig};
use crate::http::{AppState, router};

/// Why `settle serve` stopped or did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    #[error(
        "store {0:?} is not supported: use --data DIR for the embedded store or --store postgres://... for PostgreSQL"
    )]
    /// The `--store` URL names no supported store.
    UnsupportedStore(String),
}

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

fn embedded_options(t: &crate::config::Tuning) -> EmbeddedOptions {
    let d = EmbeddedOptions::default();
    EmbeddedOptions {
        max_queue: t.max_queue.unwrap_or(d.max_queue),
        segment_bytes: t.segment_bytes.unwrap_or(d.segment_bytes),
        ..d
    }
}

fn pg_options(t: &crate::config::Tuning) -> settle_pg::PgOptions {
    let d = settle_pg::PgOptions::default();
    let ms = |v: Option<u64>, default: std::time::Duration| {
        v.map_or(default, std::time::Duration::from_millis)
    };
    settle_pg::PgOptions {
        group_commit_queue: t.max_queue.unwrap_or(d.group_commit_queue),
        statement_timeout: ms(t.pg_statement_timeout_ms, d.statement_timeout),
        lock_timeout: ms(t.pg_lock_timeout_ms, d.lock_timeout),
        idle_in_transaction_timeout: ms(
            t.pg_idle_in_transaction_timeout_ms,
            d.idle_in_transaction_timeout,
        ),
        client_timeout: ms(t.pg_client_timeout_ms, d.client_timeout),
        ..d
    }
}

/// The one place that turns configuration into a store: `--data DIR` is
/// the embedded store, `--store postgres://…` the PostgreSQL store.
pub async fn open_store(config: &Config) -> Result<OpenedStore, ServeError> {
    match &config.store {
        StoreConfig::Embedded(dir) => {
            let store = EmbeddedStore::open(
                dir,
                EmbeddedOptions {
                    limits: config.limits(),
                    clock: {
                        let clock = Clock::system();
                        clock.advance(config.clock_skew_ms);
                        clock
                    },
                    ..embedded_options(&config.tuning)
                },
            )?;
            let closer = store.clone();
            Ok(OpenedStore::new(store, move || closer.close()))
        }
        StoreConfig::Url(url)
            if url.starts_with("postgres://") || url.starts_with("postgresql://") =>
        {
            let clock = Clock::system();
            clock.advance(config.clock_skew_ms);
            let store = settle_pg::PgStore::connect(
                url,
                settle_pg::PgOptions {
                    limits: config.limits(),
                    clock,
                    application_name: format!("settle serve {}", config.listen),
                    ..pg_options(&config.tuning)
                },
            )
            .await?;
            let closer = store.clone();
            Ok(OpenedStore::new(Arc::new(store), move || closer.close()))
        }
        StoreConfig::Url(url) => Err(ServeError::UnsupportedStore(url.clone())),
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
            let mut app = app.clone();
            async move { app.call(req.map(axum::body::Body::new)).await }
        });
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

async fn sweep_loop(
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

/// Logs to stderr; `SETTLE_LOG` (or `RUST_LOG`) sets the filter, default `info`.
pub fn init_tracing() {
    let filter = std::env::var("SETTLE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// `settle serve`: reads the settings, opens the store, prints
/// `listening on ADDR` on stdout (tests and scripts read it), serves until
/// SIGTERM or ctrl-c.
pub async fn serve_main(args: ServeArgs) -> Result<(), ServeError> {
    init_tracing();
    let config = Config::from_args(&args)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: config.listen,
        source,
    })?;
    if matches!(config.auth, crate::config::AuthConfig::Off) {
        warn!(
            "AUTHENTICATION IS OFF: no [[tenants]] are configured, so every caller on this \
             machine is tenant `default`. This is only allowed on a loopback address ({addr}). \
             Configure [[tenants]] before exposing the server."
        );
    }
    let opened = open_store(&config).await?;
    match &config.store {
        StoreConfig::Embedded(dir) => info!(data = %dir.display(), "embedded store open"),
        StoreConfig::Url(_) => info!("store open"),
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on {addr}");
        let _ = out.flush();
    }
    info!(%addr, "listening");
    run(config, opened, listener, shutdown_signal()).await;
    Ok(())
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
