// Generates testdata/fingerprint-vectors.json (the shared fingerprint vectors
// of issue 10 item 2 / SPEC §11.1) with an independent JCS implementation:
// the `canonicalize` npm package (Samuel Erdtman, co-author of RFC 8785).
// The Python tests re-check every vector with the `rfc8785` PyPI package, and
// both SDKs' own implementations are tested against the file.
//
//   cd sdk/typescript && npm install && node scripts/gen-vectors.mjs
//
// Inputs are kept as raw JSON text so that the file shows the RFC's own
// spellings (1E30, 4.50, ...) and every SDK's JSON parser is exercised too.
// Field selection (a list of JSON pointers) is the SDKs' convention, written
// down in sdk/MIDDLEWARE-KEYS.md: the canonicalised value is the object
// {pointer: value} of the pointers that resolve; a pointer that does not
// resolve is left out; a malformed pointer or an empty list is an error.
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import canonicalize from 'canonicalize';

function f64(hex) {
  const b = Buffer.from(hex, 'hex');
  return b.readDoubleBE(0);
}

// RFC 8785 §3.2.2.3 table (IEEE 754 bit patterns → expected text), and
// Appendix B sample numbers. Written into the file as the shortest text that
// parses back to the same double.
const rfcNumbers = [
  ['0000000000000000', '0'],
  ['8000000000000000', '0'],
  ['0000000000000001', '5e-324'],
  ['8000000000000001', '-5e-324'],
  ['7fefffffffffffff', '1.7976931348623157e+308'],
  ['ffefffffffffffff', '-1.7976931348623157e+308'],
  ['4340000000000000', '9007199254740992'],
  ['c340000000000000', '-9007199254740992'],
  ['4430000000000000', '295147905179352830000'],
  ['44b52d02c7e14af5', '9.999999999999997e+22'],
  ['44b52d02c7e14af6', '1e+23'],
  ['44b52d02c7e14af7', '1.0000000000000001e+23'],
  ['444b1ae4d6e2ef4e', '999999999999999700000'],
  ['444b1ae4d6e2ef4f', '999999999999999900000'],
  ['444b1ae4d6e2ef50', '1e+21'],
  ['3eb0c6f7a0b5ed8c', '9.999999999999997e-7'],
  ['3eb0c6f7a0b5ed8d', '0.000001'],
  ['41b3de4355555553', '333333333.3333332'],
  ['41b3de4355555554', '333333333.33333325'],
  ['41b3de4355555555', '333333333.3333333'],
  ['41b3de4355555556', '333333333.3333334'],
  ['41b3de4355555557', '333333333.33333343'],
  ['becbf647612f3696', '-0.0000033333333333333333'],
  ['43143ff3c1cb0959', '1424953923781206.2'],
];

const cases = [];
function add(name, input, fields) {
  cases.push({ name, input, fields });
}
function addError(name, input, fields, error) {
  cases.push({ name, input, fields, error });
}

// --- RFC 8785 examples -----------------------------------------------------
add('rfc8785 §3.2.2 main example', `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\"\\/",
  "literals": [null, true, false]
}`);
add('rfc8785 §3.2.3 sorting example', `{
  "\\u20ac": "Euro Sign",
  "\\r": "Carriage Return",
  "\\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\\ud83d\\ude00": "Emoji: Grinning Face",
  "\\u0080": "Control",
  "\\u00f6": "Latin Small Letter O With Diaeresis"
}`);
add('rfc8785 §3.2.4 utf-8 example', `{"Unnormalized Unicode":"A\\u030a"}`);
for (const [hex, want] of rfcNumbers) {
  const v = f64(hex);
  // The shortest round-trip text; "-0" for negative zero.
  const text = Object.is(v, -0) ? '-0.0' : JSON.stringify(v);
  if (Number(text) !== v && !(Object.is(v, -0))) throw new Error(`bad text for ${hex}`);
  if (canonicalize(v) !== want) throw new Error(`canonicalize disagrees with RFC 8785 on ${hex}: ${canonicalize(v)} != ${want}`);
  add(`rfc8785 §3.2.2.3 number ${hex}`, `[${text}]`);
}

