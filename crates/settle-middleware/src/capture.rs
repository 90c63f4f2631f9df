//! Capturing the handler's response and recording the run's outcome: a
//! response up to the stored limit is settled whole before it is sent; a
//! larger one is streamed to the client and settled, as not stored, once
//! its body ends; a handler that failed, or a request cancelled while it
//! ran, is settled `unknown` ([`Unsettled`] records it even when dropped).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::Response;
use http_body_util::BodyExt as _;
use settle_core::{
    Binding, Command, Digest, ErrorText, Fence, Key, Outcome, RefusalCode, Release, ReleaseReason,
    ResultJson, Settle,
};
use sha2::{Digest as _, Sha256};

use crate::answer::{note, refuse};
use crate::backend::{BoxFuture, CallError, heartbeat, retry};
use crate::layer::{BoxError, Retryable, Settings};
use crate::layout;
use crate::table::{self, Disposition, ReleaseOn};

/// A lease whose outcome is not recorded yet. Dropped while armed (the
/// framework cancelled the request: the client disconnected), it records
/// what it has in a task of its own: `unknown` while the handler ran, the
/// response once it was captured.
pub(crate) struct Unsettled {
    settings: Arc<Settings>,
    key: String,
    lkey: Key,
    fence: Fence,
    fingerprint: Digest,
    binding: Binding,
    /// The call that records the outcome known so far (`None`: recorded).
    state: Option<Command>,
    /// A streamed response ended: dropping records its outcome, nothing
    /// was cancelled.
    ended: bool,
    /// The route's statuses that say nothing happened.
    release_on: ReleaseOn,
}

impl Unsettled {
    /// The lease of a handler about to run: until its outcome is recorded,
    /// dropping it records `unknown` ("handler cancelled").
    pub(crate) fn armed(
        settings: Arc<Settings>,
        key: String,
        lkey: Key,
        fence: Fence,
        fingerprint: Digest,
        binding: Binding,
        release_on: ReleaseOn,
    ) -> Unsettled {
        let mut u = Unsettled {
            settings,
            key,
            lkey,
            fence,
            fingerprint,
            binding,
            state: None,
            ended: false,
            release_on,
        };
        u.state = Some(u.settle_cmd(Outcome::unknown(
            ErrorText::new("error", "handler cancelled").ok(),
        )));
        u
    }

    fn settle_cmd(&self, outcome: Outcome) -> Command {
        Command::Settle(Settle {
            key: self.lkey.clone(),
            fence: self.fence,
            fingerprint: self.fingerprint,
            binding: self.binding.clone(),
            outcome,
        })
    }

    pub(crate) async fn unknown(&mut self, why: &'static str) {
        note("outcome_unknown");
        tracing::warn!(
            key = self.key,
            why,
            "idempotency: the handler failed; outcome unknown"
        );
        let cmd = self.settle_cmd(Outcome::unknown(
            ErrorText::new("error", format!("handler failed: {why}")).ok(),
        ));
        self.state = Some(cmd.clone());
        self.record(cmd).await;
    }

    /// The release of a response that says nothing happened: `not_committed`,
    /// with `forget` for a status the application added to `release_on`.
    fn release_cmd(&self, forget: bool) -> Command {
        Command::Release(Release {
            key: self.lkey.clone(),
            fence: self.fence,
            reason: ReleaseReason::NotCommitted,
            forget,
        })
    }

    /// What a response with this status (and this marking) records:
    /// `None` for one that is stored.
    fn release_for(&self, status: u16, retryable: bool) -> Option<Command> {
        match table::disposition(status, retryable, &self.release_on) {
            Disposition::NotCommitted => Some(self.release_cmd(false)),
            Disposition::Forget => Some(self.release_cmd(true)),
            Disposition::Completed | Disposition::Failed => None,
        }
    }

