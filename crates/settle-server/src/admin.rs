//! The operator endpoints of SPEC §12, behind the admin tokens
//! ([`crate::auth::AdminAuth`]): `GET /v1/admin/export` streams one
//! consistent snapshot of the whole store (every tenant) in the portable
//! format of `settle_portable`, chunk by chunk as the store hands it out.
//!
//! The body is never buffered whole: each chunk of entities is written
//! into a small buffer and sent. The trailer (counts, digest, the store's
//! fence counter at the end) is written only after the last chunk; if the
//! store fails midway the body is aborted (the connection closes without
//! the chunked terminator), so a client holds an incomplete file, never a
//! well-formed file missing records.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use settle_ledger::{Snapshot, Store, StoreError};
use settle_portable::Writer;
use tracing::{error, info, warn};

use crate::http::{AppState, Route, finish, store_error};
use crate::metrics as m;
use crate::openapi::V1Errors;
use crate::problem::Problem;

/// The media type of an export ([`settle_api::EXPORT_MEDIA_TYPE`]).
pub use settle_api::EXPORT_MEDIA_TYPE as EXPORT_CONTENT_TYPE;

/// Stream a consistent snapshot of the whole store (every tenant) in the
/// portable export format (SPEC §12; `docs/http-api.md`, "Admin access").
///
/// The body is chunked as the store produces it; its last line is the
/// trailer. A body that ends without its trailer is an aborted export
/// (the store failed midway): `settle_portable::verify` refuses it.
#[utoipa::path(
    get, path = "/v1/admin/export", tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "the portable export: a header line, every record, principal and warning task of every tenant in canonical order, a trailer line", body = String, content_type = "application/vnd.settle.export"),
        V1Errors,
    )
)]
pub async fn export(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    finish(Route::AdminExport, export_inner(&st, &headers).await)
}

async fn export_inner(st: &AppState, headers: &HeaderMap) -> Result<Response, Problem> {
    st.live().admin.check(headers)?;
    let snap = st.store.export().await.map_err(|e| refused(&e))?;
    let stream = ExportStream::start(st.store.clone(), snap)?;
    let mut resp = Response::new(Body::from_stream(futures::stream::unfold(
        stream,
        ExportStream::next,
    )));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(EXPORT_CONTENT_TYPE),
    );
    // Every tenant's records: no cache on the way may keep a copy.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// A store that cannot start an export: 503 `unavailable` (the closed list
/// of problem codes of SPEC §7 has no 501; every engine of the product
/// exports, only a library user's own `Store` may not), else the usual
/// storage failure (503 with a correlation id).
fn refused(e: &StoreError) -> Problem {
    metrics::counter!(m::EXPORTS, "outcome" => "refused").increment(1);
    match e {
        StoreError::Unsupported(what) => Problem::unavailable(format!(
            "this server's engine cannot export ({what} is not supported); stop it and \
             export its data offline, or run a server on an engine that exports"
        )),
        e => store_error("export", None, e),
    }
}

/// The writer's output, drained after each chunk.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    fn take(&self) -> Bytes {
        Bytes::from(std::mem::take(
            &mut *self.0.lock().expect("never held across a panic"),
        ))
    }
}

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("never held across a panic")
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One export in progress: the snapshot's entities in, the file's bytes out.
struct ExportStream {
    store: Arc<dyn Store>,
    snap: Snapshot,
    /// `None` once the trailer is written or the export failed.
    writer: Option<Writer<Buffer>>,
    out: Buffer,
    engine: &'static str,
    started: Instant,
}

type Chunk = Result<Bytes, std::io::Error>;

