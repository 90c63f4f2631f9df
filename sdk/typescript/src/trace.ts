// The caller's W3C trace context on every request to settle (SPEC §12,
// Traces), without a dependency on OpenTelemetry: `@opentelemetry/api` is an
// optional peer dependency, loaded once, on the first request (require() in
// the CommonJS build, import() in the ES module one). When it is installed,
// the headers its global propagator writes for the active context are added
// (with the W3C propagator that the OpenTelemetry SDKs register: `traceparent`,
// and `tracestate` when the context has one); when it is not, or no span is
// active, or no propagator is registered, nothing is.
import { createRequire } from 'node:module';
import { join } from 'node:path';

interface OtelApi {
  context: { active(): unknown };
  propagation: { inject(context: unknown, carrier: Record<string, string>): void };
}

let api: OtelApi | null | undefined; // undefined: not loaded yet
let loading: Promise<void> | undefined;

function usable(m: unknown): OtelApi | null {
  const a = m as Partial<OtelApi> | null | undefined;
  return typeof a?.context?.active === 'function' && typeof a?.propagation?.inject === 'function' ? (a as OtelApi) : null;
}

function load(): Promise<void> {
  loading ??= (async () => {
    const name = '@opentelemetry/api'; // a variable: an optional peer dependency, not bundled
    let m: unknown = null;
    try {
      // `require` exists in the CommonJS build only: the application's own
      // CommonJS copy of the API there, import() in the ES module build.
      m = typeof require === 'function' ? require(name) : await import(name);
    } catch {
      // `npm install ./sdk/typescript` links the folder, and Node resolves
      // from this file's real path, outside the application: look from the
      // application (the working directory) as well.
      try {
        m = createRequire(join(process.cwd(), 'package.json'))(name);
      } catch {
        m = null; // not installed (or failing to load): no trace headers
      }
    }
    api = usable(m) ?? usable((m as { default?: unknown } | null)?.default);
  })();
  return loading;
}

function inject(headers: Record<string, string>): void {
  if (!api) return;
  try {
    api.propagation.inject(api.context.active(), headers);
  } catch {
    // a failing propagator never fails a call to the ledger
  }
}

/** Adds the trace context headers of the active context to `headers`: at
 * once when the API is loaded (or known absent), else once it is. */
export function injectTraceContext(headers: Record<string, string>): void | Promise<void> {
  if (api === undefined) return load().then(() => inject(headers));
  inject(headers);
}
