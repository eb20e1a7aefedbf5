"""Read Avro object container files with fastavro (a reader nobody here wrote) and print them as JSON.

usage: avro_dump.py FILE...   ->  one JSON object per file on stdout:
  {"file", "codec", "schema", "records": [...]}
bytes become {"$b64": base64}, timestamp-micros become integer microseconds since the epoch (UTC).
"""
import base64
import datetime
import json
import sys

import fastavro

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def plain(v):
    if isinstance(v, (bytes, bytearray)):
        return {"$b64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        d = v - EPOCH
        return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    return v


for path in sys.argv[1:]:
    with open(path, "rb") as f:
        r = fastavro.reader(f)
        records = [plain(rec) for rec in r]
        print(json.dumps({
            "file": path,
            "codec": r.codec,
            "schema": r.writer_schema,
            "records": records,
        }))
