//! The remote system the workers' effects write to. It honours the
//! operation key and the fence (SPEC §1): per key it remembers the highest
//! fence it has seen, in writes and in reconcile queries alike, and
//! rejects a lower one. It deduplicates only a redelivery of the same
//! write (same key and fence: the network duplicated it), not a new
//! write under a newer fence: keeping a second attempt from being sent is
//! the ledger's job, and the checkers count every write the remote applied.

use std::collections::BTreeMap;

use settle_core::{Digest, Fence};

/// What the upstream answered for an effect (deterministic per key:
/// SPEC §5 assumes matching attempts produce the same response).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    /// `completed` (true) or `failed` (false).
    pub completed: bool,
    /// SHA-256 of the raw response.
    pub digest: Digest,
}

/// One write the remote applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The fence it was sent under.
    pub fence: Fence,
    /// Simulated time (ms) it landed.
    pub at: u64,
}

/// What a write got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// Applied: the upstream's response.
    Applied(Response),
    /// Refused without applying: the fence is below one already seen.
    StaleFence,
    /// Refused without applying (a 429-like definitive refusal).
    Refused,
}

/// What a reconcile query found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryResult {
    /// A write was applied; its response.
    Committed(Response),
    /// Nothing was applied (as of this query, which also fences out lower fences).
    NotCommitted,
    /// The query was refused: its fence is below one already seen.
    StaleFence,
    /// The remote's status API cannot tell for this key (a hook that
    /// cannot tell: the record must stay `unknown`, never be guessed).
    CannotTell,
}

#[derive(Clone, Debug, Default)]
struct KeyState {
    max_seen: Option<Fence>,
    applied: Vec<Applied>,
    /// Fences whose write was refused definitively: a redelivered copy
    /// gets the same refusal (SPEC §4 release(not_committed) relies on a
    /// refusal that guarantees the write never happens).
    refused: Vec<Fence>,
    /// Every fence seen, in order (writes and queries).
    seen: Vec<Fence>,
}

/// The simulated remote.
#[derive(Clone, Debug, Default)]
pub struct Remote {
    keys: BTreeMap<String, KeyState>,
}

/// The response of key `key` (deterministic).
pub fn response_for(key: &str, key_index: usize) -> Response {
    let mut d = [0u8; 32];
    for (i, b) in key.bytes().enumerate() {
        d[i % 32] ^= b;
    }
    d[31] = d[31].wrapping_add(0x5a);
    Response {
        // Most effects complete; some fail definitively upstream.
        completed: key_index % 5 != 4,
        digest: Digest(d),
    }
}

impl Remote {
    fn see(&mut self, key: &str, fence: Fence) -> Option<&mut KeyState> {
        let st = self.keys.entry(key.to_string()).or_default();
        if st.max_seen.is_some_and(|m| fence < m) {
            return None;
        }
        st.max_seen = Some(fence);
        st.seen.push(fence);
        Some(st)
    }

    /// A write for `key` under `fence` lands at `at`.
    pub fn write(
        &mut self,
        key: &str,
        key_index: usize,
        fence: Fence,
        at: u64,
        refuse: bool,
    ) -> WriteResult {
        let Some(st) = self.see(key, fence) else {
            return WriteResult::StaleFence;
        };
        if st.applied.iter().any(|a| a.fence == fence) {
            // A redelivery of a write already applied: the same answer.
            return WriteResult::Applied(response_for(key, key_index));
        }
        if refuse || st.refused.contains(&fence) {
            st.refused.push(fence);
            return WriteResult::Refused;
        }
        st.applied.push(Applied { fence, at });
        WriteResult::Applied(response_for(key, key_index))
    }

    /// A reconcile query for `key` under `fence`.
    pub fn query(&mut self, key: &str, key_index: usize, fence: Fence) -> QueryResult {
        let Some(st) = self.see(key, fence) else {
            return QueryResult::StaleFence;
        };
        if st.applied.is_empty() {
            QueryResult::NotCommitted
        } else {
            QueryResult::Committed(response_for(key, key_index))
        }
    }

    /// Every write applied for `key`.
    pub fn applied(&self, key: &str) -> &[Applied] {
        self.keys.get(key).map_or(&[], |s| &s.applied)
    }

    /// Every fence the remote saw for `key`, in order.
    pub fn seen(&self, key: &str) -> &[Fence] {
        self.keys.get(key).map_or(&[], |s| &s.seen)
    }
}
