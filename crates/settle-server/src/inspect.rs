//! The inspection API of SPEC §9: `GET /v1/operations` (a filtered,
//! keyset-paginated listing) and `GET /v1/stats` (the tenant's counts).
//! Tenant-scoped and authenticated like every §7 route; read-only.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use settle_api::{ListResponse, OperationSummary, Stats, StatusCounts};
use settle_ledger::inspect::{
    self, Cursor, ListFilter, ListOrder, ListQuery, ListStatus, MAX_LIMIT, TenantStats,
};

use crate::http::{AppState, Route, finish, store_error};
use crate::openapi::V1Errors;
use crate::problem::Problem;
use crate::wire::decode_segment;

/// The default page size (SPEC §9).
const DEFAULT_LIMIT: usize = 100;

fn json<T: serde::Serialize>(value: &T) -> Response {
    let mut body = serde_json::to_vec(value).expect("responses always serialize");
    body.push(b'\n');
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The opaque cursor of a key: its bytes in hex (a key is visible ASCII,
/// so the cursor needs no escaping in a query string).
pub fn cursor(c: &Cursor) -> String {
    hex::encode(c.to_text())
}

/// Every cursor [`cursor`] writes, and nothing else: the hex of a key
/// (visible ASCII, 1-255 bytes, hex 21-7e), of `u <ms> <key>` or of
/// `a <bucket> <ms> <key>` (`75 20`, `61 20 3x 20`; digits `3x`, at most 18
/// of them: every such number fits the stores' signed 64-bit columns).
/// The OpenAPI document gives it to `after` (spelled again in `list`'s
/// attribute, which takes only a literal; a test holds the two equal), so a
/// generated value is a position the server takes, never a refusal.
#[cfg(test)]
const CURSOR_PATTERN: &str = "^((2[1-9a-f]|[3-6][0-9a-f]|7[0-9a-e]){1,255}|7520(3[0-9]){1,18}20(2[1-9a-f]|[3-6][0-9a-f]|7[0-9a-e]){1,255}|61203[0-3]20(3[0-9]){1,18}20(2[1-9a-f]|[3-6][0-9a-f]|7[0-9a-e]){1,255})$";

fn parse_cursor(raw: &str) -> Result<Cursor, Problem> {
    let bad = || Problem::invalid("after", "not a cursor returned by this listing");
    let bytes = hex::decode(raw).map_err(|_| bad())?;
    let s = String::from_utf8(bytes).map_err(|_| bad())?;
    Cursor::from_text(&s).ok_or_else(bad)
}

fn parse_bool(name: &str, v: &str) -> Result<bool, Problem> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Problem::invalid(name, "must be true or false")),
    }
}

