"""Input of the change data capture bench (benches/cdc_merge.rs): N NDJSON Pub/Sub messages
(`{"data": base64(json), "messageId": "..."}`) whose payloads are changes to a table keyed by `id`:

    {"id": 17, "name": "...", "qty": 3, "price": 1.5, "_CHANGE_TYPE": "UPSERT",
     "_CHANGE_SEQUENCE_NUMBER": "1a"}
    {"id": 17, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": "1C"}

* K keys, each change picks one uniformly; a key that is present gets a DELETE 33% of the time, an
  absent one 5% of the time (a delete of a key that is not there): ~25% deletes overall.
* Each key's sequence numbers rise with gaps of 1 to 3; most keys spell theirs as one section of
  hex digits (`1a`, `1C`, either case, sometimes with leading zeros), one key in six as two
  sections (`high/low`, four numbers per high section), so the normalized form matters.
* ~5% of the changes are delivered late, up to 2K positions after their slot: past one or two of
  their key's later changes and, with batches of 10000 over 5000 keys, often into a later batch
  (where only the row's stored number, or the tombstone of a delete, tells they are old).

Deterministic for a given N, K and seed (stdlib only). Prints a JSON line of statistics to stderr.

usage: cdc_data.py OUTPUT.ndjson [N [K [SEED]]]
       (N, K default to SUBSINK_BENCH_CHANGES / SUBSINK_BENCH_KEYS or 100000 / 5000)
"""
import base64
import json
import os
import random
import sys


def spell(number, two, rng):
    """`number` in one of BigQuery's accepted spellings (one or two sections)."""
    sections = [number // 4, number % 4] if two else [number]
    if two and sections[1] == 0 and rng.random() < 0.5:
        sections = sections[:1]  # `5` is `5/0`
    parts = []
    for n in sections:
        digits = "%X" % n
        if rng.random() < 0.5:
            digits = digits.lower()
        if rng.random() < 0.1:
            digits = "00" + digits
        parts.append(digits)
    return "/".join(parts)


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else int(
        os.environ.get("SUBSINK_BENCH_CHANGES", "100000"))
    keys = int(sys.argv[3]) if len(sys.argv) > 3 else int(
        os.environ.get("SUBSINK_BENCH_KEYS", "5000"))
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 35
    rng = random.Random(seed)
    two = [rng.random() < 1 / 6 for _ in range(keys)]
    counter = [0] * keys
    present = [False] * keys
    stats = {"changes": n, "keys": keys, "upserts": 0, "deletes": 0, "deletes_of_absent": 0,
             "late": 0, "inversions": 0}
    slots = []
    for i in range(n):
        k = rng.randrange(keys)
        delete = rng.random() < (0.33 if present[k] else 0.05)
        counter[k] += rng.randint(1, 3)
        c = {"id": k * 7 + 1}
        if delete:
            stats["deletes"] += 1
            stats["deletes_of_absent"] += not present[k]
            present[k] = False
            c["_CHANGE_TYPE"] = "DELETE"
        else:
            stats["upserts"] += 1
            present[k] = True
            c["name"] = "item-%d-%d" % (k, counter[k])
            c["qty"] = rng.randrange(-1000, 1000000)
            c["price"] = rng.randrange(0, 10**7) / 100
            c["_CHANGE_TYPE"] = "UPSERT"
        c["_CHANGE_SEQUENCE_NUMBER"] = spell(counter[k], two[k], rng)
        slot = float(i)
        if rng.random() < 0.05:
            slot += rng.uniform(1, 2 * keys)
            stats["late"] += 1
        slots.append((slot, k, counter[k], c))
    slots.sort(key=lambda s: s[0])
    best = {}
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for i, (_, k, number, c) in enumerate(slots):
            if best.get(k, -1) > number:
                stats["inversions"] += 1  # delivered after a higher number of its key
            best[k] = max(best.get(k, -1), number)
            data = base64.b64encode(json.dumps(c, separators=(",", ":")).encode()).decode()
            f.write('{"data":"%s","messageId":"%d"}\n' % (data, i))
    os.replace(out + ".tmp", out)
    print(json.dumps(stats), file=sys.stderr)


if __name__ == "__main__":
    main()
