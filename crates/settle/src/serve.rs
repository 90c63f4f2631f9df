//! `settle serve`: the flags (clap, each with its `SETTLE_*` variable),
//! logging (tracing-subscriber), and engine selection: `--data DIR` opens
//! the embedded store, `--store postgres://…` the PostgreSQL store. The
//! server itself (`settle-server`) only sees the `Store` trait.

use std::path::PathBuf;
use std::sync::Arc;

use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::{Clock, StoreError};
use settle_server::config::{Config, ConfigError, StoreConfig, Tuning};
use settle_server::{OpenedStore, Settings};
use tokio::net::TcpListener;
use tracing::info;

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
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The store did not open.
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    /// The OTLP exporter cannot be built.
    #[error("{0}")]
    Otlp(String),
    /// The TLS certificate or key cannot be served.
    #[error(transparent)]
    Tls(#[from] settle_server::tls::TlsError),
    /// `--store` names no engine this binary has.
    #[error(
        "store {0:?} is not supported: use --data DIR for the embedded store or --store postgres://... for PostgreSQL"
    )]
    UnsupportedStore(String),
    /// `--pid-file` cannot be written.
    #[error("cannot write the pid file {path}: {source}")]
    PidFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// `settle serve` flags; each also reads its `SETTLE_*` variable.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Directory of the embedded store [default: ./settle-data].
    #[arg(long, env = "SETTLE_DATA", value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port (the bound address is
    /// printed) [default: 127.0.0.1:7411].
    #[arg(long, env = "SETTLE_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// TOML config file (every key optional; flags and variables win) [default: none].
    #[arg(long, env = "SETTLE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// PostgreSQL URL instead of --data (postgres://USER@HOST:PORT/DB) [default: none: the
    /// embedded store].
    #[arg(long, env = "SETTLE_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// A tenant as NAME=SHA256-OF-TOKEN (repeatable; added to the file's [[tenants]])
    /// [default: none: authentication off, loopback only].
    #[arg(
        long = "tenant",
        env = "SETTLE_TENANTS",
        value_delimiter = ',',
        value_name = "NAME=SHA256"
    )]
    pub tenants: Vec<String>,
    /// The hex SHA-256 of an admin token: the operator endpoints
    /// (`/v1/admin/…`, `settle backup`) need one (repeatable; added to the file's
    /// [admin] token_sha256) [default: none: admin endpoints open only while authentication is
    /// off].
    #[arg(
        long = "admin-token-sha256",
        env = "SETTLE_ADMIN_TOKEN_SHA256",
        value_delimiter = ',',
        value_name = "SHA256"
    )]
    pub admin_tokens_sha256: Vec<String>,
    /// A settlement needs at least this much lease left [default: 100].
    #[arg(long, env = "SETTLE_LEASE_MARGIN_MS")]
    pub lease_margin_ms: Option<u64>,
    /// Larger request bodies get 413 [default: 1048576].
    #[arg(long, env = "SETTLE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// A batch (`POST /v1/batch`) with more calls gets 422 [default: 1000].
    #[arg(long, env = "SETTLE_MAX_BATCH_CALLS")]
    pub max_batch_calls: Option<usize>,
    /// Larger batch bodies get 413 [default: 16777216].
    #[arg(long, env = "SETTLE_MAX_BATCH_BODY_BYTES")]
    pub max_batch_body_bytes: Option<usize>,
    /// Larger outcome results get 422 [default: 65536].
    #[arg(long, env = "SETTLE_MAX_RESULT_BYTES")]
    pub max_result_bytes: Option<usize>,
    /// Warning counts saturate here [default: 1000].
    #[arg(long, env = "SETTLE_WARNING_CAP")]
    pub warning_cap: Option<u64>,
    /// An open record without a live lease, untouched this long, is stuck [default: 3600].
    #[arg(long, env = "SETTLE_STUCK_AFTER_S")]
    pub stuck_after_s: Option<u64>,
    /// How often lapsed leases are ended and expired records collected [default: 1000].
    #[arg(long, env = "SETTLE_SWEEP_INTERVAL_MS")]
    pub sweep_interval_ms: Option<u64>,
    /// `retention_s` of a claim that does not give one [default: 86400].
    #[arg(long, env = "SETTLE_DEFAULT_RETENTION_S")]
    pub default_retention_s: Option<u64>,
    /// Slow-client limit: time to send the request head, and then the body [default: 10000].
    #[arg(long, env = "SETTLE_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,
    /// Commands waiting for the store's writer (embedded) or group commit
    /// (PostgreSQL) beyond this answer 503 with Retry-After [default: 65536 embedded, 4096 PostgreSQL].
    #[arg(long, env = "SETTLE_MAX_QUEUE")]
    pub max_queue: Option<usize>,
    /// Size of each preallocated log segment of the embedded store; a new
    /// store takes about twice this on disk [default: 67108864].
    #[arg(long, env = "SETTLE_SEGMENT_BYTES")]
    pub segment_bytes: Option<u64>,
    /// Deprecated and ignored (a warning at startup); removed in the next
    /// release. Hidden from --help: accepted so that old scripts still start.
    #[arg(long, hide = true, env = "SETTLE_THREAD_PRIORITIES", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new())]
    pub thread_priorities: Option<bool>,
    /// PostgreSQL: server-side statement_timeout per transaction [default: 10000].
    #[arg(long, env = "SETTLE_PG_STATEMENT_TIMEOUT_MS")]
    pub pg_statement_timeout_ms: Option<u64>,
    /// PostgreSQL: lock_timeout for row and principal locks [default: 5000].
    #[arg(long, env = "SETTLE_PG_LOCK_TIMEOUT_MS")]
    pub pg_lock_timeout_ms: Option<u64>,
    /// PostgreSQL: idle_in_transaction_session_timeout [default: 5000].
    #[arg(long, env = "SETTLE_PG_IDLE_IN_TRANSACTION_TIMEOUT_MS")]
    pub pg_idle_in_transaction_timeout_ms: Option<u64>,
    /// PostgreSQL: client-side deadline for each round trip [default: 15000].
    #[arg(long, env = "SETTLE_PG_CLIENT_TIMEOUT_MS")]
    pub pg_client_timeout_ms: Option<u64>,
    /// `/metrics` then needs `Authorization: Bearer <token>`, the token
    /// whose hex SHA-256 this is [default: /metrics is open].
    #[arg(long, env = "SETTLE_METRICS_TOKEN_SHA256", value_name = "SHA256")]
    pub metrics_token_sha256: Option<String>,
    /// The gauges that scan the store (open records, quarantined evidence)
    /// are refreshed at most this often, whatever the scrape rate [default: 10000].
    #[arg(long, env = "SETTLE_METRICS_REFRESH_MS")]
    pub metrics_refresh_ms: Option<u64>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key; re-read on SIGHUP)
    /// [default: none: plain HTTP, loopback or --behind-proxy only].
    #[arg(
        long,
        env = "SETTLE_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1) [default: none].
    #[arg(
        long,
        env = "SETTLE_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// A TLS-terminating proxy is in front: allows plain HTTP on a non-loopback address
    /// [default: false].
    #[arg(long, env = "SETTLE_BEHIND_PROXY", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub behind_proxy: Option<bool>,
    /// Export OpenTelemetry traces over OTLP/HTTP to this base URL (spans go to URL/v1/traces)
    /// [default: none].
    #[arg(long, env = "SETTLE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Write the server's process id to FILE once it listens (for `kill -HUP $(cat FILE)`
    /// without systemd); removed when it exits [default: none].
    #[arg(long, env = "SETTLE_PID_FILE", value_name = "FILE")]
    pub pid_file: Option<PathBuf>,
    /// Testing only: moves the store's clock by this many milliseconds [default: 0].
    #[arg(
        long,
        env = "SETTLE_CLOCK_SKEW_MS",
        hide = true,
        allow_hyphen_values = true
    )]
    pub clock_skew_ms: Option<i64>,
}

