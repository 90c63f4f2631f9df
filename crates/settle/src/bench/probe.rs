//! The probe: the minimal durable claim/settle store, the reference that
//! `settle bench --data DIR --reference probe` measures settle against, on
//! the same machine in the same minute.
//!
//! Timed figures on these VMs swing from one hour to the next, so a figure
//! of the engine means something only next to a figure of the same work,
//! done as simply as it can be done durably, measured in alternating runs.
//! The probe is that work and nothing else:
//!
//! - a hash map, key → (fence, status, digest), in 16 shards behind mutexes;
//!   a caller applies its command there (claim: insert the key with a fresh
//!   fence from a counter; settle: check the fence and that the key is
//!   pending, set completed and the result's digest);
//! - then it sends the command to one writer thread through a channel and
//!   waits: the writer takes everything queued, appends one entry per
//!   command (key, fence, status, 32-byte digest: ~80 bytes) to a buffer
//!   behind one header (length and CRC-32 of the group, as settle frames
//!   its log), writes it to an append-only file in DIR with `write_all`,
//!   makes it durable with one `fdatasync` (`sync_data`), and only then
//!   answers every caller of the group (group commit);
//! - so a claim and a settle are each durable before they are answered,
//!   exactly like settle's, with the same pair loop (`run_workers`) and key
//!   shape as settle's in-process runs.
//!
//! What it leaves out is what settle adds on top of that: its rules
//! (fingerprints, bindings, leases, replays), records, checkpoints into an
//! index, eviction, bounded memory, and publishing states only once durable
//! (the probe's map holds a command's state before its entry is durable;
//! nothing reads it during a run). No tricks either way: a fresh file, no
//! preallocation, one real `write` and `fdatasync` per group.

use std::collections::HashMap;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_ledger::bench::{Limit, PairStats, PairWorker, run_workers};
use tokio::sync::oneshot;

const SHARDS: usize = 16;
const CLAIM: u8 = b'C';
const SETTLE: u8 = b'S';
const PENDING: u8 = 0;
const COMPLETED: u8 = 1;
/// The digests of settle's bench pairs (`PairInput::standard`).
const FINGERPRINT: [u8; 32] = [7; 32];
const RESULT: [u8; 32] = [101; 32];
/// A group's header: the entries' length and their CRC-32, little-endian.
const HEADER: usize = 8;

/// Why a probe run stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the probe's log: {0}")]
    Io(Arc<std::io::Error>),
    #[error("the probe's writer stopped")]
    Closed,
    #[error("the probe refused a fresh pair ({0})")]
    Refused(String),
}

impl From<std::io::Error> for ProbeError {
    fn from(e: std::io::Error) -> ProbeError {
        ProbeError::Io(Arc::new(e))
    }
}

#[derive(Clone, Copy)]
struct State {
    fence: u64,
    status: u8,
    digest: [u8; 32],
}

/// One command on its way to the log, and who waits for it.
struct Job {
    kind: u8,
    key: Box<str>,
    state: State,
    done: oneshot::Sender<Result<(), Arc<std::io::Error>>>,
}

struct Map {
    shards: Vec<Mutex<HashMap<Box<str>, State>>>,
    hasher: std::collections::hash_map::RandomState,
    fences: AtomicU64,
}

/// The probe store: open it on a fresh file, run workers, close it.
pub struct Probe {
    map: Arc<Map>,
    tx: Sender<Job>,
    writer: std::thread::JoinHandle<std::io::Result<()>>,
}

impl Probe {
    /// Creates (or truncates) the log at `path` and starts the writer.
    pub fn open(path: &Path) -> Result<Probe, ProbeError> {
        let file = File::create(path)?;
        // The new file's name is durable before the first group is.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("settle-probe".into())
            .spawn(move || write_groups(file, rx))?;
        let map = Map {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: Default::default(),
            fences: AtomicU64::new(0),
        };
        Ok(Probe {
            map: Arc::new(map),
            tx,
            writer,
        })
    }

    /// Worker `w` of a run whose keys are `{prefix}-{w}-{n}`.
    pub fn worker(&self, prefix: &str, w: usize) -> ProbeWorker {
        ProbeWorker {
            map: self.map.clone(),
            tx: self.tx.clone(),
            prefix: format!("{prefix}-{w}-"),
        }
    }