/// Parses the query string of `GET /v1/operations`. Unknown parameters
/// and repeated ones are refused (a typo must not silently widen a filter).
fn parse_list_query(raw: Option<&str>, stuck_after_ms: u64) -> Result<ListQuery, Problem> {
    let mut q = ListQuery {
        filter: ListFilter::default(),
        order: ListOrder::Key,
        after: None,
        limit: DEFAULT_LIMIT,
        stuck_after_ms,
    };
    let mut seen: Vec<String> = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        // No `+` for space: keys have no spaces, and `+` is a key character.
        let value = decode_segment("query", value)?;
        let value = String::from_utf8(value)
            .map_err(|_| Problem::bad_request("a query parameter is not UTF-8"))?;
        if seen.iter().any(|s| s == name) {
            return Err(Problem::invalid(name, "given more than once"));
        }
        seen.push(name.to_string());
        let f = &mut q.filter;
        match name {
            "status" => {
                for s in value.split(',') {
                    let st = ListStatus::parse(s).ok_or_else(|| {
                        Problem::invalid(
                            "status",
                            format!(
                                "unknown status {s:?}; one or more of pending, running, \
                                 unknown, conflict, failed, completed, separated by commas"
                            ),
                        )
                    })?;
                    f.statuses.push(st);
                }
            }
            "reconcile_required" => f.reconcile_required = Some(parse_bool(name, &value)?),
            "disputed" => f.disputed = Some(parse_bool(name, &value)?),
            "stuck" => f.stuck = Some(parse_bool(name, &value)?),
            "quarantined" => f.quarantined = Some(parse_bool(name, &value)?),
            "key_prefix" => {
                if !(1..=255).contains(&value.len())
                    || !value.bytes().all(|c| (0x21..=0x7e).contains(&c))
                {
                    return Err(Problem::invalid(
                        "key_prefix",
                        "1-255 bytes of visible ASCII (0x21-0x7E)",
                    ));
                }
                f.key_prefix = Some(value);
            }
            "limit" => {
                q.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| Problem::invalid("limit", "an integer from 1 to 1000"))?;
            }
            "after" => q.after = Some(parse_cursor(&value)?),
            "order" => {
                q.order = ListOrder::parse(&value)
                    .ok_or_else(|| Problem::invalid("order", "one of key, updated, attention"))?;
            }
            other => {
                return Err(Problem::invalid(
                    other,
                    "unknown query parameter (status, reconcile_required, disputed, stuck, \
                     quarantined, key_prefix, order, limit, after)",
                ));
            }
        }
    }
    // The cursor carries the order (SPEC §9): a later page continues the
    // listing the cursor came from, whatever `order` says. Refusing a
    // mismatch would make a schema-valid request fail (the document cannot
    // tie one parameter to another); continuing in another order than the
    // cursor's position belongs to is not possible.
    if let Some(c) = &q.after {
        q.order = c.order();
    }
    Ok(q)
}

/// List the tenant's operations, filtered, one page at a time (SPEC §9).
#[utoipa::path(
    get, path = "/v1/operations", tag = "inspection",
    params(
        ("status" = Option<String>, Query, description = "One or more of pending, running, unknown, conflict, failed, completed, separated by commas (pending includes running)"),
        ("reconcile_required" = Option<bool>, Query, description = "Only records that do (true) or do not (false) require reconciliation"),
        ("disputed" = Option<bool>, Query, description = "Only disputed (true) or undisputed (false) records"),
        ("stuck" = Option<bool>, Query, description = "Only stuck (true) or not stuck (false) records: not terminal, no open lease, untouched for stuck_after_s"),
        ("quarantined" = Option<bool>, Query, description = "Only records with (true) or without (false) quarantined evidence"),
        ("key_prefix" = Option<String>, Query, description = "Only keys starting with this (1-255 bytes of visible ASCII); the scan starts at the prefix and ends past it", pattern = "^[!-~]{1,255}$"),
        ("order" = Option<String>, Query, description = "key (default): by key, a bounded scan per page; updated: most recently updated first; attention: reconcile required, then disputed, then stuck, then the rest, most recently updated first within each (these two read every record the prefix allows per page). The cursor carries the order.", pattern = "^(key|updated|attention)$"),
        ("limit" = Option<u32>, Query, description = "Most records per page, 1-1000 (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "The previous page's `next` cursor. Opaque to clients; it carries its listing's order, which the page continues (`order` is then not needed). Today the lowercase hex of the position's text: the key (key order), `u <updated_at ms> <key>` (updated) or `a <bucket 0-3> <updated_at ms> <key>` (attention); the pattern is exactly that, so every value it admits is a position.", pattern = "^((2[1-9a-f]|[3-6][0-9a-f]|7[0-9a-e]){1,255}|7520(3[0-9]){1,18}20(2[1-9a-f]|[3-6][0-9a-f]|7[0-9a-e]){1,255}|61203[0-3]20(3[0-9]){1,18}20(2[1-9a-f]|[3-6][0-9a-f]|7[0-9a-e]){1,255})$"),
    ),
    responses(
        (status = 200, description = "One page in the listing's order. A page may hold fewer than `limit` records while `next` is not null (a bounded scan); the listing ends when `next` is null.", body = ListResponse),
        V1Errors,
    )
)]
pub async fn list(State(st): State<Arc<AppState>>, req: Request) -> Response {
    finish(Route::List, list_inner(&st, req).await)
}