impl From<ServeArgs> for Settings {
    fn from(a: ServeArgs) -> Settings {
        Settings {
            data: a.data,
            listen: a.listen,
            config: a.config,
            store: a.store,
            tenants: a.tenants,
            admin_tokens_sha256: a.admin_tokens_sha256,
            lease_margin_ms: a.lease_margin_ms,
            max_body_bytes: a.max_body_bytes,
            max_batch_calls: a.max_batch_calls,
            max_batch_body_bytes: a.max_batch_body_bytes,
            max_result_bytes: a.max_result_bytes,
            warning_cap: a.warning_cap,
            stuck_after_s: a.stuck_after_s,
            sweep_interval_ms: a.sweep_interval_ms,
            default_retention_s: a.default_retention_s,
            request_timeout_ms: a.request_timeout_ms,
            max_queue: a.max_queue,
            segment_bytes: a.segment_bytes,
            thread_priorities: a.thread_priorities,
            pg_statement_timeout_ms: a.pg_statement_timeout_ms,
            pg_lock_timeout_ms: a.pg_lock_timeout_ms,
            pg_idle_in_transaction_timeout_ms: a.pg_idle_in_transaction_timeout_ms,
            pg_client_timeout_ms: a.pg_client_timeout_ms,
            metrics_token_sha256: a.metrics_token_sha256,
            metrics_refresh_ms: a.metrics_refresh_ms,
            clock_skew_ms: a.clock_skew_ms,
            tls_cert: a.tls_cert,
            tls_key: a.tls_key,
            behind_proxy: a.behind_proxy.unwrap_or(false),
            otlp_endpoint: a.otlp_endpoint,
        }
    }
}