    /// Stops the writer once every worker is gone (the log stays).
    pub fn close(self) -> Result<(), ProbeError> {
        drop(self.tx);
        match self.writer.join() {
            Ok(r) => Ok(r?),
            Err(_) => Err(ProbeError::Closed),
        }
    }
}

/// The writer: everything queued becomes one group, one `write_all` and
/// one `fdatasync`, then every caller of the group is answered.
fn write_groups(mut file: File, rx: Receiver<Job>) -> std::io::Result<()> {
    let (mut buf, mut group) = (Vec::with_capacity(1 << 17), Vec::new());
    while let Ok(first) = rx.recv() {
        group.push(first);
        group.extend(rx.try_iter());
        buf.clear();
        buf.resize(HEADER, 0);
        for j in &group {
            buf.push(j.kind);
            buf.push(j.key.len() as u8); // bench keys: < 100 bytes
            buf.extend_from_slice(j.key.as_bytes());
            buf.extend_from_slice(&j.state.fence.to_le_bytes());
            buf.push(j.state.status);
            buf.extend_from_slice(&j.state.digest);
        }
        let len = (buf.len() - HEADER) as u32;
        let crc = crc32fast::hash(&buf[HEADER..]);
        buf[..4].copy_from_slice(&len.to_le_bytes());
        buf[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        let r = file.write_all(&buf).and_then(|()| file.sync_data());
        let answer = r.map_err(Arc::new);
        for j in group.drain(..) {
            let _ = j.done.send(answer.clone());
        }
        if let Err(e) = answer {
            return Err(std::io::Error::new(e.kind(), e.to_string()));
        }
    }
    Ok(())
}

/// One caller: claims then settles a fresh key per call.
pub struct ProbeWorker {
    map: Arc<Map>,
    tx: Sender<Job>,
    prefix: String,
}

impl ProbeWorker {
    /// Applies `f` to the key's entry in the map, then logs the command
    /// with the state `f` left and waits until it is durable.
    async fn command(
        &self,
        kind: u8,
        key: &str,
        f: impl FnOnce(&mut HashMap<Box<str>, State>) -> Option<State>,
    ) -> Result<State, ProbeError> {
        let shard = self.map.hasher.hash_one(key) as usize % SHARDS;
        let state = f(&mut self.map.shards[shard]
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
        .ok_or_else(|| ProbeError::Refused(key.to_string()))?;
        let (done, answer) = oneshot::channel();
        let job = Job {
            kind,
            key: key.into(),
            state,
            done,
        };
        self.tx.send(job).map_err(|_| ProbeError::Closed)?;
        match answer.await {
            Ok(r) => r.map(|()| state).map_err(ProbeError::Io),
            Err(_) => Err(ProbeError::Closed),
        }
    }
}

impl PairWorker for ProbeWorker {
    type Error = ProbeError;
    async fn call(&mut self, n: u64) -> Result<u64, ProbeError> {
        // `{prefix}{n}` without the formatting machinery, as settle's worker.
        let mut key = String::with_capacity(self.prefix.len() + 20);
        key.push_str(&self.prefix);
        let digits = n.checked_ilog10().unwrap_or(0) + 1;
        for i in (0..digits).rev() {
            key.push(char::from(b'0' + (n / 10u64.pow(i) % 10) as u8));
        }
        let claimed = self
            .command(CLAIM, &key, |m| {
                let fence = self.map.fences.fetch_add(1, Ordering::Relaxed) + 1;
                let s = State {
                    fence,
                    status: PENDING,
                    digest: FINGERPRINT,
                };
                m.insert(key.as_str().into(), s).is_none().then_some(s)
            })
            .await?;
        self.command(SETTLE, &key, |m| {
            let s = m.get_mut(key.as_str())?;
            if s.fence != claimed.fence || s.status != PENDING {
                return None;
            }
            (s.status, s.digest) = (COMPLETED, RESULT);
            Some(*s)
        })
        .await?;
        Ok(1)
    }
}

/// One probe run in `dir` (a fresh log, removed afterwards): its stats and
/// the process's CPU time per pair in µs, measured as settle's runs are.
pub async fn run(
    dir: &Path,
    concurrency: usize,
    duration: Duration,
    progress: Arc<AtomicU64>,
) -> Result<(PairStats, Option<f64>), ProbeError> {
    let path = dir.join(format!("probe-{}.log", super::run_id()));
    let probe = Probe::open(&path)?;
    let prefix = format!("bench-{}", super::run_id());
    let workers = (0..concurrency.max(1))
        .map(|w| probe.worker(&prefix, w))
        .collect();
    let cpu_before = super::process_cpu_s();
    let stats = run_workers(workers, Limit::For(duration), progress).await;
    let cpu = super::process_cpu_s().zip(cpu_before).map(|(a, b)| a - b);
    let closed = probe.close();
    let removed = std::fs::remove_file(&path);
    let stats = stats?;
    closed?;
    removed?;
    Ok((stats, cpu.map(|c| c * 1e6 / stats.pairs.max(1) as f64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(kind, key, fence, status, digest)` of every entry of a log, in
    /// order; every group's length and CRC-32 checked.
    fn decode(log: &[u8]) -> Vec<(u8, String, u64, u8, [u8; 32])> {
        let (mut out, mut at) = (Vec::new(), 0);
        while at < log.len() {
            let len = u32::from_le_bytes(log[at..at + 4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(log[at + 4..at + HEADER].try_into().unwrap());
            let mut g = &log[at + HEADER..at + HEADER + len];
            assert_eq!(crc32fast::hash(g), crc, "group at {at}");
            at += HEADER + len;
            while !g.is_empty() {
                let k = g[1] as usize;
                let key = String::from_utf8(g[2..2 + k].to_vec()).unwrap();
                let fence = u64::from_le_bytes(g[2 + k..10 + k].try_into().unwrap());
                let digest = g[11 + k..43 + k].try_into().unwrap();
                out.push((g[0], key, fence, g[10 + k], digest));
                g = &g[43 + k..];
            }
        }
        out
    }

    /// Every acknowledged claim and settle is in the log, in the order a
    /// key went through them, with the fence its claim was given.
    #[tokio::test]
    async fn the_log_holds_every_acknowledged_command() {
        let dir = std::env::temp_dir().join(format!("settle-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("probe.log");
        let probe = Probe::open(&path).unwrap();
        let workers = (0..8).map(|w| probe.worker("bench-t", w)).collect();
        let stats = run_workers(workers, Limit::Calls(300), Arc::default())
            .await
            .unwrap();
        probe.close().unwrap();
        let entries = decode(&std::fs::read(&path).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(stats.pairs, 300);
        assert_eq!(entries.len(), 600);
        let mut claimed: HashMap<String, (usize, u64)> = HashMap::new();
        let mut last_fence: HashMap<String, u64> = HashMap::new();
        let mut settled = 0;
        for (i, (kind, key, fence, status, digest)) in entries.iter().enumerate() {
            let (w, _) = key
                .strip_prefix("bench-t-")
                .unwrap()
                .split_once('-')
                .unwrap();
            match *kind {
                CLAIM => {
                    assert_eq!((*status, *digest), (PENDING, FINGERPRINT), "{key}");
                    assert!(claimed.insert(key.clone(), (i, *fence)).is_none(), "{key}");
                    // A worker's pairs follow each other: its fences increase.
                    let last = last_fence.insert(w.to_string(), *fence);
                    assert!(last.is_none_or(|l| l < *fence), "{key}: {last:?} {fence}");
                }
                SETTLE => {
                    let (at, f) = claimed[key];
                    assert!(at < i && f == *fence, "{key}");
                    assert_eq!((*status, *digest), (COMPLETED, RESULT), "{key}");
                    settled += 1;
                }
                k => panic!("entry kind {k}"),
            }
        }
        assert_eq!(settled, 300);
        // Every claim took its own fence from the counter: 1..=300.
        let mut fences: Vec<u64> = claimed.values().map(|&(_, f)| f).collect();
        fences.sort_unstable();
        assert_eq!(fences, (1..=300).collect::<Vec<_>>());
        // And each worker's keys are its calls 0, 1, 2, … with none missing.
        for w in 0..8 {
            let mut ns: Vec<u64> = claimed
                .keys()
                .filter_map(|k| k.strip_prefix(&format!("bench-t-{w}-"))?.parse().ok())
                .collect();
            ns.sort_unstable();
            assert_eq!(ns, (0..ns.len() as u64).collect::<Vec<_>>(), "worker {w}");
        }
    }
}