impl ExportStream {
    /// Writes the header (it goes out with the first chunk).
    fn start(store: Arc<dyn Store>, snap: Snapshot) -> Result<ExportStream, Problem> {
        let out = Buffer::default();
        let header = snap.header();
        let writer = Writer::new(out.clone(), header).map_err(|e| {
            let correlation_id = crate::problem::correlation_id();
            error!(%correlation_id, error = %e, "export: the header does not encode");
            let mut p = Problem::unavailable(format!(
                "internal error (the server log has it under correlation_id {correlation_id})"
            ));
            p.correlation_id = Some(correlation_id);
            p
        })?;
        info!(
            engine = snap.engine,
            fence_floor = snap.fence_floor,
            "export started"
        );
        Ok(ExportStream {
            store,
            engine: snap.engine,
            snap,
            writer: Some(writer),
            out,
            started: Instant::now(),
        })
    }

    /// The next piece of the body: the bytes of one or more chunks of
    /// entities, then the trailer; an error (which aborts the body) if the
    /// store fails; `None` after the trailer or the error.
    async fn next(mut self) -> Option<(Chunk, ExportStream)> {
        loop {
            let writer = self.writer.as_mut()?;
            match self.snap.next_chunk().await {
                Ok(Some(chunk)) => {
                    for e in &chunk {
                        if let Err(err) = writer.write(e) {
                            // Out of order or not encodable: an engine bug.
                            return Some(self.abort(&err.to_string()));
                        }
                    }
                    let bytes = self.out.take();
                    if !bytes.is_empty() {
                        return Some((Ok(bytes), self));
                    }
                }
                Err(e) => {
                    let p = store_error("export", None, &e);
                    let id = p.correlation_id.clone().unwrap_or_default();
                    return Some(self.abort(&format!("the store failed (correlation_id {id})")));
                }
                Ok(None) => return Some(self.finish().await),
            }
        }
    }

    /// The trailer, with the store's fence counter now.
    async fn finish(mut self) -> (Chunk, ExportStream) {
        let floor = match self.store.fence_floor().await {
            Ok(f) => f,
            Err(e) => {
                let p = store_error("export", None, &e);
                let id = p.correlation_id.clone().unwrap_or_default();
                return self.abort(&format!(
                    "the store's fence counter is unavailable (correlation_id {id})"
                ));
            }
        };
        let writer = self.writer.take().expect("finish runs once, with a writer");
        match writer.finish(floor) {
            Ok((_, s)) => {
                metrics::counter!(m::EXPORTS, "outcome" => "completed").increment(1);
                info!(
                    engine = self.engine,
                    records = s.records,
                    principals = s.principals,
                    warning_tasks = s.warning_tasks,
                    max_fence = s.max_fence,
                    fence_floor = s.fence_floor,
                    bytes = s.bytes,
                    seconds = self.started.elapsed().as_secs_f64(),
                    "export completed"
                );
                let bytes = self.out.take();
                (Ok(bytes), self)
            }
            Err(e) => self.abort(&e.to_string()),
        }
    }

    /// Ends the export without its trailer: the error makes hyper abort
    /// the body, so the client never sees a chunked terminator.
    fn abort(mut self, why: &str) -> (Chunk, ExportStream) {
        let written = self.writer.take().map_or(0, |w| w.bytes());
        metrics::counter!(m::EXPORTS, "outcome" => "failed").increment(1);
        error!(
            engine = self.engine,
            bytes = written,
            seconds = self.started.elapsed().as_secs_f64(),
            "export aborted without its trailer: {why}"
        );
        (
            Err(std::io::Error::other(format!("export aborted: {why}"))),
            self,
        )
    }
}

impl Drop for ExportStream {
    fn drop(&mut self) {
        if let Some(w) = &self.writer {
            // The client went away (or the server shut down) mid-export;
            // dropping the receiver stops the store's producer.
            metrics::counter!(m::EXPORTS, "outcome" => "abandoned").increment(1);
            warn!(
                engine = self.engine,
                bytes = w.bytes(),
                seconds = self.started.elapsed().as_secs_f64(),
                "export abandoned before its trailer (the client disconnected)"
            );
        }
    }
}
