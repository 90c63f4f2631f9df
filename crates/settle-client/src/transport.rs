//! How requests reach the server: a pool of keep-alive connections shared
//! by every task (the default), or one dedicated connection that calls
//! take turns on (no pool bookkeeping: for load generators and per-task
//! clients).

use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HOST, HeaderValue};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client as Pool;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

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

pub(crate) enum Transport {
    Pooled(Pool<HttpConnector, Full<Bytes>>),
    Single {
        sender: Mutex<Option<SendRequest<Full<Bytes>>>>,
        connect_timeout: Duration,
    },
}

impl Transport {
    pub fn pooled(connect_timeout: Duration, idle_timeout: Duration, max_idle: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        // Requests are small and answered at once: no Nagle delay.
        connector.set_nodelay(true);
        let pool = Pool::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Transport::Pooled(pool)
    }

    pub fn single(connect_timeout: Duration) -> Self {
        Transport::Single {
            sender: Mutex::new(None),
            connect_timeout,
        }
    }

    /// The request target for `path`: absolute for the pool (it picks
    /// the connection by it), origin-form with `Host` on a connection.
    pub fn uri(&self, t: &Target, path: &str) -> String {
        match self {
            Transport::Pooled(_) => format!("http://{}{}{path}", t.authority, t.prefix),
            Transport::Single { .. } => format!("{}{path}", t.prefix),
        }
    }

    /// Sends one request; the answer's head (the body follows).
    pub async fn request(
        &self,
        t: &Target,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let (sender, connect_timeout) = match self {
            Transport::Pooled(pool) => return pool.request(req).await.map_err(|e| pooled(t, e)),
            Transport::Single {
                sender,
                connect_timeout,
            } => (sender, *connect_timeout),
        };
        req.headers_mut().insert(HOST, t.host.clone());
        let mut guard = sender.lock().await;
        // A kept connection the server closed meanwhile gives the request
        // back unsent: then once more, on a fresh connection.
        match attempt(t, &mut guard, connect_timeout, req).await {
            Ok(resp) => Ok(resp),
            Err((_, Some(unsent))) => {
                *guard = None;
                attempt(t, &mut guard, connect_timeout, unsent)
                    .await
                    .map_err(|(e, _)| e)
            }
            Err((e, None)) => Err(e),
        }
    }
}

type Unsent = Option<Request<Full<Bytes>>>;

/// One try on the kept connection (a new one if there is none): the
/// answer, or the error and the request if it was never sent.
async fn attempt(
    t: &Target,
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    connect_timeout: Duration,
    req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, (ClientError, Unsent)> {
    let s = match slot {
        Some(s) if !s.is_closed() => s,
        // Boxed: the rare connect would otherwise make every call's future
        // (moved on each call) several times larger.
        _ => slot.insert(
            Box::pin(connect(t, connect_timeout))
                .await
                .map_err(|e| (e, None))?,
        ),
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

async fn connect(t: &Target, timeout: Duration) -> Result<SendRequest<Full<Bytes>>, ClientError> {
    let err = |e: std::io::Error| ClientError::Connect {
        authority: t.authority.clone(),
        source: e.into(),
    };
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(&t.authority)).await {
        Ok(s) => s.map_err(err)?,
        Err(_) => return Err(err(std::io::ErrorKind::TimedOut.into())),
    };
    // Requests are small and answered at once: no Nagle delay.
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
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
