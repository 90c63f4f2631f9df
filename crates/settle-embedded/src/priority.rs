//! Thread priorities: the store's threads tell the scheduler which of them
//! every command waits for.
//!
//! The writer and the log thread are the critical path of every group
//! commit; the checkpointer, the index's writeback and compactions, and
//! segment preparation are background work with a backlog bound (the writer
//! waits for the checkpointer only past `max_checkpoint_backlog`). On two
//! cores at 1,024 in flight the writer spent a quarter of its time, and the
//! log thread most of its time between syncs, runnable but waiting for a
//! core the checkpointer held (`/proc/<tid>/schedstat`); with these nice
//! values the benchmarks gave 4-7 % more pairs/s, in process and over HTTP
//! batches (docs/performance.md, "Tenth round").
//!
//! Linux only (per-thread nice values); elsewhere nothing changes. Raising a
//! thread's priority needs root, `CAP_SYS_NICE` or an `RLIMIT_NICE`
//! allowance: without it the critical threads stay at the process's nice
//! value and only the background threads are lowered, which is always
//! allowed. `EmbeddedOptions::thread_priorities` turns all of it off.

use std::cell::Cell;

/// What a store thread does, for the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every command waits for it: raised by [`RAISE`] where permitted.
    Critical,
    /// Bounded by backpressure: nice [`BACKGROUND_NICE`].
    Background,
}

/// How far a critical thread's nice value goes below the one it inherited.
pub const RAISE: i32 = 10;

/// The background threads' nice value (the lowest priority there is).
pub const BACKGROUND_NICE: i32 = 19;

thread_local! {
    /// This thread took a role: threads it spawns for background work
    /// (segment preparation) take [`Role::Background`].
    static TOOK: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread `role`'s priority (when `enabled`); failures
/// (no permission to raise) leave it as it is. Gives back the nice value the
/// thread has afterwards (`None`: not Linux, or it could not be read).
pub fn take(role: Role, enabled: bool) -> Option<i32> {
    if enabled {
        TOOK.with(|t| t.set(true));
        set(role);
    }
    current()
}

/// Whether the calling thread took a role (so that the work it hands to a
/// new thread should be background work too).
pub fn took() -> bool {
    TOOK.with(|t| t.get())
}

#[cfg(target_os = "linux")]
fn set(role: Role) {
    use rustix::process::setpriority_process;
    let tid = rustix::thread::gettid();
    let Some(now) = current() else { return };
    let target = match role {
        Role::Critical => (now - RAISE).max(-20),
        Role::Background => BACKGROUND_NICE.max(now),
    };
    if target == now {
        return;
    }
    if let Err(e) = setpriority_process(Some(tid), target) {
        // EPERM/EACCES: not allowed to raise; the thread keeps its nice value.
        tracing::debug!(?role, target, error = %e, "thread priority unchanged");
    }
}

#[cfg(not(target_os = "linux"))]
fn set(_role: Role) {}

/// The calling thread's nice value.
#[cfg(target_os = "linux")]
pub fn current() -> Option<i32> {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()
}

#[cfg(not(target_os = "linux"))]
pub fn current() -> Option<i32> {
    None
}

/// Whether this process may raise a thread's priority (root, or
/// `CAP_SYS_NICE`, or an `RLIMIT_NICE` allowance): asked of the kernel
/// directly on a throwaway thread, so nothing else changes.
#[cfg(all(test, target_os = "linux"))]
fn may_raise() -> bool {
    std::thread::spawn(|| {
        let before = current().unwrap();
        let tid = rustix::thread::gettid();
        before > -20 && rustix::process::setpriority_process(Some(tid), before - 1).is_ok()
    })
    .join()
    .unwrap()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn on_a_thread(role: Role, enabled: bool) -> (Option<i32>, Option<i32>, bool) {
        std::thread::spawn(move || {
            let before = current();
            let after = take(role, enabled);
            (before, after, took())
        })
        .join()
        .unwrap()
    }

    #[test]
    fn background_threads_take_the_lowest_priority() {
        let (before, after, took) = on_a_thread(Role::Background, true);
        assert!(before.is_some());
        assert_eq!(after, Some(BACKGROUND_NICE));
        assert!(took);
    }

    #[test]
    fn critical_threads_are_raised_where_permitted_and_kept_otherwise() {
        let (before, after, took) = on_a_thread(Role::Critical, true);
        let before = before.unwrap();
        let want = if may_raise() {
            (before - RAISE).max(-20)
        } else {
            before
        };
        assert_eq!(after, Some(want));
        assert!(took);
    }

    #[test]
    fn disabled_changes_nothing() {
        for role in [Role::Critical, Role::Background] {
            let (before, after, took) = on_a_thread(role, false);
            assert_eq!(before, after);
            assert!(!took);
        }
    }
}
