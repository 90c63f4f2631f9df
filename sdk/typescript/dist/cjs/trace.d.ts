/** Adds the trace context headers of the active context to `headers`: at
 * once when the API is loaded (or known absent), else once it is. */
export declare function injectTraceContext(headers: Record<string, string>): void | Promise<void>;
