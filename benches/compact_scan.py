"""Compaction of a Delta table (issue 36): a table of many small commits, then `subsink compact`,
then scans of both, in interleaved rounds.

    SUBSINK_VENV/bin/python benches/compact_scan.py

1. Builds the table with the real binary: `subsink run` of generated NDJSON messages (id, name,
   score, kind, at) with `subsink.table.maxMessages` = ROWS, so COMMITS commits of ROWS rows
   (one Parquet file each) into a local folder.
2. Copies it, and runs `subsink compact --table-url file://COPY` on the copy (timed; the report
   printed): files and bytes before and after.
3. ROUNDS rounds; in each, for both tables (their order alternating per round), each query timed
   from opening the table (`deltalake.DeltaTable(path)`: reading the log) to the last row:
   * `pyarrow scan`:  `dt.to_pyarrow_dataset().to_table()`, every column;
   * `pyarrow agg`:   the dataset's `id`, `kind`, `score` columns, `group_by("kind")` with count,
                      sum and max;
   * `duckdb scan`:   `SELECT * FROM ds` over the same pyarrow dataset, fetched as Arrow (`con.sql(…).to_arrow_table()`);
   * `duckdb agg`:    `SELECT kind, count(*), sum(score), max(id) FROM ds GROUP BY kind`.
   Every round is printed, then the medians; the results of the two tables must be equal.

Environment: SUBSINK_BIN (default target/release/subsink if built, else target/debug/subsink),
COMPACT_BENCH_COMMITS (500), COMPACT_BENCH_ROWS (1000), COMPACT_BENCH_ROUNDS (5),
COMPACT_BENCH_DIR (scratch folder; default a temp dir, removed at the end).
"""

import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import deltalake
import duckdb
import pyarrow.compute as pc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITS = int(os.environ.get("COMPACT_BENCH_COMMITS", "500"))
ROWS = int(os.environ.get("COMPACT_BENCH_ROWS", "1000"))
ROUNDS = int(os.environ.get("COMPACT_BENCH_ROUNDS", "5"))
SCHEMA = [
    {"name": "id", "type": "INT64", "mode": "REQUIRED"},
    {"name": "name", "type": "STRING"},
    {"name": "score", "type": "FLOAT64"},
    {"name": "kind", "type": "STRING"},
    {"name": "at", "type": "TIMESTAMP"},
]
KINDS = ["click", "view", "buy", "share", "like"]


def subsink_bin():
    if os.environ.get("SUBSINK_BIN"):
        return os.environ["SUBSINK_BIN"]
    for profile in ("release", "debug"):
        p = os.path.join(ROOT, "target", profile, "subsink")
        if os.path.exists(p):
            return p
    sys.exit("no subsink binary: cargo build first, or set SUBSINK_BIN")


def du(path):
    files = total = 0
    for d, _, fs in os.walk(path):
        if "_delta_log" in d:  # its checkpoints are Parquet too
            continue
        for f in fs:
            if f.endswith(".parquet"):
                files += 1
                total += os.path.getsize(os.path.join(d, f))
    return files, total


def build(scratch, binary):
    src = os.path.join(scratch, "in.ndjson")
    with open(src, "w") as out:
        for i in range(COMMITS * ROWS):
            row = {"id": i, "name": f"name-{i % 9973}", "score": (i % 1000) / 7.0,
                   "kind": KINDS[i % len(KINDS)],
                   "at": f"2024-05-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z"}
            data = base64.b64encode(json.dumps(row).encode()).decode()
            out.write(json.dumps({"data": data, "messageId": str(i),
                                  "publishTime": "2024-05-01T00:00:00Z"}) + "\n")
    sub = os.path.join(scratch, "sub.json")
    with open(sub, "w") as f:
        json.dump({"name": "projects/bench/subscriptions/compact",
                   "topic": "projects/bench/topics/events",
                   "bigqueryConfig": {"table": "bench.events.rows", "useTableSchema": True},
                   "subsink": {"table": {"maxMessages": str(ROWS)}}}, f)
    schema = os.path.join(scratch, "schema.json")
    with open(schema, "w") as f:
        json.dump(SCHEMA, f)
    table = os.path.join(scratch, "small")
    t0 = time.monotonic()
    subprocess.run([binary, "run", "--subscription", sub, "--source", src,
                    "--table-url", "file://" + table, "--table-schema", schema],
                   check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, SUBSINK_LOG="error"))
    print(f"built: {COMMITS} commits x {ROWS} rows in {time.monotonic() - t0:.1f} s", flush=True)
    return table


