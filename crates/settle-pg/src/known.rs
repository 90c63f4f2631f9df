//! What this process knows of the store from its own round trips: the
//! records it last committed (each with its row's `xmin`), the
//! principal rows it read, the database clock at its last read and a block
//! of fences drawn ahead. The one-round-trip path
//! (`group_commit/warm.rs`, `warm_batch`) decides a batch on this instead of reading, and its write
//! statement checks every piece of it under the batch's locks
//! (docs/postgres.md, "The one-round-trip path"): nothing here is trusted
//! without that check, so a stale entry costs a fallback, never a wrong
//! answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use settle_core::{Fence, Key, PrincipalState, Record, TenantId};

use crate::session::Server;

/// Records kept at most; the map is cleared when full (a miss only costs
/// the two-round-trip path).
const MAX_RECORDS: usize = 65_536;
const MAX_PRINCIPALS: usize = 16_384;
/// The clock is estimated from the last read for at most this long.
const CLOCK_AGE: Duration = Duration::from_secs(1);
/// A block of fences is used for at most this long after the load that
/// drew it was sent; the write itself checks the 500 ms insert window on
/// the database clock, this only avoids sending writes bound to fail.
const FENCE_AGE: Duration = Duration::from_millis(400);
/// The most fences a load draws ahead (two full batches' worth at the
/// default `max_batch`; `nextval` costs ~0.3 µs each). A block is sized on
/// what one-round-trip writes took from the one before ([`Draws`]).
pub const FENCE_BLOCK: i32 = 128;
/// The most fences one claim consumes: its own and, when its load draws
/// a block ahead that the server never uses, the whole block (the export
/// header's `fences_per_claim_max`, SPEC §12).
pub const FENCES_PER_CLAIM_MAX: u64 = FENCE_BLOCK as u64 + 1;
/// A record is trusted by its `xmin` for at most this long: far less than
/// the ~2^31 transactions after which a 32-bit `xmin` comes round again.
const RECORD_AGE: Duration = Duration::from_secs(60);

/// A principal's row as read (all `None`: no row), and its state.
#[derive(Clone)]
pub struct PrincipalRow {
    pub generation: Option<String>,
    pub moved_at: Option<i64>,
    pub moves: Option<Vec<u8>>,
    pub state: PrincipalState,
}

/// Fences drawn ahead, in increasing order, with the database time of the
/// draw and when the load that drew them was sent.
struct FenceBlock {
    fences: VecDeque<Fence>,
    /// The highest fence of the draw.
    last: Fence,
    db_ms: i64,
    sent: Instant,
}

/// The latest block drawn, kept after the block is dropped (used up, too
/// old, found stale): how many fences it held, its last fence, and how
/// many of them one-round-trip batches committed. The next block is sized
/// on it: a block is usable only while no other fence is drawn, so every
/// load with claims replaces the one held, and what that one still holds
/// is skipped, never used.
#[derive(Default)]
struct Draws {
    size: usize,
    last: Option<Fence>,
    granted: usize,
}

impl Draws {
    /// Fences to draw ahead for a load with `claims` claims: twice what
    /// one-round-trip batches committed from the last block (twice its
    /// size if they took all of it), at least the load's own claims (so a
    /// batch like it can try the one-round-trip path again after it
    /// stopped working), at most [`FENCE_BLOCK`]. A lone client's blocks
    /// double up to the most; while one-round-trip batches commit none
    /// (they fail their check, or the blocks grow old), a load skips at
    /// most as many fences as it claims.
    fn ahead(&self, claims: i32) -> i32 {
        let want = if self.size > 0 && self.granted >= self.size {
            2 * self.size
        } else {
            2 * self.granted
        };
        (want.min(FENCE_BLOCK as usize) as i32).max(claims.clamp(0, FENCE_BLOCK))
    }
}

#[derive(Default)]
struct State {
    /// The server all of this was learnt from (`Seen`): after a failover
    /// or a restore, transaction ids — and so `xmin`s — are handed out
    /// again, so nothing learnt before is kept.
    server: Option<Server>,
    records: HashMap<(TenantId, Key), (Record, String, Instant)>,
    principals: HashMap<(String, String), PrincipalRow>,
    /// The database clock (ms) a read returned, and when its answer came.
    clock: Option<(i64, Instant)>,
    /// The latest estimate handed out: estimates never go back.
    floor: i64,
    fences: Option<FenceBlock>,
    draws: Draws,
}

