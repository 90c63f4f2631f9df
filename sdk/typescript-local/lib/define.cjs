'use strict';
// One implementation for both module systems: index.cjs and index.mjs each
// pass their own @settle/client `Client` (so `instanceof Client` holds in
// either) and get the LocalLedger class back.
const { join } = require('node:path');
const { existsSync } = require('node:fs');

const HOST = 'settle.local';
// Headers every client call carries, which the local ledger does not need.
const STANDARD = new Set(['accept', 'user-agent', 'content-type']);
// Statuses whose Response must have no body (the fetch standard).
const NULL_BODY = new Set([101, 103, 204, 205, 304]);

let native;
/** The addon the install script built (napi build → settle-local.node). */
function loadNative() {
  if (native) return native;
  const file = join(__dirname, '..', 'settle-local.node');
  if (!existsSync(file)) {
    throw new Error(
      `@settle/local: its native part is not built (${file} is missing). ` +
        'It is built when the package is installed; run `npm run build` in sdk/typescript-local (needs cargo).',
    );
  }
  native = require(file);
  return native;
}

function headerPairs(h) {
  const out = [];
  if (!h) return out;
  if (typeof h.forEach === 'function' && !Array.isArray(h)) {
    h.forEach((v, n) => out.push([n, String(v)]));
  } else if (Array.isArray(h)) {
    for (const [n, v] of h) out.push([String(n), String(v)]);
  } else {
    for (const [n, v] of Object.entries(h)) if (v !== undefined) out.push([n, String(v)]);
  }
  return out;
}

async function bodyBytes(body) {
  if (body === undefined || body === null) return Buffer.alloc(0);
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof ArrayBuffer) return Buffer.from(body);
  if (ArrayBuffer.isView(body)) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  // Blob, URLSearchParams, streams...: what Request would send.
  return Buffer.from(await new Request('http://' + HOST, { method: 'POST', body, duplex: 'half' }).arrayBuffer());
}

/** A `fetch` for http://settle.local/... that answers from `ledger` (a NativeLedger). */
function makeFetch(ledger) {
  return async function localFetch(input, init = {}) {
    let method = init.method;
    let headers = init.headers;
    let body = init.body;
    let url;
    let signal = init.signal;
    if (typeof input === 'string' || input instanceof URL) {
      url = new URL(String(input));
    } else if (input && typeof input.url === 'string') {
      // a Request
      url = new URL(input.url);
      method ??= input.method;
      headers ??= input.headers;
      signal ??= input.signal;
      if (body === undefined && input.body !== null) body = await input.arrayBuffer();
    } else {
      throw new TypeError('fetch(input, init): input must be a URL, a string or a Request');
    }
    if (url.host !== HOST) throw new TypeError(`@settle/local answers only http://${HOST}/..., not ${url.origin}`);
    signal?.throwIfAborted();
    const call = ledger.request((method ?? 'GET').toUpperCase(), url.pathname + url.search, headerPairs(headers), await bodyBytes(body));
    // The call cannot be cancelled once on the thread pool; an abort only
    // stops the wait, as with a request already on the wire.
    const reply = signal
      ? await new Promise((resolve, reject) => {
          const onAbort = () => reject(signal.reason);
          signal.addEventListener('abort', onAbort, { once: true });
          call.then(
            (r) => (signal.removeEventListener('abort', onAbort), resolve(r)),
            (e) => (signal.removeEventListener('abort', onAbort), reject(e)),
          );
        })
      : await call;
    return new Response(NULL_BODY.has(reply.status) ? null : reply.body, {
      status: reply.status,
      headers: reply.headers.map(([n, v]) => [n, v]),
    });
  };
}

/** The client's error for a native call that failed: `LedgerClosed` once closed. */
function callError(errors, e, method, path) {
  if (e && e.code === 'Closing') return new errors.LedgerClosed(`this LocalLedger is closed (${method} ${path}); open a new one`, { cause: e });
  return new errors.TransportError(`${method} ${path}: ${e?.message ?? String(e)}`, { cause: e });
}

function answer(a) {
  return { status: a.status, text: a.body, retryAfter: a.retryAfter ?? null };
}

/** `client`: the @settle/client module of the caller's module system. */
function define(client) {
  const { Client } = client;
  class LocalLedger extends Client {
    #native;

    /** @param {{ data?: string, segmentBytes?: number, timeoutMs?: number, headers?: Record<string, string> }} [options] */
    constructor(options = {}) {
      if (options === null || typeof options !== 'object') throw new TypeError('new LocalLedger({ data? })');
      const { data, segmentBytes, timeoutMs, headers } = options;
      if (data !== undefined && data !== null && typeof data !== 'string') throw new TypeError('LocalLedger: data must be a directory path (string)');
      if (data === '') throw new TypeError('LocalLedger: data must not be empty (omit it for the in-memory ledger)');
      if (segmentBytes !== undefined && !(Number.isSafeInteger(segmentBytes) && segmentBytes >= 65536 && segmentBytes <= 1073741824)) {
        throw new TypeError(`LocalLedger: segmentBytes must be an integer in [65536, 1073741824], not ${segmentBytes}`);
      }
      const { NativeLedger } = loadNative();
      const ledger = new NativeLedger(data ?? null, segmentBytes ?? null);
      const fetch = makeFetch(ledger);
      super({ url: 'http://' + HOST, fetch, timeoutMs, headers });
      this.#native = ledger;
      /** A `fetch` for http://settle.local/... answered by this ledger (every route of the HTTP API). */
      Object.defineProperty(this, 'fetch', { value: fetch, enumerable: false });
    }

    /** Every call of the client, straight into the native ledger (no fetch
     * objects): answered in place in memory (a call never waits there), on
     * libuv's thread pool on a directory (an fsync never blocks the loop),
     * waited for at most `timeoutMs` as over HTTP. */
    exchange(method, path, headers, body) {
      // What the ledger reads of the client's headers: the caller's own
      // and trace context (a JSON body's content-type is implied).
      const flat = [];
      for (const n in headers) if (!STANDARD.has(n)) flat.push(n, headers[n]);
      if (!this.#native.durable) {
        try {
          return answer(this.#native.exchangeSync(method, path, flat, body ?? null));
        } catch (e) {
          throw callError(client, e, method, path);
        }
      }
      let call;
      try {
        call = this.#native.exchange(method, path, flat, body ?? null);
      } catch (e) {
        return Promise.reject(callError(client, e, method, path));
      }
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new client.TransportError(`${method} ${path}: no answer in ${this.timeoutMs} ms`)), this.timeoutMs); // the Client's own
      });
      return Promise.race([call.then(answer, (e) => Promise.reject(callError(client, e, method, path))), timeout]).finally(() => clearTimeout(timer));
    }

    /** Whether receipts survive the process: false in memory, true with `data`. */
    get durable() {
      return this.#native.durable;
    }

    /** Closes the store (releases the directory's lock); later calls fail
     * at once with `LedgerClosed` (never retried). Idempotent. */
    close() {
      this.#native.close();
    }

    [Symbol.dispose]() {
      this.close();
    }

    async [Symbol.asyncDispose]() {
      this.close();
    }
  }
  return LocalLedger;
}

module.exports = { define, loadNative, HOST };
