//! The durable index (fjall): the state as of the last checkpoint.
//!
//! Keyspaces: `data` (every entity, versioned values), `open` (ids of
//! records that are not terminal, reloaded into memory at start), `expiry`
//! (`[expires_at BE][id]` of terminal records, for collection) and `meta`.

use std::path::Path;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use settle_ledger::StoreError;

use crate::codec::{Value, decode_value};

pub struct Index {
    db: Database,
    data: Keyspace,
    open: Keyspace,
    expiry: Keyspace,
    meta: Keyspace,
}

fn err(e: fjall::Error) -> StoreError {
    StoreError::Io(format!("index: {e}"))
}

/// Meta values persisted with each checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Log segments up to and including this one are in the index.
    pub checkpoint_seq: u64,
    /// Batches up to and including this LSN are in the index.
    pub checkpoint_lsn: u64,
    /// The fence counter at the checkpoint.
    pub next_fence: u64,
}

/// One entity written by a checkpoint (its newest state in the covered log).
pub struct CheckpointItem<'a> {
    pub key: &'a [u8],
    /// A record that is not terminal.
    pub open: bool,
    /// A terminal record's collection time.
    pub expires_at: Option<u64>,
    /// The encoded value; empty for a deleted entity.
    pub value: &'a [u8],
}

pub fn expiry_key(expires_at_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&expires_at_ms.to_be_bytes());
    k.extend_from_slice(key);
    k
}

impl Index {
    pub fn open(path: &Path) -> Result<Index, StoreError> {
        let db = Database::builder(path)
            // We persist explicitly at each checkpoint; the log covers the rest.
            .manual_journal_persist(true)
            .cache_size(32 * 1024 * 1024)
            .open()
            .map_err(err)?;
        let ks = |name: &str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(err)
        };
        Ok(Index {
            data: ks("data")?,
            open: ks("open")?,
            expiry: ks("expiry")?,
            meta: ks("meta")?,
            db,
        })
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Value>, StoreError> {
        match self.data.get(key).map_err(err)? {
            Some(v) => Ok(Some(decode_value(&v)?)),
            None => Ok(None),
        }
    }

    pub fn meta(&self) -> Result<Meta, StoreError> {
        let get = |k: &str| -> Result<u64, StoreError> {
            Ok(match self.meta.get(k).map_err(err)? {
                Some(v) => u64::from_le_bytes(
                    v.as_ref()
                        .try_into()
                        .map_err(|_| StoreError::Corrupt(format!("meta {k}")))?,
                ),
                None => 0,
            })
        };
        Ok(Meta {
            checkpoint_seq: get("checkpoint_seq")?,
            checkpoint_lsn: get("checkpoint_lsn")?,
            next_fence: get("next_fence")?.max(1),
        })
    }

    /// The ids and values of all open records (to reload at start).
    pub fn open_records(&self) -> Result<Vec<(Vec<u8>, Value)>, StoreError> {
        let mut out = Vec::new();
        for g in self.open.iter() {
            let k = g.key().map_err(err)?;
            // A crash between ingesting `data` and `open` can leave an id
            // whose record settled or went; the log replay covers it.
            if let Some(v @ Value::Record(_)) = self.get(&k)?
                && matches!(&v, Value::Record(r) if !r.status.is_terminal())
            {
                out.push((k.to_vec(), v));
            }
        }
        Ok(out)
    }

    /// Writes a checkpoint durably before returning. `items` must be sorted
    /// by key. Bulk ingestion writes sorted tables straight to disk (fsynced)
    /// instead of going through memtables and the journal: a checkpoint
    /// costs a sort and a sequential write, which keeps it cheap enough to
    /// run beside the writer. The keyspaces are ingested one after another;
    /// a crash in between is harmless because the covered log segments are
    /// deleted only after `meta` says the checkpoint is complete, and replay
    /// is idempotent (see docs/design.md).
    pub fn checkpoint(&self, items: &[CheckpointItem<'_>], meta: Meta) -> Result<(), StoreError> {
        debug_assert!(items.windows(2).all(|w| w[0].key < w[1].key));
        let mut data = self.data.start_ingestion().map_err(err)?;
        for it in items {
            if it.value.is_empty() {
                data.write_tombstone(it.key).map_err(err)?;
            } else {
                data.write(it.key, it.value).map_err(err)?;
            }
        }
        data.finish().map_err(err)?;

        // Open records are listed; every other record id gets a tombstone
        // (cheap in a sorted ingestion, and it needs no knowledge of the past).
        let mut open = self.open.start_ingestion().map_err(err)?;
        let mut expiring = Vec::new();
        for it in items.iter().filter(|it| it.key.first() == Some(&b'r')) {
            if it.open {
                open.write(it.key, []).map_err(err)?;
            } else {
                open.write_tombstone(it.key).map_err(err)?;
            }
            if let Some(e) = it.expires_at {
                expiring.push(expiry_key(e, it.key));
            }
        }
        open.finish().map_err(err)?;

        expiring.sort_unstable();
        let mut expiry = self.expiry.start_ingestion().map_err(err)?;
        for k in expiring {
            expiry.write(k, []).map_err(err)?;
        }
        expiry.finish().map_err(err)?;

        let mut b = self.db.batch();
        b.insert(
            &self.meta,
            "checkpoint_seq",
            meta.checkpoint_seq.to_le_bytes(),
        );
        b.insert(
            &self.meta,
            "checkpoint_lsn",
            meta.checkpoint_lsn.to_le_bytes(),
        );
        b.insert(&self.meta, "next_fence", meta.next_fence.to_le_bytes());
        b.commit().map_err(err)?;
        self.db.persist(PersistMode::SyncAll).map_err(err)
    }

    /// Expiry entries due at `now_ms`, oldest first, at most `limit`.
    pub fn due(&self, now_ms: u64, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for g in self
            .expiry
            .range(..expiry_key(now_ms.saturating_add(1), &[]))
        {
            let k = g.key().map_err(err)?;
            let t = u64::from_be_bytes(
                k[..8]
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("expiry key".into()))?,
            );
            out.push((t, k[8..].to_vec()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Drops an expiry entry that no longer matches its record.
    pub fn forget_expiry(&self, t: u64, key: &[u8]) -> Result<(), StoreError> {
        self.expiry.remove(expiry_key(t, key)).map_err(err)
    }

    /// Every stored entity (for offline inspection).
    pub fn for_each(&self, mut f: impl FnMut(&[u8], Value)) -> Result<(), StoreError> {
        for g in self.data.iter() {
            let (k, v) = g.into_inner().map_err(err)?;
            f(&k, decode_value(&v)?);
        }
        Ok(())
    }
}
