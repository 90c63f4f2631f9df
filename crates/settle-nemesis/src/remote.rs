//! The counting remote: the service the workload's effects write to. It
//! de-duplicates nothing, so a second effect for a key is visible; it
//! numbers every effect it applies (the number is the effect's result);
//! and it refuses a fence lower than one it has seen for the key, from an
//! effect or a reconcile query (SPEC §1: the remote's own fencing, which a
//! paused worker's late write meets).
//!
//! A line protocol over TCP, one request per connection:
//! `APPLY <key> <fence>` → `OK <id>` | `FENCED <seen>`;
//! `QUERY <key> <fence>` → `APPLIED <id>` | `NONE` | `FENCED <seen>`.
//! Every event is a JSON line of [`RemoteEvent`] in the log file.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::check::RemoteEvent;

#[derive(Default)]
struct Keys {
    /// The highest fence seen per key, and the effect applied (the last).
    seen: HashMap<String, (u64, Option<u64>)>,
    next_id: u64,
}

struct Remote {
    keys: Mutex<Keys>,
    log: Mutex<std::fs::File>,
}

impl Remote {
    fn log(&self, e: &RemoteEvent) {
        let mut line = serde_json::to_vec(e).expect("an event serializes");
        line.push(b'\n');
        let mut f = self.log.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line).expect("the remote's log is writable");
    }

    fn answer(&self, line: &str) -> String {
        let mut parts = line.split_whitespace();
        let (Some(verb), Some(key), Some(Ok(fence)), None) = (
            parts.next(),
            parts.next(),
            parts.next().map(str::parse::<u64>),
            parts.next(),
        ) else {
            return "BAD\n".into();
        };
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let next = keys.next_id + 1;
        let entry = keys.seen.entry(key.to_string()).or_insert((0, None));
        if fence < entry.0 {
            let seen = entry.0;
            drop(keys);
            self.log(&RemoteEvent::Fenced {
                key: key.into(),
                fence,
                seen,
            });
            return format!("FENCED {seen}\n");
        }
        entry.0 = fence;
        match verb {
            "APPLY" => {
                entry.1 = Some(next);
                keys.next_id = next;
                // Logged before it is answered: an answered effect is in the log.
                self.log(&RemoteEvent::Apply {
                    key: key.into(),
                    fence,
                    id: next,
                });
                format!("OK {next}\n")
            }
            "QUERY" => {
                let applied = entry.1;
                drop(keys);
                self.log(&RemoteEvent::Query {
                    key: key.into(),
                    fence,
                    applied,
                });
                match applied {
                    Some(id) => format!("APPLIED {id}\n"),
                    None => "NONE\n".into(),
                }
            }
            _ => "BAD\n".into(),
        }
    }
}

/// Serves the remote on `listen` until the process is killed.
pub async fn serve(listen: &str, log: &Path) -> std::io::Result<()> {
    let remote = Arc::new(Remote {
        keys: Mutex::new(Keys::default()),
        log: Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?,
        ),
    });
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (sock, _) = listener.accept().await?;
        let remote = remote.clone();
        tokio::spawn(async move {
            let (r, mut w) = sock.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_ok() {
                let answer = remote.answer(line.trim_end());
                let _ = w.write_all(answer.as_bytes()).await;
            }
        });
    }
}

/// What the remote answered a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Applied as effect `id`, or (a query) effect `id` was applied.
    Applied(u64),
    /// (A query) nothing was applied for the key.
    None,
    /// Refused: a higher fence was seen.
    Fenced,
}

/// Why a request got no answer: `sent` says whether it may have arrived.
#[derive(Debug, thiserror::Error)]
#[error("the remote did not answer ({what}; sent: {sent})")]
pub struct NoAnswer {
    pub sent: bool,
    pub what: String,
}

/// One request to the remote at `addr`, each step bounded by `timeout`.
pub async fn call(addr: &str, line: &str, timeout: Duration) -> Result<Answer, NoAnswer> {
    let fail = |sent: bool, what: String| NoAnswer { sent, what };
    let mut sock = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| fail(false, "connect timed out".into()))?
        .map_err(|e| fail(false, e.to_string()))?;
    sock.write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(|e| fail(true, e.to_string()))?;
    let mut answer = String::new();
    tokio::time::timeout(timeout, BufReader::new(sock).read_line(&mut answer))
        .await
        .map_err(|_| fail(true, "answer timed out".into()))?
        .map_err(|e| fail(true, e.to_string()))?;
    let mut parts = answer.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u64>)) {
        (Some("OK" | "APPLIED"), Some(Ok(id))) => Ok(Answer::Applied(id)),
        (Some("NONE"), None) => Ok(Answer::None),
        (Some("FENCED"), _) => Ok(Answer::Fenced),
        _ => Err(fail(true, format!("unexpected answer {answer:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> (Remote, tempfile::NamedTempFile) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let r = Remote {
            keys: Mutex::new(Keys::default()),
            log: Mutex::new(f.reopen().unwrap()),
        };
        (r, f)
    }

    #[test]
    fn it_counts_every_effect_and_refuses_lower_fences() {
        let (r, f) = remote();
        assert_eq!(r.answer("QUERY a 1"), "NONE\n");
        assert_eq!(r.answer("APPLY a 2"), "OK 1\n");
        // Not de-duplicated: a second effect with a fence as high is applied.
        assert_eq!(r.answer("APPLY a 2"), "OK 2\n");
        assert_eq!(r.answer("APPLY a 1"), "FENCED 2\n");
        assert_eq!(r.answer("QUERY a 1"), "FENCED 2\n");
        assert_eq!(r.answer("QUERY a 3"), "APPLIED 2\n");
        // The query raised the fence seen.
        assert_eq!(r.answer("APPLY a 2"), "FENCED 3\n");
        assert_eq!(r.answer("APPLY"), "BAD\n");
        let events: Vec<RemoteEvent> = std::fs::read_to_string(f.path())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 7); // the BAD line is not an event
        assert_eq!(
            events[1],
            RemoteEvent::Apply {
                key: "a".into(),
                fence: 2,
                id: 1
            }
        );
    }
}