    /// The handler said nothing was done ([`HandlerError::NotSent`](crate::HandlerError)):
    /// released `not_committed` (its word), and 503
    /// `idempotency_unavailable` with `Retry-After: 1` in place of its
    /// response; the retry runs the handler.
    pub(crate) async fn not_sent(&mut self) -> Response<Body> {
        note("not_sent");
        let cmd = self.release_cmd(false);
        self.state = Some(cmd.clone());
        self.record(cmd).await;
        refuse(&table::not_sent(), Some(&self.key))
    }

    async fn record(&mut self, cmd: Command) {
        let deadline = Duration::from_millis(self.settings.lease_ms.get() + 1000);
        let unknown_already =
            matches!(&cmd, Command::Settle(st) if !st.outcome.status().is_terminal());
        let forget = matches!(&cmd, Command::Release(r) if r.forget);
        match retry(&self.settings.backend, cmd, deadline).await {
            Ok(_) => {}
            // A repeated forget whose first answer was lost: the record is
            // already gone.
            Err(CallError::Refused(RefusalCode::NotFound)) if forget => {}
            Err(CallError::Refused(RefusalCode::ReceiptRequired)) if forget => {
                // The record keeps evidence of an earlier attempt (SPEC §4
                // release(forget)): released without forgetting it.
                if let Err(e) =
                    retry(&self.settings.backend, self.release_cmd(false), deadline).await
                {
                    tracing::error!(key = self.key, error = %e, "idempotency: the lease could not be released");
                }
            }
            Err(CallError::Invalid(e)) if !unknown_already => {
                // The ledger will not take this record (a stored response over
                // its max_result_bytes, a server without release(not_committed)):
                // the safe record is unknown, at once rather than at lease expiry.
                tracing::error!(key = self.key, error = %e, "idempotency: the ledger refused the outcome; recording unknown");
                let unknown = self.settle_cmd(Outcome::unknown(
                    ErrorText::new("error", "outcome refused by the ledger").ok(),
                ));
                if let Err(e) = retry(&self.settings.backend, unknown, deadline).await {
                    tracing::error!(key = self.key, error = %e, "idempotency: the outcome could not be recorded");
                }
            }
            Err(e) => {
                // The lease lapses after dispatch: the ledger marks it unknown.
                tracing::error!(key = self.key, error = %e, "idempotency: the outcome could not be recorded");
            }
        }
        self.state = None;
    }

    /// Records the handler's response and answers it.
    pub(crate) async fn finish(
        &mut self,
        parts: axum::http::response::Parts,
        body: Bytes,
    ) -> Response<Body> {
        let s = self.settings.clone();
        let status = parts.status.as_u16();
        let retryable = parts.extensions.get::<Retryable>().is_some();
        let d = table::disposition(status, retryable, &self.release_on);
        let cmd = match self.release_for(status, retryable) {
            Some(release) => {
                note("not_committed");
                release
            }
            None => {
                let headers: Vec<(String, Vec<u8>)> = parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                    .collect();
                let (result, digest) = layout::encode_response(
                    status,
                    &headers,
                    &body,
                    &s.stored_headers,
                    s.max_stored_body,
                );
                match stored_outcome(d, &result, &digest) {
                    Ok(o) => self.settle_cmd(o),
                    Err(e) => {
                        tracing::error!(key = self.key, error = %e, "idempotency: the response cannot be stored");
                        self.settle_cmd(Outcome::unknown(
                            ErrorText::new("error", "response not storable").ok(),
                        ))
                    }
                }
            }
        };
        self.state = Some(cmd.clone());
        self.record(cmd).await;
        let mut resp = Response::from_parts(parts, Body::from(body));
        // The body goes out whole: a framing header of a stream is wrong now.
        resp.headers_mut()
            .remove(axum::http::header::TRANSFER_ENCODING);
        resp
    }
}