/// What a warm batch takes from [`Known`]: everything it decides on.
pub struct Warm {
    /// Each record as known (`None`: a key this process knows nothing of,
    /// for a claim, taken to be free) with the `xmin` it was known at.
    pub records: HashMap<(TenantId, Key), (Option<Record>, Option<String>)>,
    pub principals: HashMap<(String, String), PrincipalRow>,
    /// The database clock estimated from the last read: never ahead of it.
    pub db_ms: i64,
    /// The claims' fences, in increasing order, and the database time of their draw.
    pub fences: Vec<Fence>,
    pub fences_db_ms: i64,
    /// The last fence of their block's draw (checked to be the sequence's
    /// last value), when the batch has claims.
    pub fences_last: Option<Fence>,
}

/// See the module's documentation.
pub struct Known {
    /// Off by option, or after the one-round-trip write failed in a way
    /// only it can (it then stays off: the two-round-trip path serves).
    on: AtomicBool,
    state: Mutex<State>,
    /// Batches committed in one round trip, and batches that tried and fell back.
    warm: AtomicU64,
    fell_back: AtomicU64,
    /// Batches sent on the one-round-trip path, whatever became of them
    /// (committed, fell back, failed, in doubt).
    sent: AtomicU64,
}

impl Known {
    pub fn new(on: bool) -> Known {
        Known {
            on: AtomicBool::new(on),
            state: Mutex::default(),
            warm: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns the one-round-trip path off for good (see [`Known::on`]).
    pub fn turn_off(&self) {
        self.on.store(false, Ordering::Relaxed);
        *self.state() = State::default();
    }

    /// Batches committed in one round trip, and batches that fell back.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.warm.load(Ordering::Relaxed),
            self.fell_back.load(Ordering::Relaxed),
        )
    }

    /// Batches sent on the one-round-trip path so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// A batch is about to be sent on the one-round-trip path.
    pub fn sending(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A one-round-trip batch committed `claims` fences of the block that
    /// ends at `fences_last` (`None`: it had no claims).
    pub fn granted(&self, fences_last: Option<Fence>, claims: usize) {
        if fences_last.is_none() {
            return;
        }
        let mut s = self.state();
        if s.draws.last == fences_last {
            s.draws.granted += claims;
        }
    }

    pub fn count(&self, warm: bool) {
        let c = if warm { &self.warm } else { &self.fell_back };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Fences a load with `claims` claims should draw beyond them: a new
    /// block whenever it draws any (a block is usable only while it ends
    /// at the sequence's last value: `sql::warm_check`), or when the one
    /// held is short or old; sized by [`Draws::ahead`].
    pub fn fences_wanted(&self, claims: i32) -> i32 {
        if !self.is_on() {
            return 0;
        }
        let s = self.state();
        match &s.fences {
            Some(b)
                if claims == 0
                    && !b.fences.is_empty()
                    && 2 * b.fences.len() >= s.draws.size
                    && b.sent.elapsed() < FENCE_AGE =>
            {
                0
            }
            _ => s.draws.ahead(claims),
        }
    }

    /// What a load read: fences drawn beyond the batch's own (at `db_ms`,
    /// the load sent at `sent`), the clock again at its end (`end_ms`, its
    /// answer came at `answered`) and the principal rows. (Its records are
    /// not kept: the batch writes them and [`Known::committed`] keeps them
    /// as written; those it only read would cost a copy each for a rare
    /// use.)
    pub fn loaded(
        &self,
        db_ms: i64,
        end_ms: i64,
        sent: Instant,
        answered: Instant,
        extra_fences: Vec<Fence>,
        principals: impl IntoIterator<Item = ((String, String), PrincipalRow)>,
    ) {
        if !self.is_on() {
            return;
        }
        let mut s = self.state();
        if s.clock.is_none_or(|(ms, _)| ms <= end_ms) {
            s.clock = Some((end_ms, answered));
        }
        if let Some(&last) = extra_fences.last() {
            s.draws = Draws {
                size: extra_fences.len(),
                last: Some(last),
                granted: 0,
            };
            s.fences = Some(FenceBlock {
                fences: extra_fences.into(),
                last,
                db_ms,
                sent,
            });
        }
        for (id, row) in principals {
            if s.principals.len() >= MAX_PRINCIPALS {
                s.principals.clear();
            }
            s.principals.insert(id, row);
        }
    }

    /// A batch committed (its answer came): its records as written, at
    /// `xmin`; `None` deletes.
    pub fn committed(
        &self,
        xmin: &str,
        records: impl IntoIterator<Item = ((TenantId, Key), Option<Record>)>,
    ) {
        if !self.is_on() {
            return;
        }
        let mut s = self.state();
        let now = Instant::now();
        for (id, r) in records {
            s.put(id, r.map(|r| (r, xmin.to_string(), now)));
        }
    }

    /// Forgets these records (written elsewhere, or an outcome not known).
    pub fn forget<'a>(&self, ids: impl IntoIterator<Item = &'a (TenantId, Key)>) {
        if !self.is_on() {
            return;
        }
        let mut s = self.state();
        for id in ids {
            s.records.remove(id);
        }
    }

    /// Forgets what a warm batch found stale: its records and principals,
    /// and the clock and fences (so the next batch reads them afresh).
    pub fn stale<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a (TenantId, Key)>,
        principals: impl IntoIterator<Item = &'a (String, String)>,
    ) {
        let mut s = self.state();
        for id in ids {
            s.records.remove(id);
        }
        for p in principals {
            s.principals.remove(p);
        }
        s.clock = None;
        s.floor = 0;
        s.fences = None;
    }