async fn list_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, _body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    let q = parse_list_query(parts.uri.query(), live.stuck_after_ms)?;
    let page = inspect::list(&*st.store, tenant, &q)
        .await
        .map_err(|e| store_error("list", None, &e))?;
    Ok(json(&ListResponse {
        operations: page
            .records
            .iter()
            .map(|r| OperationSummary::of(r, page.now, live.stuck_after_ms))
            .collect(),
        next: page.next.as_ref().map(cursor),
    }))
}

/// The wire form of a tenant's counts.
pub fn stats_body(s: &TenantStats) -> Stats {
    Stats {
        by_status: StatusCounts {
            pending: s.pending,
            running: s.running,
            unknown: s.unknown,
            conflict: s.conflict,
            failed: s.failed,
            completed: s.completed,
        },
        total: s.total,
        reconcile_required: s.reconcile_required,
        disputed: s.disputed,
        stuck: s.stuck,
        quarantined: s.quarantined,
        quarantined_records: s.quarantined_records,
        refused: s.refused,
    }
}

/// Counts over the tenant's records (SPEC §9).
#[utoipa::path(
    get, path = "/v1/stats", tag = "inspection",
    responses(
        (status = 200, description = "The caller's tenant's counts", body = Stats),
        V1Errors,
    )
)]
pub async fn stats(State(st): State<Arc<AppState>>, req: Request) -> Response {
    finish(Route::Stats, stats_inner(&st, req).await)
}

async fn stats_inner(st: &AppState, req: Request) -> Result<Response, Problem> {
    let (parts, _body) = req.into_parts();
    let live = st.live();
    let tenant = live.admit(&parts.headers)?;
    if parts.uri.query().is_some_and(|q| !q.is_empty()) {
        return Err(Problem::invalid(
            "query",
            "GET /v1/stats takes no parameters",
        ));
    }
    let s = inspect::tenant_stats(&*st.store, tenant, live.stuck_after_ms)
        .await
        .map_err(|e| store_error("stats", None, &e))?;
    Ok(json(&stats_body(&s)))
}

/// `/console` → `/console/` (the page's relative links need the slash).
pub async fn console_redirect() -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = axum::http::StatusCode::PERMANENT_REDIRECT;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/console/"));
    resp
}

