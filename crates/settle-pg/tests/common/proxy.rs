//! A TCP proxy in front of PostgreSQL that the test controls: it passes
//! bytes through until armed, then cuts one connection at the COMMIT.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What to do with the next COMMIT a client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Pass everything.
    Off,
    /// Swallow the COMMIT (and what came with it) and close both sides:
    /// the server never commits.
    BeforeCommit,
    /// Let the COMMIT through, wait for the server to answer it, drop the
    /// answer and close both sides: committed, but the client never hears.
    AfterCommit,
}

pub struct Proxy {
    pub port: u16,
    mode: Arc<Mutex<Cut>>,
    /// Connections cut so far.
    pub cuts: Arc<AtomicU64>,
}

/// A simple-query `COMMIT` message ends with these bytes, and so does the
/// server's `CommandComplete` for it ("READ COMMITTED" never matches: the
/// NUL must follow `COMMIT`).
const COMMIT: &[u8] = b"COMMIT\0";
const ROLLBACK: &[u8] = b"ROLLBACK\0";

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

impl Proxy {
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(Cut::Off));
        let cuts = Arc::new(AtomicU64::new(0));
        let (m, c) = (mode.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pump_pair(client, server, m.clone(), c.clone()));
            }
        });
        Proxy { port, mode, cuts }
    }

    /// The URL of the database through this proxy.
    pub fn url(&self, base: &str) -> String {
        base.replace("127.0.0.1:5432", &format!("127.0.0.1:{}", self.port))
    }

    /// Arms a cut for the next COMMIT on any connection (one shot).
    pub fn arm(&self, cut: Cut) {
        *self.mode.lock().unwrap() = cut;
    }
}

async fn pump_pair(
    client: TcpStream,
    server: TcpStream,
    mode: Arc<Mutex<Cut>>,
    cuts: Arc<AtomicU64>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // `swallow`: the server's answers are dropped until COMMIT's answer, then both sides close.
    let (swallow_tx, swallow_rx) = watch::channel(false);
    let (close_tx, mut close_rx) = watch::channel(false);
    let close_tx = Arc::new(close_tx);

    let up_close = close_tx.clone();
    let mut up_close_rx = close_tx.subscribe();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                r = cr.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
                _ = up_close_rx.changed() => break,
            };
            let chunk = &buf[..n];
            if find(chunk, COMMIT) {
                let cut = {
                    let mut m = mode.lock().unwrap();
                    std::mem::replace(&mut *m, Cut::Off)
                };
                match cut {
                    Cut::Off => {}
                    Cut::BeforeCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        let _ = up_close.send(true);
                        break;
                    }
                    Cut::AfterCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        let _ = swallow_tx.send(true);
                    }
                }
            }
            if sw.write_all(chunk).await.is_err() {
                break;
            }
        }
        let _ = up_close.send(true);
    });

    let down_close = close_tx.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                r = sr.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
                _ = close_rx.changed() => break,
            };
            let chunk = &buf[..n];
            if *swallow_rx.borrow() {
                // Answered (committed or rolled back): now cut, answer unheard.
                if find(chunk, COMMIT) || find(chunk, ROLLBACK) {
                    break;
                }
                continue;
            }
            if cw.write_all(chunk).await.is_err() {
                break;
            }
        }
        let _ = down_close.send(true);
    });
    let _ = tokio::join!(up, down);
}
