//! Server settings (SPEC §7): defaults, then the TOML file, then `SETTLE_*`
//! environment variables and flags (a flag beats its variable).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use settle_core::{Digest, RetentionS, TenantId};

/// Why the server will not start with these settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The config file is not valid TOML of the expected keys.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        source: Box<toml::de::Error>,
    },
    /// A setting is out of range or malformed.
    #[error("invalid setting {setting}: {reason}")]
    Invalid {
        /// The setting's name (the file's key).
        setting: &'static str,
        /// Why it was refused.
        reason: String,
    },
    #[error(
        "refusing to start: listen address {0} is not loopback and TLS is off, so tokens and \
         records would cross the network in clear text. Give --tls-cert and --tls-key (config \
         tls_cert, tls_key), or --behind-proxy (config behind_proxy = true) when a \
         TLS-terminating proxy is in front, or listen on 127.0.0.1 / [::1]"
    )]
    /// A non-loopback listen address without TLS and without `behind_proxy`.
    PlainTextOnNetwork(SocketAddr),
    #[error(
        "refusing to start: listen address {0} is not loopback and no tenants are configured, so \
         anyone who can reach it could read and write every record. Add [[tenants]] with \
         name and token_sha256 to the config file (or --tenant NAME=SHA256), or listen on \
         127.0.0.1 / [::1]"
    )]
    /// A non-loopback listen address with no tenants configured: anyone who
    /// can reach it could read and write every record.
    OpenWithoutTenants(SocketAddr),
}

fn invalid(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting,
        reason: reason.into(),
    }
}

/// One `[[tenants]]` table: the tenant's name, the SHA-256 of its bearer
/// token(s), and its quotas (SPEC §12).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's name (key syntax); records of different tenants never meet.
    pub name: String,
    /// Lowercase hex SHA-256 of the tenant's bearer token (the token itself is
    /// never stored), or a list of them: several during a rotation.
    #[serde(deserialize_with = "one_or_many")]
    pub token_sha256: Vec<String>,
    /// Requests per second admitted (a batch is one request); with `burst`.
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Requests admitted at once above the rate [default: `rate_per_s`
    /// rounded up].
    #[serde(default)]
    pub burst: Option<u32>,
    /// Records the tenant may hold (terminal ones too, until collected).
    #[serde(default)]
    pub max_records: Option<u64>,
}

/// A tenant's quotas (SPEC §12), validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    /// Requests per second and burst; `None`: no rate limit.
    pub rate: Option<Rate>,
    /// Records the tenant may hold; `None`: no limit.
    pub max_records: Option<u64>,
}

/// A request rate: `per_s` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Requests per second, > 0.
    pub per_s: f64,
    /// Requests admitted at once, ≥ 1.
    pub burst: u32,
}

/// `tls_cert` and `tls_key`: PEM files, re-read on SIGHUP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The config file as written (every key optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See `--listen`.
    pub listen: Option<String>,
    /// See `--data`.
    pub data: Option<PathBuf>,
    /// See `--store`.
    pub store: Option<String>,
    /// See `--lease-margin-ms`.
    pub lease_margin_ms: Option<u64>,
    /// See `--max-body-bytes`.
    pub max_body_bytes: Option<usize>,
    /// See `--max-batch-calls`.
    pub max_batch_calls: Option<usize>,
    /// See `--max-batch-body-bytes`.
    pub max_batch_body_bytes: Option<usize>,
    /// See `--max-result-bytes`.
    pub max_result_bytes: Option<usize>,
    /// See `--warning-cap`.
    pub warning_cap: Option<u64>,
    /// See `--stuck-after-s`.
    pub stuck_after_s: Option<u64>,
    /// See `--sweep-interval-ms`.
    pub sweep_interval_ms: Option<u64>,
    /// See `--default-retention-s`.
    pub default_retention_s: Option<u64>,
    /// See `--request-timeout-ms`.
    pub request_timeout_ms: Option<u64>,
    /// See `--max-queue`.
    pub max_queue: Option<usize>,
    /// See `--segment-bytes`.
    pub segment_bytes: Option<u64>,
    /// Deprecated and ignored (see [`Config::deprecated`]).
    pub thread_priorities: Option<bool>,
    /// See `--pg-statement-timeout-ms`.
    pub pg_statement_timeout_ms: Option<u64>,
    /// See `--pg-lock-timeout-ms`.
    pub pg_lock_timeout_ms: Option<u64>,
    /// See `--pg-idle-in-transaction-timeout-ms`.
    pub pg_idle_in_transaction_timeout_ms: Option<u64>,
    /// See `--pg-client-timeout-ms`.
    pub pg_client_timeout_ms: Option<u64>,
    /// See `--metrics-token-sha256`.
    pub metrics_token_sha256: Option<String>,
    /// See `--metrics-refresh-ms`.
    pub metrics_refresh_ms: Option<u64>,
    /// See `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// See `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// See `--behind-proxy`.
    pub behind_proxy: Option<bool>,
    /// See `--otlp-endpoint`.
    pub otlp_endpoint: Option<String>,
    /// The `[[tenants]]` tables; `--tenant` adds to them.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// The `[admin]` table (SPEC §12); `--admin-token-sha256` adds to its tokens.
    pub admin: Option<AdminFileConfig>,
}

/// The `[admin]` table: who may call the operator endpoints (SPEC §12,
/// `GET /v1/admin/export`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdminFileConfig {
    /// Lowercase hex SHA-256 of an admin bearer token, or a list of them
    /// (several during a rotation): `token_sha256 = "…"` or `["…", "…"]`.
    #[serde(deserialize_with = "one_or_many")]
    pub token_sha256: Vec<String>,
}

