"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.settleBinary = settleBinary;
exports.startSettle = startSettle;
exports.localLedger = localLedger;
// @settle/client/testing: a real ledger for your tests, with any test
// framework (node:test, vitest, jest: nothing here depends on one).
//
//   import { startSettle } from '@settle/client/testing';
//   const settle = await startSettle();          // `settle serve` on a free port, a temporary data directory
//   const client = settle.client();              // a Client of it
//   ...
//   await settle.stop();                         // or: await using settle = await startSettle();
//
//   import { localLedger } from '@settle/client/testing';
//   const ledger = await localLedger();          // in process, from the @settle/local package
const node_child_process_1 = require("node:child_process");
const node_crypto_1 = require("node:crypto");
const node_fs_1 = require("node:fs");
const node_os_1 = require("node:os");
const node_module_1 = require("node:module");
const node_path_1 = require("node:path");
const node_url_1 = require("node:url");
const node_readline_1 = require("node:readline");
const client_js_1 = require("./client.js");
function executable(path) {
    try {
        (0, node_fs_1.accessSync)(path, node_fs_1.constants.X_OK);
        return true;
    }
    catch {
        return false;
    }
}
/** The settle binary: `bin`, else $SETTLE_BIN, else `settle` on PATH; an error naming both when absent. */
function settleBinary(bin) {
    const explicit = bin ?? process.env.SETTLE_BIN;
    if (explicit) {
        if (executable(explicit))
            return explicit;
        throw new Error(`the settle binary ${JSON.stringify(explicit)} (${bin ? 'the bin option' : 'SETTLE_BIN'}) is not an executable file: ` +
            'build it with `cargo build --release -p settle` and point SETTLE_BIN at target/release/settle, or put `settle` on PATH');
    }
    for (const dir of (process.env.PATH ?? '').split(node_path_1.delimiter)) {
        if (!dir || !(0, node_path_1.isAbsolute)(dir))
            continue;
        const p = (0, node_path_1.join)(dir, process.platform === 'win32' ? 'settle.exe' : 'settle');
        if (executable(p))
            return p;
    }
    throw new Error('no settle binary: SETTLE_BIN is not set and `settle` is not on PATH. ' +
        'Build it with `cargo build --release -p settle` and set SETTLE_BIN=/path/to/target/release/settle, or put `settle` on PATH');
}
const running = new Set();
let exitHook = false;
/** Starts `settle serve` on a free port of 127.0.0.1 with a temporary data
 * directory; resolves once it listens. Stop it with `stop()` (a server left
 * running is killed when the test process exits). */
async function startSettle(options = {}) {
    const bin = settleBinary(options.bin);
    const dir = (0, node_fs_1.mkdtempSync)((0, node_path_1.join)((0, node_os_1.tmpdir)(), 'settle-test-'));
    const args = ['serve', '--data', (0, node_path_1.join)(dir, 'data'), '--listen', '127.0.0.1:0'];
    const tenants = options.tenants ? Object.entries(options.tenants) : [];
    if (tenants.length > 0) {
        const cfg = (0, node_path_1.join)(dir, 'settle.toml');
        (0, node_fs_1.writeFileSync)(cfg, tenants.map(([name, token]) => `[[tenants]]\nname = ${JSON.stringify(name)}\ntoken_sha256 = "${(0, node_crypto_1.createHash)('sha256').update(token).digest('hex')}"\n`).join('\n'));
        args.push('--config', cfg);
    }
    args.push(...(options.args ?? []));
    const proc = (0, node_child_process_1.spawn)(bin, args, {
        stdio: ['ignore', 'pipe', 'inherit'],
        env: { ...process.env, SETTLE_LOG: options.log ?? process.env.SETTLE_LOG ?? 'error' },
    });
    running.add(proc);
    if (!exitHook) {
        exitHook = true;
        process.once('exit', () => {
            for (const p of running)
                p.kill('SIGKILL');
        });
    }
    const cleanup = () => {
        running.delete(proc);
        (0, node_fs_1.rmSync)(dir, { recursive: true, force: true });
    };
    let url;
    try {
        url = await new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`settle did not listen within ${options.startTimeoutMs ?? 30_000} ms`)), options.startTimeoutMs ?? 30_000);
            const rl = (0, node_readline_1.createInterface)({ input: proc.stdout });
            rl.once('line', (line) => {
                clearTimeout(timer);
                if (line.startsWith('listening on '))
                    resolve('http://' + line.split(' ').pop());
                else
                    reject(new Error(`settle did not start: ${line}`));
            });
            proc.once('error', (e) => {
                clearTimeout(timer);
                reject(new Error(`could not run ${bin}: ${e.message}`, { cause: e }));
            });
            proc.once('exit', (code, signal) => {
                clearTimeout(timer);
                reject(new Error(`settle exited (${signal ?? code}) before listening; its log is above`));
            });
        });
    }
    catch (e) {
        proc.kill('SIGKILL');
        cleanup();
        throw e;
    }
    proc.stdout.resume(); // later lines are not read: keep the pipe from filling
    let stopping = null;
    const stop = () => {
        stopping ??= (async () => {
            if (proc.exitCode === null && proc.signalCode === null) {
                const exited = new Promise((r) => proc.once('exit', r));
                proc.kill('SIGTERM');
                const t = setTimeout(() => proc.kill('SIGKILL'), 10_000);
                await exited;
                clearTimeout(t);
            }
            cleanup();
        })();
        return stopping;
    };
    return {
        url,
        dataDir: dir,
        process: proc,
        client: (o = {}) => new client_js_1.Client({ url, ...o }),
        stop,
        [Symbol.asyncDispose]: stop,
    };
}
/** A fresh in-process ledger (`new LocalLedger(options)` of the
 * @settle/local package, loaded when first called): a Client that needs no
 * server. Close it with `close()` (or `await using`). Fails with how to
 * install @settle/local when it is missing. */
async function localLedger(options = {}) {
    const name = '@settle/local'; // a variable: not a dependency of this package, loaded only here
    const notFound = (e) => {
        const code = e?.code;
        return (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') && String(e.message).includes(name);
    };
    let mod;
    try {
        mod = await import(name);
    }
    catch (e) {
        if (!notFound(e))
            throw e;
        // `npm install ./sdk/typescript` links the folder, and Node resolves
        // from this file's real path, outside the project: look from the
        // project (the working directory) as well.
        let dir;
        try {
            dir = (0, node_path_1.dirname)((0, node_module_1.createRequire)((0, node_path_1.join)(process.cwd(), 'package.json')).resolve(`${name}/package.json`));
        }
        catch {
            throw new Error(`localLedger() needs the @settle/local package, which is not installed: npm install ./sdk/typescript-local`, { cause: e });
        }
        mod = await import((0, node_url_1.pathToFileURL)((0, node_path_1.join)(dir, 'index.mjs')).href);
    }
    const Ctor = mod.LocalLedger ?? mod.default?.LocalLedger;
    if (typeof Ctor !== 'function')
        throw new Error('@settle/local does not export the LocalLedger class');
    const ledger = new Ctor(options);
    if (typeof ledger[Symbol.asyncDispose] !== 'function') {
        Object.defineProperty(ledger, Symbol.asyncDispose, { value: async () => ledger.close() });
    }
    return ledger;
}
