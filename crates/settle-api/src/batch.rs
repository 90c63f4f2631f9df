//! The batch API of SPEC §10: the envelopes. The endpoint comes with the
//! batch work; each call's fields are the single call's request body.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::problem::Problem;

/// `POST /v1/batch`.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct BatchRequest {
    /// At most the server's `max_batch_calls` (default 1000); applied in order.
    pub calls: Vec<BatchCall>,
}

/// Which call a batch entry makes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchOp {
    /// `claim` (SPEC §4); the fields of `ClaimRequest`.
    Claim,
    /// `heartbeat`; the fields of `HeartbeatRequest`.
    Heartbeat,
    /// `dispatch`; the fields of `DispatchRequest`.
    Dispatch,
    /// `settle`; the fields of `SettleRequest`.
    Settle,
    /// `release`; the fields of `ReleaseRequest`.
    Release,
    /// `reconcile`; the fields of `ReconcileRequest`.
    Reconcile,
    /// `get`: the record; no fields.
    Get,
}

/// One call: `op`, the raw `key` (not percent-encoded), and the single
/// call's request fields beside them. (A server reads each call from its
/// raw text, so that a result keeps its exact spelling; this type is how
/// a client builds one.)
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchCall {
    /// Which call to make.
    pub op: BatchOp,
    /// The operation's key as it is (not percent-encoded).
    pub key: String,
    /// The fields of the call's request body (`ClaimRequest`, ...).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub fields: Map<String, Value>,
}

impl BatchCall {
    /// A call of `op` on `key` with `body` (a request body type of this
    /// crate, or `EmptyRequest` for `get`).
    ///
    /// The fields pass through `serde_json::Value`: a settle's `result`
    /// loses spelling a `Value` cannot hold (numbers beyond a double are
    /// rounded, duplicate members merged). Where the result must be stored
    /// exactly as given, send the batch as text, as
    /// `settle_client::Client::execute_batch` does.
    pub fn new<T: Serialize>(op: BatchOp, key: impl Into<String>, body: &T) -> BatchCall {
        let fields = match serde_json::to_value(body) {
            Ok(Value::Object(m)) => m,
            // Every request body of this crate is an object.
            _ => Map::new(),
        };
        BatchCall {
            op,
            key: key.into(),
            fields,
        }
    }
}

/// The answer to a batch: one result per call, in order.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct BatchResponse {
    /// One result per call, in the order of the calls.
    pub results: Vec<BatchResult>,
}

/// What the single call would have answered: its HTTP status and body
/// (a problem object when the status is not 200).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchResult {
    /// The HTTP status the single call would have answered (200, 4xx or 503).
    pub status: u16,
    /// Kept as raw text, so a replayed result keeps its exact spelling.
    #[schema(value_type = Object)]
    pub body: Box<RawValue>,
}

/// [`BatchResponse`] read in place: each body borrowed from the answer's
/// bytes, not copied into a `Box<RawValue>` of its own (what a client
/// reading thousands of results per second wants).
#[derive(Debug, Deserialize)]
pub struct BatchResponseRef<'a> {
    /// One result per call, in the order of the calls.
    #[serde(borrow)]
    pub results: Vec<BatchResultRef<'a>>,
}

/// [`BatchResult`] with its body borrowed.
#[derive(Debug, Deserialize)]
pub struct BatchResultRef<'a> {
    /// The HTTP status the single call would have answered.
    pub status: u16,
    /// The body, as sent.
    #[serde(borrow)]
    pub body: &'a RawValue,
}

impl PartialEq for BatchResult {
    fn eq(&self, o: &BatchResult) -> bool {
        self.status == o.status && self.body.get() == o.body.get()
    }
}

impl BatchResult {
    /// The body as `T` when the call succeeded, else the problem.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, BatchError> {
        if self.status == 200 {
            serde_json::from_str(self.body.get()).map_err(BatchError::Body)
        } else {
            match serde_json::from_str::<Problem>(self.body.get()) {
                Ok(p) => Err(BatchError::Problem(Box::new(p))),
                Err(e) => Err(BatchError::Body(e)),
            }
        }
    }
}

/// Why a batch result is not the expected body.
#[derive(Debug)]
pub enum BatchError {
    /// The call was refused or failed.
    Problem(Box<Problem>),
    /// The body does not have the expected shape.
    Body(serde_json::Error),
}
