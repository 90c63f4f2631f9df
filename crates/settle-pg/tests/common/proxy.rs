//! A TCP proxy in front of PostgreSQL that the test controls: it passes
//! bytes through until armed, then cuts, holds or silences one connection
//! at its next COMMIT. It can also drop the startup `options` parameter,
//! as a connection pooler may.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What to do with the next COMMIT a client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Pass everything.
    Off,
    /// Swallow the COMMIT (and what came after it in the same read; what
    /// came before it, such as the statements pipelined ahead of it, is
    /// passed on) and close both sides: the server never commits.
    BeforeCommit,
    /// Let the COMMIT through, wait for the server to answer it, drop the
    /// answer and close both sides: committed, but the client never hears.
    AfterCommit,
    /// Swallow the COMMIT, keep both sockets open and forward nothing more
    /// in either direction; a close by the server is passed on to the
    /// client (a crash of the server is noticed).
    HoldCommit,
    /// Swallow the COMMIT and go silent both ways without closing anything,
    /// whatever either side does (a dead network or a hung middlebox),
    /// until [`Proxy::release`].
    SilentBeforeCommit,
    /// Let the COMMIT through, then go silent both ways without closing,
    /// until [`Proxy::release`]: committed, the answer never arrives.
    SilentAfterCommit,
}

pub struct Proxy {
    pub port: u16,
    upstream: Arc<Mutex<String>>,
    mode: Arc<Mutex<Cut>>,
    /// Connections cut, held or silenced so far.
    pub cuts: Arc<AtomicU64>,
    release: Arc<watch::Sender<u64>>,
}

/// A simple-query `COMMIT` message ends with these bytes, and so does the
/// server's `CommandComplete` for it ("READ COMMITTED" never matches: the
/// NUL must follow `COMMIT`).
const COMMIT: &[u8] = b"COMMIT\0";
const ROLLBACK: &[u8] = b"ROLLBACK\0";

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Where the simple-query message carrying `COMMIT` starts in `chunk`
/// (its type byte `Q` and length come before the text): what the client
/// pipelined before it (a whole transaction, on the one-round-trip path)
/// reaches the server whatever the cut does to the COMMIT.
fn commit_message_start(chunk: &[u8]) -> usize {
    let at = chunk
        .windows(COMMIT.len())
        .position(|w| w == COMMIT)
        .unwrap_or(0);
    match at.checked_sub(5) {
        Some(start) if chunk[start] == b'Q' => start,
        _ => 0,
    }
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        Proxy::start_with(upstream, false).await
    }

    /// `strip_options`: remove the `options` parameter from every startup
    /// message (what a pooler that does not pass startup options through does).
    pub async fn start_with(upstream: &str, strip_options: bool) -> Proxy {
        let upstream = Arc::new(Mutex::new(upstream.to_string()));
        let up = upstream.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(Cut::Off));
        let cuts = Arc::new(AtomicU64::new(0));
        let release = Arc::new(watch::channel(0u64).0);
        let (m, c, r) = (mode.clone(), cuts.clone(), release.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = up.lock().unwrap().clone();
                let Ok(server) = TcpStream::connect(&to).await else {
                    continue;
                };
                // As the client and the server themselves do: without it
                // Nagle's algorithm holds small answers for ~40 ms, which
                // no real path between them adds.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(pump_pair(
                    client,
                    server,
                    m.clone(),
                    c.clone(),
                    r.clone(),
                    strip_options,
                ));
            }
        });
        Proxy {
            port,
            upstream,
            mode,
            cuts,
            release,
        }
    }

    /// The URL of the database through this proxy (`base` names `upstream`).
    pub fn url(&self, base: &str) -> String {
        let (head, rest) = base.split_once('@').expect("postgres://user@host:port/db");
        let (_, db) = rest.split_once('/').expect("a database name");
        format!("{head}@127.0.0.1:{}/{db}", self.port)
    }

    /// Sends new connections to another server (as a moved DNS name or
    /// virtual IP would).
    pub fn set_upstream(&self, upstream: &str) {
        *self.upstream.lock().unwrap() = upstream.to_string();
    }

    /// Arms a cut for the next COMMIT on any connection (one shot).
    pub fn arm(&self, cut: Cut) {
        *self.mode.lock().unwrap() = cut;
    }

    /// Closes every silenced connection (both sides).
    pub fn release(&self) {
        self.release.send_modify(|n| *n += 1);
    }
}