impl Unsettled {
    /// A response past the stored limit: nothing to replay is stored, so
    /// the body goes to the client as the handler produces it; the outcome
    /// (its status, and the body's length and digest once the stream
    /// ends) is recorded when the body ends or is dropped, the lease
    /// heartbeated until then.
    pub(crate) async fn stream(
        mut self,
        parts: axum::http::response::Parts,
        prefix: Bytes,
        rest: Body,
    ) -> Response<Body> {
        let s = self.settings.clone();
        let status = parts.status.as_u16();
        let retryable = parts.extensions.get::<Retryable>().is_some();
        let disposition = table::disposition(status, retryable, &self.release_on);
        if let Some(cmd) = self.release_for(status, retryable) {
            note("not_committed");
            self.state = Some(cmd.clone());
            self.record(cmd).await;
            let body = Streamed::plain(prefix, rest);
            return Response::from_parts(parts, Body::new(body));
        }
        let headers: Vec<(String, Vec<u8>)> = parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
            .collect();
        // Until the stream ends, what is known: the status, not the body.
        let (result, digest) =
            layout::encode_streamed_response(status, &headers, &s.stored_headers, None);
        self.state = Some(self.streamed_cmd(disposition, &result, &digest));
        let beat = tokio::spawn(heartbeat(
            s.backend.clone(),
            self.lkey.clone(),
            self.fence,
            s.lease_ms,
        ));
        let body = Streamed {
            settle: Some(StreamSettle {
                pending: self,
                disposition,
                status,
                headers,
                heartbeat: beat,
            }),
            digest: Some(Sha256::new()),
            ..Streamed::plain(prefix, rest)
        };
        Response::from_parts(parts, Body::new(body))
    }

    fn streamed_cmd(&self, d: Disposition, result: &serde_json::Value, digest: &str) -> Command {
        match stored_outcome(d, result, digest) {
            Ok(o) => self.settle_cmd(o),
            Err(e) => {
                tracing::error!(key = self.key, error = %e, "idempotency: the response cannot be stored");
                self.settle_cmd(Outcome::unknown(
                    ErrorText::new("error", "response not storable").ok(),
                ))
            }
        }
    }
}

/// What a streamed response records when its body ends or is dropped.
struct StreamSettle {
    pending: Unsettled,
    disposition: Disposition,
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    heartbeat: tokio::task::JoinHandle<Infallible>,
}

impl Drop for StreamSettle {
    fn drop(&mut self) {
        // The lease needs no more beats; `pending` records the outcome.
        self.heartbeat.abort();
    }
}

/// A response body past the stored limit: the part read first, then the
/// rest as the handler produces it, digested on the way. One frame is
/// always held back, so the client has the whole body only once its
/// outcome is recorded (a retry right after it gets `response_not_stored`,
/// not `request_in_progress`).
struct Streamed {
    prefix: Option<Bytes>,
    rest: Body,
    digest: Option<Sha256>,
    len: u64,
    held: Option<http_body::Frame<Bytes>>,
    /// `None` for a body nothing is recorded for (released `not_committed`).
    settle: Option<StreamSettle>,
    /// Recording the outcome, before the held frame and the end go out.
    recording: Option<BoxFuture<'static, ()>>,
    /// The handler's body broke: its error, sent once `unknown` is recorded.
    failed: Option<BoxError>,
    done: bool,
}

impl Streamed {
    fn plain(prefix: Bytes, rest: Body) -> Streamed {
        Streamed {
            prefix: Some(prefix),
            rest,
            digest: None,
            len: 0,
            held: None,
            settle: None,
            recording: None,
            failed: None,
            done: false,
        }
    }

