"""Reads back the Delta tables the archive replay bench (benches/archive_replay.rs) made, one per
contender, with deltalake and pyarrow (readers subsink does not share code with), and fails unless
each holds exactly the archive's messages and the tables hold the same thing:

* each table: N rows, message ids "0" … "N-1", each once;
* both: the same columns with the same types, and, row by row (matched by message id), the same
  values in every column;
* both: the same Parquet codec in every column chunk of every data file (subsink writes zstd).

Prints one line per table (rows, data files, codecs) and one for the comparison. Not timed.

usage: archive_replay_check.py N TABLE_DIR [TABLE_DIR …]
"""
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

n = int(sys.argv[1])
tables = sys.argv[2:]
failed = []


def fail(msg):
    failed.append(msg)
    print(f"check: FAILED: {msg}")


def ids_sorted(dt):
    """The table's message ids as integers, and the row order that sorts them."""
    ids = dt.to_pyarrow_table(columns=["message_id"]).column("message_id")
    as_int = pc.cast(ids, pa.int64())
    return as_int, pc.sort_indices(as_int)


schemas = {}
order = {}
for path in tables:
    dt = DeltaTable(path)
    before = len(failed)
    schema = dt.schema().to_arrow()
    schemas[path] = schema
    ids, idx = ids_sorted(dt)
    order[path] = idx
    rows = len(ids)
    if rows != n:
        fail(f"{path}: {rows} rows, expected {n}")
    nulls = ids.null_count
    distinct = pc.count_distinct(ids).as_py()
    lo, hi = pc.min(ids).as_py(), pc.max(ids).as_py()
    # n rows, none null, n distinct values, all within 0..n-1: each id exactly once.
    if nulls or distinct != n or lo != 0 or hi != n - 1:
        fail(f"{path}: message ids: {distinct} distinct of {rows} rows, {nulls} null, range {lo}..{hi}")
    codecs = set()
    files = dt.file_uris()
    for uri in files:
        meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                codecs.add(meta.row_group(g).column(c).compression)
    schemas[path, "codecs"] = codecs
    print(
        f"check: {path}: {rows} rows, message ids 0..{n - 1} each once: "
        f"{'yes' if len(failed) == before else 'NO'}; {len(files)} data files, "
        f"{dt.version() + 1} log versions, codecs {', '.join(sorted(codecs))}"
    )

first = tables[0]
for other in tables[1:]:
    a, b = schemas[first], schemas[other]
    if [(f.name, f.type) for f in a] != [(f.name, f.type) for f in b]:
        fail(f"columns differ: {first}: {a} / {other}: {b}")
        continue
    if schemas[first, "codecs"] != schemas[other, "codecs"]:
        fail(f"codecs differ: {schemas[first, 'codecs']} / {schemas[other, 'codecs']}")
    # Column by column (to hold one column of each table at a time), both in message id order.
    differ = []
    for name in a.names:
        ca = DeltaTable(first).to_pyarrow_table(columns=[name]).column(name).take(order[first])
        cb = DeltaTable(other).to_pyarrow_table(columns=[name]).column(name).take(order[other])
        if not ca.equals(cb):
            neq = pc.invert(pc.fill_null(pc.equal(ca, cb), False))
            i = pc.index(neq, True).as_py()
            differ.append(name)
            fail(f"column {name} differs, first at row {i} in message id order: {ca[i]!r} / {cb[i]!r}")
    if not differ:
        print(f"check: {first} and {other}: same {len(a)} columns ({', '.join(a.names)}), same values in every row")

sys.exit(1 if failed else 0)
