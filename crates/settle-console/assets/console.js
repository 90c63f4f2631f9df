// The settle operator console (SPEC §9). One ES module, no framework:
// it calls the same /v1 API as any client, with the tenant token kept in
// this tab's sessionStorage only. Every value from the server is put into
// the page as text (never as HTML).

const TOKEN = "settle.console.token";
const $ = (id) => document.getElementById(id);

/** Builds an element: h("td", {class: "key"}, "text", child, ...). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v == null) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function token() {
  return sessionStorage.getItem(TOKEN);
}

/** Whether the server runs without authentication (no tenants, loopback
 *  only: `/v1/stats` answers without a token). The console then asks for
 *  no token and offers no sign-out. */
let authOff = false;

async function probeAuthOff() {
  try {
    const resp = await fetch("/v1/stats", { headers: { Accept: "application/json" } });
    return resp.ok;
  } catch {
    return false;
  }
}

class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code;
  }
}

/** One API call; a problem+json answer becomes an ApiError. */
async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, { detail: `the server did not answer (${e.message})` });
  }
  const text = await resp.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = null; }
  if (!resp.ok) {
    if (resp.status === 401 && (token() !== null || authOff)) {
      // A server that now wants a token (or refuses this one): ask for it.
      authOff = false;
      signOut(token() === null ? "The server now asks for a tenant token; sign in." : "Your token was refused; sign in again.");
    }
    throw new ApiError(resp.status, json);
  }
  return json;
}

const seg = (s) => encodeURIComponent(s);

function say(msg) {
  const s = $("status");
  s.textContent = msg;
  s.hidden = false;
  clearTimeout(say.t);
  say.t = setTimeout(() => { s.hidden = true; }, 6000);
}

function errorBox(e) {
  return h("p", { class: "error", role: "alert" },
    e.status === 0 ? e.message : `Error ${e.status}${e.code ? ` (${e.code})` : ""}: ${e.message}`);
}

function fmtTime(t) {
  return t ? t.replace("T", " ").replace("Z", " UTC") : "–";
}

// ---- the middleware's ledger key (SPEC §8, sdk/MIDDLEWARE-KEYS.md) ----

const K256 = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

/** SHA-256 (FIPS 180-4) in plain JavaScript, for pages without
 *  `crypto.subtle` (plain HTTP off loopback is not a secure context). */
export function sha256Fallback(bytes) {
  const H = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
  const buf = new Uint8Array(Math.ceil((bytes.length + 9) / 64) * 64);
  buf.set(bytes);
  buf[bytes.length] = 0x80;
  const dv = new DataView(buf.buffer);
  const bits = bytes.length * 8;
  dv.setUint32(buf.length - 8, Math.floor(bits / 0x100000000));
  dv.setUint32(buf.length - 4, bits >>> 0);
  const W = new Uint32Array(64);
  const rotr = (x, n) => (x >>> n) | (x << (32 - n));
  for (let off = 0; off < buf.length; off += 64) {
    for (let i = 0; i < 16; i++) W[i] = dv.getUint32(off + 4 * i);
    for (let i = 16; i < 64; i++) {
      const s0 = rotr(W[i - 15], 7) ^ rotr(W[i - 15], 18) ^ (W[i - 15] >>> 3);
      const s1 = rotr(W[i - 2], 17) ^ rotr(W[i - 2], 19) ^ (W[i - 2] >>> 10);
      W[i] = W[i - 16] + s0 + W[i - 7] + s1;
    }
    let [a, b, c, d, e, f, g, hh] = H;
    for (let i = 0; i < 64; i++) {
      const t1 = (hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + W[i]) >>> 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) >>> 0;
      hh = g; g = f; f = e; e = (d + t1) >>> 0;
      d = c; c = b; b = a; a = (t1 + t2) >>> 0;
    }
    H[0] += a; H[1] += b; H[2] += c; H[3] += d; H[4] += e; H[5] += f; H[6] += g; H[7] += hh;
  }
  const out = new Uint8Array(32);
  const ov = new DataView(out.buffer);
  H.forEach((x, i) => ov.setUint32(4 * i, x));
  return out;
}

/** Lowercase hex SHA-256: `crypto.subtle` when the page has it, else the
 *  module's own. */
export async function sha256Hex(bytes) {
  const subtle = globalThis.crypto?.subtle;
  return hex(subtle ? new Uint8Array(await subtle.digest("SHA-256", bytes)) : sha256Fallback(bytes));
}

/** The ledger key of a middleware record: "mw-" + hex SHA-256(F(namespace)
 *  || F(principal) || F(key)), F = 4-byte big-endian UTF-8 length, bytes. */
export async function ledgerKey(namespace, principal, key) {
  const parts = [namespace, principal, key].map((x) => new TextEncoder().encode(x));
  const buf = new Uint8Array(parts.reduce((n, p) => n + 4 + p.length, 0));
  const dv = new DataView(buf.buffer);
  let at = 0;
  for (const p of parts) {
    dv.setUint32(at, p.length);
    buf.set(p, at + 4);
    at += 4 + p.length;
  }
  return `mw-${await sha256Hex(buf)}`;
}

class KeyInvalid extends Error {}

