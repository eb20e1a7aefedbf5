"""The storage bench's job done with fastavro: NDJSON of Pub/Sub messages -> Avro with metadata
(layout B), one container file, null codec. Prints msgs/s, MB/s (input) and peak RSS.

usage: fastavro_same_job.py INPUT.ndjson OUTPUT.avro
"""
import base64
import datetime
import json
import resource
import sys
import time

import fastavro

SCHEMA = fastavro.parse_schema({
    "type": "record", "namespace": "com.google.pubsub", "name": "PubsubMessageWithMetadata",
    "fields": [
        {"name": "subscription_name", "type": "string"},
        {"name": "message_id", "type": "string"},
        {"name": "publish_time", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "attributes", "type": {"type": "map", "values": "string"}},
        {"name": "data", "type": "bytes"},
    ],
})


def records(path):
    with open(path, "rb") as f:
        for line in f:
            m = json.loads(line)
            t = datetime.datetime.fromisoformat(m["publishTime"].replace("Z", "+00:00"))
            attrs = dict(m.get("attributes", {}))
            if m.get("orderingKey"):
                attrs["ordering_key"] = m["orderingKey"]
            yield {
                "subscription_name": "projects/bench/subscriptions/bench",
                "message_id": m["messageId"],
                "publish_time": t,
                "attributes": attrs,
                "data": base64.b64decode(m["data"]),
            }


def main():
    src, dst = sys.argv[1], sys.argv[2]
    import os
    size = os.path.getsize(src)
    n = 0
    start = time.perf_counter()

    def counted():
        nonlocal n
        for r in records(src):
            n += 1
            yield r

    with open(dst, "wb") as out:
        fastavro.writer(out, SCHEMA, counted(), codec="null")
    secs = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"fastavro: {n} msgs in {secs:.2f} s: {n / secs:,.0f} msgs/s, "
          f"{size / secs / 1e6:,.1f} MB/s input, peak RSS {rss:.0f} MiB")


main()