/// The console's embedded files (SPEC §9). Public: the page holds no data;
/// everything it shows comes from the authenticated `/v1` API.
pub async fn console(req: Request) -> Response {
    let path = req.uri().path();
    let file = path.strip_prefix("/console/").unwrap_or("");
    let Some(asset) = settle_console::asset(file) else {
        return Problem::not_found(format!("no console file {file:?}")).into_response();
    };
    let mut resp = Response::new(Body::from(asset.bytes));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(settle_console::CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The files change only with the binary.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Publishes the quarantine gauges: the sum of the configured tenants'
/// counts. Quarantined evidence is kept on terminal records too, which the
/// engines' open-record gauges do not read, so this is a scan of every
/// configured tenant's records, run at most once per `metrics_refresh_ms`
/// (`metrics::Gauges`; see docs/operations.md).
pub async fn publish_quarantine(st: &AppState) {
    let (mut entries, mut records) = (0u64, 0u64);
    let live = st.live();
    for t in live.auth.tenants() {
        match inspect::tenant_stats(&*st.store, &t, live.stuck_after_ms).await {
            Ok(s) => {
                entries += s.quarantined;
                records += s.quarantined_records;
            }
            Err(e) => {
                tracing::warn!(error = %e, "quarantine counts unavailable for /metrics");
                return;
            }
        }
    }
    metrics::gauge!("settle_records_quarantined").set(entries as f64);
    metrics::gauge!("settle_records_quarantined_records").set(records as f64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_core::Key;

    #[test]
    fn query_parsing_accepts_the_spec_and_refuses_the_rest() {
        let q = parse_list_query(
            Some("status=pending,unknown&stuck=true&limit=5&key_prefix=ord%2D&after=6b"),
            1000,
        )
        .unwrap();
        assert_eq!(
            q.filter.statuses,
            [ListStatus::Pending, ListStatus::Unknown]
        );
        assert_eq!(q.filter.stuck, Some(true));
        assert_eq!(q.limit, 5);
        assert_eq!(q.filter.key_prefix.as_deref(), Some("ord-"));
        assert_eq!(q.after, Some(Cursor::Key(Key::new("k").unwrap())));
        assert_eq!(q.order, ListOrder::Key);
        assert_eq!(parse_list_query(None, 1).unwrap().limit, 100);
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=x",
            "status=runnin",
            "stuck=yes",
            "after=zz",
            "after=20",
            "color=red",
            "stuck=true&stuck=false",
            "key_prefix=",
            "order=time",
            // Hex, but not a position (a NUL byte; a space alone).
            "after=00",
            "after=7520",
        ] {
            assert_eq!(
                parse_list_query(Some(bad), 1).unwrap_err().status,
                422,
                "{bad}"
            );
        }
        let k = Cursor::Key(Key::new("a/b?c").unwrap());
        assert_eq!(parse_cursor(&cursor(&k)).unwrap(), k);
        let u = Cursor::Ordered {
            order: ListOrder::Updated,
            bucket: 0,
            updated_at: settle_core::Timestamp(9),
            key: Key::new("k").unwrap(),
        };
        let q = parse_list_query(Some(&format!("order=updated&after={}", cursor(&u))), 1).unwrap();
        assert_eq!(
            (q.order, q.after.clone()),
            (ListOrder::Updated, Some(u.clone()))
        );
        // The cursor carries the order: another `order` does not change
        // which listing the page continues.
        let q = parse_list_query(Some(&format!("order=key&after={}", cursor(&u))), 1).unwrap();
        assert_eq!((q.order, q.after), (ListOrder::Updated, Some(u)));
        let q = parse_list_query(Some("order=attention&after=6b"), 1).unwrap();
        assert_eq!(q.order, ListOrder::Key);
    }

    /// `CURSOR_PATTERN` admits exactly the cursors the server takes: every
    /// cursor it writes matches, and every value matching it parses (a
    /// sample of each form, at the edges of each part).
    #[test]
    fn the_cursor_pattern_is_exactly_the_cursors_taken() {
        let doc: serde_json::Value =
            serde_json::from_slice(&crate::openapi::document(100)).unwrap();
        let after = doc["paths"]["/v1/operations"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "after")
            .unwrap();
        assert_eq!(after["schema"]["pattern"], CURSOR_PATTERN);
        let re = regex_lite::Regex::new(CURSOR_PATTERN).unwrap();
        let key = |s: &str| Key::new(s).unwrap();
        let longest = "~".repeat(255);
        let written = [
            Cursor::Key(key("!")),
            Cursor::Key(key(&longest)),
            Cursor::Key(key("a/b?c")),
            Cursor::Ordered {
                order: ListOrder::Updated,
                bucket: 0,
                updated_at: settle_core::Timestamp(0),
                key: key("k"),
            },
            Cursor::Ordered {
                order: ListOrder::Attention,
                bucket: 3,
                updated_at: settle_core::Timestamp(1_765_000_000_000),
                key: key(&longest),
            },
        ];
        for c in &written {
            let text = cursor(c);
            assert!(
                re.is_match(&text),
                "{c:?} wrote {text}, which the pattern refuses"
            );
            assert_eq!(&parse_cursor(&text).unwrap(), c);
        }
        // Matching values that no server wrote still parse: leading zeros,
        // 18 digits, the highest bucket.
        for text in [
            "0001",
            "u 000000000000000000 !",
            "u 999999999999999999 ~",
            "a 3 1 x",
        ] {
            let hexed = hex::encode(text);
            assert!(re.is_match(&hexed), "{text}");
            parse_cursor(&hexed).unwrap_or_else(|e| panic!("{text}: {e:?}"));
        }
        // Refused, and outside the pattern.
        for text in [
            "",
            " ",
            "u  k",
            "u 1",
            "u +1 k",
            "a 4 1 k",
            "u 1234567890123456789 k",
            "k\u{7f}",
            "a b",
        ] {
            let hexed = hex::encode(text);
            assert!(!re.is_match(&hexed), "the pattern admits {text:?}");
            assert!(parse_cursor(&hexed).is_err(), "{text:?} parsed");
        }
    }
}
