"""Input of the table-writer bench: N NDJSON Pub/Sub messages in REST form
(`{"data": base64, "attributes": {...}, "messageId": ..., "publishTime": RFC 3339}`) whose payload
is a JSON object with the 12 typed fields of `benches/table_events.schema.json`: two strings, an
INT64, a FLOAT64, a BOOL, a NUMERIC as decimal text, TIMESTAMP / DATE / TIME as BigQuery literals,
a REPEATED STRING, a RECORD, and a NULLABLE string that is null a third of the time and absent
another third. Deterministic for a given N and seed (stdlib only).

usage: table_data.py OUTPUT.ndjson [N]   (N defaults to SUBSINK_BENCH_MESSAGES or 1000000)
"""
import base64
import datetime
import json
import os
import random
import sys

TAGS = ["checkout", "mobile", "web", "promo", "retry", "eu", "us", "beta", "vip", "new"]
NAMES = ["ann", "bob", "chloé", "dmitri", "eve", "fatima", "gus", "hiro", "ines", "jürgen"]
MODELS = ["pixel-9", "iphone-16", "galaxy-s25", "thinkpad-x1", "macbook-air"]
LOCALES = ["en-US", "fr-FR", "de-DE", "ja-JP", "pt-BR"]
BASE = datetime.datetime(2026, 11, 30, tzinfo=datetime.timezone.utc)


def payload(rng, i):
    t = BASE + datetime.timedelta(microseconds=i * 1000 + rng.randrange(1000))
    p = {
        "event_id": "%032x" % rng.getrandbits(128),
        "user_name": "%s-%d" % (rng.choice(NAMES), rng.randrange(100000)),
        "quantity": rng.randrange(-1000, 1000000),
        "score": rng.randrange(-10**9, 10**9) / 1024.0,
        "is_test": rng.random() < 0.1,
        "amount": "%d.%02d" % (rng.randrange(100000), rng.randrange(100)),
        "event_time": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "event_date": t.strftime("%Y-%m-%d"),
        "local_time": "%02d:%02d:%02d.%03d" % (
            rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.randrange(1000)),
        "tags": rng.sample(TAGS, rng.randrange(5)),
        "device": {
            "model": rng.choice(MODELS),
            "os_version": rng.randrange(10, 20),
            "locale": rng.choice(LOCALES),
        },
    }
    r = i % 3
    if r == 0:
        p["coupon"] = "C%06d" % rng.randrange(10**6)
    elif r == 1:
        p["coupon"] = None
    return p


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else int(
        os.environ.get("SUBSINK_BENCH_MESSAGES", "1000000"))
    rng = random.Random(20261130)
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for i in range(n):
            data = json.dumps(payload(rng, i), separators=(",", ":"), ensure_ascii=False)
            pub = BASE + datetime.timedelta(microseconds=i * 1000)
            line = {
                "data": base64.b64encode(data.encode()).decode(),
                "attributes": {"source": "bench", "tenant": "t-%d" % (i % 100),
                               "type": "event.v1"},
                "messageId": str(10_000_000_000 + i),
                "publishTime": pub.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            }
            f.write(json.dumps(line, separators=(",", ":")))
            f.write("\n")
    os.replace(out + ".tmp", out)


main()
