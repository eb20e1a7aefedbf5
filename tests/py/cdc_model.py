"""Change data capture into Delta (subsink issue 35): a generator of change streams and the
reference model of the table they must leave behind. Used by tests/cdc.rs; standard library only.

    cdc_model.py generate --seed S --changes N --keys K [--key id|region,id] [--no-sequence]
        One JSON object on stdout:
          "key":      the primary key's columns
          "changes":  the message payloads in arrival (delivery) order, one JSON object each
          "expected": the rows the table must hold afterwards, sorted by the key
          "stats":    what the stream contains (the Rust test asserts the interesting cases occur)
    cdc_model.py model --key id|region,id   (a JSON array of payloads on stdin)
        The expected rows of those payloads, in the order given (the model alone).

The model (docs/contract.md §4.9, stated independently of the implementation):
  * a change's number is its `_CHANGE_SEQUENCE_NUMBER`, or 0 without one (absent or null);
    sequence numbers are 1 to 4 sections of hex digits separated by `/`, compared section by
    section as unsigned numbers, missing sections being 0 (`FF` and `FF/0` are equal);
  * per key, the change with the highest number over the whole stream wins; among equal numbers,
    the later arrival (so a stream without numbers: the last change by arrival);
  * a change without `_CHANGE_TYPE` fails alone (dead letter): it is not part of the stream;
  * a DELETE winner means no row; an UPSERT winner is the row: the table's columns as the payload
    gives them (absent = NULL) plus `_CHANGE_SEQUENCE_NUMBER` normalized (4 sections, each 16
    upper-case hex digits, `/`-joined; NULL when the winner had none);
  * tombstones (with every change inside the retention window): the keys whose winner is a
    DELETE with a number above 0.

Generated streams (deterministic for a seed):
  * K keys, each change picks a key uniformly; a key that is present gets a DELETE 30% of the
    time, an absent key an UPSERT 85% of the time (re-inserts after deletes, and deletes of keys
    that are not there);
  * each key's numbers rise with random gaps; its shape is fixed per key: one section (`1F`),
    two sections (`3/2`, written as one section when the second is 0), a first section near
    2^64 (16 digits), or four sections; upper or lower case, sometimes leading zeros or trailing
    `/0` sections;
  * ~10% of the changes are delivered late, after up to three of their key's later changes;
  * ~5% are delivered twice (an exact copy, later in the stream);
  * nullable columns are sometimes absent or null;
  * `--mixed` (with numbers): ~15% of the changes carry no number (absent, or null), and ~8% reuse
    their key's previous number with other content (equal numbers: the later arrival wins).
"""

import argparse
import json
import random
import sys

COLUMNS = ["id", "region", "name", "qty", "score", "ok"]
REGIONS = ["eu", "us", "ap"]
SECTION_MAX = (1 << 64) - 1


def parse_sequence(text):
    """The number of a sequence string as a 4-tuple of ints (missing sections are 0)."""
    sections = text.split("/")
    assert 1 <= len(sections) <= 4, text
    out = []
    for s in sections:
        assert 1 <= len(s) <= 16 and all(c in "0123456789abcdefABCDEF" for c in s), text
        out.append(int(s, 16))
    while len(out) < 4:
        out.append(0)
    return tuple(out)


def normalize(number):
    return "/".join("%016X" % n for n in number)


def key_of(change, key):
    return tuple(change.get(k) for k in key)


ZERO = (0, 0, 0, 0)


def number_of_change(c):
    n = c.get("_CHANGE_SEQUENCE_NUMBER")
    return ZERO if n is None else parse_sequence(n)


def winners(changes, key):
    """Per key: (number, change) of the winner; changes without `_CHANGE_TYPE` fail alone."""
    winner = {}
    for i, c in enumerate(changes):
        if c.get("_CHANGE_TYPE") is None:
            continue
        k = key_of(c, key)
        rank = (number_of_change(c), i)
        old = winner.get(k)
        if old is None or rank >= old[0]:
            winner[k] = (rank, c)
    return {k: (rank[0], c) for k, (rank, c) in winner.items()}