/// A string or a list of strings, as a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a hex SHA-256 string or a list of them")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<String>, E> {
            Ok(vec![v.to_string()])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Vec<String>, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = a.next_element::<String>()? {
                out.push(s);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

impl FileConfig {
    /// Reads and parses the file at `path` (values are checked later, by
    /// [`Config::merge`]).
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }
}

/// The settings as given (flags and `SETTLE_*` variables in the binary):
/// every one optional, applied over the config file and the defaults.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Directory of the embedded store.
    pub data: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port (the bound address is printed).
    pub listen: Option<String>,
    /// TOML config file.
    pub config: Option<PathBuf>,
    /// PostgreSQL URL instead of --data (postgres://USER@HOST:PORT/DB).
    pub store: Option<String>,
    /// A tenant as NAME=SHA256-OF-TOKEN (repeatable; added to the file's `[[tenants]]`).
    pub tenants: Vec<String>,
    /// The hex SHA-256 of an admin token (repeatable; added to the file's
    /// `[admin] token_sha256`).
    pub admin_tokens_sha256: Vec<String>,
    /// A settlement needs at least this much lease left [default: 100].
    pub lease_margin_ms: Option<u64>,
    /// Larger request bodies get 413 [default: 1048576].
    pub max_body_bytes: Option<usize>,
    /// A batch (`POST /v1/batch`) with more calls gets 422 [default: 1000].
    pub max_batch_calls: Option<usize>,
    /// Larger batch bodies get 413 [default: 16777216].
    pub max_batch_body_bytes: Option<usize>,
    /// Larger outcome results get 422 [default: 65536].
    pub max_result_bytes: Option<usize>,
    /// Warning counts saturate here [default: 1000].
    pub warning_cap: Option<u64>,
    /// An open record without a live lease, untouched this long, is stuck [default: 3600].
    pub stuck_after_s: Option<u64>,
    /// How often lapsed leases are ended and expired records collected [default: 1000].
    pub sweep_interval_ms: Option<u64>,
    /// `retention_s` of a claim that does not give one [default: 86400].
    pub default_retention_s: Option<u64>,
    /// Slow-client limit: time to send the request head, and then the body [default: 10000].
    pub request_timeout_ms: Option<u64>,
    /// Commands waiting for the store's writer (embedded) or group commit
    /// (PostgreSQL) beyond this answer 503 with Retry-After [default: 65536 embedded, 4096 PostgreSQL].
    pub max_queue: Option<usize>,
    /// Size of each preallocated log segment of the embedded store; a new
    /// store takes about twice this on disk [default: 67108864].
    pub segment_bytes: Option<u64>,
    /// Deprecated and ignored (see [`Config::deprecated`]).
    pub thread_priorities: Option<bool>,
    /// PostgreSQL: server-side statement_timeout per transaction [default: 10000].
    pub pg_statement_timeout_ms: Option<u64>,
    /// PostgreSQL: lock_timeout for row and principal locks [default: 5000].
    pub pg_lock_timeout_ms: Option<u64>,
    /// PostgreSQL: idle_in_transaction_session_timeout [default: 5000].
    pub pg_idle_in_transaction_timeout_ms: Option<u64>,
    /// PostgreSQL: client-side deadline for each round trip [default: 15000].
    pub pg_client_timeout_ms: Option<u64>,
    /// `/metrics` needs `Authorization: Bearer <token>` with this SHA-256 [default: open].
    pub metrics_token_sha256: Option<String>,
    /// The gauges that scan the store are refreshed at most this often [default: 10000].
    pub metrics_refresh_ms: Option<u64>,
    /// Testing only: moves the store's clock by this many milliseconds.
    pub clock_skew_ms: Option<i64>,
    /// PEM certificate chain: serve HTTPS (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// A TLS-terminating proxy is in front: plain HTTP on a non-loopback address is allowed.
    pub behind_proxy: bool,
    /// OTLP/HTTP base URL: spans go to `URL/v1/traces`.
    pub otlp_endpoint: Option<String>,
}

/// Where the records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded store in this directory (the default).
    Embedded(PathBuf),
    /// A store URL (`postgres://...`).
    Url(String),
}

/// Who may call: a list of tenants, or nobody checks (loopback only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// No tenants and a loopback listen address: every call is tenant `default`.
    Off,
    /// Token digest → tenant.
    Tenants(Vec<(TenantId, Digest)>),
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// Where the records live.
    pub store: StoreConfig,
    /// Who may call.
    pub auth: AuthConfig,
    /// The digests of the admin tokens (`[admin] token_sha256`, SPEC §12);
    /// empty: no admin token (the admin endpoints are then open only while
    /// authentication is off).
    pub admin_tokens: Vec<Digest>,
    /// A settlement or dispatch needs at least this much lease left, in ms.
    pub lease_margin_ms: u64,
    /// Larger request bodies are answered 413.
    pub max_body_bytes: usize,
    /// Most calls in one batch (SPEC §10).
    pub max_batch_calls: usize,
    /// Largest batch body.
    pub max_batch_body_bytes: usize,
    /// Larger outcome results (compact JSON) are answered 422.
    pub max_result_bytes: usize,
    /// Warning counts saturate here.
    pub warning_cap: u64,
    /// A non-terminal record with no live lease, untouched this long (seconds), is stuck.
    pub stuck_after_s: u64,
    /// How often the sweep ends lapsed leases and collects expired records, in ms.
    pub sweep_interval_ms: u64,
    /// The `retention_s` of a claim that gives none.
    pub default_retention: RetentionS,
    /// Slow-client limit in ms: to send the request head, and then the body.
    pub request_timeout_ms: u64,
    /// Testing only (hidden flag): skew of the store's clock.
    pub clock_skew_ms: i64,
    /// When set, `/metrics` needs a bearer token with this SHA-256 (SPEC §7).
    pub metrics_token_sha256: Option<Digest>,
    /// The gauges that scan the store (open records, quarantine) are
    /// refreshed at most this often, whatever the scrape rate, in ms.
    pub metrics_refresh_ms: u64,
    /// Engine tuning; `None` keeps the engine's default.
    pub tuning: Tuning,
    /// The deprecated settings that were given (in the file, as a flag or
    /// its variable, whatever the value), by their file key: accepted for
    /// one more release, ignored, and warned about at startup.
    pub deprecated: Vec<&'static str>,
    /// Settings given that this configuration does not use (`data` with a
    /// PostgreSQL store, PostgreSQL timeouts with the embedded one, ...),
    /// each a sentence for a start-up warning: silently ignoring what an
    /// operator wrote hides a mistake.
    pub unused: Vec<String>,
    /// Per-tenant quotas (SPEC §12); a tenant without any is not listed.
    pub quotas: Vec<(TenantId, Quota)>,
    /// HTTPS when set.
    pub tls: Option<TlsFiles>,
    /// Plain HTTP on a non-loopback address is allowed (a proxy terminates TLS).
    pub behind_proxy: bool,
    /// OTLP/HTTP base URL of a trace collector.
    pub otlp_endpoint: Option<String>,
}