/** An RFC 8941 sf-string starting at v[i] (a quote): [text, index after it]. */
function sfString(v, i) {
  let out = "";
  for (i += 1; i < v.length; i++) {
    const c = v[i];
    if (c === "\\") {
      const e = v[i + 1];
      if (e !== '"' && e !== "\\") throw new KeyInvalid("bad escape in an sf-string (only \\\" and \\\\)");
      out += e;
      i += 1;
    } else if (c === '"') {
      return [out, i + 1];
    } else if (c < " " || c > "~") {
      throw new KeyInvalid("bad character in an sf-string");
    } else {
      out += c;
    }
  }
  throw new KeyInvalid("unterminated sf-string");
}

const PARAM_KEY = /^[a-z*][a-z0-9_.*-]*/;
// A token, a decimal, an integer, a byte sequence or a boolean (MIDDLEWARE-KEYS.md).
const BARE_ITEM = /^(?:[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*|-?[0-9]{1,12}\.[0-9]{1,3}|-?[0-9]{1,15}|:[A-Za-z0-9+/=]*:|\?[01])/;

/** The key an Idempotency-Key header value carries, as every settle
 *  middleware reads it: spaces and tabs trimmed; a value starting with a
 *  quote is an sf-string with optional parameters (parsed and ignored),
 *  any other value is the key as sent; then 1-255 visible ASCII. Throws
 *  an Error saying what is wrong. */
export function parseIdempotencyKey(header) {
  const v = header.replace(/^[ \t]+|[ \t]+$/g, "");
  let key = v;
  if (v.startsWith('"')) {
    let i;
    [key, i] = sfString(v, 0);
    while (i < v.length) {
      if (v[i] !== ";") throw new KeyInvalid(`unexpected ${JSON.stringify(v[i])} after the key (only ;parameters may follow)`);
      i += 1;
      while (v[i] === " ") i += 1;
      const k = PARAM_KEY.exec(v.slice(i));
      if (!k) throw new KeyInvalid("a parameter needs a lower-case key");
      i += k[0].length;
      if (v[i] === "=") {
        i += 1;
        if (v[i] === '"') {
          i = sfString(v, i)[1];
        } else {
          const item = BARE_ITEM.exec(v.slice(i));
          if (!item) throw new KeyInvalid("a parameter's value is not an sf-string, token, number, byte sequence or boolean");
          i += item[0].length;
        }
      }
    }
  }
  if (!/^[\x21-\x7e]{1,255}$/.test(key)) throw new KeyInvalid("the key must be 1-255 visible ASCII characters");
  return key;
}

// ---- sign in ----

function signOut(msg) {
  sessionStorage.removeItem(TOKEN);
  location.hash = "#/";
  route();
  if (msg) {
    const e = $("signin-error");
    e.textContent = msg;
    e.hidden = false;
  }
}

async function signIn(ev) {
  ev.preventDefault();
  const err = $("signin-error");
  err.hidden = true;
  const t = $("token").value.trim();
  sessionStorage.setItem(TOKEN, t);
  const btn = ev.submitter || ev.target.querySelector("button");
  btn.disabled = true;
  try {
    await api("GET", "/v1/stats");
    $("token").value = "";
    location.hash = "#/";
    route();
  } catch (e) {
    sessionStorage.removeItem(TOKEN);
    err.textContent = e.status === 401 ? "That token was refused." : e.message;
    err.hidden = false;
    $("token").focus();
  } finally {
    btn.disabled = false;
  }
}

// ---- overview: stats and the list ----

const STAT_CARDS = [
  ["stuck", "stuck", (s) => s.stuck, { stuck: "true" }],
  ["reconcile_required", "reconcile required", (s) => s.reconcile_required, { reconcile_required: "true" }],
  ["disputed", "disputed", (s) => s.disputed, { disputed: "true" }],
  ["quarantined", "quarantined evidence", (s) => s.quarantined, { quarantined: "true" }],
  ["unknown", "unknown", (s) => s.by_status.unknown, { status: "unknown" }],
  ["running", "running", (s) => s.by_status.running, { status: "running" }],
  ["pending", "pending", (s) => s.by_status.pending, { status: "pending" }],
  ["conflict", "conflict", (s) => s.by_status.conflict, { status: "conflict" }],
  ["failed", "failed", (s) => s.by_status.failed, { status: "failed" }],
  ["completed", "completed", (s) => s.by_status.completed, { status: "completed" }],
  ["total", "total", (s) => s.total, {}],
  ["refused", "refused (§6.9)", (s) => s.refused, null],
];
const ALERTING = new Set(["stuck", "reconcile_required", "disputed", "quarantined", "refused"]);

async function loadStats() {
  const box = $("stats");
  box.setAttribute("aria-busy", "true");
  try {
    const s = await api("GET", "/v1/stats");
    box.replaceChildren(...STAT_CARDS.map(([id, label, get, filter]) => {
      const n = get(s);
      const cls = `stat${ALERTING.has(id) && n > 0 ? " alert" : ""}`;
      const inner = [h("span", { class: "n" }, n), h("span", { class: "l" }, label)];
      return filter
        ? h("button", { type: "button", class: cls, "data-stat": id, "aria-label": `${n} ${label}: show them`,
            onclick: () => setFilters(filter) }, inner)
        : h("div", { class: cls, "data-stat": id }, inner);
    }));
  } catch (e) {
    box.replaceChildren(errorBox(e));
  } finally {
    box.setAttribute("aria-busy", "false");
  }
}

/** The listing state: filters and order from the form (the cursors carry
 *  the order, so every page is asked with the same query), the cursor
 *  stack for paging. */
const listing = { query: "", order: "key", cursors: [null], page: 0, next: null };

const ORDERS = {
  key: "in key order",
  updated: "recently updated first",
  attention: "needs attention first (reconcile required, disputed, stuck, then the rest; recently updated first within each)",
};

function formQuery() {
  const f = new FormData($("filters"));
  const p = new URLSearchParams();
  const st = f.getAll("status");
  if (st.length) p.set("status", st.join(","));
  for (const flag of ["stuck", "reconcile_required", "disputed", "quarantined"]) {
    if (f.get(flag)) p.set(flag, "true");
  }
  const prefix = String(f.get("key_prefix") || "").trim();
  if (prefix) p.set("key_prefix", prefix);
  const order = String(f.get("order") || "key");
  if (order !== "key") p.set("order", order);
  p.set("limit", String(f.get("limit") || "50"));
  return p.toString();
}

function takeQuery() {
  listing.query = formQuery();
  listing.order = new URLSearchParams(listing.query).get("order") || "key";
}

function setFilters(filter) {
  const form = $("filters");
  const order = form.elements.order.value;
  form.reset();
  form.elements.order.value = order;
  for (const [k, v] of Object.entries(filter)) {
    const box = form.querySelector(`input[name="${k}"][value="${v}"]`);
    if (box) box.checked = true;
  }
  applyFilters();
}

function applyFilters(ev) {
  ev?.preventDefault();
  takeQuery();
  listing.cursors = [null];
  listing.page = 0;
  loadPage();
}

function badge(text, cls) {
  return h("span", { class: `badge ${cls}` }, text);
}

function flags(o) {
  return [
    o.stuck && badge("stuck", "f-stuck"),
    o.reconcile_required && badge("reconcile required", "f-reconcile"),
    o.disputed && badge("disputed", "f-disputed"),
    o.quarantined > 0 && badge(`quarantined ${o.quarantined}`, "f-quarantined"),
  ];
}

async function loadPage() {
  const box = $("list");
  box.setAttribute("aria-busy", "true");
  box.replaceChildren(h("p", { class: "loading" }, "Loading operations…"));
  const after = listing.cursors[listing.page];
  const q = listing.query || "limit=50";
  try {
    const r = await api("GET", `/v1/operations?${q}${after ? `&after=${seg(after)}` : ""}`);
    listing.next = r.next;
    if (r.operations.length === 0) {
      box.replaceChildren(h("p", { class: "empty" }, r.next
        ? "No matching operations in this stretch of the scan; it continues on the next page."
        : (listing.page === 0 ? "No operations match these filters." : "No more operations.")));
    } else {
      box.replaceChildren(h("table", {},
        h("caption", {}, `Operations, page ${listing.page + 1}, ${ORDERS[listing.order]}`),
        h("thead", {}, h("tr", {}, ["Key", "Status", "Attention", "Lease", "Attempts", "Updated"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, r.operations.map((o) => h("tr", { "data-key": o.key },
          h("td", { class: "key", "data-label": "Key" }, h("a", { href: `#/op/${seg(o.key)}` }, o.key)),
          h("td", { "data-label": "Status" }, badge(o.status, `s-${o.status}`)),
          h("td", { "data-label": "Attention" }, flags(o)),
          h("td", { "data-label": "Lease" }, o.lease ? `${o.lease.purpose} · fence ${o.lease.fence}${o.lease.dispatched ? " · dispatched" : ""}` : "–"),
          h("td", { "data-label": "Attempts" }, o.attempts),
          h("td", { "data-label": "Updated" }, fmtTime(o.updated_at)),
        )))));
    }
  } catch (e) {
    listing.next = null;
    box.replaceChildren(errorBox(e));
  } finally {
    box.setAttribute("aria-busy", "false");
    $("prev").disabled = listing.page === 0;
    $("first").disabled = listing.page === 0;
    $("next").disabled = !listing.next;
    $("pageinfo").textContent = `Page ${listing.page + 1}${listing.next ? "" : " (last)"}`;
  }
}

function nextPage() {
  if (!listing.next) return;
  listing.cursors[listing.page + 1] = listing.next;
  listing.page += 1;
  loadPage();
}

function prevPage() {
  if (listing.page === 0) return;
  listing.page -= 1;
  loadPage();
}

function firstPage() {
  listing.page = 0;
  loadPage();
}

// ---- one record: the timeline and the reconcile action ----

function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function leaseText(l) {
  const end = l.ended ? `ended ${fmtTime(l.ended.at)} (${l.ended.reason})` : `open until ${fmtTime(l.expires_at)}`;
  return `${l.purpose} lease · fence ${l.fence} · generation ${l.generation} · ${end}`;
}

/** A time for sorting: milliseconds, or `fallback` when there is none. */
function timeOf(t, fallback) {
  const ms = t ? Date.parse(t) : NaN;
  return Number.isNaN(ms) ? fallback : ms;
}

function quarantineEntry(q, r) {
  const b = q.binding;
  const foreignFp = q.fingerprint && q.fingerprint !== r.reservation.fingerprint;
  return h("li", { class: "bad" }, h("strong", {}, "Quarantined evidence"), " ",
    h("span", { class: "when" }, fmtTime(q.at)),
    h("p", {}, `${q.call} under fence ${q.fence} refused: ${q.reason}`),
    kv([
      ["principal", b ? `${b.principal} (generation ${b.generation})` : "–"],
      b && ["scopes", b.scopes.join(", ") || "–"],
      q.status && ["reported status", q.status],
      q.finding && ["reported finding", q.finding],
      q.response_sha256 && ["response_sha256", h("code", {}, q.response_sha256)],
      q.fingerprint && ["fingerprint", [h("code", {}, q.fingerprint), foreignFp ? " (not the reservation's)" : ""]],
    ]));
}

/** One record's history, every entry in time order (equal times keep the
 *  order they are built in: reservation, attempts, receipt, quarantine). */
function timeline(r) {
  const created = timeOf(r.created_at, 0);
  const entries = [];
  const add = (at, el) => {
    if (at) el.dataset.at = at;
    entries.push({ t: timeOf(at, Infinity), el });
  };
  add(r.created_at, h("li", {}, h("strong", {}, "Reserved"), " ", h("span", { class: "when" }, fmtTime(r.created_at)),
    kv([["fingerprint", h("code", {}, r.reservation.fingerprint)],
        ["principal", `${r.reservation.principal} (generation ${r.reservation.generation})`],
        ["scopes", r.reservation.scopes.join(", ") || "–"]])));
  if (r.attempts_total > r.attempts.length) {
    entries.push({ t: created, el: h("li", {}, `${r.attempts_total - r.attempts.length} older attempts not kept`) });
  }
  for (const a of r.attempts) {
    const l = a.lease;
    const parts = [
      h("strong", {}, `Attempt ${a.number}: claimed`), " ", h("span", { class: "when" }, fmtTime(l.granted_at)),
      h("p", {}, leaseText(l)),
      l.worker && kv([["worker", h("code", {}, l.worker)]]),
      l.marks_dispatch && h("p", {}, l.dispatched ? "Dispatch recorded: the remote write may have started." : "Not dispatched."),
    ];
    if (a.observations.length) {
      parts.push(h("ul", {}, a.observations.map((o) => h("li", {},
        h("span", { class: "when" }, fmtTime(o.at)), ` ${o.call}`,
        o.status ? ` ${o.status}` : "", o.finding ? ` ${o.finding}` : "",
        o.accepted ? " — accepted" : ` — refused${o.code ? ` (${o.code})` : ""}`))));
    }
    if (a.receipt) parts.push(h("p", {}, `Receipt: ${a.receipt.status} at ${fmtTime(a.receipt.committed_at)}`));
    if (a.error) parts.push(h("p", {}, `Error reported: ${a.error}`));
    add(l.granted_at, h("li", { class: a.receipt?.status === "unknown" ? "bad" : "" }, parts));
  }
  if (r.receipt) {
    add(r.receipt.committed_at, h("li", {}, h("strong", {}, `Settled ${r.receipt.status}`), " ", h("span", { class: "when" }, fmtTime(r.receipt.committed_at)),
      r.outcome?.result !== undefined && h("pre", {}, JSON.stringify(r.outcome.result, null, 2))));
  }
  if (r.quarantine_total > r.quarantine.length) {
    const first = Math.min(...r.quarantine.map((q) => timeOf(q.at, Infinity)));
    entries.push({ t: first, el: h("li", { class: "bad" }, `${r.quarantine_total - r.quarantine.length} older quarantined entries not kept`) });
  }
  for (const q of r.quarantine) add(q.at, quarantineEntry(q, r));
  // Array.prototype.sort is stable.
  entries.sort((x, y) => x.t - y.t);
  const items = entries.map((e) => e.el);
  if (r.reconcile_required) {
    items.push(h("li", { class: "bad" }, h("strong", {}, "Reconcile required"),
      h("p", {}, "The effect may or may not have happened. No new execution is allowed until someone finds out and reports it.")));
  }
  return h("ol", { class: "timeline", "aria-label": "Timeline" }, items);
}

/** The claim's worker label of the latest attempt (the middlewares write
 *  `idempotency-key=<key> principal=<binding principal>` there). */
function latestWorker(r) {
  return r.attempts.at(-1)?.lease.worker ?? r.lease?.worker ?? null;
}

/** The last search by Idempotency-Key: the ledger key and how it was found. */
let found = null;

async function findRecord(ev) {
  ev.preventDefault();
  const form = $("find");
  const err = $("find-error");
  err.hidden = true;
  let key;
  try {
    if (form.elements.mode.value === "idempotency") {
      const header = parseIdempotencyKey($("find-header").value);
      const principal = $("find-principal").value;
      const namespace = $("find-namespace").value;
      key = await ledgerKey(namespace, principal, header);
      found = { key, text: `Ledger key computed from Idempotency-Key ${header}, principal ${principal === "" ? "(empty)" : principal}, namespace ${namespace === "" ? "(empty)" : namespace}.` };
    } else {
      key = $("find-key").value.trim();
      if (!key) throw new Error("Give the ledger key.");
    }
  } catch (e) {
    err.textContent = e instanceof KeyInvalid ? `Not a valid Idempotency-Key: ${e.message}.` : e.message;
    err.hidden = false;
    return;
  }
  location.hash = `#/op/${seg(key)}`;
}

function findMode() {
  const byHeader = $("find").elements.mode.value === "idempotency";
  $("find-by-key").hidden = byHeader;
  $("find-by-header").hidden = !byHeader;
  $("find-hint").hidden = !byHeader;
  $("find-error").hidden = true;
}

/** A notice shown above a record (what an action just did). */
function notice(text, alert = false) {
  return h("div", { class: `card notice${alert ? " alert" : ""}`, role: alert ? "alert" : "status" }, text);
}

async function loadRecord(key, note = null) {
  const body = $("record-body");
  $("record-h").textContent = `Operation ${key}`;
  body.setAttribute("aria-busy", "true");
  body.replaceChildren(h("p", { class: "loading" }, "Loading the record…"));
  try {
    const r = await api("GET", `/v1/operations/${seg(key)}`);
    body.replaceChildren(
      note ?? "",
      h("div", { class: "card" },
        h("p", {}, badge(r.status, `s-${r.status}`), flags({ ...r, stuck: false, quarantined: r.quarantine_total })),
        found?.key === key && h("p", {}, found.text),
        kv([latestWorker(r) && ["worker", h("code", {}, latestWorker(r))],
            ["updated", fmtTime(r.updated_at)],
            ["attempts", r.attempts_total],
            r.settled_at && ["settled", fmtTime(r.settled_at)],
            r.expires_at && ["collected after", fmtTime(r.expires_at)]])),
      h("h3", {}, "Timeline"),
      timeline(r),
      ...(r.reconcile_required ? [reconcileForm(r)] : []),
    );
  } catch (e) {
    body.replaceChildren(e.status === 404
      ? h("p", { class: "empty" }, "No such operation (or it was collected after its retention).",
        found?.key === key ? ` ${found.text} The ledger key depends on all three: check the principal and the namespace.` : "")
      : errorBox(e));
  } finally {
    body.setAttribute("aria-busy", "false");
  }
}

function reconcileForm(r) {
  const form = h("form", { class: "card actions", id: "reconcile-form", "aria-labelledby": "reconcile-h" },
    h("h3", { id: "reconcile-h" }, "Reconcile"),
    h("p", {}, "Find out, outside settle, whether the effect happened (ask the remote system by this key), then report it. The console acts as a worker would: it claims the reconcile lease with the reservation's fingerprint and binding, and reports your finding under it."),
    h("fieldset", {},
      h("legend", {}, "Finding"),
      h("label", {}, h("input", { type: "radio", name: "finding", value: "not_committed", checked: true }),
        h("span", {}, h("strong", {}, "not committed"), " — the effect did not happen. The reconcile requirement is cleared and the next worker's claim executes it (the status keeps its rank).")),
      h("label", {}, h("input", { type: "radio", name: "finding", value: "committed" }),
        h("span", {}, h("strong", {}, "committed"), " — it happened; give its outcome. The record settles with it.")),
      h("label", {}, h("input", { type: "radio", name: "finding", value: "unavailable" }),
        h("span", {}, h("strong", {}, "unavailable"), " — you could not find out; nothing changes."))),
    h("div", { id: "committed-fields", hidden: true },
      h("label", { for: "rc-status" }, "Outcome status"), " ",
      h("select", { id: "rc-status", name: "status" }, h("option", {}, "completed"), h("option", {}, "failed")),
      h("p", {}, h("label", { for: "rc-result" }, "Result (JSON)")),
      h("textarea", { id: "rc-result", name: "result", spellcheck: "false" }, "{}"),
      h("p", {}, h("label", { for: "rc-sha" }, "response_sha256 (64 hex digits)")),
      h("input", { id: "rc-sha", name: "response_sha256", size: 66, spellcheck: "false", autocomplete: "off" })),
    h("div", { class: "row" }, h("button", { type: "submit", class: "danger" }, "Reconcile…")),
    h("div", { id: "reconcile-result", "aria-live": "polite" }));
  form.addEventListener("change", () => {
    form.querySelector("#committed-fields").hidden = form.elements.finding.value !== "committed";
  });
  form.addEventListener("submit", (ev) => { ev.preventDefault(); reconcile(r, form); });
  return form;
}

async function reconcile(r, form) {
  const finding = form.elements.finding.value;
  const out = form.querySelector("#reconcile-result");
  let outcome;
  if (finding === "committed") {
    let result;
    try { result = JSON.parse(form.elements.result.value); } catch (e) {
      out.replaceChildren(h("p", { class: "error", role: "alert" }, `The result is not JSON: ${e.message}`));
      return;
    }
    const sha = form.elements.response_sha256.value.trim();
    if (!/^[0-9a-f]{64}$/.test(sha)) {
      out.replaceChildren(h("p", { class: "error", role: "alert" }, "response_sha256 must be 64 lowercase hex digits."));
      return;
    }
    outcome = { status: form.elements.status.value, result, response_sha256: sha };
  }
  const what = {
    not_committed: "report that the effect did NOT happen. The reconcile requirement is cleared and the next worker's claim executes it again.",
    committed: `report that the effect happened with outcome ${outcome?.status}. The record settles with it; retries get this outcome.`,
    unavailable: "report that you could not find out. Nothing changes; the record still requires reconciliation.",
  }[finding];
  if (!(await confirmDialog("Reconcile this operation?", [
    h("p", {}, `You are about to ${what}`),
    h("p", {}, `Key: ${r.key}. This is recorded durably and cannot be undone.`),
  ]))) return;
  const binding = { principal: r.reservation.principal, scopes: r.reservation.scopes, generation: r.reservation.generation };
  const key = seg(r.key);
  out.replaceChildren(h("p", { class: "loading" }, "Reconciling…"));
  try {
    // Look again first: since the page was drawn someone may have
    // reconciled the record, or it settled and was collected; a claim
    // would then execute it (or create it afresh).
    let now;
    try {
      now = await api("GET", `/v1/operations/${key}`);
    } catch (e) {
      if (e.status === 404) return loadRecord(r.key);
      throw e;
    }
    if (!now.reconcile_required) {
      return loadRecord(r.key, notice("Nothing was reported: the record no longer requires reconciliation (someone reported a finding meanwhile).", true));
    }
    // marks_dispatch: the lease says whether anything was sent, so an
    // execute lease can be released as not_dispatched.
    const claim = await api("POST", `/v1/operations/${key}/claim`, { fingerprint: r.reservation.fingerprint, binding, marks_dispatch: true });
    if (claim.decision === "execute") {
      // Reconciled (or collected) between the look and the claim: the
      // console holds an execute lease it will never use. Let go at once,
      // or a real worker waits in_flight for the whole lease.
      await api("POST", `/v1/operations/${key}/release`, { fence: claim.fence, reason: "not_dispatched" });
      return loadRecord(r.key, notice(`Nothing was reported: the record no longer required reconciliation, and the claim answered execute. The console released that lease (fence ${claim.fence}, not_dispatched) at once, so a worker's claim executes now.`, true));
    }
    if (claim.decision !== "reconcile") {
      return loadRecord(r.key, notice(claim.decision === "in_flight"
        ? "Nothing was reported: someone holds the record's lease right now; try again shortly."
        : `Nothing was reported: the claim answered ${claim.decision}; the record no longer requires reconciliation.`, true));
    }
    const body = { fence: claim.fence, finding };
    if (finding === "committed") Object.assign(body, { fingerprint: r.reservation.fingerprint, binding, outcome });
    await api("POST", `/v1/operations/${key}/reconcile`, body);
    if (finding === "not_committed") {
      // not_committed continues as an execute lease under the same fence;
      // the console executes nothing, so it lets go (nothing was sent).
      await api("POST", `/v1/operations/${key}/release`, { fence: claim.fence, reason: "not_dispatched" });
    }
    say(`Reconciled ${r.key}: ${finding.replace("_", " ")}.`);
    await loadRecord(r.key, finding === "not_committed"
      ? notice(`Finding not_committed recorded. The execute lease it became (fence ${claim.fence}) was released (not_dispatched): the next worker's claim executes.`)
      : null);
  } catch (e) {
    out.replaceChildren(errorBox(e));
  }
}

/** A modal confirmation; resolves true only on the confirm button. */
function confirmDialog(title, body) {
  const d = $("confirm");
  $("confirm-h").textContent = title;
  $("confirm-text").replaceChildren(...body);
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.returnValue = "cancel";
    d.showModal();
    $("confirm-cancel").focus();
  });
}

// ---- the list's selection: reconcile all as not committed ----

/** The worker label of the bulk action's claims (SPEC §9). */
const BULK_WORKER = "settle-console";
/** Records handled at once. */
const BULK_PARALLEL = 4;
/** At most this many keys are shown in the confirmation. */
const BULK_SHOWN = 5;

const bulk = { running: false, stop: false };

/** The list's filters in words (order and page size aside). */
function describeQuery(query) {
  const p = new URLSearchParams(query);
  const parts = [];
  if (p.get("key_prefix")) parts.push(`key prefix “${p.get("key_prefix")}”`);
  if (p.get("status")) parts.push(`status ${p.get("status").split(",").join(" or ")}`);
  for (const f of ["stuck", "disputed", "quarantined"]) if (p.get(f)) parts.push(f);
  return parts.length ? parts.join(", ") : "no filter: every record";
}

/** Every key of the selection `query` that requires reconciliation, in the
 *  list's order, every page (the cursor carries the order). */
async function selectionKeys(query, progress) {
  const p = new URLSearchParams(query);
  p.set("reconcile_required", "true");
  p.set("limit", "1000");
  p.delete("after");
  const keys = [];
  const seen = new Set();
  let after = null;
  do {
    const r = await api("GET", `/v1/operations?${p}${after ? `&after=${seg(after)}` : ""}`);
    for (const o of r.operations) {
      if (!seen.has(o.key)) { seen.add(o.key); keys.push(o.key); }
    }
    after = r.next;
    progress(keys.length);
  } while (after);
  return keys;
}

/** Hands back a lease the console will not use (nothing was sent); one
 *  that already ended is let go already. */
async function releaseUnused(k, fence) {
  try {
    await api("POST", `/v1/operations/${k}/release`, { fence, reason: "not_dispatched" });
  } catch (e) {
    if (e.status === 409 && (e.code === "stale_fence" || e.code === "lease_expired")) return;
    throw e;
  }
}

/** One record of the selection, as the SDK Reconciler with a hook that
 *  says not_committed (and `settle reconcile --key-prefix`): the stored
 *  reservation, the principal's current generation, marks_dispatch; the
 *  finding under the reconcile lease, then the execute lease it became is
 *  released. Resolves {reconciled: true} or {skipped: why}; throws when a
 *  call failed (before the finding: the record is as it was; after it:
 *  reconciled, the unreleased lease runs out). */
async function reconcileNotCommitted(key) {
  const k = seg(key);
  let r;
  try {
    r = await api("GET", `/v1/operations/${k}`);
  } catch (e) {
    if (e.status === 404) return { skipped: "collected meanwhile" };
    throw e;
  }
  if (!r.reconcile_required) return { skipped: "no longer requires reconciliation" };
  const res = r.reservation;
  const current = await api("GET", `/v1/principals/${seg(res.principal)}`);
  const binding = { principal: res.principal, scopes: res.scopes, generation: Math.max(current.generation, res.generation) };
  let claim;
  try {
    claim = await api("POST", `/v1/operations/${k}/claim`,
      { fingerprint: res.fingerprint, binding, marks_dispatch: true, worker: BULK_WORKER });
  } catch (e) {
    if (e.status === 409) return { skipped: `the claim was refused (${e.code ?? "conflict"})` };
    throw e;
  }
  if (claim.decision === "execute") {
    // Resolved meanwhile: the console executes nothing; let go at once.
    await releaseUnused(k, claim.fence);
    return { skipped: `resolved meanwhile (the execute lease it was granted, fence ${claim.fence}, was released)` };
  }
  if (claim.decision !== "reconcile") {
    return { skipped: claim.decision === "in_flight" ? "held by a live lease" : `the claim answered ${claim.decision}` };
  }
  const found = await api("POST", `/v1/operations/${k}/reconcile`, { fence: claim.fence, finding: "not_committed" });
  if (found?.decision !== "execute") throw new Error(`the reconcile answered ${JSON.stringify(found)}`);
  // not_committed continues as an execute lease under the same fence.
  await releaseUnused(k, claim.fence);
  return { reconciled: true };
}

async function bulkReconcile() {
  if (bulk.running) return;
  const button = $("bulk-reconcile");
  const out = $("bulk-body");
  // What the list shows is what is acted on: filters edited but not
  // applied are applied first.
  if (formQuery() !== listing.query) applyFilters();
  const query = listing.query;
  const what = describeQuery(query);
  bulk.running = true;
  button.disabled = true;
  try {
    const looking = h("p", { class: "loading" }, "Finding the records of this selection that require reconciliation…");
    out.replaceChildren(looking);
    let keys;
    try {
      keys = await selectionKeys(query, (n) => {
        looking.textContent = `Finding the records of this selection that require reconciliation… ${n} so far.`;
      });
    } catch (e) {
      out.replaceChildren(errorBox(e));
      return;
    }
    const n = keys.length;
    if (n === 0) {
      out.replaceChildren(h("p", { class: "empty" }, `No record of this selection (${what}) requires reconciliation; nothing to do.`));
      return;
    }
    const records = n === 1 ? "1 record" : `${n} records`;
    out.replaceChildren(h("p", { class: "hint" }, `Found ${records}; waiting for your confirmation.`));
    const ok = await confirmDialog(`Reconcile ${records} as not committed?`, [
      h("p", {}, `${records} of the list's selection (${what}) ${n === 1 ? "requires" : "require"} reconciliation:`),
      h("ul", { class: "keys" }, keys.slice(0, BULK_SHOWN).map((k) => h("li", {}, h("code", {}, k))),
        n > BULK_SHOWN && h("li", {}, `and ${n - BULK_SHOWN} more`)),
      h("p", {}, h("strong", {}, "You attest that none of these effects reached the remote; the next claim of each executes again.")),
      h("p", {}, "For each, the console claims the reconcile lease with the reservation's fingerprint and binding (at the principal's current generation), reports not_committed, and releases the execute lease that becomes (not_dispatched). A record resolved meanwhile, or held by a live lease, is skipped. This is recorded durably and cannot be undone."),
    ]);
    if (!ok) {
      out.replaceChildren(h("p", { role: "status" }, "Cancelled: nothing was changed."));
      return;
    }
    await runBulk(keys, out);
  } finally {
    bulk.running = false;
    button.disabled = false;
  }
}

async function runBulk(keys, out) {
  const n = keys.length;
  const tally = { reconciled: [], skipped: [], errors: [] };
  bulk.stop = false;
  let next = 0;
  let done = 0;
  const bar = h("progress", { max: n, value: 0, "aria-label": "Records handled" });
  const text = h("p", {});
  const stop = h("button", { type: "button", id: "bulk-stop" }, "Stop");
  stop.addEventListener("click", () => {
    bulk.stop = true;
    stop.disabled = true;
    tick();
  });
  const tick = () => {
    bar.value = done;
    text.textContent = `Reconciling as not committed: ${done} of ${n} handled (reconciled ${tally.reconciled.length}, skipped ${tally.skipped.length}, errors ${tally.errors.length})…${bulk.stop ? " Stopping after the records under way." : ""}`;
  };
  out.setAttribute("aria-busy", "true");
  out.replaceChildren(h("div", { class: "card progress" }, text, bar, h("div", { class: "row" }, stop)));
  tick();
  const worker = async () => {
    while (!bulk.stop && next < n) {
      const at = next++;
      const key = keys[at];
      try {
        const r = await reconcileNotCommitted(key);
        if (r.reconciled) tally.reconciled.push({ at, key });
        else tally.skipped.push({ at, key, why: r.skipped });
      } catch (e) {
        tally.errors.push({ at, key, e });
        // Signed out (the token was refused): nothing more can succeed.
        if (e.status === 401) bulk.stop = true;
      }
      done += 1;
      tick();
    }
  };
  await Promise.all(Array.from({ length: Math.min(BULK_PARALLEL, n) }, worker));
  // In the selection's order, not the order the records were finished in.
  for (const list of Object.values(tally)) list.sort((x, y) => x.at - y.at);
  const left = n - done;
  const line = `Reconciled ${tally.reconciled.length}, skipped ${tally.skipped.length}, errors ${tally.errors.length}.`;
  const keyLink = (key) => h("a", { href: `#/op/${seg(key)}` }, key);
  out.replaceChildren(h("div", { class: `card notice summary${tally.errors.length || left ? " alert" : ""}`, role: "status" },
    h("p", {}, h("strong", {}, line),
      left > 0 ? ` Stopped: ${left} not handled (they still require reconciliation).` : "",
      tally.reconciled.length ? " The next claim of each reconciled record executes." : ""),
    tally.errors.length > 0 && [
      h("p", {}, "Errors (open a record to see where it stands; running the action again takes those that still require reconciliation):"),
      h("ul", { class: "keys errors" }, tally.errors.map(({ key, e }) => h("li", {}, keyLink(key), " — ",
        e instanceof ApiError ? (e.status === 0 ? e.message : `error ${e.status}${e.code ? ` (${e.code})` : ""}: ${e.message}`) : e.message))),
    ],
    tally.skipped.length > 0 && h("details", {}, h("summary", {}, `Skipped (${tally.skipped.length})`),
      h("ul", { class: "keys" }, tally.skipped.map(({ key, why }) => h("li", {}, keyLink(key), ` — ${why}`)))),
    tally.reconciled.length > 0 && h("details", {}, h("summary", {}, `Reconciled (${tally.reconciled.length})`),
      h("ul", { class: "keys" }, tally.reconciled.map(({ key }) => h("li", {}, keyLink(key)))))));
  out.setAttribute("aria-busy", "false");
  say(`Bulk reconcile: ${line}`);
  loadStats();
  loadPage();
}

// ---- warnings and principals ----

async function showWarnings(ev) {
  ev.preventDefault();
  const task = $("task").value.trim();
  const box = $("warnings-body");
  if (!task) return;
  box.replaceChildren(h("p", { class: "loading" }, "Loading warnings…"));
  try {
    const w = await api("GET", `/v1/tasks/${seg(task)}/warnings`);
    box.replaceChildren(w.warnings.length === 0
      ? h("p", { class: "empty" }, `Task ${task} has no warnings.`)
      : h("table", {}, h("caption", {}, `Warnings of task ${task}`),
        h("thead", {}, h("tr", {}, ["Class", "Count", "First", "Last", "Detail"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, w.warnings.map((x) => h("tr", {},
          h("td", { "data-label": "Class" }, x.class),
          h("td", { "data-label": "Count" }, `${x.count}${x.saturated ? "+" : ""}`),
          h("td", { "data-label": "First" }, fmtTime(x.first_at)),
          h("td", { "data-label": "Last" }, fmtTime(x.last_at)),
          h("td", { "data-label": "Detail" }, x.detail ?? "–"))))));
  } catch (e) {
    box.replaceChildren(errorBox(e));
  }
}

async function revoke(ev) {
  ev.preventDefault();
  const p = $("principal").value.trim();
  const box = $("revoke-body");
  if (!p) return;
  if (!(await confirmDialog(`Revoke ${p}?`, [
    h("p", {}, `Every lease ${p} holds ends now, and every call carrying its current or an older generation is refused. Its workers must claim again with the new generation.`),
    h("p", {}, "This cannot be undone."),
  ]))) return;
  try {
    const r = await api("POST", `/v1/principals/${seg(p)}/revoke`, {});
    box.replaceChildren(h("p", { role: "status" }, `Revoked ${r.principal}: its generation is now ${r.generation}.`));
    say(`Revoked ${r.principal}.`);
  } catch (e) {
    box.replaceChildren(errorBox(e));
  }
}

// ---- routing ----

const SECTIONS = ["signin", "overview", "record", "warnings", "principals"];

function show(id) {
  for (const s of SECTIONS) $(s).hidden = s !== id;
  $("nav").hidden = id === "signin";
  $("signout").hidden = authOff;
  $("authoff").hidden = !authOff;
}

function route() {
  if (!authOff && token() === null) {
    show("signin");
    $("token").focus();
    return;
  }
  const hash = location.hash || "#/";
  if (hash.startsWith("#/op/")) {
    show("record");
    loadRecord(decodeURIComponent(hash.slice(5)));
  } else if (hash === "#/warnings") {
    show("warnings");
  } else if (hash === "#/principals") {
    show("principals");
  } else {
    show("overview");
    loadStats();
    if (!listing.query) takeQuery();
    loadPage();
  }
}

$("signin-form").addEventListener("submit", signIn);
$("signout").addEventListener("click", () => signOut());
$("find").addEventListener("submit", findRecord);
$("find").addEventListener("change", findMode);
$("filters").addEventListener("submit", applyFilters);
$("filters").addEventListener("reset", () => setTimeout(applyFilters, 0));
$("next").addEventListener("click", nextPage);
$("prev").addEventListener("click", prevPage);
$("first").addEventListener("click", firstPage);
$("warnings-form").addEventListener("submit", showWarnings);
$("revoke-form").addEventListener("submit", revoke);
$("bulk-reconcile").addEventListener("click", bulkReconcile);
window.addEventListener("hashchange", route);

// Without a stored token, find out first whether the server asks for one.
if (token() === null) authOff = await probeAuthOff();
route();
