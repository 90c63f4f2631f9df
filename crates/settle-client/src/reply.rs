//! An answer as received, before it is read as a type.

use std::time::Duration;

use hyper::body::Bytes;
use serde::de::DeserializeOwned;
use settle_api::Problem;

use crate::error::{ClientError, HttpError};

/// An HTTP answer: status, content type, `Retry-After` and the body bytes
/// exactly as the server sent them (a replayed result keeps its spelling).
#[derive(Debug, Clone)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type` header (empty when absent).
    pub content_type: String,
    /// `Retry-After` in whole seconds, when the server sent one.
    pub retry_after: Option<Duration>,
    /// The body as received.
    pub body: Bytes,
}

impl Reply {
    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as untyped JSON (`Null` when it is not JSON): for tools
    /// and tests that look at answers the types do not describe.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The problem+json body of an error answer.
    pub fn problem(&self) -> Option<Problem> {
        if self.is_success() {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// A success body as `T`; an error status as [`ClientError::Http`].
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        if !self.is_success() {
            return Err(self.error().into());
        }
        serde_json::from_slice(&self.body).map_err(|e| ClientError::UnexpectedBody {
            status: self.status,
            reason: e.to_string(),
        })
    }

    /// The error this answer is (meaningful for an error status).
    pub fn error(&self) -> HttpError {
        HttpError {
            status: self.status,
            problem: self.problem(),
            retry_after: self.retry_after,
            body: self.body.clone(),
        }
    }
}
