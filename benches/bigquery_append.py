"""The BigQuery bench's Python contender: the same job as `subsink run` into a BigQuery table,
with Google's official Storage Write client (`google-cloud-bigquery-storage`).

Reads the bench's NDJSON messages, maps each to the same row subsink writes (use_table_schema +
write_metadata: the payload's JSON fields as columns, then subscription_name, message_id,
publish_time and the attributes as JSON text), builds Arrow record batches with pyarrow of about
8 MiB of message bytes (subsink's request size), and appends them to the table's default stream
with `AppendRowsStream`, every request sent at once and then every answer awaited.

    python bigquery_append.py INPUT.ndjson HOST:PORT projects/P/datasets/D/tables/T SUBSCRIPTION

prints one JSON object: rows, seconds (from the first line read to the last append answered:
interpreter start and imports are not counted), cpu_seconds (of that span).
"""
import base64
import json
import sys
import time

import grpc
import pyarrow as pa
from google.cloud.bigquery_storage_v1 import BigQueryWriteClient, types, writer
from google.cloud.bigquery_storage_v1.services.big_query_write.transports import (
    BigQueryWriteGrpcTransport,
)

CHUNK_BYTES = 8 << 20

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("ok", pa.bool_()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("payload", pa.string()),
        pa.field("subscription_name", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("attributes", pa.string()),
    ]
)


def micros(rfc3339):
    # 2023-09-25T04:10:00.123456Z
    from datetime import datetime

    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1_000_000)


def main():
    path, host, table, subscription = sys.argv[1:5]
    start, cpu = time.perf_counter(), time.process_time()
    channel = grpc.insecure_channel(host)
    client = BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))
    stream_name = f"{table}/streams/_default"
    schema_bytes = SCHEMA.serialize().to_pybytes()
    template = types.AppendRowsRequest(write_stream=stream_name)
    template.arrow_rows = types.AppendRowsRequest.ArrowData(
        writer_schema=types.ArrowSchema(serialized_schema=schema_bytes)
    )
    stream = writer.AppendRowsStream(client, template)
    cols = {f.name: [] for f in SCHEMA}
    futures, rows, pending = [], 0, 0

    def flush():
        nonlocal cols, pending
        batch = pa.record_batch([pa.array(cols[f.name], type=f.type) for f in SCHEMA], schema=SCHEMA)
        req = types.AppendRowsRequest(write_stream=stream_name)
        req.arrow_rows = types.AppendRowsRequest.ArrowData(
            writer_schema=types.ArrowSchema(serialized_schema=schema_bytes),
            rows=types.ArrowRecordBatch(serialized_record_batch=batch.serialize().to_pybytes()),
        )
        futures.append(stream.send(req))
        cols = {f.name: [] for f in SCHEMA}
        pending = 0

    with open(path, "rb") as f:
        for line in f:
            m = json.loads(line)
            data = base64.b64decode(m["data"])
            p = json.loads(data)
            cols["id"].append(p["id"])
            cols["name"].append(p["name"])
            cols["score"].append(p["score"])
            cols["ok"].append(p["ok"])
            cols["at"].append(micros(p["at"]))
            cols["payload"].append(p["payload"])
            cols["subscription_name"].append(subscription)
            cols["message_id"].append(m["messageId"])
            cols["publish_time"].append(micros(m["publishTime"]))
            attrs = m.get("attributes") or {}
            cols["attributes"].append(json.dumps(attrs, separators=(",", ":"), sort_keys=True))
            rows += 1
            pending += len(data) + sum(len(k) + len(v) for k, v in attrs.items())
            if pending >= CHUNK_BYTES:
                flush()
    if pending:
        flush()
    for fut in futures:
        fut.result()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu
    stream.close()
    print(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu_seconds}))


if __name__ == "__main__":
    main()