def model(changes, key):
    """Expected rows of `changes` (payloads in arrival order), sorted by the key."""
    win = winners(changes, key)
    rows = []
    for k in sorted(win, key=sort_key):
        number, c = win[k]
        kind = c["_CHANGE_TYPE"]
        assert kind in ("UPSERT", "DELETE"), c
        if kind == "DELETE":
            continue
        row = {col: c.get(col) for col in COLUMNS}
        row["_CHANGE_SEQUENCE_NUMBER"] = (
            None if c.get("_CHANGE_SEQUENCE_NUMBER") is None else normalize(number))
        rows.append(row)
    return rows


def tombstones(changes, key):
    """How many tombstones the table keeps (every change inside the retention window)."""
    return sum(1 for number, c in winners(changes, key).values()
               if c["_CHANGE_TYPE"] == "DELETE" and number > ZERO)


def sort_key(k):
    # Keys are tuples of ints and strings; None never occurs in a generated key.
    return tuple((0, v) if isinstance(v, int) else (1, v) for v in k)


def fmt_sequence(number, rng, shape):
    """A string for `number` (4-tuple) in one of BigQuery's accepted spellings."""
    sections = list(number)
    keep = 4
    while keep > 1 and sections[keep - 1] == 0:
        keep -= 1
    if shape == "two" and keep == 1 and rng.random() < 0.5:
        keep = 2  # `5/0`: the same number as `5`
    if rng.random() < 0.15:
        keep = max(keep, min(4, keep + rng.randint(1, 3)))  # trailing `/0` sections
    parts = []
    for n in sections[:keep]:
        digits = "%X" % n
        if rng.random() < 0.5:
            digits = digits.lower()
        if rng.random() < 0.1:
            digits = "0" * min(16 - len(digits), rng.randint(1, 3)) + digits
        parts.append(digits)
    return "/".join(parts)