// --- numbers ---------------------------------------------------------------
add('integer zero', '0');
add('integer negative zero', '-0');
add('float negative zero', '-0.0');
add('small integers', '[1, -1, 10, 100, 12345]');
add('max safe integer', '[9007199254740991, -9007199254740991]');
add('2^53 and 2^53+1 (the latter rounds to the nearest double)', '[9007199254740992, 9007199254740993]');
add('large integer 1e20 stays plain', '100000000000000000000');
add('large integer 1e21 switches to exponent', '1000000000000000000000');
add('very large integer', '123456789012345678901234567890');
add('2^64', '18446744073709551616');
add('fractions', '[1.5, -1.5, 0.1, 0.5, 0.30000000000000004, 3.141592653589793]');
add('integral floats print as integers', '[1.0, -2.00, 1e0, 100.000]');
add('exponent spellings', '[1E2, 1e+2, 1e-2, 2.5e-8, 12345e-2, 1.2345E+4]');
add('small magnitudes: 1e-6 plain, 1e-7 exponent', '[0.000001, 0.0000001, 1e-7, 1.5e-10]');
add('large magnitudes', '[1e21, 1.5e300, -1e308, 1e22]');
add('denormals', '[5e-324, 2.2250738585072014e-308, 2.225073858507201e-308]');
add('numbers as amounts', '{"amount": 1099, "currency": "EUR", "fee": 0.25}');

// --- strings and Unicode ---------------------------------------------------
add('control characters use short escapes or lowercase \\u00xx',
  '"\\u0000\\u0001\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u001f\\u0020"');
add('DEL, C1 controls, U+2028 and U+2029 are written literally', '"\\u007f\\u0080\\u009f\\u2028\\u2029"');
add('quote, backslash and solidus', '"\\"\\\\/\\/"');
add('non-ASCII written as UTF-8, not escaped', '"caf\\u00e9 \\u65e5\\u672c \\u0416 \\ud83d\\ude00 \\u00df"');
add('raw UTF-8 input', '"Grüße, 世界 🙂"');
add('precomposed é', '{"name": "\\u00e9"}');
add('decomposed é is a different string (no normalisation)', '{"name": "e\\u0301"}');
add('astral plane characters', '["\\ud834\\udd1e", "\\ud83c\\udff3\\ufe0f\\u200d\\ud83c\\udf08"]');
add('empty string', '""');
add('BOM and noncharacters are kept', '"\\ufeff\\uffff\\ufdd0"');

// --- key order -------------------------------------------------------------
add('keys sorted by UTF-16 code units', '{"b": 1, "a": 2, "B": 3, "aa": 4, "": 5, "A": 6, "_": 7, "~": 8}');
add('digit keys sort as strings', '{"10": "ten", "9": "nine", "1": "one", "100": "hundred"}');
add('astral key sorts before U+E000..U+FFFF (UTF-16, not code point order)',
  '{"\\uffff": "last in code units", "\\ue000": "private use", "\\ud83d\\ude00": "emoji", "\\u00ff": "y diaeresis"}');
add('prefix keys', '{"abc": 3, "ab": 2, "a": 1, "abd": 4}');
add('key with NUL sorts after its prefix', '{"a\\u0000": 2, "a": 1}');
add('member order of the input is irrelevant (1)', '{"currency": "EUR", "amount": 10, "meta": {"z": 1, "y": 2}}');
add('member order of the input is irrelevant (2)', '{"meta": {"y": 2, "z": 1}, "amount": 10, "currency": "EUR"}');

// --- nesting and empties ---------------------------------------------------
add('empty object', '{}');
add('empty array', '[]');
add('null', 'null');
add('true', 'true');
add('false', 'false');
add('nested empties', '{"a": {}, "b": [], "c": [{}, []], "d": [[[]]]}');
add('nested objects sorted at every level', '{"z": {"b": {"d": 1, "c": 2}, "a": [ {"y": 1, "x": 2} ]}, "a": null}');
add('array order is kept', '[3, 1, 2, "b", "a", {"b": 1, "a": 2}]');
add('whitespace of the input is irrelevant', ' { "a" :\t[ 1 ,\n 2 ] , "b" : { } } ');
add('deep nesting', '[[[[[[[[[[{"deep": [[[[[[[[[[1]]]]]]]]]]}]]]]]]]]]]');
add('payment request', '{"amount": 1000, "currency": "EUR", "customer": {"id": "cus_42", "email": "a@example.com"}, "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "note": null, "delay_ms": 0}');

