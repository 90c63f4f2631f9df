//! Thread priorities: the store's background threads yield to the ones
//! every command waits for.
//!
//! The writer and the log thread are the critical path of every group
//! commit; the checkpointer, the index's writeback and compactions, and
//! segment preparation are background work with a backlog bound (the writer
//! waits for the checkpointer only past `max_checkpoint_backlog`). On two
//! cores at 1,024 in flight the writer spent a quarter of its time, and the
//! log thread a third, runnable but waiting for a core the checkpointer
//! held (`bench/threads`). With [`Role::Background`] the background
//! threads run [`BACKGROUND_NICE`] levels below the thread that opened the
//! store (about a third of its CPU share when both want a core): ~4 % more
//! pairs/s in process at 1,024 in flight.
//!
//! It is off by default (`EmbeddedOptions::thread_priorities`): a
//! checkpointer that gets less CPU than the writer can fall behind, fill
//! its backlog, and then the writer waits for a whole checkpoint. At nice
//! 19 (or nice 0 beside a writer raised to -10) the p999 went from ~20 ms
//! to 90-300 ms; at +4 it was 90-150 ms in 2 of 13 runs, against none of
//! 16 without (docs/performance.md, "Tenth round"). Raising the critical
//! threads instead would need a privilege (root, `CAP_SYS_NICE`), so it is
//! not done. Lowering needs none.
//!
//! Linux only (per-thread nice values); elsewhere nothing changes.
//! `EmbeddedOptions::thread_priorities` turns it on.

use std::cell::Cell;

/// What a store thread does, for the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every command waits for it: keeps the opener's priority; background
    /// work it starts (segment preparation) takes [`Role::Background`].
    Critical,
    /// Bounded by backpressure: [`BACKGROUND_NICE`] levels lower.
    Background,
}

/// How many nice levels the background threads go below the thread that
/// started them (at most to 19, the lowest priority).
pub const BACKGROUND_NICE: i32 = 4;

thread_local! {
    /// This thread took a role: threads it spawns for background work
    /// (segment preparation) take [`Role::Background`].
    static TOOK: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread `role`'s priority (when `enabled`); a failure
/// leaves it as it is. Gives back the nice value the thread has afterwards
/// (`None`: not Linux, or it could not be read).
pub fn take(role: Role, enabled: bool) -> Option<i32> {
    if enabled {
        TOOK.with(|t| t.set(true));
        if role == Role::Background {
            lower();
        }
    }
    current()
}

/// Starts a thread named `name` that takes `role` (when `enabled`), then runs `f`.
pub fn spawn<T: Send + 'static>(
    name: &str,
    role: Role,
    enabled: bool,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            take(role, enabled);
            f()
        })
}

/// Whether the calling thread took a role (so that the work it hands to a
/// new thread should be background work).
pub fn took() -> bool {
    TOOK.with(|t| t.get())
}

/// The nice value a background thread started by a thread at `nice` takes.
pub fn background_of(nice: i32) -> i32 {
    (nice + BACKGROUND_NICE).min(19)
}

#[cfg(target_os = "linux")]
fn lower() {
    let Some(now) = current() else { return };
    let target = background_of(now);
    if target == now {
        return;
    }
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), target) {
        // Lowering is always allowed; a seccomp filter could still refuse.
        tracing::debug!(target, error = %e, "thread priority unchanged");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower() {}

/// The calling thread's nice value.
#[cfg(target_os = "linux")]
pub fn current() -> Option<i32> {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()
}

#[cfg(not(target_os = "linux"))]
pub fn current() -> Option<i32> {
    None
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
    fn background_threads_go_a_few_levels_lower() {
        let (before, after, took) = on_a_thread(Role::Background, true);
        let before = before.unwrap();
        assert_eq!(after, Some(background_of(before)));
        assert!(after.unwrap() > before || before == 19);
        assert!(took);
    }

    #[test]
    fn critical_threads_keep_their_priority_and_are_marked() {
        let (before, after, took) = on_a_thread(Role::Critical, true);
        assert_eq!(before, after);
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

    #[test]
    fn background_stops_at_the_lowest_priority() {
        assert_eq!(background_of(0), BACKGROUND_NICE);
        assert_eq!(background_of(17), 19);
        assert_eq!(background_of(19), 19);
        assert_eq!(background_of(-20), -20 + BACKGROUND_NICE);
    }
}
