//! The store's threads run at their roles' priorities (Linux): the writer
//! and the log thread at the opener's, the checkpointer, the reclaim
//! thread, fjall's compaction worker and segment preparation a few levels
//! lower; with
//! `thread_priorities` off, all at the opener's. One test in its own process: it reads every thread's
//! nice value from /proc, so no other test's store may be open meanwhile.
#![cfg(target_os = "linux")]

use std::sync::Arc;

use parking_lot::Mutex;
use settle_embedded::priority::{self, background_of};
use settle_embedded::{CheckpointStep, EmbeddedOptions, EmbeddedStore, Faults};
mod common;
use common::{claim_and_settle, logs};

/// The nice values of this process's threads named `comm` (as the kernel
/// shortens names: 15 bytes).
fn nice_of(comm: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let t = t.unwrap().path();
        let Ok(name) = std::fs::read_to_string(t.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if name.trim_end() != comm {
            continue;
        }
        let stat = std::fs::read_to_string(t.join("stat")).unwrap();
        // Fields after the name (which may hold spaces) start after ')';
        // nice is the 19th field of the line, the 17th after it.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        out.push(rest.split(' ').nth(16).unwrap().parse().unwrap());
    }
    out
}

/// Opens a store, writes until a segment is checkpointed, and gives back
/// the nice values of the writer, the log thread, the reclaim thread and
/// fjall's worker while it is open, and the one the checkpointer had
/// during its checkpoint.
async fn run(on: bool) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let seen = Arc::new(Mutex::new(None));
    {
        let seen = seen.clone();
        // Runs on the checkpointer thread.
        *faults.checkpoint_hook.lock() = Some(Arc::new(move |step| {
            if step == CheckpointStep::TablesWritten {
                *seen.lock() = priority::current();
            }
        }));
    }
    let o = EmbeddedOptions {
        segment_bytes: 8192,
        thread_priorities: on,
        faults: Some(faults.clone()),
        ..EmbeddedOptions::default()
    };
    let store = EmbeddedStore::open(dir.path(), o).unwrap();
    // A settled pair: the writer applied a command and the log thread
    // synced a frame, both after taking their roles. Until a segment is
    // sealed (for a checkpoint) and a second one is being prepared: the
    // first preparation is started by the opening thread, later ones by
    // the log thread.
    let mut n = 0;
    while logs(dir.path()) < 2 || faults.prepare_nice.lock().len() < 2 {
        claim_and_settle(&store, &format!("k-{n}")).await;
        n += 1;
        assert!(n < 10_000, "no segment was sealed");
    }
    let writer = nice_of("settle-writer");
    let sync = nice_of("settle-log");
    let reclaim = nice_of("settle-reclaim");
    let base = priority::current().unwrap();
    let background = if on { background_of(base) } else { base };
    let prepared = faults.prepare_nice.lock().clone();
    assert_eq!(prepared[0], base, "the opener's segment preparation");
    assert!(
        prepared[1..].iter().all(|&n| n == background),
        "segment preparation started by the log thread: {prepared:?}"
    );
    let fjall = nice_of("fjall:worker");
    // Closing runs every checkpoint to its end and joins the store's threads.
    let closing = store.clone();
    tokio::task::spawn_blocking(move || closing.close())
        .await
        .unwrap();
    let checkpointer = *seen.lock();
    (writer, sync, reclaim, fjall, checkpointer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_threads_take_their_roles_priorities() {
    let base = priority::current().unwrap();
    let lowered = background_of(base);
    assert!(lowered > base || base == 19);

    let (writer, sync, reclaim, fjall, checkpointer) = run(true).await;
    assert_eq!(writer, vec![base], "writer");
    assert_eq!(sync, vec![base], "log thread");
    assert_eq!(reclaim, vec![lowered], "reclaim thread");
    assert_eq!(fjall, vec![lowered], "fjall's worker");
    assert_eq!(checkpointer, Some(lowered), "checkpointer");

    // (fjall's worker may outlive the first store a while: not looked at.)
    let (writer, sync, reclaim, _, checkpointer) = run(false).await;
    assert_eq!(writer, vec![base], "writer, priorities off");
    assert_eq!(sync, vec![base], "log thread, priorities off");
    assert_eq!(reclaim, vec![base], "reclaim thread, priorities off");
    assert_eq!(checkpointer, Some(base), "checkpointer, priorities off");
}