// --- field selection -------------------------------------------------------
const pay = '{"amount": 1000, "currency": "EUR", "customer": {"id": "cus_42", "email": "a@example.com"}, "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "note": null, "request_id": "r-1"}';
add('fields: two top-level members', pay, ['/amount', '/currency']);
add('fields: the order of the pointers is irrelevant', pay, ['/currency', '/amount']);
add('fields: a duplicated pointer counts once', pay, ['/amount', '/currency', '/amount']);
add('fields: nested member', pay, ['/customer/id', '/amount']);
add('fields: array element and member of an element', pay, ['/items/0', '/items/1/sku']);
add('fields: a whole subtree', pay, ['/items']);
add('fields: the whole document ("" pointer)', pay, ['']);
add('fields: a null value is present, not missing', pay, ['/note']);
add('fields: a missing member is left out', pay, ['/amount', '/missing']);
add('fields: all missing gives the empty object', pay, ['/missing', '/customer/phone']);
add('fields: "-" is never an element (missing)', pay, ['/items/-']);
add('fields: leading-zero index is not an index (missing)', pay, ['/items/01']);
add('fields: index out of range (missing)', pay, ['/items/2']);
add('fields: a pointer through a scalar (missing)', pay, ['/amount/value']);
add('fields: a pointer into null (missing)', pay, ['/note/x']);
const esc = '{"a/b": 1, "m~n": 2, "~1": 3, "": 4, " ": 5, "0": 6, "x": {"": {"y": 7}}, "%25": 8}';
add('fields: ~1 escapes "/"', esc, ['/a~1b']);
add('fields: ~0 escapes "~"', esc, ['/m~0n']);
add('fields: ~01 is "~1", not "/"', esc, ['/~01']);
add('fields: "/" is the empty key', esc, ['/']);
add('fields: a space key', esc, ['/ ']);
add('fields: "0" on an object is a member name', esc, ['/0']);
add('fields: empty keys inside a path', esc, ['/x//y']);
add('fields: no percent-decoding', esc, ['/%25']);
add('fields: every pointer of the escaping object', esc, ['/a~1b', '/m~0n', '/~01', '/', '/ ', '/0', '/x//y', '/%25']);
add('fields: selecting from an array document', '[{"id": 1}, {"id": 2}]', ['/1/id', '/0']);
add('fields: Unicode member names', '{"prix": 5, "€": "EUR", "😀": true}', ['/€', '/😀']);
addError('fields: a pointer without a leading "/" is refused', pay, ['amount'], 'invalid_fields');
addError('fields: "~" must be followed by 0 or 1', pay, ['/a~2b'], 'invalid_fields');
addError('fields: a trailing "~" is refused', pay, ['/amount~'], 'invalid_fields');
addError('fields: an empty list is refused', pay, [], 'invalid_fields');

// --- selection (the convention of sdk/MIDDLEWARE-KEYS.md) -----------------
function parsePointer(p) {
  if (p === '') return [];
  if (!p.startsWith('/')) throw new Error('invalid_fields');
  return p.slice(1).split('/').map((t) => {
    if (/~[^01]|~$/.test(t)) throw new Error('invalid_fields');
    return t.replace(/~1/g, '/').replace(/~0/g, '~');
  });
}
const MISSING = Symbol('missing');
function resolve(doc, tokens) {
  let cur = doc;
  for (const t of tokens) {
    if (Array.isArray(cur)) {
      if (!/^(0|[1-9][0-9]*)$/.test(t)) return MISSING;
      const i = Number(t);
      if (i >= cur.length) return MISSING;
      cur = cur[i];
    } else if (cur !== null && typeof cur === 'object') {
      if (!Object.prototype.hasOwnProperty.call(cur, t)) return MISSING;
      cur = cur[t];
    } else {
      return MISSING;
    }
  }
  return cur;
}
function select(doc, fields) {
  if (fields === undefined) return doc;
  if (fields.length === 0) throw new Error('invalid_fields');
  const out = {};
  const parsed = fields.map((p) => [p, parsePointer(p)]);
  for (const [p, tokens] of parsed) {
    const v = resolve(doc, tokens);
    if (v !== MISSING) out[p] = v;
  }
  return out;
}

const seen = new Set();
const lines = [];
for (const c of cases) {
  if (seen.has(c.name)) throw new Error(`duplicate name ${c.name}`);
  seen.add(c.name);
  const doc = JSON.parse(c.input);
  const parts = [`"name": ${JSON.stringify(c.name)}`, `"input": ${c.input.replace(/\s*\n\s*/g, ' ').trim()}`];
  if (c.fields !== undefined) parts.push(`"fields": ${JSON.stringify(c.fields)}`);
  if (c.error !== undefined) {
    let threw = null;
    try { select(doc, c.fields); } catch (e) { threw = e.message; }
    if (threw !== c.error) throw new Error(`${c.name}: expected error ${c.error}, got ${threw}`);
    parts.push(`"error": ${JSON.stringify(c.error)}`);
  } else {
    const canonical = canonicalize(select(doc, c.fields));
    const sha256 = createHash('sha256').update(canonical, 'utf8').digest('hex');
    parts.push(`"canonical": ${JSON.stringify(canonical)}`, `"sha256": "${sha256}"`);
  }
  lines.push(`  {${parts.join(', ')}}`);
}
const text = `[\n${lines.join(',\n')}\n]\n`;
JSON.parse(text); // the file must be valid JSON
const out = fileURLToPath(new URL('../../../testdata/fingerprint-vectors.json', import.meta.url));
writeFileSync(out, text);
console.log(`wrote ${cases.length} cases to ${out}`);
