//! How requests reach the server: a pool of keep-alive connections shared
//! by every task (the default), or one dedicated connection that calls
//! take turns on (no pool bookkeeping: for load generators and per-task
//! clients). Either over TLS for an `https://` URL (rustls: hyper-rustls
//! around the pool's connector, tokio-rustls on the one connection); an
//! `http://` URL's transport has no TLS layer at all.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HOST, HeaderValue};
use hyper::rt::{Read, Write};
use hyper::{Request, Response};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as Pool;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::error::ClientError;

/// Where the server is.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// `host:port`.
    pub authority: String,
    /// The URL's path prefix, without a trailing `/` (usually empty).
    pub prefix: String,
    host: HeaderValue,
}

impl Target {
    pub fn new(authority: String, prefix: String) -> Result<Target, ClientError> {
        let host = HeaderValue::from_str(&authority)
            .map_err(|_| ClientError::Request("the host is not a valid header value".into()))?;
        Ok(Target {
            authority,
            prefix,
            host,
        })
    }
}

/// The TLS side of one dedicated connection: the settings and the name
/// the server's certificate must hold.
pub(crate) struct SingleTls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

pub(crate) enum Transport {
    Pooled(Pool<HttpConnector, Full<Bytes>>),
    /// The pool of an `https://` URL.
    PooledTls(Pool<HttpsConnector<HttpConnector>, Full<Bytes>>),
    Single {
        sender: Mutex<Option<SendRequest<Full<Bytes>>>>,
        connect_timeout: Duration,
        /// `Some` for an `https://` URL.
        tls: Option<Box<SingleTls>>,
    },
}

impl Transport {
    /// A pool; `tls` for an `https://` URL.
    pub fn pooled(
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
        tls: Option<ClientConfig>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        // Requests are small and answered at once: no Nagle delay.
        connector.set_nodelay(true);
        let mut pool = Pool::builder(TokioExecutor::new());
        pool.pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(max_idle);
        let Some(config) = tls else {
            return Transport::Pooled(pool.build(connector));
        };
        // The TLS layer is handed `https://` URIs, which the plain
        // connector refuses unless told not to check the scheme.
        connector.enforce_http(false);
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(connector);
        Transport::PooledTls(pool.build(https))
    }

    /// One dedicated connection to `t`; `tls` for an `https://` URL.
    pub fn single(
        connect_timeout: Duration,
        tls: Option<ClientConfig>,
        t: &Target,
    ) -> Result<Self, ClientError> {
        let tls = match tls {
            Some(config) => Some(Box::new(SingleTls {
                connector: TlsConnector::from(Arc::new(config)),
                name: server_name(&t.authority)?,
            })),
            None => None,
        };
        Ok(Transport::Single {
            sender: Mutex::new(None),
            connect_timeout,
            tls,
        })
    }

    /// The request target for `path`: absolute for the pool (it picks
    /// the connection by it), origin-form with `Host` on a connection.
    pub fn uri(&self, t: &Target, path: &str) -> String {
        match self {
            Transport::Pooled(_) => format!("http://{}{}{path}", t.authority, t.prefix),
            Transport::PooledTls(_) => format!("https://{}{}{path}", t.authority, t.prefix),
            Transport::Single { .. } => format!("{}{path}", t.prefix),
        }
    }

    /// Sends one request; the answer's head (the body follows).
    pub async fn request(
        &self,
        t: &Target,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let (sender, how) = match self {
            Transport::Pooled(pool) => return pool.request(req).await.map_err(|e| pooled(t, e)),
            Transport::PooledTls(pool) => {
                return pool.request(req).await.map_err(|e| pooled(t, e));
            }
            Transport::Single {
                sender,
                connect_timeout,
                tls,
            } => (
                sender,
                Connect {
                    timeout: *connect_timeout,
                    tls: tls.as_deref(),
                },
            ),
        };
        req.headers_mut().insert(HOST, t.host.clone());
        let mut guard = sender.lock().await;
        // A kept connection the server closed meanwhile gives the request
        // back unsent: then once more, on a fresh connection.
        match attempt(t, &mut guard, how, req).await {
            Ok(resp) => Ok(resp),
            Err((_, Some(unsent))) => {
                *guard = None;
                attempt(t, &mut guard, how, unsent)
                    .await
                    .map_err(|(e, _)| e)
            }
            Err((e, None)) => Err(e),
        }
    }
}

