// The second engine of tests/transforms.rs's differential test: Node.js (V8) runs a
// subscription's JavaScript UDFs on the messages of an NDJSON file with the contract of
// docs/transforms.md, written here from the contract, not from subsink's code.
//
//   node smt_reference.js TRANSFORMS.json MESSAGES.ndjson  →  one JSON line per message:
//   {"id": ID, "outcome": "transformed", "data": TEXT, "attributes": {…}}
//   {"id": ID, "outcome": "filtered", "by": FUNCTION}
//   {"id": ID, "outcome": "failed", "by": FUNCTION}
//
// Each UDF runs in a V8 context of its own (node:vm) that holds ECMAScript's built-ins only.
'use strict';
const fs = require('node:fs');
const vm = require('node:vm');

const transforms = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  .filter((t) => !t.disabled)
  .map((t) => {
    const ctx = vm.createContext({});
    vm.runInContext(t.javascriptUdf.code, ctx, { filename: 'udf' });
    return { name: t.javascriptUdf.functionName, ctx };
  });

const isPlainObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);

// One UDF's result: null filters; {data: string, attributes?: {string: string}} replaces.
function shape(r, attributes) {
  if (r === null) return { filtered: true };
  if (!isPlainObject(r)) return { failed: true };
  const data = r.data;
  if (typeof data !== 'string' || !data.isWellFormed()) return { failed: true };
  const a = r.attributes;
  if (a === undefined) return { data, attributes };
  if (!isPlainObject(a)) return { failed: true };
  const out = {};
  for (const [k, v] of Object.entries(a)) {
    if (typeof v !== 'string' || !v.isWellFormed() || !k.isWellFormed()) return { failed: true };
    out[k] = v;
  }
  return { data, attributes: out };
}

function run(wire) {
  const id = wire.messageId;
  const bytes = Buffer.from(wire.data || '', 'base64');
  const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  let cur = { data: text, attributes: { ...(wire.attributes || {}) } };
  const metadata = { message_id: id };
  if (wire.publishTime) {
    metadata.publish_time = new Date(wire.publishTime).toISOString().slice(0, 19) + 'Z';
  }
  if (wire.orderingKey) metadata.ordering_key = wire.orderingKey;
  for (const t of transforms) {
    const message = { data: cur.data, attributes: { ...cur.attributes } };
    let r;
    try {
      r = vm.runInContext(`${t.name}`, t.ctx)(message, { ...metadata });
    } catch (e) {
      return { id, outcome: 'failed', by: t.name };
    }
    let s;
    try {
      s = shape(r, cur.attributes);
    } catch (e) {
      return { id, outcome: 'failed', by: t.name };
    }
    if (s.filtered) return { id, outcome: 'filtered', by: t.name };
    if (s.failed) return { id, outcome: 'failed', by: t.name };
    cur = s;
  }
  return { id, outcome: 'transformed', data: cur.data, attributes: cur.attributes };
}

const out = [];
for (const line of fs.readFileSync(process.argv[3], 'utf8').split('\n')) {
  if (line.trim() === '') continue;
  out.push(JSON.stringify(run(JSON.parse(line))));
}
process.stdout.write(out.join('\n') + '\n');
