// Browser tests of the console at /console/: a real `settle serve` with two
// tenants, records created through the API, and the system's Chromium
// driven by playwright-core. Screenshots go to $SCREENSHOT_DIR (default
// ./screenshots, git-ignored).
//
//   SETTLE_BIN=target/debug/settle CHROMIUM=/usr/bin/chromium npm test

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const BIN = resolve(process.env.SETTLE_BIN ?? "../../../target/debug/settle");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const SHOTS = resolve(process.env.SCREENSHOT_DIR ?? "screenshots");
const ACME = "tok-acme-console";
const BETA = "tok-beta-console";
const sha = (s) => createHash("sha256").update(s).digest("hex");
const fp = (n) => n.toString(16).padStart(2, "0").repeat(32);
const VECTORS = JSON.parse(readFileSync(new URL("../../../sdk/middleware-vectors.json", import.meta.url), "utf8"));
/** SPEC §8's ledger key, computed here independently of the console. */
function mwKey(namespace, principal, key) {
  const frame = (s) => { const b = Buffer.from(s, "utf8"); const n = Buffer.alloc(4); n.writeUInt32BE(b.length); return [n, b]; };
  return `mw-${createHash("sha256").update(Buffer.concat([namespace, principal, key].flatMap(frame))).digest("hex")}`;
}

let server, url, data, browser;

async function call(token, method, path, body, base = url) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(base + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, json: text ? JSON.parse(text) : null };
}

const binding = { principal: "svc-pay", scopes: ["pay"], generation: 0 };
const completed = (n) => ({ status: "completed", result: { charge: n }, response_sha256: fp(100 + n) });

async function claim(token, key) {
  const r = await call(token, "POST", `/v1/operations/${encodeURIComponent(key)}/claim`, { fingerprint: fp(1), binding });
  assert.equal(r.json.decision, "execute", JSON.stringify(r.json));
  return r.json.fence;
}

async function settle(token, key, fence, outcome) {
  return call(token, "POST", `/v1/operations/${encodeURIComponent(key)}/settle`, { fence, fingerprint: fp(1), binding, outcome });
}

function serverEnv() {
  const env = { ...process.env };
  delete env.SETTLE_TENANTS;
  delete env.SETTLE_CONFIG;
  return env;
}

/** Starts `settle serve` on loopback with `args`; resolves to {proc, url, data}. */
async function startServer(args) {
  const dir = mkdtempSync(join(tmpdir(), "settle-console-"));
  const proc = spawn(BIN, ["serve", "--listen", "127.0.0.1:0", "--data", dir, "--stuck-after-s", "0", ...args],
    { stdio: ["ignore", "pipe", "inherit"], env: serverEnv() });
  const line = await new Promise((res, rej) => {
    const rl = createInterface({ input: proc.stdout });
    rl.once("line", res);
    proc.once("exit", (c) => rej(new Error(`settle serve exited ${c}`)));
  });
  const m = /^listening on (.+)$/.exec(line.trim());
  assert.ok(m, `settle serve did not start: ${line}`);
  return { proc, url: `http://${m[1]}`, data: dir };
}

async function stopServer(proc, dir) {
  if (proc && proc.exitCode === null) {
    const exited = new Promise((res) => proc.once("exit", res));
    proc.kill("SIGTERM");
    await exited;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  ({ proc: server, url, data } = await startServer(["--tenant", `acme=${sha(ACME)}`, "--tenant", `beta=${sha(BETA)}`]));

  // acme: a stuck record (released, nothing applied, left alone), a
  // disputed one, an unknown one (reconcile required), some completed.
  const f1 = await claim(ACME, "order-stuck");
  await call(ACME, "POST", "/v1/operations/order-stuck/release", { fence: f1, reason: "not_committed" });
  const f2 = await claim(ACME, "order-disputed");
  assert.equal((await settle(ACME, "order-disputed", f2, completed(1))).status, 200);
  assert.equal((await settle(ACME, "order-disputed", f2, completed(2))).status, 409);
  const f3 = await claim(ACME, "order-unknown");
  assert.equal((await settle(ACME, "order-unknown", f3, { status: "unknown", error: "timeout after send" })).status, 200);
  for (let i = 0; i < 6; i++) {
    const f = await claim(ACME, `order-paid-${i}`);
    await settle(ACME, `order-paid-${i}`, f, completed(1));
  }
  await call(ACME, "POST", "/v1/tasks/nightly-sync/warnings/slow_remote", { detail: "remote took 9 s" });
  // beta: a record acme must never see.
  await claim(BETA, "beta-secret");

  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  await stopServer(server, data);
});