    /// Everything a batch needs to be decided without reading, or `None`
    /// when something is not known (or too old): `records` with whether
    /// some command needs the record (a settlement; a claim of a key never
    /// seen takes it as free), the principals, `claims` fences. Takes the
    /// fences out of the block.
    pub fn warm<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a (TenantId, Key), bool)>,
        principals: impl IntoIterator<Item = &'a (String, String)>,
        claims: usize,
        server: Option<&Server>,
    ) -> Option<Warm> {
        if !self.is_on() {
            return None;
        }
        let mut s = self.state();
        if s.server.as_ref() != server {
            *s = State {
                server: server.cloned(),
                ..State::default()
            };
            return None;
        }
        let (db_ms, answered) = s.clock?;
        let age = answered.elapsed();
        if age >= CLOCK_AGE {
            return None;
        }
        let mut out = HashMap::new();
        for (id, needed) in records {
            match s
                .records
                .get(id)
                .filter(|(_, _, at)| at.elapsed() < RECORD_AGE)
            {
                Some((r, x, _)) => {
                    out.insert(id.clone(), (Some(r.clone()), Some(x.clone())));
                }
                None if needed => return None,
                None => {
                    out.insert(id.clone(), (None, None));
                }
            }
        }
        let mut ps = HashMap::new();
        for p in principals {
            ps.insert(p.clone(), s.principals.get(p)?.clone());
        }
        let block = s.fences.as_mut()?;
        if block.fences.len() < claims || block.sent.elapsed() >= FENCE_AGE {
            return None;
        }
        let fences: Vec<Fence> = block.fences.drain(..claims).collect();
        let fences_db_ms = block.db_ms;
        let fences_last = (claims > 0).then_some(block.last);
        // The read happened before its answer came: this is at most the
        // database clock now. The write checks that it is not ahead of the
        // clock, nor more than `sql::MAX_CLOCK_LAG_MS` behind it.
        let est = (db_ms + age.as_millis() as i64).max(s.floor);
        s.floor = est;
        Some(Warm {
            records: out,
            principals: ps,
            db_ms: est,
            fences,
            fences_db_ms,
            fences_last,
        })
    }
}

impl State {
    fn put(&mut self, id: (TenantId, Key), r: Option<(Record, String, Instant)>) {
        match r {
            Some(r) => {
                if self.records.len() >= MAX_RECORDS {
                    self.records.clear();
                }
                self.records.insert(id, r);
            }
            None => {
                self.records.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drew(size: usize, granted: usize) -> Draws {
        Draws {
            size,
            last: None,
            granted,
        }
    }

    #[test]
    fn a_block_is_sized_on_what_the_one_before_gave() {
        // Nothing drawn yet: as many as the load claims.
        assert_eq!(drew(0, 0).ahead(1), 1);
        assert_eq!(drew(0, 0).ahead(0), 0);
        // Used up: twice as many, up to the most.
        assert_eq!(drew(4, 4).ahead(1), 8);
        assert_eq!(drew(100, 100).ahead(1), FENCE_BLOCK);
        // Replaced before it was used up: twice what it gave.
        assert_eq!(drew(128, 10).ahead(1), 20);
        // Gave nothing: only a probe the size of the load's claims.
        assert_eq!(drew(128, 0).ahead(30), 30);
        assert_eq!(drew(128, 0).ahead(0), 0);
    }

    /// `FENCES_PER_CLAIM_MAX` holds: a load with claims draws at most
    /// `FENCE_BLOCK` beyond them, whatever came before.
    #[test]
    fn no_block_is_larger_than_the_most() {
        for size in [0, 1, 64, 127, 128, 1000] {
            for granted in [0, 1, 63, 64, 128, 1000] {
                for claims in [0, 1, 64, 128, 129, 10_000] {
                    let n = drew(size, granted).ahead(claims);
                    assert!(
                        (0..=FENCE_BLOCK).contains(&n),
                        "{size} {granted} {claims}: {n}"
                    );
                }
            }
        }
    }
}