    /// The handler's body broke mid-stream: what went out stays out, and
    /// the outcome is `unknown` (SPEC §8: a failure after the handler
    /// started), as for a body under the stored limit that breaks.
    fn record_failure(&mut self) -> Option<BoxFuture<'static, ()>> {
        let mut st = self.settle.take()?;
        note("outcome_unknown");
        tracing::warn!(
            key = st.pending.key,
            "idempotency: the response body failed mid-stream; outcome unknown"
        );
        let cmd = st.pending.settle_cmd(Outcome::unknown(
            ErrorText::new("error", "handler failed: response body failed").ok(),
        ));
        st.pending.state = Some(cmd.clone());
        st.pending.ended = true;
        Some(Box::pin(async move {
            st.pending.record(cmd).await;
        }))
    }

    /// The body ended: what records it, with its length and digest.
    fn record_end(&mut self) -> Option<BoxFuture<'static, ()>> {
        let mut st = self.settle.take()?;
        let digest = self.digest.take().expect("digested while it is recorded");
        let body = (self.len, hex::encode(digest.finalize()));
        let stored = st.pending.settings.stored_headers.clone();
        let (result, response) =
            layout::encode_streamed_response(st.status, &st.headers, &stored, Some(body));
        let cmd = st.pending.streamed_cmd(st.disposition, &result, &response);
        st.pending.state = Some(cmd.clone());
        st.pending.ended = true;
        Some(Box::pin(async move {
            st.pending.record(cmd).await;
        }))
    }
}

impl HttpBody for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(rec) = &mut this.recording {
                ready!(rec.as_mut().poll(cx));
                this.recording = None;
            }
            if let Some(e) = this.failed.take() {
                this.done = true;
                this.held = None;
                return Poll::Ready(Some(Err(e)));
            }
            if this.done {
                return Poll::Ready(this.held.take().map(Ok));
            }
            let next = match this.prefix.take() {
                Some(p) => Some(Ok(http_body::Frame::data(p))),
                None => ready!(std::pin::Pin::new(&mut this.rest).poll_frame(cx)),
            };
            match next {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        if let Some(d) = &mut this.digest {
                            d.update(data);
                        }
                        this.len += data.len() as u64;
                    }
                    if let Some(out) = this.held.replace(frame) {
                        return Poll::Ready(Some(Ok(out)));
                    }
                }
                // The handler's body broke: `unknown` is recorded before
                // the error goes on (a body nothing is recorded for, one
                // released `not_committed`, passes it on at once).
                Some(Err(e)) => {
                    this.failed = Some(e.into());
                    this.recording = this.record_failure();
                }
                None => {
                    this.done = true;
                    this.recording = this.record_end();
                }
            }
        }
    }
}

/// A response body read up to the stored limit.
pub(crate) enum Read {
    /// All of it (within the limit).
    Whole(Bytes),
    /// Past the limit: what was read, and the rest, unread.
    Over(Bytes, Body),
}

/// Reads `body` until it ends or passes `max` bytes (trailers are not kept,
/// as before).
pub(crate) async fn read_up_to<B>(body: B, max: usize) -> Result<Read, BoxError>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut buf = axum::body::Bytes::new();
    let mut parts: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            parts.push(data);
            if len > max {
                let prefix = join(parts);
                return Ok(Read::Over(prefix, Body::new(body)));
            }
        }
    }
    if !parts.is_empty() {
        buf = join(parts);
    }
    Ok(Read::Whole(buf))
}

/// The chunks as one buffer (no copy for one chunk).
fn join(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let mut out = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in &parts {
        out.extend_from_slice(p);
    }
    Bytes::from(out)
}

pub(crate) fn stored_outcome(
    d: Disposition,
    result: &serde_json::Value,
    digest: &str,
) -> Result<Outcome, settle_core::InvalidInput> {
    let result = ResultJson::from_value(result, usize::MAX)?;
    let digest = Digest::parse("response_sha256", digest)?;
    Ok(match d {
        Disposition::Failed => Outcome::failed(result, digest, None),
        _ => Outcome::completed(result, digest),
    })
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        let Some(cmd) = self.state.take() else {
            return;
        };
        if self.ended {
            tracing::debug!(
                key = self.key,
                "idempotency: streamed response sent; recording it"
            );
        } else {
            note("cancelled");
            tracing::warn!(
                key = self.key,
                "idempotency: the request was cancelled (client gone); recording its outcome"
            );
        }
        let backend = self.settings.backend.clone();
        let deadline = Duration::from_millis(self.settings.lease_ms.get() + 1000);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = retry(&backend, cmd, deadline).await {
                    tracing::error!(error = %e, "idempotency: the outcome of a cancelled request could not be recorded");
                }
            });
        }
    }
}
