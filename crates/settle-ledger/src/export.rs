//! A store's snapshot ([`Store::export`]) written in the portable format
//! (SPEC §12, `settle_portable`), and what engines share to produce one.

use std::io::Write;

use settle_portable::{Entity, Header, Summary, Writer};

use crate::store::{Part, Snapshot, Store, StoreError};

/// Entities per chunk of a snapshot's stream.
pub const CHUNK: usize = 1024;

/// Why an export did not complete (the file then has no trailer: it is
/// never read back as a whole export).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The output failed, or an entity came out of order (an engine bug).
    #[error(transparent)]
    Format(#[from] settle_portable::Error),
}

/// Why an import wrote nothing (or, killed midway, nothing usable: each
/// engine's import makes the target whole in one final step).
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file is damaged, truncated, of a newer version, or not an export.
    #[error(transparent)]
    Format(#[from] settle_portable::Error),
    /// The target already holds data.
    #[error("the target is not empty ({0}); import only into an empty store")]
    NotEmpty(String),
    /// The target store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading the file or writing the target failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What an import wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    /// The file's summary (counts, digests).
    pub summary: Summary,
    /// The fence counter the target starts at.
    pub fence_floor: u64,
}

impl Snapshot {
    /// A snapshot whose entities come through the returned sender, [`CHUNK`]
    /// at a time (the producer stops when the receiver is dropped).
    pub fn channel(
        engine: &'static str,
        fence_floor: u64,
        fences_per_claim_max: u64,
    ) -> (
        Snapshot,
        tokio::sync::mpsc::Sender<Result<Part, StoreError>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        (
            Snapshot {
                engine,
                fence_floor,
                fences_per_claim_max,
                entities: rx,
            },
            tx,
        )
    }

    /// A snapshot of entities already in memory (sorted here).
    pub fn of(engine: &'static str, fence_floor: u64, mut entities: Vec<Entity>) -> Snapshot {
        entities.sort_by(|a, b| a.order().cmp(&b.order()));
        // One fence per claim: the rules draw a fence for each new lease.
        let (snap, tx) = Snapshot::channel(engine, fence_floor, 1);
        tokio::spawn(async move {
            let mut rest = entities.into_iter().peekable();
            while rest.peek().is_some() {
                let chunk: Vec<Entity> = rest.by_ref().take(CHUNK).collect();
                if tx.send(Ok(Part::Entities(chunk))).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(Ok(Part::End)).await;
        });
        snap
    }

    /// The export header for this snapshot.
    pub fn header(&self) -> Header {
        Header::new(self.engine, self.fence_floor, self.fences_per_claim_max)
    }
}

/// Writes `store`'s snapshot to `out` in the portable format, calling
/// `progress(entities, bytes)` after each chunk; the trailer states the
/// store's fence counter once the last entity is written.
pub async fn export_to<S, W>(
    store: &S,
    out: W,
    mut progress: impl FnMut(u64, u64),
) -> Result<(W, Summary), ExportError>
where
    S: Store + ?Sized,
    W: Write,
{
    let mut snap = store.export().await?;
    let mut w = Writer::new(out, snap.header())?;
    while let Some(chunk) = snap.next_chunk().await? {
        for e in &chunk {
            w.write(e)?;
        }
        progress(w.entities(), w.bytes());
    }
    let end = store.fence_floor().await?;
    Ok(w.finish(end)?)
}

#[cfg(test)]
mod tests {
    use settle_core::testkit::{binding, claim, completed, revoke, settle};
    use settle_core::{Limits, Reply, TenantId};

    use super::*;
    use crate::{Clock, MemStore};

    #[tokio::test]
    async fn a_memory_store_exports_every_entity_in_order() {
        let store = MemStore::new(Limits::default(), Clock::system());
        let acme = TenantId::new("acme").unwrap();
        let mut fences = Vec::new();
        for k in ["b", "a", "c"] {
            let Reply::Claim(c) = store
                .execute(&acme, claim(k, 1, binding("alice", 0)))
                .await
                .unwrap()
            else {
                panic!("a claim")
            };
            fences.push(c);
        }
        let f = match &fences[0] {
            settle_core::ClaimDecision::Execute(g) => g.fence,
            other => panic!("{other:?}"),
        };
        store
            .execute(&acme, settle("b", f, 1, binding("alice", 0), completed(3)))
            .await
            .unwrap();
        store.execute(&acme, revoke("alice")).await.unwrap();
        let mut calls = 0;
        let (bytes, summary) = export_to(&store, Vec::new(), |_, _| calls += 1)
            .await
            .unwrap();
        assert_eq!(calls, 1);
        assert_eq!(summary.records, 3);
        assert_eq!(summary.principals, 1);
        assert_eq!(summary.max_fence, 3);
        assert_eq!(summary.fence_floor, 4);
        let read = settle_portable::verify(&bytes[..]).unwrap();
        assert_eq!(read, summary);
        let keys: Vec<String> = settle_portable::Reader::new(&bytes[..])
            .unwrap()
            .map(|e| e.unwrap().order().2.to_string())
            .collect();
        assert_eq!(keys, ["a", "b", "c", "alice"]);
    }
}
