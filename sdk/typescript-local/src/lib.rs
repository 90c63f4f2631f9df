//! `@settle/local`'s native part: the napi-rs face of
//! [`settle_local::LocalLedger`].
//!
//! One class, `NativeLedger`. `exchange(method, target, headers, body)`
//! answers what `@settle/client`'s `Client` reads of an answer
//! (`{ status, body, retryAfter }`, the body as text): `LocalLedger`
//! calls it directly, no `fetch` objects. On a directory it runs on
//! libuv's thread pool (an `AsyncTask`), never on the event loop, so an
//! fsync never blocks JavaScript; `exchangeSync` answers in place, for the
//! in-memory store, whose calls never wait. `request(...)` resolves to
//! `{ status, headers, body }` for the `fetch` that serves any route.
#![allow(missing_docs)] // the generated bindings; documented in index.d.ts

use std::sync::Arc;

use napi::bindgen_prelude::{AsyncTask, Buffer};
use napi::{Env, Error, Result, Status, Task};
use napi_derive::napi;
use settle_local::{Answer, LocalError, LocalLedger, LocalOptions, Reply};

/// The JavaScript error's `code`: `Closing` for a closed ledger (the
/// package throws `LedgerClosed` for it).
fn to_js(e: LocalError) -> Error {
    let status = match e {
        LocalError::Invalid(_) => Status::InvalidArg,
        LocalError::Closed => Status::Closing,
        _ => Status::GenericFailure,
    };
    Error::new(status, e.to_string())
}

/// `[name, value, name, value, ...]` as pairs.
fn pairs(flat: Vec<String>) -> Result<Vec<(String, String)>> {
    if !flat.len().is_multiple_of(2) {
        return Err(Error::new(
            Status::InvalidArg,
            "headers are [name, value, ...] (an even length)",
        ));
    }
    let mut it = flat.into_iter();
    let mut out = Vec::with_capacity(it.len() / 2);
    while let (Some(n), Some(v)) = (it.next(), it.next()) {
        out.push((n, v));
    }
    Ok(out)
}

/// What a client reads of one answer.
#[napi(object)]
pub struct NativeAnswer {
    pub status: u32,
    /// The body as text (JSON for every API route).
    pub body: String,
    pub retry_after: Option<String>,
}

impl From<Answer> for NativeAnswer {
    fn from(a: Answer) -> NativeAnswer {
        NativeAnswer {
            status: u32::from(a.status),
            body: String::from_utf8(a.body)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            retry_after: a.retry_after,
        }
    }
}

/// A settle server in this process.
#[napi]
pub struct NativeLedger {
    inner: Arc<LocalLedger>,
}

/// One answer.
#[napi(object)]
pub struct NativeReply {
    pub status: u32,
    /// `[name, value]` pairs.
    pub headers: Vec<Vec<String>>,
    pub body: Buffer,
}

#[napi]
impl NativeLedger {
    /// The in-memory store when `data` is null, else the embedded engine in
    /// `data` with `segmentBytes` log segments (default 4 MiB).
    #[napi(constructor)]
    pub fn new(data: Option<String>, segment_bytes: Option<f64>) -> Result<NativeLedger> {
        let mut options = LocalOptions::default();
        if let Some(n) = segment_bytes {
            if !(n.is_finite() && n >= 0.0 && n.fract() == 0.0 && n <= 9_007_199_254_740_991.0) {
                return Err(Error::new(
                    Status::InvalidArg,
                    format!("segmentBytes must be a whole number of bytes, not {n}"),
                ));
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked above
            {
                options.segment_bytes = n as u64;
            }
        }
        let inner = LocalLedger::open_with(data.as_deref().map(std::path::Path::new), &options)
            .map_err(to_js)?;
        Ok(NativeLedger {
            inner: Arc::new(inner),
        })
    }

    /// Whether receipts survive the process.
    #[napi(getter)]
    pub fn durable(&self) -> bool {
        self.inner.durable()
    }

    /// One call of a client, answered in place (the in-memory store).
    #[napi]
    pub fn exchange_sync(
        &self,
        method: String,
        target: String,
        headers: Vec<String>,
        body: Option<String>,
    ) -> Result<NativeAnswer> {
        let headers = pairs(headers)?;
        let body = body.map(String::into_bytes).unwrap_or_default();
        self.inner
            .exchange(&method, &target, &headers, body)
            .map(NativeAnswer::from)
            .map_err(to_js)
    }

    /// One call of a client, on the thread pool (a store that waits on the disk).
    #[napi(ts_return_type = "Promise<NativeAnswer>")]
    pub fn exchange(
        &self,
        method: String,
        target: String,
        headers: Vec<String>,
        body: Option<String>,
    ) -> Result<AsyncTask<Exchange>> {
        Ok(AsyncTask::new(Exchange {
            ledger: self.inner.clone(),
            method,
            target,
            headers: pairs(headers)?,
            body: body.map(String::into_bytes).unwrap_or_default(),
        }))
    }

    /// One HTTP exchange, on the thread pool.
    #[napi(ts_return_type = "Promise<NativeReply>")]
    pub fn request(
        &self,
        method: String,
        target: String,
        headers: Vec<Vec<String>>,
        body: Buffer,
    ) -> Result<AsyncTask<Call>> {
        let headers = headers
            .into_iter()
            .map(|pair| match <[String; 2]>::try_from(pair) {
                Ok([n, v]) => Ok((n, v)),
                Err(_) => Err(Error::new(
                    Status::InvalidArg,
                    "headers are [name, value] pairs",
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AsyncTask::new(Call {
            ledger: self.inner.clone(),
            method,
            target,
            headers,
            body: body.to_vec(),
        }))
    }

    /// Closes the store; later requests reject.
    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}

pub struct Call {
    ledger: Arc<LocalLedger>,
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Task for Call {
    type Output = Reply;
    type JsValue = NativeReply;

    fn compute(&mut self) -> Result<Reply> {
        let body = std::mem::take(&mut self.body);
        self.ledger
            .call(&self.method, &self.target, &self.headers, body)
            .map_err(to_js)
    }

    fn resolve(&mut self, _env: Env, out: Reply) -> Result<NativeReply> {
        Ok(NativeReply {
            status: u32::from(out.status),
            headers: out.headers.into_iter().map(|(n, v)| vec![n, v]).collect(),
            body: out.body.into(),
        })
    }
}

pub struct Exchange {
    ledger: Arc<LocalLedger>,
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Task for Exchange {
    type Output = Answer;
    type JsValue = NativeAnswer;

    fn compute(&mut self) -> Result<Answer> {
        let body = std::mem::take(&mut self.body);
        self.ledger
            .exchange(&self.method, &self.target, &self.headers, body)
            .map_err(to_js)
    }

    fn resolve(&mut self, _env: Env, out: Answer) -> Result<NativeAnswer> {
        Ok(out.into())
    }
}
