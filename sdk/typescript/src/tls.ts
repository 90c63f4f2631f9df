// Custom TLS trust for an https ledger (SPEC §12, TLS). Node's global fetch
// takes no CA, so a Client given `ca` sends through a small fetch on
// node:https whose Agent (keep-alive, as fetch's) trusts exactly those
// certificates. It does what the client asks of a fetch (method, headers, a
// string body, the abort signal; the answer's status, headers and body) and
// no more: no redirects (settle sends none), no decompression (it asks for
// none). node:https is loaded on the first request of such a client only:
// a client without `ca` is unchanged, and the package keeps no runtime
// dependencies.

/** PEM CA certificate(s): a string or Buffer (a bundle may hold several), or an array of them. */
export type CACertificates = string | Buffer | ReadonlyArray<string | Buffer>;

const NULL_BODY = new Set([204, 205, 304]); // a Response of these statuses has no body

/** A fetch whose https connections trust `ca` (instead of Node's default roots). */
export async function fetchTrusting(ca: CACertificates): Promise<typeof fetch> {
  const https = await import('node:https');
  const agent = new https.Agent({ ca: (Array.isArray(ca) ? [...ca] : ca) as string | Buffer | Array<string | Buffer>, keepAlive: true });
  const trusting = (input: string | URL | Request, init: RequestInit = {}): Promise<Response> =>
    new Promise<Response>((resolve, reject) => {
      const url = input instanceof Request ? input.url : String(input);
      const headers = Object.fromEntries(new Headers(init.headers));
      const options = { method: init.method ?? 'GET', headers, agent, signal: init.signal ?? undefined };
      const req = https.request(url, options, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('error', reject);
        res.on('close', () => {
          if (!res.complete) reject(new Error('the connection closed before the end of the answer'));
        });
        res.on('end', () => {
          const status = res.statusCode ?? 0;
          const answer = new Headers();
          for (let i = 0; i + 1 < res.rawHeaders.length; i += 2) answer.append(res.rawHeaders[i]!, res.rawHeaders[i + 1]!);
          try {
            resolve(new Response(NULL_BODY.has(status) ? null : Buffer.concat(chunks), { status, statusText: res.statusMessage ?? '', headers: answer }));
          } catch (e) {
            reject(e); // a status a Response cannot have
          }
        });
      });
      req.on('error', reject); // refused, reset, a certificate not trusted, aborted (the timeout)
      req.end(init.body as string | Uint8Array | undefined);
    });
  return trusting as typeof fetch;
}

/** Validates `ca` when the Client is made: a PEM string or Buffer, or a non-empty array of them. */
export function checkCA(ca: unknown): asserts ca is CACertificates {
  const one = (c: unknown) => (typeof c === 'string' || c instanceof Uint8Array) && c.length > 0;
  if (Array.isArray(ca) ? ca.length > 0 && ca.every(one) : one(ca)) return;
  throw new TypeError('new Client({ ca }): ca must be a PEM string or Buffer, or a non-empty array of them');
}