/// How the single transport opens its connection.
#[derive(Clone, Copy)]
struct Connect<'a> {
    timeout: Duration,
    tls: Option<&'a SingleTls>,
}

/// The name an `https://` server's certificate must hold: the host of
/// `host:port` (an IPv6 address without its brackets).
fn server_name(authority: &str) -> Result<ServerName<'static>, ClientError> {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_string()).map_err(|e| {
        ClientError::Tls(format!(
            "{host:?} cannot be checked against a certificate: {e}"
        ))
    })
}

type Unsent = Option<Request<Full<Bytes>>>;

/// One try on the kept connection (a new one if there is none): the
/// answer, or the error and the request if it was never sent.
async fn attempt(
    t: &Target,
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    how: Connect<'_>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, (ClientError, Unsent)> {
    let s = match slot {
        Some(s) if !s.is_closed() => s,
        // Boxed: the rare connect would otherwise make every call's future
        // (moved on each call) several times larger.
        _ => slot.insert(Box::pin(connect(t, how)).await.map_err(|e| (e, None))?),
    };
    if let Err(e) = s.ready().await {
        *slot = None;
        return Err((transport(t, e), Some(req)));
    }
    s.try_send_request(req).await.map_err(|mut e| {
        *slot = None;
        let unsent = e.take_message();
        (transport(t, e.into_error()), unsent)
    })
}

/// A new connection: TCP (within the connect timeout), then for an
/// `https://` URL the TLS handshake, which checks the server's
/// certificate (a refused certificate is a connect error: nothing was
/// sent), then HTTP/1.1.
async fn connect(t: &Target, how: Connect<'_>) -> Result<SendRequest<Full<Bytes>>, ClientError> {
    let err = |e: std::io::Error| ClientError::Connect {
        authority: t.authority.clone(),
        source: e.into(),
    };
    let stream = match tokio::time::timeout(how.timeout, TcpStream::connect(&t.authority)).await {
        Ok(s) => s.map_err(err)?,
        Err(_) => return Err(err(std::io::ErrorKind::TimedOut.into())),
    };
    // Requests are small and answered at once: no Nagle delay.
    let _ = stream.set_nodelay(true);
    match how.tls {
        None => handshake(t, TokioIo::new(stream)).await,
        Some(tls) => {
            let stream = tls
                .connector
                .connect(tls.name.clone(), stream)
                .await
                .map_err(err)?;
            handshake(t, TokioIo::new(stream)).await
        }
    }
}

/// HTTP/1.1 on a connection; its driver runs on a task of its own.
async fn handshake<I>(t: &Target, io: I) -> Result<SendRequest<Full<Bytes>>, ClientError>
where
    I: Read + Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| ClientError::Connect {
            authority: t.authority.clone(),
            source: e.into(),
        })?;
    tokio::spawn(async move {
        // Ends when the server closes the connection or the sender is dropped.
        let _ = conn.await;
    });
    Ok(sender)
}

fn pooled(t: &Target, e: hyper_util::client::legacy::Error) -> ClientError {
    if e.is_connect() {
        ClientError::Connect {
            authority: t.authority.clone(),
            source: e.into(),
        }
    } else {
        transport(t, e)
    }
}

fn transport(t: &Target, e: impl Into<crate::error::BoxError>) -> ClientError {
    ClientError::Transport {
        authority: t.authority.clone(),
        source: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_name_is_the_host() {
        for (authority, name) in [
            ("settle.internal:443", "settle.internal"),
            ("127.0.0.1:7411", "127.0.0.1"),
            ("[::1]:7411", "::1"),
        ] {
            assert_eq!(server_name(authority).unwrap().to_str(), name);
        }
    }
}