/// Engine settings that have good defaults in the engines themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Commands waiting for the store beyond this are answered 503 with Retry-After.
    pub max_queue: Option<usize>,
    /// Size of each preallocated log segment of the embedded store, in bytes.
    pub segment_bytes: Option<u64>,
    /// PostgreSQL `statement_timeout`, in ms.
    pub pg_statement_timeout_ms: Option<u64>,
    /// PostgreSQL `lock_timeout` for row and principal locks, in ms.
    pub pg_lock_timeout_ms: Option<u64>,
    /// PostgreSQL `idle_in_transaction_session_timeout`, in ms.
    pub pg_idle_in_transaction_timeout_ms: Option<u64>,
    /// PostgreSQL client-side deadline of each round trip, in ms.
    pub pg_client_timeout_ms: Option<u64>,
}

/// The deprecated settings given in `file` or `args` (whatever the value),
/// by their file key: accepted for one more release and ignored.
///
/// `thread_priorities` ran the embedded store's background threads at a
/// lower priority: off by default, its measured gain (~1 %) was within the
/// noise, so the mechanism went.
fn deprecated_given(file: &FileConfig, args: &Settings) -> Vec<&'static str> {
    let given = [(
        "thread_priorities",
        file.thread_priorities.or(args.thread_priorities).is_some(),
    )];
    given
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect()
}

/// The admin tokens' digests: the file's `[admin] token_sha256` and the
/// flag's values, each a valid digest, none twice, none a tenant's (a
/// token is a tenant's or an admin's, never both).
fn admin_tokens(
    file: Option<AdminFileConfig>,
    flags: &[String],
    tenants: &[(TenantId, Digest)],
) -> Result<Vec<Digest>, ConfigError> {
    const KEY: &str = "admin.token_sha256";
    let given = file.map(|a| a.token_sha256).unwrap_or_default();
    let mut out: Vec<Digest> = Vec::with_capacity(given.len() + flags.len());
    for hex in given.iter().chain(flags) {
        let d = Digest::parse(KEY, hex).map_err(|e| invalid(KEY, e.reason))?;
        if out.contains(&d) {
            return Err(invalid(KEY, format!("{hex} appears twice")));
        }
        if let Some((name, _)) = tenants.iter().find(|(_, t)| t == &d) {
            return Err(invalid(
                KEY,
                format!(
                    "{hex} is also the token of tenant {name}; give the admin a token of its own"
                ),
            ));
        }
        out.push(d);
    }
    Ok(out)
}

/// The tenants of the file's `[[tenants]]` and of `--tenant NAME=SHA256`:
/// token digest → tenant (a tenant may have several tokens, for rotation),
/// and each tenant's quotas. A name may have one `[[tenants]]` table; a
/// flag adds a token to the table of its name, or a new tenant. A token
/// is one tenant's only.
#[allow(clippy::type_complexity)]
fn tenants(
    file: Vec<TenantConfig>,
    flags: &[String],
) -> Result<(Vec<(TenantId, Digest)>, Vec<(TenantId, Quota)>), ConfigError> {
    let mut tables = file;
    let file_tables = tables.len();
    for t in flags {
        let (name, digest) = t
            .split_once('=')
            .ok_or_else(|| invalid("tenant", format!("{t:?} is not NAME=SHA256-OF-TOKEN")))?;
        match tables.iter_mut().find(|x| x.name == name) {
            Some(x) => x.token_sha256.push(digest.to_string()),
            None => tables.push(TenantConfig {
                name: name.to_string(),
                token_sha256: vec![digest.to_string()],
                rate_per_s: None,
                burst: None,
                max_records: None,
            }),
        }
    }
    let mut tokens: Vec<(TenantId, Digest)> = Vec::with_capacity(tables.len());
    let mut quotas = Vec::new();
    let mut names: Vec<TenantId> = Vec::with_capacity(tables.len());
    for (i, t) in tables.iter().enumerate() {
        let name = TenantId::new(t.name.clone())
            .map_err(|e| invalid("tenants.name", format!("{:?}: {}", t.name, e.reason)))?;
        if i < file_tables && names.contains(&name) {
            return Err(invalid("tenants.name", format!("{name} appears twice")));
        }
        names.push(name.clone());
        if t.token_sha256.is_empty() {
            return Err(invalid(
                "tenants.token_sha256",
                format!("tenant {name} has no token"),
            ));
        }
        for hex in &t.token_sha256 {
            let digest = Digest::parse("tenants.token_sha256", hex).map_err(|e| {
                invalid(
                    "tenants.token_sha256",
                    format!("tenant {name}: {}", e.reason),
                )
            })?;
            if let Some((other, _)) = tokens.iter().find(|(_, d)| d == &digest) {
                return Err(invalid(
                    "tenants.token_sha256",
                    if other == &name {
                        format!("tenant {name} lists the token {hex} twice")
                    } else {
                        format!("tenant {name} shares its token with tenant {other}")
                    },
                ));
            }
            tokens.push((name.clone(), digest));
        }
        let rate = match (t.rate_per_s, t.burst) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(invalid(
                    "tenants.burst",
                    format!("tenant {name}: burst needs rate_per_s"),
                ));
            }
            (Some(r), burst) => {
                if !(r.is_finite() && r > 0.0 && r <= 1e9) {
                    return Err(invalid(
                        "tenants.rate_per_s",
                        format!("tenant {name}: must be a number above 0 (at most 1e9)"),
                    ));
                }
                let burst = burst.unwrap_or_else(|| (r.ceil() as u32).max(1));
                if burst == 0 {
                    return Err(invalid(
                        "tenants.burst",
                        format!("tenant {name}: must be at least 1"),
                    ));
                }
                Some(Rate { per_s: r, burst })
            }
        };
        if t.max_records == Some(0) {
            return Err(invalid(
                "tenants.max_records",
                format!("tenant {name}: must be at least 1"),
            ));
        }
        if rate.is_some() || t.max_records.is_some() {
            quotas.push((
                name,
                Quota {
                    rate,
                    max_records: t.max_records,
                },
            ));
        }
    }
    Ok((tokens, quotas))
}

