//! The engine's lock order, written down once and checked in debug builds.
//!
//! A thread takes the engine's locks only in increasing [`Level`]; it may
//! skip levels and release in any order. Each place that takes one of
//! these locks first calls [`enter`] with its level; in debug builds that
//! panics when the thread already holds a lock of the same or a higher
//! level (a deadlock waiting to happen), in release builds it is free.

/// The engine's locks, in the only order a thread may take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `Shared::evict_gate`: shared by an eviction, exclusive while an
    /// export reads the map.
    EvictGate = 1,
    /// `Listing::evicting`: an eviction or a listing's fold.
    Evicting = 2,
    /// `Shared::frozen`: shared by a publish or an eviction, exclusive while
    /// an export marks its instant (one instant of map and index).
    Frozen = 3,
    /// `Shared::leased`: held by the writer while it applies a command.
    Leased = 4,
    /// `Shared::capture`: by a publish while an export reads the map, and by
    /// the export at its start and end.
    Capture = 5,
    /// A shard of the map (DashMap's own lock: an entry, `get`, `iter`,
    /// `remove_if`'s closure).
    Map = 6,
    /// `Listing::pending`.
    Pending = 7,
    /// `Listing::sorted`.
    Sorted = 8,
    /// `Shared::published`.
    Published = 9,
}

/// A level this thread holds until it is dropped.
#[must_use = "the level is held until the guard is dropped"]
pub struct Held {
    #[cfg(debug_assertions)]
    level: Level,
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<Level>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Notes that this thread is about to take a lock of `level`.
#[inline]
pub fn enter(level: Level) -> Held {
    #[cfg(debug_assertions)]
    {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(top) = h.iter().max() {
                assert!(
                    *top < level,
                    "lock order: {level:?} taken while {top:?} is held"
                );
            }
            h.push(level);
        });
        Held { level }
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = level;
        Held {}
    }
}

#[cfg(debug_assertions)]
impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let at = h
                .iter()
                .rposition(|l| *l == self.level)
                .expect("a held level is on the thread's list");
            h.remove(at);
        });
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn increasing_levels_and_any_release_order_pass() {
        let a = enter(Level::Evicting);
        let b = enter(Level::Map);
        let c = enter(Level::Sorted);
        drop(b);
        drop(a);
        let d = enter(Level::Published);
        drop(c);
        drop(d);
        let _again = enter(Level::Evicting);
    }

    #[test]
    #[should_panic(expected = "lock order: Leased taken while Map is held")]
    fn a_lower_level_under_a_higher_one_panics() {
        let _map = enter(Level::Map);
        let _leased = enter(Level::Leased);
    }

    #[test]
    #[should_panic(expected = "lock order: Map taken while Map is held")]
    fn the_same_level_twice_panics() {
        let _a = enter(Level::Map);
        let _b = enter(Level::Map);
    }
}
