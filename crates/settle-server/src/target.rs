//! The request target's length limit (SPEC §7: 414 `uri_too_long`).
//!
//! Two layers, so every over-long target gets the same problem+json:
//! requests whose target is over [`MAX_TARGET_BYTES`] are answered by the
//! server before routing ([`too_long`]); hyper refuses a request line past
//! its own hard limit (64 KiB) before the server sees a request at all and
//! writes a bodiless 414 itself, which [`ProblemFor414`] replaces on the
//! way out with the same answer.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use settle_api::Code;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::problem::Problem;

/// The longest request target (path and query) the server takes. A key
/// is at most 255 bytes (765 percent-encoded); nothing legitimate comes
/// near this. The same figure as nginx's default header buffer.
pub const MAX_TARGET_BYTES: usize = 8192;

/// The problem for a target of `len` bytes, if it is over the limit.
pub fn too_long(len: usize) -> Option<Problem> {
    (len > MAX_TARGET_BYTES).then(|| {
        Problem::new(
            Code::UriTooLong,
            format!("the request target is {len} bytes long; at most {MAX_TARGET_BYTES} are taken"),
        )
    })
}

/// The status line hyper writes for a request line past its own limit.
const HYPER_414: &[u8] = b"HTTP/1.1 414 URI Too Long\r\n";

/// Whether `head` is hyper's own bodiless 414 (the server's own 414
/// carries a content type and a body, and is never matched).
fn is_hypers_414(head: &[u8]) -> bool {
    head.starts_with(HYPER_414)
        && head.ends_with(b"\r\n\r\n")
        && memchr::memmem::find(head, b"\r\ncontent-length: 0\r\n").is_some()
        && memchr::memmem::find(head, b"content-type").is_none()
}

/// The whole response that replaces hyper's bodiless 414 (the connection
/// closes after it, as hyper's would).
fn problem_response() -> Vec<u8> {
    let mut body = too_long(usize::MAX).map_or_else(Vec::new, |mut p| {
        p.body.detail = "the request line is over the server's limit (64 KiB at most)".into();
        p.to_json()
    });
    body.push(b'\n');
    let mut out = format!(
        "HTTP/1.1 414 URI Too Long\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        crate::problem::PROBLEM_JSON,
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// A connection's stream that replaces hyper's bodiless 414 with
/// [`problem_response`]; every other byte passes unchanged.
pub struct ProblemFor414<S> {
    inner: S,
    /// The replacement being written, how much of it is out, and how many
    /// bytes of hyper's response to report once it is all out.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> ProblemFor414<S> {
    /// Wraps an accepted connection.
    pub fn new(inner: S) -> Self {
        ProblemFor414 {
            inner,
            pending: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> ProblemFor414<S> {
    fn write_pending(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        while let Some((bytes, done, _)) = &mut self.pending {
            if *done == bytes.len() {
                let (_, _, report) = self.pending.take().expect("pending");
                return Poll::Ready(Ok(report));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        unreachable!("called with a pending replacement")
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ProblemFor414<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ProblemFor414<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.pending.is_none() && is_hypers_414(buf) {
            self.pending = Some((problem_response(), 0, buf.len()));
        }
        if self.pending.is_some() {
            return self.write_pending(cx);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // hyper's 414 is a head alone: one non-empty slice.
        let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
        if self.pending.is_none()
            && let (Some(head), None) = (nonempty.next(), nonempty.next())
            && is_hypers_414(head)
        {
            self.pending = Some((problem_response(), 0, head.len()));
        }
        if self.pending.is_some() {
            return self.write_pending(cx);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test]
    async fn hypers_bodiless_414_becomes_problem_json_and_nothing_else_changes() {
        let mut out = ProblemFor414::new(Vec::new());
        let hyper = b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\ndate: Fri, 04 Dec 2026 15:57:18 GMT\r\n\r\n";
        out.write_all(hyper).await.unwrap();
        let text = String::from_utf8(out.inner.clone()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{head}");
        assert!(
            head.contains("content-type: application/problem+json"),
            "{head}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            (v["status"].as_u64(), v["code"].as_str()),
            (Some(414), Some("uri_too_long"))
        );
        assert!(body.ends_with("}\n"));

        // Any other answer, a 414 with a body among them, passes unchanged.
        for other in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 414 URI Too Long\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\n\r\n",
        ] {
            let mut out = ProblemFor414::new(Vec::new());
            out.write_all(other).await.unwrap();
            assert_eq!(out.inner, other);
        }
    }

    #[test]
    fn the_limit_is_inclusive() {
        assert!(too_long(MAX_TARGET_BYTES).is_none());
        let p = too_long(MAX_TARGET_BYTES + 1).unwrap();
        assert_eq!((p.status, p.code), (414, Code::UriTooLong));
    }
}