/// Where the records live, and the store settings given that lose.
///
/// Flags and variables beat the file for the store as for every setting,
/// so the first of these layers that names a store chooses it: the flags
/// and variables (`--store`, else `--data`), then the file (`store`, else
/// `data`), else the default directory. Whatever else named a store is
/// not used, and said so.
fn choose_store(file: &FileConfig, args: &Settings) -> (StoreConfig, Vec<String>) {
    let layers = [
        ("--store", args.store.as_ref(), "--data", args.data.as_ref()),
        (
            "store (config file)",
            file.store.as_ref(),
            "data (config file)",
            file.data.as_ref(),
        ),
    ];
    let mut store = None;
    let mut unused = Vec::new();
    for (store_name, url, data_name, dir) in layers {
        let chosen_here = match (url, dir) {
            (Some(url), _) => Some((store_name, StoreConfig::Url(url.clone()))),
            (None, Some(dir)) => Some((data_name, StoreConfig::Embedded(dir.clone()))),
            (None, None) => None,
        };
        match (&store, chosen_here) {
            (None, Some(chosen)) => {
                if let (Some(_), Some(dir)) = (url, dir) {
                    unused.push(format!(
                        "{data_name} = {} is not used: {store_name} names a PostgreSQL store",
                        dir.display()
                    ));
                }
                store = Some(chosen);
            }
            (Some((by, _)), Some(_)) => {
                for (name, given) in [
                    (store_name, url.map(|u| redact_url(u))),
                    (data_name, dir.map(|d| d.display().to_string())),
                ] {
                    if let Some(v) = given {
                        unused.push(format!("{name} = {v} is not used: {by} chooses the store"));
                    }
                }
            }
            (_, None) => {}
        }
    }
    let store = store.map_or_else(
        || StoreConfig::Embedded(PathBuf::from(DEFAULT_DATA)),
        |(_, s)| s,
    );
    (store, unused)
}

/// The engine tuning given for the other engine.
fn engine_settings_unused(store: &StoreConfig, tuning: &Tuning) -> Vec<String> {
    let (engine, others): (&str, &[(&str, bool)]) = match store {
        StoreConfig::Embedded(_) => (
            "the embedded store",
            &[
                (
                    "pg_statement_timeout_ms",
                    tuning.pg_statement_timeout_ms.is_some(),
                ),
                ("pg_lock_timeout_ms", tuning.pg_lock_timeout_ms.is_some()),
                (
                    "pg_idle_in_transaction_timeout_ms",
                    tuning.pg_idle_in_transaction_timeout_ms.is_some(),
                ),
                (
                    "pg_client_timeout_ms",
                    tuning.pg_client_timeout_ms.is_some(),
                ),
            ],
        ),
        StoreConfig::Url(_) => (
            "PostgreSQL",
            &[("segment_bytes", tuning.segment_bytes.is_some())],
        ),
    };
    others
        .iter()
        .filter(|(_, given)| *given)
        .map(|(key, _)| format!("{key} is not used: the store is {engine}"))
        .collect()
}

/// A store URL with its password, if any, replaced by `***` (for logs and
/// messages): in the user part (`postgres://u:PASSWORD@h/db`) and in a
/// `password=` parameter.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Where `settle serve` listens by default (loopback: auth may be off).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7411";
/// Where the embedded store lives by default.
pub const DEFAULT_DATA: &str = "./settle-data";

impl Config {
    /// Defaults for a loopback test server on `dir` (auth off).
    pub fn local(listen: SocketAddr, dir: PathBuf) -> Config {
        Config {
            listen,
            store: StoreConfig::Embedded(dir),
            auth: AuthConfig::Off,
            admin_tokens: Vec::new(),
            lease_margin_ms: 100,
            max_body_bytes: 1024 * 1024,
            max_batch_calls: 1000,
            max_batch_body_bytes: 16 * 1024 * 1024,
            max_result_bytes: settle_core::DEFAULT_MAX_RESULT_BYTES,
            warning_cap: 1000,
            stuck_after_s: 3600,
            sweep_interval_ms: 1000,
            default_retention: RetentionS::DEFAULT,
            request_timeout_ms: 10_000,
            clock_skew_ms: 0,
            metrics_token_sha256: None,
            metrics_refresh_ms: 10_000,
            tuning: Tuning::default(),
            deprecated: Vec::new(),
            unused: Vec::new(),
            quotas: Vec::new(),
            tls: None,
            behind_proxy: false,
            otlp_endpoint: None,
        }
    }

