//! Connections: how they are opened and watched, what is checked on each new
//! one, the server's identity, and commit tokens.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, Socket};

use crate::tls::Tls;

/// Opens connections whose driver task watches the server's notices.
///
/// PostgreSQL answers a COMMIT whose wait for a synchronous standby was
/// cancelled (a query cancel, or `statement_timeout`) with success plus a
/// WARNING: "committed locally, but might not have been replicated". Such
/// an answer must not produce a receipt, so the driver closes the
/// connection on any plain WARNING (SQLSTATE 01000, which settle's
/// statements never cause otherwise). Notices are read in order, before the
/// COMMIT's CommandComplete, so the COMMIT then fails as a lost connection
/// and is resolved by its commit token (which also waits for the standby).
///
/// With or without TLS (the URL's `sslmode`, `tls.rs`): the pools and the
/// connections outside them share one connector.
pub struct Connector(pub Tls);

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        cfg: &Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let cfg = cfg.clone();
        let tls = self.0.clone();
        Box::pin(async move { connect(&cfg, &tls).await })
    }
}

/// Opens one watched connection (also used outside the pools). Without
/// TLS, exactly tokio-postgres's `NoTls` connection: the driver is generic
/// over the stream, not boxed.
pub async fn connect(
    cfg: &Config,
    tls: &Tls,
) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
    match tls {
        Tls::Off => {
            let (client, conn) = cfg.connect(NoTls).await?;
            Ok((client, tokio::spawn(drive(conn))))
        }
        Tls::Rustls(make) => {
            let (client, conn) = cfg.connect(make.clone()).await?;
            Ok((client, tokio::spawn(drive(conn))))
        }
    }
}

async fn drive<T: AsyncRead + AsyncWrite + Unpin>(mut conn: Connection<Socket, T>) {
    loop {
        match futures::future::poll_fn(|cx| conn.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notice(n))) if *n.code() == SqlState::WARNING => {
                tracing::error!(
                    message = n.message(),
                    detail = n.detail().unwrap_or(""),
                    "PostgreSQL warned on a settle connection; closing it so that an \
                     answer it qualifies is treated as in doubt"
                );
                return; // dropping the connection closes the socket
            }
            Some(Ok(AsyncMessage::Notice(n))) => {
                tracing::debug!(severity = n.severity(), message = n.message(), "notice")
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::debug!(error = %e, "connection ended");
                return;
            }
            None => return,
        }
    }
}

/// What the server says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub fsync: String,
    pub synchronous_commit: String,
    /// Set by initdb; kept by a promoted standby and by a restart.
    pub system_identifier: String,
    /// Changes when the postmaster restarts, NOT when it reinitialises
    /// after a backend crashed (measured: `docs/postgres.md`).
    pub started: String,
    pub in_recovery: bool,
    /// The current timeline (hex), none on a standby. A promotion starts a
    /// new one.
    pub timeline: Option<String>,
}

impl Server {
    pub async fn read(c: &Client, sql: &str) -> Result<Server, tokio_postgres::Error> {
        let r = c.query_one(sql, &[]).await?;
        Ok(Server {
            fsync: r.get(0),
            synchronous_commit: r.get(1),
            system_identifier: r.get(2),
            started: r.get(3),
            in_recovery: r.get(4),
            timeline: r.get(5),
        })
    }

    /// Whether the server flushes what it commits (`synchronous_commit` is
    /// set per transaction, so only `fsync` is a property of the server).
    pub fn refusal(&self) -> Option<String> {
        (self.fsync != "on").then(|| {
            format!(
                "PostgreSQL runs with fsync={}: a commit would not survive a crash; \
                 settle refuses to serve until fsync is on",
                self.fsync
            )
        })
    }

    /// How `self` (now) differs from `before`, for logs and errors.
    pub fn changes_since(&self, before: &Server) -> Vec<String> {
        let mut v = Vec::new();
        if self.system_identifier != before.system_identifier {
            v.push(format!(
                "system identifier {} (was {})",
                self.system_identifier, before.system_identifier
            ));
        }
        if self.timeline != before.timeline {
            v.push(format!(
                "timeline {:?} (was {:?})",
                self.timeline, before.timeline
            ));
        }
        if self.started != before.started {
            v.push(format!(
                "postmaster started {} (was {})",
                self.started, before.started
            ));
        }
        v
    }
}

/// The latest server identity seen by any connection of the store.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Option<Server>>>);

impl Seen {
    pub fn get(&self) -> Option<Server> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn set(&self, s: Server) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }
}

/// A commit token: written by the transaction it names, so that after an
/// interrupted COMMIT its presence — not a transaction id, which PostgreSQL
/// can hand out again after a crash — says whether that transaction committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// The database clock (ms) read by the transaction: the table's
    /// cleanup order, and part of the key.
    pub at: i64,
    pub bytes: [u8; 16],
}

impl Token {
    /// A token never handed out before: a 128-bit random per-process seed
    /// plus a per-process counter.
    pub fn new(at: i64) -> Token {
        static SEED: OnceLock<(u64, u64)> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let (hi, lo) = *SEED.get_or_init(|| {
            // RandomState is keyed from the operating system's random source.
            let salt = (
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            (
                RandomState::new().hash_one(salt),
                RandomState::new().hash_one(salt),
            )
        });
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&hi.to_le_bytes());
        bytes[8..].copy_from_slice(&lo.wrapping_add(n).to_le_bytes());
        Token { at, bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(Token::new(5).bytes));
        }
    }
}
