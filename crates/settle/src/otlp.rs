//! `--otlp-endpoint URL`: the server's spans (settle-server's `trace`
//! module) exported over OTLP/HTTP (protobuf) to `URL/v1/traces`, in
//! batches, by the OpenTelemetry SDK's batch processor.
//!
//! The batch processor runs the export on its own thread outside any
//! async runtime; [`Post`] hands each request to the server's tokio
//! runtime (its hyper client needs one) and waits for the answer there.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client as Pool;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;

/// An export that does not finish within this is dropped (and logged by
/// the SDK): traces never hold up the server.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP HTTP client: POSTs on the runtime of `handle`.
#[derive(Debug, Clone)]
struct Post {
    handle: tokio::runtime::Handle,
    pool: Pool<HttpConnector, Full<Bytes>>,
}

impl HttpClient for Post {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let pool = self.pool.clone();
        let task = self.handle.spawn(async move {
            let resp = pool.request(request.map(Full::new)).await?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        });
        Box::pin(async move { task.await.map_err(|e| Box::new(e) as HttpError)? })
    }
}

/// The tracer provider exporting to `endpoint` (a base URL); the caller
/// keeps it and calls [`shutdown`] at exit (it flushes what is pending).
pub fn provider(endpoint: &str) -> Result<SdkTracerProvider, String> {
    let post = Post {
        handle: tokio::runtime::Handle::current(),
        pool: Pool::builder(TokioExecutor::new()).build(HttpConnector::new()),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(post)
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("otlp_endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("settle")
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The `tracing` layer that turns the server's spans into OpenTelemetry
/// spans of `provider`, and the W3C propagator for incoming `traceparent`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use tracing_subscriber::Layer as _;
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    // Only the span's own fields: no source location, thread, target or
    // busy/idle timings (they would be the same on every span).
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("settle"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(settle_server::trace::TARGET, tracing::Level::INFO),
        )
}

/// Flushes the pending spans and stops the exporter (off the async workers:
/// the flush blocks).
pub async fn shutdown(provider: SdkTracerProvider) {
    let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    if let Ok(Err(e)) = done {
        tracing::warn!(error = %e, "traces: the last spans could not be exported");
    }
}