def number_of(counter, shape):
    if shape == "one":
        return (counter, 0, 0, 0)
    if shape == "two":
        return (counter // 4, counter % 4, 0, 0)
    if shape == "big":
        return (SECTION_MAX - 0xFFFF + counter, 0, 0, 0)
    return (1, 0x2F, counter // 16, counter % 16)  # "four"


def key_values(k, key):
    """The key columns of key number `k`."""
    if key == ["region", "id"]:
        # ids repeat across regions: a writer keying on `id` alone would merge three keys.
        return {"region": REGIONS[k % 3], "id": k // 3}
    ident = k * 7 + 1
    if k % 50 == 0:
        ident = (1 << 62) + k  # beyond 2^53: exact 64-bit integers
    return {"id": ident}


def generate(seed, n, keys, key, sequence, mixed=False):
    rng = random.Random(seed)
    shapes = ["one"] * 12 + ["two"] * 5 + ["big"] * 2 + ["four"]
    shape = [rng.choice(shapes) for _ in range(keys)]
    counter = [0] * keys
    present = [False] * keys
    ever_deleted = [False] * keys
    stats = {"changes": 0, "upserts": 0, "deletes": 0, "reinserts": 0, "deletes_of_absent": 0,
             "late": 0, "duplicates": 0, "multi_section": 0,
             "sixteen_digit_section": 0, "inversions": 0, "unnumbered": 0,
             "equal_numbers": 0}
    logical = []  # (key number, payload) in the order the source produced them
    for _ in range(n):
        k = rng.randrange(keys)
        if present[k]:
            kind = "DELETE" if rng.random() < 0.3 else "UPSERT"
        else:
            kind = "UPSERT" if rng.random() < 0.85 else "DELETE"
        equal = mixed and counter[k] > 0 and rng.random() < 0.08
        if not equal:
            counter[k] += rng.randint(1, 3)
        c = dict(key_values(k, key))
        if kind == "UPSERT":
            if "region" not in c:
                c["region"] = rng.choice(REGIONS)
            r = rng.random()
            if r < 0.1:
                pass  # `name` absent: NULL
            elif r < 0.15:
                c["name"] = None
            else:
                c["name"] = "k%d-c%d-%s" % (k, counter[k], rng.choice(["", "é", "x" * 20]))
            c["qty"] = rng.randint(-(1 << 40), 1 << 40)
            if rng.random() < 0.9:
                c["score"] = rng.randint(-8000, 8000) / 8
            c["ok"] = rng.random() < 0.5
            c["_CHANGE_TYPE"] = "UPSERT"
            stats["upserts"] += 1
            if ever_deleted[k] and not present[k]:
                stats["reinserts"] += 1
            present[k] = True
        else:
            c["_CHANGE_TYPE"] = "DELETE"
            if rng.random() < 0.2:
                c["name"] = "deleted"  # a DELETE may carry other columns: they do not matter
            stats["deletes"] += 1
            if not present[k]:
                stats["deletes_of_absent"] += 1
            present[k] = False
            ever_deleted[k] = True
        if sequence and mixed and rng.random() < 0.15:
            stats["unnumbered"] += 1
            if rng.random() < 0.3:
                c["_CHANGE_SEQUENCE_NUMBER"] = None
        elif sequence:
            if equal:
                stats["equal_numbers"] += 1
            number = number_of(counter[k], shape[k])
            text = fmt_sequence(number, rng, shape[k])
            assert parse_sequence(text) == number, (text, number)
            c["_CHANGE_SEQUENCE_NUMBER"] = text
            if "/" in text:
                stats["multi_section"] += 1
            if any(len(s.lstrip("0")) == 16 for s in text.split("/")):
                stats["sixteen_digit_section"] += 1
        elif rng.random() < 0.1:
            c["_CHANGE_SEQUENCE_NUMBER"] = None  # explicitly no number: the same as absent
        logical.append((k, c))

    # Delivery: a change's slot is its position, plus a delay when it is late; duplicates are
    # copies with a slot of their own. The average distance between two changes of a key is
    # `keys`, so a delay of up to 3 * keys lets a late change fall behind up to ~3 of its key's
    # later ones.
    slots = []
    for i, (k, c) in enumerate(logical):
        slot = float(i)
        if sequence and "_CHANGE_SEQUENCE_NUMBER" in c and rng.random() < 0.10:
            slot += rng.uniform(1, 3 * keys)
            stats["late"] += 1
        slots.append((slot, rng.random(), k, c))
        if rng.random() < 0.05:
            slots.append((i + rng.uniform(0, 3 * keys), rng.random(), k, c))
            stats["duplicates"] += 1
    slots.sort(key=lambda s: (s[0], s[1]))
    changes = [c for _, _, _, c in slots]
    stats["changes"] = len(changes)
    if sequence:
        best = {}
        for _, _, k, c in slots:
            num = number_of_change(c)
            if k in best and num < best[k]:
                stats["inversions"] += 1  # delivered after a higher number of its key
            best[k] = max(best.get(k, num), num)
    return {"key": key, "changes": changes, "expected": model(changes, key),
            "tombstones": tombstones(changes, key), "stats": stats}


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--seed", type=int, required=True)
    g.add_argument("--changes", type=int, required=True)
    g.add_argument("--keys", type=int, required=True)
    g.add_argument("--key", default="id")
    g.add_argument("--no-sequence", action="store_true")
    g.add_argument("--mixed", action="store_true")
    m = sub.add_parser("model")
    m.add_argument("--key", default="id")
    a = p.parse_args()
    key = a.key.split(",")
    assert key in (["id"], ["region", "id"]), key
    if a.cmd == "generate":
        out = generate(a.seed, a.changes, a.keys, key, not a.no_sequence, a.mixed)
    else:
        out = model(json.load(sys.stdin), key)
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