/// Removes `options` from a startup message; anything else is returned as is.
fn strip_startup_options(msg: &[u8]) -> Vec<u8> {
    // Int32 length, Int32 protocol 3.0, then name\0value\0 pairs and a final \0.
    if msg.len() < 8 || msg[4..8] != [0, 3, 0, 0] {
        return msg.to_vec();
    }
    let mut out = msg[4..8].to_vec();
    let mut parts = msg[8..].split(|b| *b == 0);
    while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
        if name.is_empty() {
            break;
        }
        if name != b"options" {
            out.extend_from_slice(name);
            out.push(0);
            out.extend_from_slice(value);
            out.push(0);
        }
    }
    out.push(0);
    let mut framed = ((out.len() + 4) as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&out);
    framed
}

#[allow(clippy::too_many_lines)] // one scenario, kept whole
async fn pump_pair(
    client: TcpStream,
    server: TcpStream,
    mode: Arc<Mutex<Cut>>,
    cuts: Arc<AtomicU64>,
    release: Arc<watch::Sender<u64>>,
    strip_options: bool,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // `swallow`: the server's answers are dropped until COMMIT's answer, then both sides close.
    let (swallow_tx, swallow_rx) = watch::channel(false);
    let (close_tx, mut close_rx) = watch::channel(false);
    let close_tx = Arc::new(close_tx);
    // Silent: nothing passes either way, and nothing is closed until released.
    let silent = Arc::new(AtomicBool::new(false));
    // Held: nothing passes upstream; the server's close still reaches the client.
    let held = Arc::new(AtomicBool::new(false));

    if strip_options {
        // The startup message is the client's first (NoTls: no SSLRequest).
        let mut len = [0u8; 4];
        if cr.read_exact(&mut len).await.is_err() {
            return;
        }
        let n = u32::from_be_bytes(len) as usize;
        let mut msg = len.to_vec();
        msg.resize(n.max(4), 0);
        if cr.read_exact(&mut msg[4..]).await.is_err() {
            return;
        }
        if sw.write_all(&strip_startup_options(&msg)).await.is_err() {
            return;
        }
    }

    let up_close = close_tx.clone();
    let mut up_close_rx = close_tx.subscribe();
    let mut up_release = release.subscribe();
    let (up_silent, up_held) = (silent.clone(), held.clone());
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                r = cr.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
                _ = up_close_rx.changed() => return,
                _ = up_release.changed() => return,
            };
            if up_silent.load(Ordering::SeqCst) || up_held.load(Ordering::SeqCst) {
                continue;
            }
            let mut chunk = &buf[..n];
            if find(chunk, COMMIT) {
                let cut = {
                    let mut m = mode.lock().unwrap();
                    std::mem::replace(&mut *m, Cut::Off)
                };
                if matches!(
                    cut,
                    Cut::BeforeCommit | Cut::HoldCommit | Cut::SilentBeforeCommit
                ) {
                    let start = commit_message_start(chunk);
                    if sw.write_all(&chunk[..start]).await.is_err() {
                        break;
                    }
                    chunk = &chunk[start..];
                }
                match cut {
                    Cut::Off => {}
                    Cut::BeforeCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Cut::AfterCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        let _ = swallow_tx.send(true);
                    }
                    Cut::HoldCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        up_held.store(true, Ordering::SeqCst);
                        continue;
                    }
                    Cut::SilentBeforeCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        up_silent.store(true, Ordering::SeqCst);
                        continue;
                    }
                    Cut::SilentAfterCommit => {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        let _ = sw.write_all(chunk).await;
                        up_silent.store(true, Ordering::SeqCst);
                        continue;
                    }
                }
            }
            if sw.write_all(chunk).await.is_err() {
                break;
            }
        }
        if up_silent.load(Ordering::SeqCst) {
            // The client gave up: a silent network does not tell the server.
            let _ = up_release.changed().await;
            drop(sw);
            return;
        }
        let _ = up_close.send(true);
    });

    let down_close = close_tx.clone();
    let mut down_release = release.subscribe();
    let down_silent = silent.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                r = sr.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
                _ = close_rx.changed() => return,
                _ = down_release.changed() => return,
            };
            if down_silent.load(Ordering::SeqCst) {
                continue;
            }
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
        if down_silent.load(Ordering::SeqCst) {
            // The server went away: the client is not told either.
            let _ = down_release.changed().await;
            drop(cw);
            return;
        }
        let _ = down_close.send(true);
    });
    let _ = tokio::join!(up, down);
}