async function page(viewport = { width: 1280, height: 800 }, base = url) {
  const ctx = await browser.newContext({ viewport });
  const p = await ctx.newPage();
  const errors = [];
  p.on("pageerror", (e) => errors.push(e));
  p.on("console", (m) => { if (m.type() === "error" && !/401/.test(m.text())) errors.push(m.text()); });
  p.errors = errors;
  await p.goto(`${base}/console/`);
  return p;
}

async function signIn(p, token) {
  await p.getByLabel("Tenant token").fill(token);
  await p.getByRole("button", { name: "Sign in" }).click();
}

test("a wrong token is refused and nothing is shown", async () => {
  const p = await page();
  await signIn(p, "not-a-token");
  await p.getByText("That token was refused.").waitFor();
  assert.equal(await p.locator("#overview").isVisible(), false);
  assert.equal(await p.evaluate(() => sessionStorage.length), 0);
  await p.screenshot({ path: join(SHOTS, "signin-refused.png") });
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("the sign-in page shows no navigation (no Sign out)", async () => {
  const p = await page();
  await p.getByLabel("Tenant token").waitFor();
  assert.equal(await p.locator("#nav").isVisible(), false);
  assert.equal(await p.getByRole("button", { name: "Sign out" }).isVisible(), false);
  assert.equal(await p.getByRole("navigation", { name: "Main" }).count(), 0, "no Main navigation in the accessibility tree");
  assert.equal(await p.locator("#overview").isVisible(), false);
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("a server without tenants opens the dashboard with no token prompt", async () => {
  const open = await startServer([]);
  try {
    const f = await call("", "POST", "/v1/operations/open-1/claim", { fingerprint: fp(1), binding }, open.url);
    assert.equal(f.json.decision, "execute");
    const p = await page(undefined, open.url);
    await p.locator('tr[data-key="open-1"]').waitFor();
    assert.equal(await p.locator('[data-stat="total"] .n').innerText(), "1");
    assert.equal(await p.locator("#signin").isVisible(), false);
    assert.equal(await p.getByLabel("Tenant token").isVisible(), false);
    assert.equal(await p.getByRole("button", { name: "Sign out" }).isVisible(), false);
    assert.equal(await p.getByRole("link", { name: "Principals" }).isVisible(), true);
    assert.match(await p.locator("#nav").innerText(), /no sign-in/);
    // No token was stored, asked for or sent.
    assert.equal(await p.evaluate(() => sessionStorage.length), 0);
    await p.screenshot({ path: join(SHOTS, "auth-off.png") });
    assert.deepEqual(p.errors, []);
    await p.context().close();
  } finally {
    await stopServer(open.proc, open.data);
  }
});

test("a server with tenants still asks for a token", async () => {
  const p = await page();
  await p.getByLabel("Tenant token").waitFor();
  assert.equal(await p.locator("#signin").isVisible(), true);
  assert.equal(await p.locator("#overview").isVisible(), false);
  await p.context().close();
});

test("sign in; the stats and a stuck and a disputed record are listed", async () => {
  const p = await page();
  await p.screenshot({ path: join(SHOTS, "signin.png") });
  await signIn(p, ACME);
  const stuckRow = p.locator('tr[data-key="order-stuck"]');
  await stuckRow.waitFor();
  assert.match(await stuckRow.innerText(), /stuck/);
  assert.match(await p.locator('tr[data-key="order-disputed"]').innerText(), /disputed/);
  assert.match(await p.locator('tr[data-key="order-unknown"]').innerText(), /reconcile required/);
  await p.locator('[data-stat="stuck"] .n').waitFor();
  assert.equal(await p.locator('[data-stat="disputed"] .n').innerText(), "1");
  assert.equal(await p.locator('[data-stat="total"] .n').innerText(), "9");
  // The token lives in this tab's session storage only.
  assert.equal(await p.evaluate(() => sessionStorage.getItem("settle.console.token")), ACME);
  assert.equal(await p.evaluate(() => localStorage.length), 0);
  assert.equal(await p.evaluate(() => document.cookie), "");
  await p.screenshot({ path: join(SHOTS, "overview.png"), fullPage: true });

  // The stuck card filters the list; paging walks every record once.
  await p.locator('[data-stat="stuck"]').click();
  await p.waitForFunction(() => document.querySelectorAll("tbody tr").length === 2);
  assert.deepEqual(await p.locator("tbody tr").evaluateAll((rs) => rs.map((r) => r.dataset.key)), ["order-stuck", "order-unknown"]);
  await p.getByRole("button", { name: "Clear" }).click();
  await p.getByLabel("Per page").selectOption("25");
  await p.getByLabel("Key prefix").fill("order-paid-");
  await p.getByRole("button", { name: "Apply" }).click();
  await p.waitForFunction(() => document.querySelectorAll("tbody tr").length === 6);
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("a record's timeline: attempts, quarantined evidence, the receipt", async () => {
  const p = await page();
  await signIn(p, ACME);
  await p.getByRole("link", { name: "order-disputed" }).click();
  await p.getByRole("heading", { name: "Operation order-disputed" }).waitFor();
  const tl = p.getByRole("list", { name: "Timeline" });
  await tl.waitFor();
  const text = await tl.innerText();
  assert.match(text, /Reserved/);
  assert.match(text, /Attempt 1: claimed/);
  assert.match(text, /Quarantined evidence/);
  assert.match(text, /result_mismatch/);
  assert.match(text, /Settled completed/);
  assert.doesNotMatch(await p.locator("#record-body").innerText(), /\bnull\b|undefined/);
  await p.screenshot({ path: join(SHOTS, "timeline.png"), fullPage: true });
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("the timeline is in time order; a quarantined entry shows its principal, fence, status, digest and reason", async () => {
  const key = "order-foreign";
  const f = await claim(ACME, key);
  assert.equal((await settle(ACME, key, f, completed(3))).status, 200);
  await new Promise((res) => setTimeout(res, 20));
  // A later settle from another principal: refused and quarantined.
  const zombie = { principal: "svc-zombie", scopes: ["pay"], generation: 0 };
  const q = await call(ACME, "POST", `/v1/operations/${key}/settle`, { fence: f, fingerprint: fp(1), binding: zombie, outcome: completed(4) });
  assert.equal(q.status, 409, JSON.stringify(q.json));
  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  await p.goto(`${url}/console/#/op/${key}`);
  const tl = p.getByRole("list", { name: "Timeline" });
  await tl.waitFor();
  const texts = await tl.locator(":scope > li").allInnerTexts();
  const settled = texts.findIndex((t) => /^Settled completed/.test(t));
  const quarantined = texts.findIndex((t) => /^Quarantined evidence/.test(t));
  assert.ok(settled >= 0 && quarantined > settled, `the settle before the later quarantined settle: ${JSON.stringify(texts)}`);
  const qt = texts[quarantined];
  assert.match(qt, /svc-zombie/);
  assert.match(qt, new RegExp(`fence ${f}\\b`));
  assert.match(qt, /\bcompleted\b/);
  assert.match(qt, new RegExp(fp(104)));
  assert.match(qt, /stale_fence/);
  // Every entry with a time is in time order.
  const ats = await tl.locator(":scope > li[data-at]").evaluateAll((ls) => ls.map((l) => Date.parse(l.dataset.at)));
  assert.ok(ats.length >= 4, JSON.stringify(ats));
  assert.deepEqual(ats, [...ats].sort((x, y) => x - y));
  await p.screenshot({ path: join(SHOTS, "timeline-quarantine.png"), fullPage: true });
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("reconcile an unknown record (not committed): the next claim executes", async () => {
  const p = await page();
  await signIn(p, ACME);
  await p.getByRole("link", { name: "order-unknown" }).click();
  await p.getByRole("heading", { name: "Reconcile" }).waitFor();
  await p.getByLabel(/not committed/).check();
  await p.screenshot({ path: join(SHOTS, "reconcile.png"), fullPage: true });
  await p.getByRole("button", { name: "Reconcile…" }).click();
  const dialog = p.getByRole("dialog");
  await dialog.waitFor();
  assert.match(await dialog.innerText(), /did NOT happen/);
  await p.screenshot({ path: join(SHOTS, "reconcile-confirm.png") });
  await dialog.getByRole("button", { name: "Confirm" }).click();
  await p.getByText("Reconciled order-unknown: not committed.").waitFor();
  await p.waitForFunction(() => document.querySelector("#record-body ol.timeline") && !document.querySelector("#reconcile-form"));
  const r = await call(ACME, "GET", "/v1/operations/order-unknown");
  assert.equal(r.json.status, "unknown", "the rank never decreases");
  assert.equal(r.json.reconcile_required, false);
  assert.equal(r.json.lease.ended.reason, "released");
  assert.match(await p.locator("#record-body").innerText(), /was released \(not_dispatched\)/);
  // A worker's next claim executes.
  const again = await call(ACME, "POST", "/v1/operations/order-unknown/claim", { fingerprint: fp(1), binding });
  assert.equal(again.json.decision, "execute");
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("reconcile, but a claim answers execute (reconciled meanwhile): the console releases that lease at once", async () => {
  const key = "order-raced";
  const f = await claim(ACME, key);
  assert.equal((await settle(ACME, key, f, { status: "unknown", error: "timeout after send" })).status, 200);
  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  await p.goto(`${url}/console/#/op/${key}`);
  await p.getByRole("heading", { name: "Reconcile" }).waitFor();
  await p.getByLabel(/not committed/).check();
  // Another operator reconciles it just before the console's claim
  // reaches the server: that claim is then granted an execute lease.
  const path = `/v1/operations/${key}`;
  await p.route(`**${path}/claim`, async (route) => {
    const c = await call(ACME, "POST", `${path}/claim`, { fingerprint: fp(1), binding });
    await call(ACME, "POST", `${path}/reconcile`, { fence: c.json.fence, finding: "not_committed" });
    await call(ACME, "POST", `${path}/release`, { fence: c.json.fence, reason: "not_committed" });
    await route.continue();
  }, { times: 1 });
  await p.getByRole("button", { name: "Reconcile…" }).click();
  await p.getByRole("dialog").getByRole("button", { name: "Confirm" }).click();
  await p.waitForFunction(() => document.querySelector("#record-body ol.timeline") && !document.querySelector("#reconcile-form"));
  // A worker's claim executes at once (not in_flight behind the console's lease).
  const again = await call(ACME, "POST", `${path}/claim`, { fingerprint: fp(1), binding });
  assert.equal(again.json.decision, "execute", JSON.stringify(again.json));
  assert.match(await p.locator("#record-body").innerText(), /released that lease \(fence \d+, not_dispatched\)/);
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

/** A record that requires reconciliation, as a worker leaves it: claimed
 *  with marks_dispatch, dispatched, settled unknown. */
async function unknownAfterDispatch(key, fingerprint, b) {
  const path = `/v1/operations/${encodeURIComponent(key)}`;
  const c = await call(ACME, "POST", `${path}/claim`, { fingerprint, binding: b, marks_dispatch: true });
  assert.equal(c.json.decision, "execute", JSON.stringify(c.json));
  assert.equal((await call(ACME, "POST", `${path}/dispatch`, { fence: c.json.fence })).status, 200);
  const s = await call(ACME, "POST", `${path}/settle`, { fence: c.json.fence, fingerprint, binding: b, outcome: { status: "unknown", error: "timeout after send" } });
  assert.equal(s.status, 200, JSON.stringify(s.json));
  assert.equal((await call(ACME, "GET", path)).json.reconcile_required, true);
}

/** What the bulk action may change of each record, by key. */
async function snapshot(keys) {
  const out = {};
  for (const k of keys) {
    const r = (await call(ACME, "GET", `/v1/operations/${encodeURIComponent(k)}`)).json;
    out[k] = { status: r.status, reconcile_required: r.reconcile_required, attempts: r.attempts_total, updated_at: r.updated_at, lease: r.lease };
  }
  return out;
}

/** Filters the list by a key prefix and waits until it shows only that. */
async function filterByPrefix(p, prefix) {
  await p.getByLabel("Key prefix").fill(prefix);
  await p.getByRole("button", { name: "Apply" }).click();
  await p.waitForFunction((pre) => {
    const rows = [...document.querySelectorAll("#list tbody tr")];
    return document.querySelector("#list").getAttribute("aria-busy") === "false"
      && rows.length > 0 && rows.every((r) => r.dataset.key.startsWith(pre));
  }, prefix);
}

test("reconcile all as not committed: every record of the filtered selection that requires reconciliation, behind a confirmation (cancelling changes nothing)", async () => {
  // Two principals; svc-sweep is revoked after its records were written,
  // so the console must claim at its current generation (1), not the
  // reservation's (0).
  const sweeper = { principal: "svc-sweep", scopes: ["pay", "refund"], generation: 0 };
  const A = Array.from({ length: 6 }, (_, i) => `sweep-a-${i}`);
  const B = ["sweep-b-0", "sweep-b-1"];
  const made = {};
  for (const [i, key] of [...A, ...B].entries()) {
    made[key] = { fingerprint: fp(20 + i), binding: i % 2 ? sweeper : binding };
    await unknownAfterDispatch(key, made[key].fingerprint, made[key].binding);
  }
  // Under the same prefix but requiring nothing: not part of it.
  const f = await claim(ACME, "sweep-a-done");
  assert.equal((await settle(ACME, "sweep-a-done", f, completed(5))).status, 200);
  assert.equal((await call(ACME, "POST", "/v1/principals/svc-sweep/revoke", {})).json.generation, 1);
  const untouched = [...B, "sweep-a-done"];
  const before = await snapshot([...A, ...untouched]);

  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  await filterByPrefix(p, "sweep-a-");
  const bulk = p.getByRole("button", { name: "Reconcile all as not committed…" });

  // Cancelled: nothing changes.
  await bulk.click();
  const dialog = p.getByRole("dialog");
  await dialog.waitFor();
  const text = await dialog.innerText();
  assert.match(text, /Reconcile 6 records as not committed\?/);
  assert.match(text, /6 records of the list's selection \(key prefix “sweep-a-”\) require reconciliation/);
  for (const k of A.slice(0, 5)) assert.match(text, new RegExp(`\\b${k}\\b`));
  assert.match(text, /and 1 more/);
  assert.doesNotMatch(text, /sweep-b-|sweep-a-done/);
  assert.match(text, /you attest that none of these effects reached the remote; the next claim of each executes again/i);
  await p.screenshot({ path: join(SHOTS, "bulk-confirm.png") });
  await dialog.getByRole("button", { name: "Cancel" }).click();
  await p.getByText("Cancelled: nothing was changed.").waitFor();
  assert.deepEqual(await snapshot([...A, ...untouched]), before);

  // Confirmed.
  await bulk.click();
  await dialog.getByRole("button", { name: "Confirm" }).click();
  const summary = p.locator("#bulk-body .summary");
  await summary.waitFor();
  assert.match(await summary.innerText(), /Reconciled 6, skipped 0, errors 0\./);
  await summary.getByText("Reconciled (6)").click();
  assert.deepEqual(await summary.locator("details:last-of-type li").allInnerTexts(), A, "in the selection's order");
  await p.screenshot({ path: join(SHOTS, "bulk-done.png"), fullPage: true });

  // Through the API: those records no longer require reconciliation, the
  // console let go of every lease, and a claim of each executes at once.
  for (const k of A) {
    const r = (await call(ACME, "GET", `/v1/operations/${k}`)).json;
    assert.equal(r.reconcile_required, false, k);
    assert.equal(r.status, "unknown", `${k}: the rank never decreases`);
    assert.equal(r.lease.ended.reason, "released", k);
    assert.equal(r.attempts.at(-1).lease.worker, "settle-console", k);
    assert.equal(r.attempts.at(-1).lease.generation, made[k].binding === sweeper ? 1 : 0, k);
    const b = { ...made[k].binding, generation: made[k].binding === sweeper ? 1 : 0 };
    const again = await call(ACME, "POST", `/v1/operations/${k}/claim`, { fingerprint: made[k].fingerprint, binding: b });
    assert.equal(again.json.decision, "execute", `${k}: ${JSON.stringify(again.json)}`);
  }
  // The other prefix, and the record that required nothing: untouched.
  const after = await snapshot(untouched);
  for (const k of untouched) assert.deepEqual(after[k], before[k], k);
  assert.equal(after["sweep-b-0"].reconcile_required, true);

  // The list and the counts were refreshed; usable at phone width.
  await p.waitForFunction(() => !document.querySelector("#list tbody .f-reconcile"));
  await p.setViewportSize({ width: 390, height: 844 });
  const overflow = await p.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `no horizontal scrolling (${overflow}px)`);
  await p.screenshot({ path: join(SHOTS, "bulk-phone.png"), fullPage: true });
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("reconcile all as not committed: a record resolved meanwhile is skipped (its lease released at once), one that fails is listed with its key", async () => {
  const keys = ["sweep-c-0", "sweep-c-1", "sweep-c-2"];
  for (const k of keys) await unknownAfterDispatch(k, fp(1), binding);
  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  await filterByPrefix(p, "sweep-c-");
  // The routes stay (no `times`): once the last route is used up,
  // playwright stops intercepting and Chromium lets a request still held
  // by a handler through before the handler is done.
  // sweep-c-1: another operator reconciles it just before the console's
  // claim reaches the server, which then grants an execute lease.
  let raced = false;
  await p.route("**/v1/operations/sweep-c-1/claim", async (route) => {
    if (!raced) {
      raced = true;
      const path = "/v1/operations/sweep-c-1";
      const c = await call(ACME, "POST", `${path}/claim`, { fingerprint: fp(1), binding });
      await call(ACME, "POST", `${path}/reconcile`, { fence: c.json.fence, finding: "not_committed" });
      await call(ACME, "POST", `${path}/release`, { fence: c.json.fence, reason: "not_committed" });
    }
    await route.continue();
  });
  // sweep-c-2: the server is overloaded when the console claims it.
  let failed = false;
  await p.route("**/v1/operations/sweep-c-2/claim", async (route) => {
    if (failed) return route.continue();
    failed = true;
    return route.fulfill({
      status: 503,
      contentType: "application/problem+json",
      body: JSON.stringify({ type: "urn:settle:problem:unavailable", title: "Unavailable", status: 503, code: "unavailable", detail: "store overloaded" }),
    });
  });
  await p.getByRole("button", { name: "Reconcile all as not committed…" }).click();
  await p.getByRole("dialog").getByRole("button", { name: "Confirm" }).click();
  const summary = p.locator("#bulk-body .summary");
  await summary.waitFor();
  const text = await summary.innerText();
  assert.match(text, /Reconciled 1, skipped 1, errors 1\./);
  assert.match(text, /sweep-c-2 — error 503 \(unavailable\): store overloaded/);
  await summary.getByText("Skipped (1)").click();
  assert.match(await summary.innerText(), /sweep-c-1 — resolved meanwhile/);
  await p.screenshot({ path: join(SHOTS, "bulk-errors.png"), fullPage: true });
  const get = async (k) => (await call(ACME, "GET", `/v1/operations/${k}`)).json;
  assert.equal((await get("sweep-c-0")).reconcile_required, false);
  assert.equal((await get("sweep-c-2")).reconcile_required, true, "an error leaves the record as it was");
  // Not in_flight behind a lease the console kept.
  for (const k of ["sweep-c-0", "sweep-c-1"]) {
    const again = await call(ACME, "POST", `/v1/operations/${k}/claim`, { fingerprint: fp(1), binding });
    assert.equal(again.json.decision, "execute", `${k}: ${JSON.stringify(again.json)}`);
  }
  assert.deepEqual(p.errors.filter((e) => !/status of 503/.test(String(e))), []);
  await p.context().close();
});

test("reconcile all as not committed: Stop ends it after the records under way; the rest stay as they were", async () => {
  const keys = Array.from({ length: 8 }, (_, i) => `sweep-d-${i}`);
  for (const k of keys) await unknownAfterDispatch(k, fp(1), binding);
  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  await filterByPrefix(p, "sweep-d-");
  // Slow claims: Stop is pressed while the first records are under way.
  await p.route("**/v1/operations/sweep-d-*/claim", async (route) => {
    await new Promise((res) => setTimeout(res, 1500));
    await route.continue();
  });
  await p.getByRole("button", { name: "Reconcile all as not committed…" }).click();
  await p.getByRole("dialog").getByRole("button", { name: "Confirm" }).click();
  await p.getByRole("button", { name: "Stop" }).click();
  await p.getByText(/Stopping after the records under way/).waitFor();
  const summary = p.locator("#bulk-body .summary");
  await summary.waitFor();
  const m = /Reconciled (\d+), skipped 0, errors 0\. Stopped: (\d+) not handled/.exec(await summary.innerText());
  assert.ok(m, await summary.innerText());
  const [done, left] = [Number(m[1]), Number(m[2])];
  assert.ok(done >= 1 && left >= 1 && done + left === keys.length, m[0]);
  let still = 0;
  for (const k of keys) still += (await call(ACME, "GET", `/v1/operations/${k}`)).json.reconcile_required ? 1 : 0;
  assert.equal(still, left);
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("search by what the client sent (Idempotency-Key, principal, namespace) opens a middleware record, which shows the claim's worker", async () => {
  const key = mwKey("default", "acct-1", "neg");
  assert.equal(mwKey("default", "acct-1", "abc"), VECTORS.ledger_keys[0].ledger_key);
  const worker = "idempotency-key=neg principal=acct-1";
  const c = await call(ACME, "POST", `/v1/operations/${key}/claim`, {
    fingerprint: fp(7), binding: { principal: "acct-1", scopes: [], generation: 0 }, worker, marks_dispatch: true,
  });
  assert.equal(c.json.decision, "execute", JSON.stringify(c.json));
  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  await p.getByLabel(/Idempotency-Key \(what the client sent\)/).check();
  await p.getByRole("textbox", { name: "Idempotency-Key value" }).fill("neg");
  await p.getByRole("textbox", { name: "Principal" }).fill("acct-1");
  assert.equal(await p.getByRole("textbox", { name: "Namespace" }).inputValue(), "default");
  await p.screenshot({ path: join(SHOTS, "search.png") });
  await p.getByRole("button", { name: "Open", exact: true }).click();
  await p.getByRole("heading", { name: `Operation ${key}` }).waitFor();
  const card = p.locator("#record-body .card").filter({ hasText: "worker" }).first();
  await card.waitFor();
  assert.match(await card.innerText(), new RegExp(`worker\\s+${worker}`));
  const tl = await p.getByRole("list", { name: "Timeline" }).innerText();
  assert.match(tl, new RegExp(`Attempt 1: claimed[\\s\\S]*worker[\\s\\S]*${worker}`));
  await p.screenshot({ path: join(SHOTS, "record-worker.png"), fullPage: true });
  // The sf-string form with a parameter is the same key.
  await p.goto(`${url}/console/#/`);
  await p.getByLabel(/Idempotency-Key \(what the client sent\)/).check();
  await p.getByRole("textbox", { name: "Idempotency-Key value" }).fill('"neg";v=1');
  await p.getByRole("textbox", { name: "Principal" }).fill("acct-1");
  await p.getByRole("button", { name: "Open", exact: true }).click();
  await p.getByRole("heading", { name: `Operation ${key}` }).waitFor();
  await p.getByText(worker).first().waitFor();
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("the console's ledger key and Idempotency-Key parsing match sdk/middleware-vectors.json (crypto.subtle and the module's own SHA-256)", async () => {
  const headers = VECTORS.idempotency_key_header.filter((v) => v.values.length === 1);
  for (const subtle of [true, false]) {
    const ctx = await browser.newContext();
    if (!subtle) {
      // As on plain HTTP off loopback: no crypto.subtle.
      await ctx.addInitScript(() => Object.defineProperty(Crypto.prototype, "subtle", { get: () => undefined, configurable: true }));
    }
    const p = await ctx.newPage();
    await p.goto(`${url}/console/`);
    await p.getByLabel("Tenant token").waitFor();
    const got = await p.evaluate(async ({ keys, hdrs }) => {
      const m = await import("./console.js");
      const out = [];
      for (const v of keys) out.push(await m.ledgerKey(v.namespace, v.principal, v.key));
      const parsed = hdrs.map((v) => {
        try { return { key: m.parseIdempotencyKey(v.values[0]) }; } catch { return { error: "idempotency_key_invalid" }; }
      });
      return { out, parsed, subtle: Boolean(globalThis.crypto.subtle) };
    }, { keys: VECTORS.ledger_keys, hdrs: headers });
    assert.equal(got.subtle, subtle);
    assert.deepEqual(got.out, VECTORS.ledger_keys.map((v) => v.ledger_key));
    assert.deepEqual(got.parsed, headers.map((v) => (v.error ? { error: v.error } : { key: v.key })));
    await ctx.close();
  }
});

test("the list offers its order (key, recently updated, needs attention) and pages with it", async () => {
  // 30 records created in an order unlike their keys'; one needs
  // reconciling, one is stuck, the rest completed.
  const keys = Array.from({ length: 30 }, (_, i) => `bulk-${String((i * 7) % 30).padStart(2, "0")}`);
  for (const k of keys) {
    const f = await claim(ACME, k);
    if (k === "bulk-07") await settle(ACME, k, f, { status: "unknown", error: "timeout after send" });
    else if (k === "bulk-14") await call(ACME, "POST", `/v1/operations/${k}/release`, { fence: f, reason: "not_committed" });
    else await settle(ACME, k, f, completed(1));
  }
  const p = await page();
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  const listed = async () => {
    const seen = [];
    for (;;) {
      await p.waitForFunction(() => document.querySelector("#list").getAttribute("aria-busy") === "false");
      seen.push(...await p.locator("tbody tr").evaluateAll((rs) => rs.map((r) => r.dataset.key)));
      if (await p.locator("#next").isDisabled()) return seen;
      await p.locator("#next").click();
    }
  };
  for (const [label, order] of [["key", "key"], ["recently updated", "updated"], ["needs attention", "attention"]]) {
    await p.getByLabel("Key prefix").fill("bulk-");
    await p.getByLabel("Per page").selectOption("25");
    await p.getByLabel("Order").selectOption({ label });
    await p.getByRole("button", { name: "Apply" }).click();
    const seen = await listed();
    const api = await call(ACME, "GET", `/v1/operations?key_prefix=bulk-&order=${order}&limit=1000`);
    assert.equal(api.json.next, null);
    assert.deepEqual(seen, api.json.operations.map((o) => o.key), `order ${order}`);
    assert.equal(new Set(seen).size, 30, `every record once (${order})`);
    if (order === "key") assert.deepEqual(seen, [...keys].sort());
    if (order === "updated") assert.equal(seen[0], keys.at(-1), "the last one written first");
    if (order === "attention") assert.deepEqual(seen.slice(0, 2), ["bulk-07", "bulk-14"], "reconcile required, then stuck");
    assert.match(await p.locator("caption").innerText(), new RegExp(label === "key" ? "in key order" : label));
  }
  await p.screenshot({ path: join(SHOTS, "order-attention.png") });
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("cancelling a confirmation changes nothing; warnings per task; revoke", async () => {
  const p = await page();
  await signIn(p, ACME);
  await p.getByRole("link", { name: "Principals" }).click();
  await p.getByRole("textbox", { name: "Principal" }).fill("svc-leaked");
  await p.getByRole("button", { name: "Revoke…" }).click();
  await p.getByRole("dialog").getByRole("button", { name: "Cancel" }).click();
  assert.equal(await p.locator("#revoke-body").innerText(), "");
  await p.getByRole("button", { name: "Revoke…" }).click();
  await p.getByRole("dialog").getByRole("button", { name: "Confirm" }).click();
  await p.getByText("Revoked svc-leaked: its generation is now 1.").waitFor();
  await p.getByRole("link", { name: "Warnings" }).click();
  await p.getByRole("textbox", { name: "Task" }).fill("nightly-sync");
  await p.getByRole("button", { name: "Show" }).click();
  await p.getByRole("cell", { name: "slow_remote" }).waitFor();
  await p.screenshot({ path: join(SHOTS, "warnings.png") });
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test("one tenant's console never shows another's records", async () => {
  const p = await page();
  await signIn(p, BETA);
  await p.locator('tr[data-key="beta-secret"]').waitFor();
  assert.deepEqual(await p.locator("tbody tr").evaluateAll((rs) => rs.map((r) => r.dataset.key)), ["beta-secret"]);
  assert.equal(await p.locator('[data-stat="total"] .n').innerText(), "1");
  await p.goto(`${url}/console/#/op/order-stuck`);
  await p.getByText("No such operation").waitFor();
  await p.context().close();
});

test("usable at phone width", async () => {
  const p = await page({ width: 390, height: 844 });
  await signIn(p, ACME);
  await p.locator('tr[data-key="order-stuck"]').waitFor();
  const overflow = () => p.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(await overflow() <= 0, `no horizontal scrolling (${await overflow()}px)`);
  await p.screenshot({ path: join(SHOTS, "phone.png"), fullPage: true });
  await p.getByLabel(/Idempotency-Key \(what the client sent\)/).check();
  assert.ok(await overflow() <= 0, `no horizontal scrolling with the Idempotency-Key search (${await overflow()}px)`);
  await p.screenshot({ path: join(SHOTS, "phone-search.png") });
  await p.context().close();
});
