// The peer of benches/transforms.rs: Node.js reads the same NDJSON file, decodes each message and
// applies the same UDF (reading + transforming only, no writing). Prints one JSON line.
'use strict';
const fs = require('node:fs');
const readline = require('node:readline');

const code = fs.readFileSync(process.argv[3], 'utf8');
const udf = new Function(`${code}; return enrich;`)();

async function main() {
  const start = process.hrtime.bigint();
  const rl = readline.createInterface({
    input: fs.createReadStream(process.argv[2], { highWaterMark: 1 << 20 }),
    crlfDelay: Infinity,
  });
  let n = 0;
  let bytes = 0;
  for await (const line of rl) {
    if (!line) continue;
    const w = JSON.parse(line);
    const message = {
      data: Buffer.from(w.data, 'base64').toString('utf8'),
      attributes: w.attributes || {},
    };
    const metadata = { message_id: w.messageId, publish_time: w.publishTime.slice(0, 19) + 'Z' };
    const r = udf(message, metadata);
    bytes += Buffer.byteLength(r.data);
    n++;
  }
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ messages: n, seconds: secs, out_bytes: bytes }));
}
main();
