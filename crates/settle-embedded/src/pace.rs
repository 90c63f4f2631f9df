//! Background writes go to the disk in small steps between the log's syncs.
//!
//! A log `fdatasync` ends with a cache flush of the whole device (on a
//! virtual disk: an `fdatasync` of the whole image on the host), so it waits
//! for every write the kernel has handed to the disk before it, whoever
//! wrote it. Measured on the 2-core test machine (docs/performance.md): the
//! checkpointer's table `fsync` (tens of megabytes at once) held log syncs
//! for 50–90 ms, and each 1 MiB `O_DIRECT` write of the next segment's
//! zero-fill for 10–30 ms; those were the p99/p999 of a commit.
//!
//! So the two background writers (the segment zero-fill and the checkpoint's
//! table writeback) take turns with the log: one small step (≤ 256 KiB) per
//! log sync, started right after a sync returned. They hurry (no waiting)
//! once the active segment is half full, so a segment is always prepared and
//! checkpointed before the writer needs it: pacing trades background speed
//! for the log's latency, never the writer's progress.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A step waits at most this long for a log sync: with no traffic there is
/// nothing to protect, and background work still moves on.
const MAX_WAIT: Duration = Duration::from_millis(2);

/// Bytes a background writer hands to the disk per step.
pub const STEP_BYTES: usize = 256 * 1024;

/// Shared by the log (which reports its syncs) and the background writers
/// (which wait for them).
#[derive(Debug, Default)]
pub struct Pacer {
    /// Log syncs completed so far.
    syncs: Mutex<u64>,
    synced: Condvar,
    /// Notified only by [`Pacer::stop`]: a [`Pacer::pause`] waits on it, so
    /// the log's syncs do not wake it (with `synced`, the writeback thread
    /// woke at every sync only to wait again, and each wake cost the log
    /// thread a futex call right after its `fdatasync`).
    stopping: Condvar,
    /// Pauses waiting now (what the tests look at).
    #[cfg(test)]
    pausing: std::sync::atomic::AtomicUsize,
    /// The active segment is at least half full, or the writer is waiting
    /// for the next one: background work goes at full speed.
    hurry: AtomicBool,
    /// The store is closing: [`Pacer::next_sync`] and [`Pacer::pause`] end.
    stopped: AtomicBool,
}

impl Pacer {
    /// The log completed a sync; `hurry` says whether background work
    /// must catch up (the active segment is filling up).
    pub fn synced(&self, hurry: bool) {
        self.hurry.store(hurry, Ordering::Relaxed);
        *self.syncs.lock() += 1;
        self.synced.notify_all();
    }

    /// Background work must not wait any more (the writer needs it now).
    pub fn hurry(&self) {
        self.hurry.store(true, Ordering::Relaxed);
        self.synced.notify_all();
    }

    /// Whether background work goes at full speed.
    pub fn hurried(&self) -> bool {
        self.hurry.load(Ordering::Relaxed)
    }

    /// Ends every wait of [`Pacer::next_sync`] and [`Pacer::pause`], for good.
    pub fn stop(&self) {
        let _g = self.syncs.lock();
        self.stopped.store(true, Ordering::SeqCst);
        self.synced.notify_all();
        self.stopping.notify_all();
    }

    /// Waits for the log's next sync however long it takes; `false` once
    /// stopped. (With no log traffic there is no latency to protect.)
    pub fn next_sync(&self) -> bool {
        let mut g = self.syncs.lock();
        let seen = *g;
        while *g == seen && !self.stopped.load(Ordering::SeqCst) {
            self.synced.wait(&mut g);
        }
        !self.stopped.load(Ordering::SeqCst)
    }

    /// Waits `d` unless stopped first; `false` once stopped.
    pub fn pause(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut g = self.syncs.lock();
        while !self.stopped.load(Ordering::SeqCst) {
            #[cfg(test)]
            self.pausing.fetch_add(1, Ordering::SeqCst);
            let timed_out = self.stopping.wait_until(&mut g, deadline).timed_out();
            #[cfg(test)]
            self.pausing.fetch_sub(1, Ordering::SeqCst);
            if timed_out {
                break;
            }
        }
        !self.stopped.load(Ordering::SeqCst)
    }

    /// Runs `step` after log syncs, at most once per `every`, until stopped.
    pub fn run_after_syncs(&self, every: Duration, step: &mut dyn FnMut()) {
        while self.next_sync() {
            step();
            if !self.pause(every) {
                return;
            }
        }
    }

    /// Waits until the log's next sync completes (at most [`MAX_WAIT`]),
    /// unless background work is hurried.
    pub fn step(&self) {
        if self.hurried() {
            return;
        }
        let deadline = Instant::now() + MAX_WAIT;
        let mut g = self.syncs.lock();
        let seen = *g;
        while *g == seen && !self.hurried() {
            if self.synced.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The background thread's loop ends when the pacer is stopped, also
    /// while it waits for a sync that never comes.
    #[test]
    fn a_stopped_pacer_ends_the_background_loop() {
        let p = Arc::new(Pacer::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let bg = {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut steps = 0;
                p.run_after_syncs(Duration::from_millis(1), &mut || {
                    steps += 1;
                    let _ = tx.send(());
                });
                steps
            })
        };
        // One sync: one step (sync again until it has run).
        while rx.try_recv().is_err() {
            p.synced(false);
            std::thread::yield_now();
        }
        p.stop();
        assert!(bg.join().unwrap() >= 1);
    }

    /// A pause ends at its deadline or when the pacer stops (it waits on a
    /// condition variable of its own, which only `stop` notifies); the
    /// log's syncs meanwhile do not end it.
    #[test]
    fn a_pause_outlasts_syncs_and_ends_at_stop() {
        let p = Arc::new(Pacer::default());
        assert!(p.pause(Duration::from_millis(1)), "a pause that ran out");
        let paused = {
            let p = p.clone();
            std::thread::spawn(move || p.pause(Duration::from_secs(3600)))
        };
        // It counts itself under the lock and waits, which releases it:
        // once the lock is taken after the count, it is waiting.
        while p.pausing.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        drop(p.syncs.lock());
        for _ in 0..1000 {
            p.synced(false);
            p.hurry();
        }
        assert!(!paused.is_finished(), "a pause ended by syncs");
        p.stop();
        assert!(!paused.join().unwrap(), "a pause ended by stop says so");
        assert!(!p.pause(Duration::from_secs(3600)), "stopped: no waiting");
    }

    #[test]
    fn a_step_returns_once_the_log_syncs() {
        let p = Arc::new(Pacer::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || {
                // Keep stepping until the other side has synced at least
                // once during a step: every step ends either way.
                loop {
                    let before = *p.syncs.lock();
                    p.step();
                    if *p.syncs.lock() > before {
                        tx.send(()).unwrap();
                        return;
                    }
                }
            })
        };
        while rx.try_recv().is_err() {
            p.synced(false);
            std::thread::yield_now();
        }
        waiter.join().unwrap();
    }
}
