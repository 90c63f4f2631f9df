//! An answer read as it arrives ([`crate::Client::download`]): the head at
//! once, the body piece by piece.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};

use crate::error::ClientError;

/// A streamed answer: its status and headers, and the body as it arrives.
///
/// A body the server aborted (a chunked body without its terminator, or
/// shorter than its `Content-Length`) makes [`Download::chunk`] fail with
/// [`ClientError::Transport`]: what arrived before is incomplete.
#[derive(Debug)]
pub struct Download {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type` header (empty when absent).
    pub content_type: String,
    /// The `Content-Length` header, when the server sent one.
    pub content_length: Option<u64>,
    /// `Retry-After` in whole seconds, when the server sent one.
    pub retry_after: Option<Duration>,
    body: Incoming,
    authority: String,
    idle_timeout: Duration,
    received: u64,
}

impl Download {
    pub(crate) fn new(
        resp: hyper::Response<Incoming>,
        authority: String,
        idle_timeout: Duration,
    ) -> Download {
        let header = |name| {
            resp.headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        let content_type = header(CONTENT_TYPE).unwrap_or("").to_string();
        let content_length = header(CONTENT_LENGTH).and_then(|s| s.trim().parse().ok());
        let retry_after = header(RETRY_AFTER)
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        Download {
            status: resp.status().as_u16(),
            content_type,
            content_length,
            retry_after,
            body: resp.into_body(),
            authority,
            idle_timeout,
            received: 0,
        }
    }

    /// The next piece of the body, `None` once it ended normally. Waits
    /// at most the client's request timeout for it.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            let frame = tokio::time::timeout(self.idle_timeout, self.body.frame())
                .await
                .map_err(|_| ClientError::Timeout {
                    authority: self.authority.clone(),
                    after: self.idle_timeout,
                })?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ClientError::Transport {
                        authority: self.authority.clone(),
                        source: format!(
                            "the body ended after {} bytes, incomplete: {e}",
                            self.received
                        )
                        .into(),
                    });
                }
                Some(Ok(f)) => {
                    // Trailers (none are sent) are skipped; so are empty pieces.
                    if let Ok(data) = f.into_data()
                        && !data.is_empty()
                    {
                        self.received += data.len() as u64;
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// Body bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }
}
