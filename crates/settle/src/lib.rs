//! The `settle` binary's library part: a lean HTTP/1.1 client for a
//! running `settle serve` (used by the client subcommands, `settle bench`
//! and the integration tests).

pub mod client {
    use std::fmt::Write as _;

    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper::client::conn::http1::SendRequest;
    use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
    use hyper::{Method, Request};
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpStream;

    /// A transport failure (no HTTP answer at all).
    #[derive(Debug, thiserror::Error)]
    pub enum ClientError {
        #[error("invalid server URL {0:?}: expected http://HOST:PORT")]
        Url(String),
        #[error("cannot connect to {0}: {1}")]
        Connect(String, std::io::Error),
        #[error("HTTP error: {0}")]
        Http(#[from] hyper::Error),
        #[error("invalid request: {0}")]
        Request(String),
    }

    /// Where the server is and which token to present.
    #[derive(Debug, Clone)]
    pub struct Endpoint {
        authority: String,
        host: HeaderValue,
        base_path: String,
        auth: Option<HeaderValue>,
    }

    impl Endpoint {
        /// `url` is `http://HOST:PORT` with an optional path prefix.
        pub fn new(url: &str, token: Option<&str>) -> Result<Endpoint, ClientError> {
            let rest = url
                .strip_prefix("http://")
                .ok_or_else(|| ClientError::Url(url.to_string()))?;
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
                None => (rest, ""),
            };
            if authority.is_empty() {
                return Err(ClientError::Url(url.to_string()));
            }
            let authority = if authority
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            {
                authority.to_string()
            } else {
                format!("{authority}:80")
            };
            let auth = match token {
                Some(t) if !t.is_empty() => {
                    Some(HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                        ClientError::Request("the token is not a valid header value".into())
                    })?)
                }
                _ => None,
            };
            let host =
                HeaderValue::from_str(&authority).map_err(|_| ClientError::Url(url.to_string()))?;
            Ok(Endpoint {
                authority,
                host,
                base_path: path.to_string(),
                auth,
            })
        }

        pub fn authority(&self) -> &str {
            &self.authority
        }

        pub async fn connect(&self) -> Result<Conn, ClientError> {
            Conn::connect(self.clone()).await
        }

        /// One request on a fresh connection.
        pub async fn send(
            &self,
            method: Method,
            path: &str,
            body: Option<Vec<u8>>,
        ) -> Result<HttpReply, ClientError> {
            self.connect().await?.send(method, path, body).await
        }
    }

    /// An HTTP answer.
    #[derive(Debug, Clone)]
    pub struct HttpReply {
        pub status: u16,
        pub content_type: String,
        pub body: Bytes,
    }

    impl HttpReply {
        /// The body as JSON (`Null` if it is not JSON).
        pub fn json(&self) -> serde_json::Value {
            serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
        }
        /// The problem+json `code`, if this is an error answer.
        pub fn code(&self) -> Option<String> {
            self.json()["code"].as_str().map(str::to_string)
        }
        pub fn is_success(&self) -> bool {
            (200..300).contains(&self.status)
        }
    }

    /// One keep-alive HTTP/1.1 connection; requests on it run one at a time.
    pub struct Conn {
        sender: SendRequest<Full<Bytes>>,
        endpoint: Endpoint,
    }

    impl Conn {
        pub async fn connect(endpoint: Endpoint) -> Result<Conn, ClientError> {
            let stream = TcpStream::connect(&endpoint.authority)
                .await
                .map_err(|e| ClientError::Connect(endpoint.authority.clone(), e))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Conn { sender, endpoint })
        }

        /// Sends one request; `path` starts with `/` and is already encoded.
        pub async fn send(
            &mut self,
            method: Method,
            path: &str,
            body: Option<Vec<u8>>,
        ) -> Result<HttpReply, ClientError> {
            let uri = format!("{}{}", self.endpoint.base_path, path);
            let mut req = Request::builder()
                .method(method)
                .uri(uri)
                .header(HOST, self.endpoint.host.clone());
            if let Some(a) = &self.endpoint.auth {
                req = req.header(AUTHORIZATION, a.clone());
            }
            if body.is_some() {
                req = req.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            let req = req
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(|e| ClientError::Request(e.to_string()))?;
            self.sender.ready().await?;
            let resp = self.sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let content_type = resp
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok(HttpReply {
                status,
                content_type,
                body,
            })
        }
    }

    /// Percent-encodes one path segment (everything but unreserved characters).
    pub fn encode_segment(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(b as char);
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
        out
    }

    /// `/v1/operations/{key}/{call}` (or the record itself when `call` is empty).
    pub fn operation_path(key: &str, call: &str) -> String {
        if call.is_empty() {
            format!("/v1/operations/{}", encode_segment(key))
        } else {
            format!("/v1/operations/{}/{call}", encode_segment(key))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn segments_are_encoded() {
            assert_eq!(encode_segment("order-1"), "order-1");
            assert_eq!(encode_segment("a/b#c%d?"), "a%2Fb%23c%25d%3F");
            assert_eq!(operation_path("k 1", "claim"), "/v1/operations/k%201/claim");
        }

        #[test]
        fn urls_parse() {
            let e = Endpoint::new("http://127.0.0.1:7411", None).unwrap();
            assert_eq!(e.authority(), "127.0.0.1:7411");
            let e = Endpoint::new("http://localhost/prefix/", Some("t")).unwrap();
            assert_eq!(e.authority(), "localhost:80");
            assert_eq!(e.base_path, "/prefix");
            assert!(Endpoint::new("https://x", None).is_err());
        }
    }
}