def q_pyarrow_scan(path):
    return deltalake.DeltaTable(path).to_pyarrow_dataset().to_table().num_rows


def q_pyarrow_agg(path):
    t = deltalake.DeltaTable(path).to_pyarrow_dataset().to_table(columns=["id", "kind", "score"])
    g = t.group_by("kind").aggregate([("id", "count"), ("score", "sum"), ("id", "max")])
    g = g.sort_by("kind")
    return [(k, c, round(s, 3), m) for k, c, s, m in zip(
        g["kind"].to_pylist(), g["id_count"].to_pylist(), g["score_sum"].to_pylist(),
        g["id_max"].to_pylist())]


def q_duckdb_scan(path):
    ds = deltalake.DeltaTable(path).to_pyarrow_dataset()  # noqa: F841 (named in the query)
    con = duckdb.connect()
    return con.sql("SELECT * FROM ds").to_arrow_table().num_rows


def q_duckdb_agg(path):
    ds = deltalake.DeltaTable(path).to_pyarrow_dataset()  # noqa: F841
    con = duckdb.connect()
    rows = con.execute("SELECT kind, count(*), sum(score), max(id) FROM ds GROUP BY kind "
                       "ORDER BY kind").fetchall()
    return [(k, c, round(s, 3), m) for k, c, s, m in rows]


QUERIES = [("pyarrow scan", q_pyarrow_scan), ("pyarrow agg", q_pyarrow_agg),
           ("duckdb scan", q_duckdb_scan), ("duckdb agg", q_duckdb_agg)]


def main():
    binary = subsink_bin()
    own = "COMPACT_BENCH_DIR" not in os.environ
    scratch = os.environ.get("COMPACT_BENCH_DIR") or tempfile.mkdtemp(prefix="compact-bench-")
    os.makedirs(scratch, exist_ok=True)
    print(f"subsink: {binary}; deltalake {deltalake.__version__}, duckdb {duckdb.__version__}")
    small = build(scratch, binary)
    compacted = os.path.join(scratch, "compacted")
    shutil.copytree(small, compacted)
    t0 = time.monotonic()
    out = subprocess.run([binary, "compact", "--table-url", "file://" + compacted],
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, SUBSINK_LOG="error"))
    secs = time.monotonic() - t0
    report = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"compact: {secs:.2f} s: {json.dumps(report)}")
    small_files = len(deltalake.DeltaTable(small).file_uris())
    comp_files = len(deltalake.DeltaTable(compacted).file_uris())
    print(f"files in the log: {small_files} -> {comp_files}; bytes of those files: "
          f"{report['bytes_before']} -> "
          f"{report['bytes_before'] - report['bytes_removed'] + report['bytes_added']}; "
          f"on disk (removed files kept for VACUUM): {du(compacted)}")
    tables = [("small", small), ("compacted", compacted)]
    times = {(t, q): [] for t, _ in tables for q, _ in QUERIES}
    for r in range(ROUNDS):
        order = tables if r % 2 == 0 else list(reversed(tables))
        line = []
        for qname, q in QUERIES:
            results = {}
            for tname, path in order:
                t0 = time.monotonic()
                results[tname] = q(path)
                s = time.monotonic() - t0
                times[(tname, qname)].append(s)
                line.append(f"{qname} {tname} {s:.3f}")
            assert results["small"] == results["compacted"], (qname, results)
        print(f"round {r + 1}: " + "; ".join(line), flush=True)
    print("medians (s):")
    for qname, _ in QUERIES:
        a = statistics.median(times[("small", qname)])
        b = statistics.median(times[("compacted", qname)])
        print(f"  {qname:13s} small {a:.3f}  compacted {b:.3f}  speed-up {a / b:.1f}x")
    if own:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
