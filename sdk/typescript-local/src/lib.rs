//! `@settle/local`'s native part: the napi-rs face of
//! [`settle_local::LocalLedger`].
//!
//! One class, `NativeLedger`, whose `request(method, target, headers,
//! body)` resolves to `{ status, headers, body }`; the JavaScript package
//! turns it into a `fetch` for `@settle/client`'s own `Client`. A request
//! runs on libuv's thread pool (an `AsyncTask`), never on the event loop,
//! so an fsync never blocks JavaScript.
#![allow(missing_docs)] // the generated bindings; documented in index.d.ts

use std::sync::Arc;

use napi::bindgen_prelude::{AsyncTask, Buffer};
use napi::{Env, Error, Result, Status, Task};
use napi_derive::napi;
use settle_local::{LocalError, LocalLedger, Reply};

fn to_js(e: LocalError) -> Error {
    let status = match e {
        LocalError::Invalid(_) => Status::InvalidArg,
        _ => Status::GenericFailure,
    };
    Error::new(status, e.to_string())
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
    /// The in-memory store when `data` is null, else the embedded engine in `data`.
    #[napi(constructor)]
    pub fn new(data: Option<String>) -> Result<NativeLedger> {
        let inner = LocalLedger::open(data.as_deref().map(std::path::Path::new)).map_err(to_js)?;
        Ok(NativeLedger {
            inner: Arc::new(inner),
        })
    }

    /// Whether receipts survive the process.
    #[napi(getter)]
    pub fn durable(&self) -> bool {
        self.inner.durable()
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