    /// Reads the file named by `--config` (if any) and applies flags and variables over it.
    pub fn from_settings(args: &Settings) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        Config::merge(file, args)
    }

    /// Flags and variables win over the file; the file wins over defaults.
    // A table of settings, one block each.
    #[allow(clippy::too_many_lines)]
    pub fn merge(file: FileConfig, args: &Settings) -> Result<Config, ConfigError> {
        let deprecated = deprecated_given(&file, args);
        let (store, mut unused) = choose_store(&file, args);
        let listen_s = args
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen = listen_s
            .to_socket_addrs()
            .map_err(|e| invalid("listen", format!("{listen_s:?}: {e}")))?
            .next()
            .ok_or_else(|| invalid("listen", format!("{listen_s:?} resolves to no address")))?;

        let (parsed, quotas) = tenants(file.tenants, &args.tenants)?;
        let admin_tokens = admin_tokens(file.admin, &args.admin_tokens_sha256, &parsed)?;
        // `[admin]` alone does not turn authentication on: the tenants'
        // routes would still be open to anyone, so a non-loopback address
        // still needs tenants (docs/http-api.md, "Admin access").
        let auth = if parsed.is_empty() {
            if !listen.ip().is_loopback() {
                return Err(ConfigError::OpenWithoutTenants(listen));
            }
            AuthConfig::Off
        } else {
            AuthConfig::Tenants(parsed)
        };
        let tls = match (
            args.tls_cert.clone().or(file.tls_cert),
            args.tls_key.clone().or(file.tls_key),
        ) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => return Err(invalid("tls_key", "tls_cert is given without tls_key")),
            (None, Some(_)) => {
                return Err(invalid("tls_cert", "tls_key is given without tls_cert"));
            }
        };
        let behind_proxy = args.behind_proxy || file.behind_proxy.unwrap_or(false);
        if tls.is_none() && !behind_proxy && !listen.ip().is_loopback() {
            return Err(ConfigError::PlainTextOnNetwork(listen));
        }
        let otlp_endpoint = match args.otlp_endpoint.clone().or(file.otlp_endpoint) {
            Some(u) if u.starts_with("http://") && u.len() > "http://".len() => {
                Some(u.trim_end_matches('/').to_string())
            }
            Some(u) if u.starts_with("https://") => {
                return Err(invalid(
                    "otlp_endpoint",
                    format!(
                        "{u:?}: the trace exporter speaks plain http:// only; run a collector \
                         next to settle and give its http:// address"
                    ),
                ));
            }
            Some(u) => {
                return Err(invalid(
                    "otlp_endpoint",
                    format!("{u:?} is not an http:// URL"),
                ));
            }
            None => None,
        };

        let defaults = Config::local(listen, PathBuf::new());
        let lease_margin_ms = args
            .lease_margin_ms
            .or(file.lease_margin_ms)
            .unwrap_or(defaults.lease_margin_ms);
        if lease_margin_ms >= settle_core::LeaseMs::MAX {
            return Err(invalid(
                "lease_margin_ms",
                "must be below the longest lease (3600000)",
            ));
        }
        let max_body_bytes = args
            .max_body_bytes
            .or(file.max_body_bytes)
            .unwrap_or(defaults.max_body_bytes);
        if max_body_bytes < 1 {
            return Err(invalid("max_body_bytes", "must be at least 1"));
        }
        let max_batch_calls = args
            .max_batch_calls
            .or(file.max_batch_calls)
            .unwrap_or(defaults.max_batch_calls);
        if max_batch_calls < 1 {
            return Err(invalid("max_batch_calls", "must be at least 1"));
        }
        let max_batch_body_bytes = args
            .max_batch_body_bytes
            .or(file.max_batch_body_bytes)
            .unwrap_or(defaults.max_batch_body_bytes);
        if max_batch_body_bytes < 1 {
            return Err(invalid("max_batch_body_bytes", "must be at least 1"));
        }
        let max_result_bytes = args
            .max_result_bytes
            .or(file.max_result_bytes)
            .unwrap_or(defaults.max_result_bytes);
        if max_result_bytes == 0 {
            return Err(invalid("max_result_bytes", "must be at least 1"));
        }
        let warning_cap = args
            .warning_cap
            .or(file.warning_cap)
            .unwrap_or(defaults.warning_cap);
        if warning_cap == 0 {
            return Err(invalid("warning_cap", "must be at least 1"));
        }
        let stuck_after_s = args
            .stuck_after_s
            .or(file.stuck_after_s)
            .unwrap_or(defaults.stuck_after_s);
        let sweep_interval_ms = args
            .sweep_interval_ms
            .or(file.sweep_interval_ms)
            .unwrap_or(defaults.sweep_interval_ms);
        if sweep_interval_ms < 10 {
            return Err(invalid("sweep_interval_ms", "must be at least 10"));
        }
        let retention = args.default_retention_s.or(file.default_retention_s);
        let default_retention = match retention {
            Some(s) => RetentionS::new(s).map_err(|e| invalid("default_retention_s", e.reason))?,
            None => RetentionS::DEFAULT,
        };
        let request_timeout_ms = args
            .request_timeout_ms
            .or(file.request_timeout_ms)
            .unwrap_or(defaults.request_timeout_ms);
        if request_timeout_ms < 100 {
            return Err(invalid("request_timeout_ms", "must be at least 100"));
        }
        let metrics_token_sha256 = match args
            .metrics_token_sha256
            .clone()
            .or(file.metrics_token_sha256)
        {
            Some(d) => Some(
                Digest::parse("metrics_token_sha256", &d)
                    .map_err(|e| invalid("metrics_token_sha256", e.reason))?,
            ),
            None => None,
        };
        let metrics_refresh_ms = args
            .metrics_refresh_ms
            .or(file.metrics_refresh_ms)
            .unwrap_or(defaults.metrics_refresh_ms);
        if !(100..=3_600_000).contains(&metrics_refresh_ms) {
            return Err(invalid(
                "metrics_refresh_ms",
                "must be within [100, 3600000] ms",
            ));
        }
        let tuning = Tuning {
            max_queue: args.max_queue.or(file.max_queue),
            segment_bytes: args.segment_bytes.or(file.segment_bytes),
            pg_statement_timeout_ms: args
                .pg_statement_timeout_ms
                .or(file.pg_statement_timeout_ms),
            pg_lock_timeout_ms: args.pg_lock_timeout_ms.or(file.pg_lock_timeout_ms),
            pg_idle_in_transaction_timeout_ms: args
                .pg_idle_in_transaction_timeout_ms
                .or(file.pg_idle_in_transaction_timeout_ms),
            pg_client_timeout_ms: args.pg_client_timeout_ms.or(file.pg_client_timeout_ms),
        };
        if tuning.max_queue == Some(0) {
            return Err(invalid("max_queue", "must be at least 1"));
        }
        if let Some(b) = tuning.segment_bytes
            && !(65_536..=1 << 30).contains(&b)
        {
            return Err(invalid(
                "segment_bytes",
                "must be within [65536, 1073741824]",
            ));
        }
        for (name, v) in [
            ("pg_statement_timeout_ms", tuning.pg_statement_timeout_ms),
            ("pg_lock_timeout_ms", tuning.pg_lock_timeout_ms),
            (
                "pg_idle_in_transaction_timeout_ms",
                tuning.pg_idle_in_transaction_timeout_ms,
            ),
            ("pg_client_timeout_ms", tuning.pg_client_timeout_ms),
        ] {
            if let Some(ms) = v
                && !(1..=120_000).contains(&ms)
            {
                return Err(invalid(name, "must be within [1, 120000] ms"));
            }
        }
        unused.extend(engine_settings_unused(&store, &tuning));
        Ok(Config {
            listen,
            store,
            auth,
            admin_tokens,
            lease_margin_ms,
            max_body_bytes,
            max_batch_calls,
            max_batch_body_bytes,
            max_result_bytes,
            warning_cap,
            stuck_after_s,
            sweep_interval_ms,
            default_retention,
            request_timeout_ms,
            clock_skew_ms: args.clock_skew_ms.unwrap_or(0),
            metrics_token_sha256,
            metrics_refresh_ms,
            tuning,
            deprecated,
            unused,
            quotas,
            tls,
            behind_proxy,
            otlp_endpoint,
        })
    }

    /// The core's limits from these settings.
    pub fn limits(&self) -> settle_core::Limits {
        settle_core::Limits {
            lease_margin_ms: self.lease_margin_ms,
            warning_cap: self.warning_cap,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        for (url, shown) in [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            (
                "postgres://h/db?user=u&password=secret&sslmode=require",
                "postgres://h/db?user=u&password=***&sslmode=require",
            ),
            ("postgres://h", "postgres://h"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    fn file(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    /// Flags and variables beat the file for the store too, and every store
    /// setting that loses is named (docs/http-api.md, "Settings").
    #[test]
    fn the_store_is_chosen_by_precedence_and_what_loses_is_said() {
        let pg = "postgres://u:secret@h/db";
        // The packaged file names a directory; --store on the command line.
        let mut a = args();
        a.store = Some(pg.into());
        let c = Config::merge(file("data = \"/var/lib/settle\""), &a).unwrap();
        assert_eq!(c.store, StoreConfig::Url(pg.into()));
        assert_eq!(
            c.unused,
            ["data (config file) = /var/lib/settle is not used: --store chooses the store"]
        );
        // Both in the file: the URL wins, the directory is named.
        let c = Config::merge(file(&format!("store = \"{pg}\"\ndata = \"d\"")), &args()).unwrap();
        assert_eq!(c.store, StoreConfig::Url(pg.into()));
        assert_eq!(
            c.unused,
            ["data (config file) = d is not used: store (config file) names a PostgreSQL store"]
        );
        // --data beats the file's store (a flag beats the file); the
        // password is not repeated in the warning.
        let mut a = args();
        a.data = Some("flagdir".into());
        let c = Config::merge(file(&format!("store = \"{pg}\"")), &a).unwrap();
        assert_eq!(c.store, StoreConfig::Embedded("flagdir".into()));
        assert_eq!(
            c.unused,
            ["store (config file) = postgres://u:***@h/db is not used: --data chooses the store"]
        );
        // Nothing given twice: nothing said.
        let c = Config::merge(file("data = \"d\""), &args()).unwrap();
        assert_eq!(c.store, StoreConfig::Embedded("d".into()));
        assert!(c.unused.is_empty(), "{:?}", c.unused);
        // The other engine's tuning.
        let c = Config::merge(file("pg_lock_timeout_ms = 250"), &args()).unwrap();
        assert_eq!(
            c.unused,
            ["pg_lock_timeout_ms is not used: the store is the embedded store"]
        );
        let mut a = args();
        a.store = Some(pg.into());
        a.segment_bytes = Some(1 << 20);
        let c = Config::merge(FileConfig::default(), &a).unwrap();
        assert_eq!(
            c.unused,
            ["segment_bytes is not used: the store is PostgreSQL"]
        );
    }

    fn args() -> Settings {
        Settings::default()
    }

    #[test]
    fn defaults_are_the_specs() {
        let c = Config::merge(FileConfig::default(), &args()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:7411".parse().unwrap());
        assert_eq!(
            c.store,
            StoreConfig::Embedded(PathBuf::from("./settle-data"))
        );
        assert_eq!(c.auth, AuthConfig::Off);
        assert_eq!(c.lease_margin_ms, 100);
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(c.max_result_bytes, 64 << 10);
        assert_eq!(c.warning_cap, 1000);
        assert_eq!(c.stuck_after_s, 3600);
    }

    #[test]
    fn engine_tuning_comes_from_the_file_and_flags_and_is_checked() {
        let file: FileConfig =
            toml::from_str("max_queue = 10\nsegment_bytes = 1048576\npg_lock_timeout_ms = 250")
                .unwrap();
        let mut a = args();
        a.pg_statement_timeout_ms = Some(900);
        let c = Config::merge(file, &a).unwrap();
        assert_eq!(
            c.tuning,
            Tuning {
                max_queue: Some(10),
                segment_bytes: Some(1 << 20),
                pg_statement_timeout_ms: Some(900),
                pg_lock_timeout_ms: Some(250),
                ..Tuning::default()
            }
        );
        assert_eq!(
            Config::merge(FileConfig::default(), &args())
                .unwrap()
                .tuning,
            Tuning::default()
        );
        for bad in [
            "max_queue = 0",
            "segment_bytes = 4096",
            "pg_lock_timeout_ms = 0",
            "pg_client_timeout_ms = 600000",
        ] {
            let file: FileConfig = toml::from_str(bad).unwrap();
            assert!(
                matches!(
                    Config::merge(file, &args()),
                    Err(ConfigError::Invalid { .. })
                ),
                "{bad}"
            );
        }
    }

    /// `thread_priorities` is still accepted, in the file and as a flag,
    /// either value, and reported as deprecated whenever it was given.
    #[test]
    fn thread_priorities_is_accepted_and_reported_as_deprecated() {
        let c = Config::merge(FileConfig::default(), &args()).unwrap();
        assert!(c.deprecated.is_empty());
        for value in [true, false] {
            let file: FileConfig = toml::from_str(&format!("thread_priorities = {value}"))
                .unwrap_or_else(|e| panic!("thread_priorities = {value}: {e}"));
            let c = Config::merge(file, &args()).unwrap();
            assert_eq!(c.deprecated, ["thread_priorities"], "file, {value}");
            assert_eq!(c.tuning, Tuning::default());

            let mut a = args();
            a.thread_priorities = Some(value);
            let c = Config::merge(FileConfig::default(), &a).unwrap();
            assert_eq!(c.deprecated, ["thread_priorities"], "flag, {value}");
        }
        let mut a = args();
        a.thread_priorities = Some(true);
        let file: FileConfig = toml::from_str("thread_priorities = false").unwrap();
        assert_eq!(
            Config::merge(file, &a).unwrap().deprecated,
            ["thread_priorities"],
            "both: reported once"
        );
    }

    #[test]
    fn open_listen_without_tenants_is_refused() {
        let mut a = args();
        a.listen = Some("0.0.0.0:7411".into());
        let e = Config::merge(FileConfig::default(), &a).unwrap_err();
        assert!(matches!(e, ConfigError::OpenWithoutTenants(_)));
        assert!(e.to_string().contains("no tenants"));
    }

    #[test]
    fn file_is_parsed_and_flags_win() {
        let file: FileConfig = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            behind_proxy = true
            lease_margin_ms = 250
            warning_cap = 5
            [[tenants]]
            name = "acme"
            token_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
            "#,
        )
        .unwrap();
        let mut a = args();
        a.warning_cap = Some(7);
        let c = Config::merge(file, &a).unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.lease_margin_ms, 250);
        assert_eq!(c.warning_cap, 7);
        let AuthConfig::Tenants(t) = &c.auth else {
            panic!("auth should be on")
        };
        assert_eq!(t[0].0.as_str(), "acme");
    }

    const D1: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
    const D2: &str = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9";
    const D3: &str = "baa5a0964d3320fbc0c6a922140453c8513ea24ab8fd0577034804a967248096";

    #[test]
    fn admin_tokens_are_a_string_or_a_list_and_flags_add_to_them() {
        let one: FileConfig = toml::from_str(&format!("[admin]\ntoken_sha256 = \"{D1}\"")).unwrap();
        let c = Config::merge(one, &args()).unwrap();
        assert_eq!(c.admin_tokens, [Digest::parse("t", D1).unwrap()]);
        // [admin] without tenants leaves the tenants' routes as they were (off, on loopback).
        assert_eq!(c.auth, AuthConfig::Off);

        let many: FileConfig =
            toml::from_str(&format!("[admin]\ntoken_sha256 = [\"{D1}\", \"{D2}\"]")).unwrap();
        let mut a = args();
        a.admin_tokens_sha256 = vec![D3.into()];
        let c = Config::merge(many, &a).unwrap();
        let want: Vec<Digest> = [D1, D2, D3]
            .iter()
            .map(|d| Digest::parse("t", d).unwrap())
            .collect();
        assert_eq!(c.admin_tokens, want);
        assert!(
            Config::merge(FileConfig::default(), &args())
                .unwrap()
                .admin_tokens
                .is_empty()
        );
    }

    #[test]
    fn bad_admin_tokens_are_refused() {
        for bad in [
            "[admin]\ntoken_sha256 = 7".to_string(),
            "[admin]\ntoken = \"x\"".to_string(),
            "[admin]".to_string(),
        ] {
            assert!(toml::from_str::<FileConfig>(&bad).is_err(), "{bad}");
        }
        let mut a = args();
        for (given, why) in [
            (vec!["ABC".to_string()], "64 lowercase hex"),
            (vec![D1.to_uppercase()], "lowercase hex"),
            (vec![D1.into(), D1.into()], "appears twice"),
        ] {
            a.admin_tokens_sha256 = given;
            let e = Config::merge(FileConfig::default(), &a).unwrap_err();
            assert!(e.to_string().contains("admin.token_sha256"), "{e}");
            assert!(e.to_string().contains(why), "{e}");
        }
        // A token is a tenant's or an admin's, never both.
        a.admin_tokens_sha256 = vec![D2.into()];
        a.tenants = vec![format!("acme={D2}")];
        let e = Config::merge(FileConfig::default(), &a).unwrap_err();
        assert!(e.to_string().contains("tenant acme"), "{e}");
    }

    /// `[admin]` does not stand in for tenants: on a non-loopback address
    /// the tenants' routes would still be open to anyone.
    #[test]
    fn admin_without_tenants_still_needs_loopback() {
        let mut a = args();
        a.listen = Some("0.0.0.0:7411".into());
        a.admin_tokens_sha256 = vec![D1.into()];
        let e = Config::merge(FileConfig::default(), &a).unwrap_err();
        assert!(matches!(e, ConfigError::OpenWithoutTenants(_)), "{e}");
        a.tenants = vec![format!("acme={D2}")];
        a.behind_proxy = true;
        assert!(Config::merge(FileConfig::default(), &a).is_ok());
    }

    /// SPEC §12: a non-loopback address needs TLS, or `behind_proxy`.
    #[test]
    fn plain_http_on_the_network_needs_behind_proxy() {
        let mut a = args();
        a.listen = Some("0.0.0.0:7411".into());
        a.tenants = vec![format!("acme={D2}")];
        let e = Config::merge(FileConfig::default(), &a).unwrap_err();
        assert!(matches!(e, ConfigError::PlainTextOnNetwork(_)), "{e}");
        assert!(e.to_string().contains("--behind-proxy"), "{e}");
        let file: FileConfig = toml::from_str("behind_proxy = true").unwrap();
        let c = Config::merge(file, &a).unwrap();
        assert!(c.behind_proxy && c.tls.is_none());
        a.tls_cert = Some("cert.pem".into());
        a.tls_key = Some("key.pem".into());
        let c = Config::merge(FileConfig::default(), &a).unwrap();
        assert_eq!(
            c.tls,
            Some(TlsFiles {
                cert: "cert.pem".into(),
                key: "key.pem".into()
            })
        );
        // One file without the other is a mistake, wherever the address.
        let file: FileConfig = toml::from_str("tls_cert = \"c.pem\"").unwrap();
        let e = Config::merge(file, &args()).unwrap_err();
        assert!(e.to_string().contains("tls_key"), "{e}");
        for bad in ["collector:4318", "https://collector:4318", "http://"] {
            let file: FileConfig = toml::from_str(&format!("otlp_endpoint = {bad:?}")).unwrap();
            assert!(Config::merge(file, &args()).is_err(), "{bad}");
        }
        let file: FileConfig =
            toml::from_str("otlp_endpoint = \"http://collector:4318/\"").unwrap();
        let c = Config::merge(file, &args()).unwrap();
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://collector:4318"));
    }

    /// A tenant may list several tokens (rotation); a flag adds a token to
    /// the table of its name; a token is one tenant's only.
    #[test]
    fn tenants_have_several_tokens_and_quotas() {
        let file: FileConfig = toml::from_str(&format!(
            "[[tenants]]\nname = \"acme\"\ntoken_sha256 = [\"{D1}\", \"{D2}\"]\nrate_per_s = 2.5\nmax_records = 10\n"
        ))
        .unwrap();
        let mut a = args();
        let d3 = "3".repeat(64);
        a.tenants = vec![format!("acme={d3}"), format!("beta={}", "4".repeat(64))];
        let c = Config::merge(file, &a).unwrap();
        let AuthConfig::Tenants(t) = &c.auth else {
            panic!("auth should be on")
        };
        let names: Vec<&str> = t.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["acme", "acme", "acme", "beta"]);
        assert_eq!(c.quotas.len(), 1);
        assert_eq!(
            c.quotas[0].1,
            Quota {
                rate: Some(Rate {
                    per_s: 2.5,
                    burst: 3
                }),
                max_records: Some(10)
            }
        );
        let bad = [
            format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = [\"{D1}\", \"{D1}\"]"),
            "[[tenants]]\nname = \"a\"\ntoken_sha256 = []".to_string(),
            format!(
                "[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\n[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D2}\""
            ),
            format!(
                "[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\n[[tenants]]\nname = \"b\"\ntoken_sha256 = \"{D1}\""
            ),
            format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\nburst = 3"),
            format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\nrate_per_s = 0"),
            format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\nrate_per_s = -1"),
            format!(
                "[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\nrate_per_s = 1\nburst = 0"
            ),
            format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{D1}\"\nmax_records = 0"),
        ];
        for text in bad {
            let file: FileConfig = toml::from_str(&text).unwrap();
            assert!(
                matches!(
                    Config::merge(file, &args()),
                    Err(ConfigError::Invalid { .. })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn unknown_keys_and_bad_digests_are_refused() {
        assert!(toml::from_str::<FileConfig>("lease_margin = 1").is_err());
        let mut a = args();
        a.tenants = vec!["acme=ABC".into()];
        let e = Config::merge(FileConfig::default(), &a).unwrap_err();
        assert!(e.to_string().contains("token_sha256"), "{e}");
        let d = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
        a.tenants = vec![format!("a={d}"), format!("b={d}")];
        assert!(Config::merge(FileConfig::default(), &a).is_err());
    }
}
