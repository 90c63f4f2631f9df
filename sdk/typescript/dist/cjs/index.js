"use strict";
var __createBinding = (this && this.__createBinding) || (Object.create ? (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    var desc = Object.getOwnPropertyDescriptor(m, k);
    if (!desc || ("get" in desc ? !m.__esModule : desc.writable || desc.configurable)) {
      desc = { enumerable: true, get: function() { return m[k]; } };
    }
    Object.defineProperty(o, k2, desc);
}) : (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    o[k2] = m[k];
}));
var __setModuleDefault = (this && this.__setModuleDefault) || (Object.create ? (function(o, v) {
    Object.defineProperty(o, "default", { enumerable: true, value: v });
}) : function(o, v) {
    o["default"] = v;
});
var __exportStar = (this && this.__exportStar) || function(m, exports) {
    for (var p in m) if (p !== "default" && !Object.prototype.hasOwnProperty.call(exports, p)) __createBinding(exports, m, p);
};
var __importStar = (this && this.__importStar) || (function () {
    var ownKeys = function(o) {
        ownKeys = Object.getOwnPropertyNames || function (o) {
            var ar = [];
            for (var k in o) if (Object.prototype.hasOwnProperty.call(o, k)) ar[ar.length] = k;
            return ar;
        };
        return ownKeys(o);
    };
    return function (mod) {
        if (mod && mod.__esModule) return mod;
        var result = {};
        if (mod != null) for (var k = ownKeys(mod), i = 0; i < k.length; i++) if (k[i] !== "default") __createBinding(result, mod, k[i]);
        __setModuleDefault(result, mod);
        return result;
    };
})();
Object.defineProperty(exports, "__esModule", { value: true });
exports.middlewareCore = exports.withIdempotency = exports.authenticatedPrincipal = exports.fixedPrincipal = exports.markRetryable = exports.idempotency = exports.FingerprintError = exports.sha256Hex = exports.selectFields = exports.fingerprint = exports.canonicalize = exports.Reconciler = exports.encodeResult = exports.makeIdempotent = exports.runOnce = exports.newClaimId = exports.Client = void 0;
// @settle/client: the TypeScript SDK of settle (SPEC §7, §8, §11).
__exportStar(require("./errors.js"), exports);
__exportStar(require("./types.js"), exports);
var client_js_1 = require("./client.js");
Object.defineProperty(exports, "Client", { enumerable: true, get: function () { return client_js_1.Client; } });
Object.defineProperty(exports, "newClaimId", { enumerable: true, get: function () { return client_js_1.newClaimId; } });
var worker_js_1 = require("./worker.js");
Object.defineProperty(exports, "runOnce", { enumerable: true, get: function () { return worker_js_1.runOnce; } });
Object.defineProperty(exports, "makeIdempotent", { enumerable: true, get: function () { return worker_js_1.makeIdempotent; } });
Object.defineProperty(exports, "encodeResult", { enumerable: true, get: function () { return worker_js_1.encodeResult; } });
var reconciler_js_1 = require("./reconciler.js");
Object.defineProperty(exports, "Reconciler", { enumerable: true, get: function () { return reconciler_js_1.Reconciler; } });
var jcs_js_1 = require("./jcs.js");
Object.defineProperty(exports, "canonicalize", { enumerable: true, get: function () { return jcs_js_1.canonicalize; } });
Object.defineProperty(exports, "fingerprint", { enumerable: true, get: function () { return jcs_js_1.fingerprint; } });
Object.defineProperty(exports, "selectFields", { enumerable: true, get: function () { return jcs_js_1.selectFields; } });
Object.defineProperty(exports, "sha256Hex", { enumerable: true, get: function () { return jcs_js_1.sha256Hex; } });
Object.defineProperty(exports, "FingerprintError", { enumerable: true, get: function () { return jcs_js_1.FingerprintError; } });
var express_js_1 = require("./express.js");
Object.defineProperty(exports, "idempotency", { enumerable: true, get: function () { return express_js_1.idempotency; } });
Object.defineProperty(exports, "markRetryable", { enumerable: true, get: function () { return express_js_1.markRetryable; } });
Object.defineProperty(exports, "fixedPrincipal", { enumerable: true, get: function () { return express_js_1.fixedPrincipal; } });
Object.defineProperty(exports, "authenticatedPrincipal", { enumerable: true, get: function () { return express_js_1.authenticatedPrincipal; } });
var fetch_js_1 = require("./fetch.js");
Object.defineProperty(exports, "withIdempotency", { enumerable: true, get: function () { return fetch_js_1.withIdempotency; } });
exports.middlewareCore = __importStar(require("./mwcore.js"));