fn embedded_options(t: &Tuning) -> EmbeddedOptions {
    let d = EmbeddedOptions::default();
    EmbeddedOptions {
        max_queue: t.max_queue.unwrap_or(d.max_queue),
        segment_bytes: t.segment_bytes.unwrap_or(d.segment_bytes),
        ..d
    }
}

fn pg_options(t: &Tuning) -> settle_pg::PgOptions {
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

fn clock(config: &Config) -> Clock {
    let clock = Clock::system();
    clock.advance(config.clock_skew_ms);
    clock
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
                    clock: clock(config),
                    ..embedded_options(&config.tuning)
                },
            )?;
            let closer = store.clone();
            Ok(OpenedStore::new(store, move || closer.close()))
        }
        StoreConfig::Url(url)
            if url.starts_with("postgres://") || url.starts_with("postgresql://") =>
        {
            let store = settle_pg::PgStore::connect(
                url,
                settle_pg::PgOptions {
                    limits: config.limits(),
                    clock: clock(config),
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

/// Logs to stderr; `SETTLE_LOG` (or `RUST_LOG`) sets the filter, default
/// `default` (`info` for the server, `warn` for the benchmark, whose
/// warnings — a checkpointer the writer waits for — explain its tail).
pub fn init_tracing(default: &str) {
    init_tracing_with(default, None);
}

/// [`init_tracing`], and with `traces` the server's spans exported over
/// OTLP (they never reach the log).
fn init_tracing_with(default: &str, traces: Option<&opentelemetry_sdk::trace::SdkTracerProvider>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = std::env::var("SETTLE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default.to_string());
    let filter = format!("{filter},{}=off", settle_server::trace::TARGET);
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(traces.map(crate::otlp::layer))
        .try_init();
}

/// `settle serve`: reads the settings, opens the store, prints
/// `listening on ADDR` on stdout (tests and scripts read it), serves until
/// SIGTERM or ctrl-c.
pub async fn serve_main(mut args: ServeArgs) -> Result<(), ServeError> {
    let pid_file = args.pid_file.take();
    let settings: Settings = args.into();
    let config = Config::from_settings(&settings);
    let traces = match config
        .as_ref()
        .ok()
        .and_then(|c| c.otlp_endpoint.as_deref())
    {
        Some(endpoint) => Some(crate::otlp::provider(endpoint).map_err(ServeError::Otlp)?),
        None => None,
    };
    init_tracing_with("info", traces.as_ref());
    let config = config?;
    if let Some(endpoint) = &config.otlp_endpoint {
        settle_server::trace::enable();
        info!(
            endpoint,
            "exporting traces over OTLP/HTTP to {endpoint}/v1/traces"
        );
    }
    // Read before anything else starts: a bad certificate stops the start.
    let tls = config
        .tls
        .as_ref()
        .map(settle_server::tls::acceptor)
        .transpose()?;
    let bind_error = |source| ServeError::Bind {
        addr: config.listen.to_string(),
        source,
    };
    let listener = TcpListener::bind(config.listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    settle_server::log_auth(&config, addr);
    settle_server::log_deprecated(&config);
    let opened = open_store(&config).await?;
    match &config.store {
        StoreConfig::Embedded(dir) => info!(data = %dir.display(), "embedded store open"),
        StoreConfig::Url(url) => info!(
            engine = "postgres",
            url = %crate::pg::redacted(url),
            "PostgreSQL store open"
        ),
    }
    if let Some(path) = &pid_file {
        write_pid_file(path)?;
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on {addr}");
        let _ = out.flush();
    }
    info!(%addr, tls = tls.is_some(), "listening");
    if config.behind_proxy && tls.is_none() && !addr.ip().is_loopback() {
        info!("plain HTTP on {addr}: behind_proxy says a TLS-terminating proxy is in front");
    }
    info!(
        "SIGHUP reloads tenants, tokens, [admin], limits, quotas and the TLS files; the listen \
         address, the engine and its directory need a restart"
    );
    let edge = settle_server::Edge {
        tls,
        reload: Some(std::sync::Arc::new(move || {
            Config::from_settings(&settings)
        })),
    };
    settle_server::run_edge(
        config,
        opened,
        listener,
        edge,
        settle_server::shutdown_signal(),
    )
    .await;
    if let Some(provider) = traces {
        crate::otlp::shutdown(provider).await;
    }
    if let Some(path) = &pid_file {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Writes this process's id to `path` whole (beside it, then renamed), so
/// that a script reading it never sees a partial number.
fn write_pid_file(path: &std::path::Path) -> Result<(), ServeError> {
    let err = |source| ServeError::PidFile {
        path: path.display().to_string(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    std::fs::write(&tmp, format!("{}\n", std::process::id())).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
