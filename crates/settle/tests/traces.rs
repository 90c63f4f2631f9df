//! `settle serve --otlp-endpoint URL` (SPEC §12 "Traces") against a small
//! OTLP/HTTP receiver in the test, which decodes what arrives: a span per
//! request continuing the caller's `traceparent`, with the attributes
//! tenant, key, fence, decision and status, and a child span per store
//! commit.

mod common;

use std::collections::HashMap;

use common::{Server, TempDir, raw_status};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tokio::sync::mpsc;

/// Serves `POST /v1/traces` on a free port; every decoded export arrives on the channel.
async fn receiver() -> (
    String,
    mpsc::UnboundedReceiver<(String, ExportTraceServiceRequest)>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let tx = tx.clone();
                async move {
                    let path = req.uri().path().to_string();
                    let body = req.into_body().collect().await?.to_bytes();
                    let decoded = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    let _ = tx.send((path, decoded));
                    let mut resp =
                        hyper::Response::new(http_body_util::Full::new(hyper::body::Bytes::new()));
                    resp.headers_mut().insert(
                        "content-type",
                        hyper::header::HeaderValue::from_static("application/x-protobuf"),
                    );
                    Ok::<_, hyper::Error>(resp)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (url, rx)
}

fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .filter_map(|kv| {
            let v = match kv.value.as_ref()?.value.as_ref()? {
                Any::StringValue(s) => s.clone(),
                Any::IntValue(i) => i.to_string(),
                Any::BoolValue(b) => b.to_string(),
                Any::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.clone(), v))
        })
        .collect()
}

// Multi-threaded: the receiver must answer while the test waits for the
// server to exit (its last export happens then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_continue_the_callers_trace_and_carry_the_ledger_attributes() {
    let (url, mut exports) = receiver().await;
    let dir = TempDir::new("otlp");
    let mut s = Server::start(dir.path(), &["--otlp-endpoint", &url]);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let body = serde_json::json!({
        "fingerprint": "ab".repeat(32),
        "binding": {"principal": "svc", "scopes": ["pay"], "generation": 0},
    })
    .to_string();
    let request = format!(
        "POST /v1/operations/k1/claim HTTP/1.1\r\nhost: settle\r\ncontent-type: application/json\r\n\
         traceparent: 00-{trace_id}-{parent}-01\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = raw_status(&s.addr, request.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    // A request without trace context starts a trace of its own.
    let (status, _) = raw_status(
        &s.addr,
        b"GET /v1/operations/k1 HTTP/1.1\r\nhost: settle\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);

    // SIGTERM flushes the spans still in the batch before the process exits.
    assert!(s.terminate().success());
    let mut spans: Vec<Span> = Vec::new();
    while let Ok((path, export)) = exports.try_recv() {
        assert_eq!(path, "/v1/traces");
        for rs in export.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone());
            assert_eq!(service, Some(Any::StringValue("settle".into())));
            spans.extend(rs.scope_spans.into_iter().flat_map(|ss| ss.spans));
        }
    }
    let claim = spans
        .iter()
        .find(|s| s.name == "POST /v1/operations/{key}/claim")
        .unwrap_or_else(|| panic!("no claim span in {spans:#?}"));
    assert_eq!(
        hex(&claim.trace_id),
        trace_id,
        "the caller's trace is continued"
    );
    assert_eq!(hex(&claim.parent_span_id), parent);
    let a = attributes(claim);
    assert_eq!(a.get("tenant").map(String::as_str), Some("default"));
    assert_eq!(a.get("key").map(String::as_str), Some("k1"));
    assert_eq!(a.get("decision").map(String::as_str), Some("execute"));
    assert_eq!(a.get("status").map(String::as_str), Some("200"));
    assert!(
        a.get("fence").is_some_and(|f| f.parse::<u64>().is_ok()),
        "{a:?}"
    );

    let commit = spans
        .iter()
        .find(|s| s.name == "store commit" && s.parent_span_id == claim.span_id)
        .unwrap_or_else(|| panic!("no store commit under the claim in {spans:#?}"));
    assert_eq!(commit.trace_id, claim.trace_id);
    assert_eq!(
        attributes(commit).get("call").map(String::as_str),
        Some("claim")
    );

    let read = spans
        .iter()
        .find(|s| s.name == "GET /v1/operations/{key}")
        .expect("a span for the read");
    assert_ne!(read.trace_id, claim.trace_id);
    assert!(read.parent_span_id.is_empty(), "a root span");
}

/// The Rust client (feature `opentelemetry`) sends the caller's current
/// OpenTelemetry context, and the server continues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_sends_the_callers_trace_context() {
    use opentelemetry::context::FutureExt as _;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let (url, mut exports) = receiver().await;
    let dir = TempDir::new("otlp-client");
    let mut s = Server::start(dir.path(), &["--otlp-endpoint", &url]);
    let client = s.ep();
    let b = settle_client::testkit::binding("svc", 0);

    // No active span: the server starts a trace of its own.
    common::execute(&client, "plain", 1, &b).await;
    let trace_id = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
    let caller = SpanContext::new(
        trace_id,
        SpanId::from_hex("b7ad6b7169203331").unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let cx = opentelemetry::Context::current().with_remote_span_context(caller);
    // The context is read when the request is built, from the context
    // current while the call's future runs: async callers attach theirs
    // with `FutureExt::with_context` (or a tracing span with
    // tracing-opentelemetry, which attaches on every poll).
    let body = settle_client::testkit::claim_body(2, &b);
    let path = settle_client::operation_path("traced", "claim");
    let fut = client
        .send_raw(
            hyper::Method::POST,
            &path,
            Some(settle_client::Bytes::from(
                serde_json::to_vec(&body).unwrap(),
            )),
        )
        .with_context(cx);
    assert_eq!(fut.await.unwrap().status, 200);

    assert!(s.terminate().success());
    let mut spans: Vec<Span> = Vec::new();
    while let Ok((_, export)) = exports.try_recv() {
        for rs in export.resource_spans {
            spans.extend(rs.scope_spans.into_iter().flat_map(|ss| ss.spans));
        }
    }
    let key = |k: &str| {
        spans
            .iter()
            .find(|s| attributes(s).get("key").map(String::as_str) == Some(k))
            .unwrap_or_else(|| panic!("no span for {k} in {spans:#?}"))
    };
    assert_eq!(
        hex(&key("traced").trace_id),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert_eq!(hex(&key("traced").parent_span_id), "b7ad6b7169203331");
    assert_ne!(
        hex(&key("plain").trace_id),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert!(key("plain").parent_span_id.is_empty());
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
