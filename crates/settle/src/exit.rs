//! Exit codes (also in README.md) and the one line a failure prints.
//!
//! 0 success · 1 local failure (cannot open the store, bad config, ...) ·
//! 2 usage error · 3 the server cannot be reached · 4 the request was
//! refused as invalid (400, 401, 404, 408, 413, 422) · 5 protocol refusal
//! (409) · 6 try again later: over a quota (429) or the server is
//! unavailable (503 and other 5xx) · 7 the TLS handshake failed (a
//! certificate not trusted, a name it does not hold).

use std::fmt::Display;

pub const LOCAL: u8 = 1;
pub const USAGE: u8 = 2;
pub const UNREACHABLE: u8 = 3;
pub const INVALID: u8 = 4;
pub const REFUSED: u8 = 5;
pub const UNAVAILABLE: u8 = 6;
pub const TLS: u8 = 7;

/// Why a subcommand failed: its exit code and what to tell the user on
/// stderr (nothing when the output already said it).
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: Option<String>,
}

impl Failure {
    /// Exit `code`, printing `message` as it is.
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: Some(message.into()),
        }
    }
    /// Exit `code` without a message (the output already says why).
    pub fn silent(code: u8) -> Failure {
        Failure {
            code,
            message: None,
        }
    }
    /// Exit 1: `error: <e>`.
    pub fn local(e: impl Display) -> Failure {
        Failure::new(LOCAL, format!("error: {e}"))
    }
    /// Exit 2: `error: <e>`.
    pub fn usage(e: impl Display) -> Failure {
        Failure::new(USAGE, format!("error: {e}"))
    }
    /// Exit 3: `error: <e>`.
    pub fn unreachable(e: impl Display) -> Failure {
        Failure::new(UNREACHABLE, format!("error: {e}"))
    }
}

/// The exit code and line of a failed request: usage (2) for a bad URL,
/// token or TLS setting; the status's code for an answer; 6 for an answer
/// that is not the API's; 7 for a failed TLS handshake; 3 without any
/// answer.
pub fn client_failure(e: settle_client::ClientError) -> Failure {
    use settle_client::ClientError as E;
    match e {
        E::Url { .. } | E::Request(_) | E::Tls(_) => Failure::usage(e),
        E::Http(h) => Failure::new(for_status(h.status), h.to_string()),
        E::UnexpectedBody { .. } => Failure::new(UNAVAILABLE, format!("error: {e}")),
        e if e.is_tls_failure() => Failure::new(
            TLS,
            format!(
                "error: {e}: the TLS handshake failed (trust the server's CA with --ca-cert, and \
                 use a host name its certificate holds)"
            ),
        ),
        // A TLS server answers plain HTTP with a TLS alert, which hyper
        // reads as a response line of an unknown HTTP version.
        e if e.to_string().contains("invalid HTTP version") => {
            Failure::unreachable(format!("{e}: the server speaks TLS: use https://"))
        }
        e => Failure::unreachable(e),
    }
}

/// The exit code of an HTTP error status.
pub fn for_status(status: u16) -> u8 {
    match status {
        409 => REFUSED,
        // Like a 503: the same call may succeed later (Retry-After).
        429 => UNAVAILABLE,
        s if s >= 500 => UNAVAILABLE,
        _ => INVALID,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_maps_to_its_exit_code() {
        for (status, code) in [
            (400, INVALID),
            (401, INVALID),
            (404, INVALID),
            (422, INVALID),
            (409, REFUSED),
            (429, UNAVAILABLE),
            (500, UNAVAILABLE),
            (503, UNAVAILABLE),
        ] {
            assert_eq!(for_status(status), code, "{status}");
        }
    }
}
