"""The change data capture bench's peer (benches/cdc_merge.rs): subsink's job done with the Python
`deltalake` package (delta-rs, DataFusion underneath) and pyarrow.

    cdc_merge.py run INPUT.ndjson TABLE_DIR BATCH [json|orjson]
        Applies the changes of INPUT (benches/cdc_data.py) to a Delta table at TABLE_DIR, BATCH
        changes per commit, as subsink does (src/table/merge.rs, docs/contract.md §4.9):
        * the table (the schema's columns plus `_CHANGE_SEQUENCE_NUMBER`, STRING) and its
          tombstone table (`_tombstones/` under the root: `id`, `_CHANGE_SEQUENCE_NUMBER`) are
          created first with write_deltalake of an empty table;
        * per batch: each line decoded (json, base64, json: the standard library's json, or orjson
          when asked), the sequence number normalized (four sections of 16 upper-case hex digits
          joined by `/`), the last change per key kept (highest number; on a tie or without
          numbers the later one; pure Python);
        * changes older than their key's tombstone dropped (the tombstone table read and
          left-joined with pyarrow; only once it has a commit besides its creation, as subsink);
        * tombstones MERGEd (a numbered DELETE inserts or raises its key's, a numbered UPSERT at
          least as new deletes it), then the table MERGEd: `DeltaTable.merge(source, "t.id = s.id",
          source_alias="s", target_alias="t")` with the three clauses of subsink and the same
          predicates — matched DELETE deleted, matched UPSERT updates every column, both only when
          the change's number is NULL, the row's is NULL, or the change's >= the row's; an
          unmatched UPSERT inserted;
        * subsink's compression (zstd level 1) and `streamed_exec=False` (the source is an
          in-memory table, as subsink's `read_batch`; delta-rs may then scan it more than once).
        Timed from before the tables are created (before the first line is read) to the last
        commit; CPU seconds over the same span (this process, all threads). Prints one JSON line:
        {"changes", "batches", "commits", "version", "secs", "cpu_secs", "peak_rss_mib",
         "phases": seconds per phase, "merge": summed MERGE metrics of the table, "deltalake",
         "decoder"}.

    cdc_merge.py check INPUT.ndjson TABLE_A TOMBSTONES_A TABLE_B TOMBSTONES_B
        Reads both tables (and both tombstone tables) with deltalake and compares their sorted rows,
        and compares the rows with a model of INPUT computed here (per key, the change with the
        highest number over the whole stream; a DELETE winner is no row). Also the files of each
        table's snapshot and its log history (files added / removed over all commits). Prints one
        JSON line; exits 1 when anything differs.
"""
import base64
import json
import os
import re
import resource
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, WriterProperties, __version__ as DELTALAKE, write_deltalake

SEQ = "_CHANGE_SEQUENCE_NUMBER"
CT = "_CHANGE_TYPE"
COLUMNS = ["id", "name", "qty", "price", SEQ]
TABLE = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64()),
                   ("price", pa.float64()), (SEQ, pa.string())])
SOURCE = TABLE.append(pa.field(CT, pa.string()))
TOMBSTONES = pa.schema([("id", pa.int64()), (SEQ, pa.string())])
FORM = re.compile(r"[0-9A-Fa-f]{1,16}(?:/[0-9A-Fa-f]{1,16}){0,3}")
ZERO = "/0000000000000000"


def normalize(text):
    """BigQuery's sequence number format, normalized as subsink stores it."""
    if FORM.fullmatch(text) is None:
        raise ValueError("bad sequence number %r" % text)
    sections = text.split("/")
    return "/".join(["%016X" % int(s, 16) for s in sections]) + ZERO * (4 - len(sections))


def q(side, column):
    return "%s.`%s`" % (side, column)


NEWER = "(%s IS NULL OR %s IS NULL OR %s >= %s)" % (q("s", SEQ), q("t", SEQ), q("s", SEQ), q("t", SEQ))
TOMB_NEWER = "%s >= %s" % (q("s", SEQ), q("t", SEQ))


def decode(lines, loads=json.loads):
    """The batch's changes as columns (arrival order)."""
    cols = {c: [] for c in SOURCE.names}
    for line in lines:
        c = loads(base64.b64decode(loads(line)["data"]))
        kind = c.get(CT) or "UPSERT"
        if kind not in ("UPSERT", "DELETE"):
            raise ValueError("bad change type %r" % kind)
        seq = c.get(SEQ)
        cols["id"].append(c["id"])
        cols["name"].append(c.get("name"))
        cols["qty"].append(c.get("qty"))
        cols["price"].append(c.get("price"))
        cols[SEQ].append(None if seq is None else normalize(seq))
        cols[CT].append(kind)
    return cols


def last_changes(cols):
    """Per key the change with the highest number (on a tie, or without numbers: the later)."""
    ids, seqs = cols["id"], cols[SEQ]
    winner = {}
    for i, k in enumerate(ids):
        w = winner.get(k)
        if w is None or not (seqs[i] is not None and seqs[w] is not None and seqs[i] < seqs[w]):
            winner[k] = i
    keep = sorted(winner.values())
    return pa.table({c: pa.array([v[i] for i in keep], SOURCE.field(c).type)
                     for c, v in cols.items()}, schema=SOURCE)


def drop_stale(tomb, live):
    """`live` without the changes older than their key's tombstone."""
    if tomb.version() == 0:
        return live  # no tombstone yet
    dead = tomb.to_pyarrow_table(columns=["id", SEQ]).rename_columns(["id", "__dead"])
    joined = live.join(dead, keys="id", join_type="left outer")
    keep = pc.or_kleene(pc.or_kleene(pc.is_null(joined["__dead"]), pc.is_null(joined[SEQ])),
                         pc.greater_equal(joined[SEQ], joined["__dead"]))
    return joined.filter(keep).select(SOURCE.names)


def record_deletes(tomb, live, props):
    numbered = live.filter(pc.is_valid(live[SEQ]))
    deletes = pc.any(pc.equal(numbered[CT], "DELETE")).as_py() or False
    if not deletes and tomb.version() == 0:
        return None  # nothing to add, nothing to remove
    return (tomb.merge(numbered.select(["id", SEQ, CT]), "t.id = s.id", source_alias="s",
                       target_alias="t", writer_properties=props, streamed_exec=False)
            .when_matched_delete("%s = 'UPSERT' AND %s" % (q("s", CT), TOMB_NEWER))
            .when_matched_update({"`%s`" % SEQ: q("s", SEQ)},
                                 "%s = 'DELETE' AND %s" % (q("s", CT), TOMB_NEWER))
            .when_not_matched_insert({"id": "s.id", "`%s`" % SEQ: q("s", SEQ)},
                                     "%s = 'DELETE'" % q("s", CT))
            .execute())


def merge_into(dt, live, props):
    every = {"`%s`" % c: q("s", c) for c in COLUMNS}
    return (dt.merge(live, "t.id = s.id", source_alias="s", target_alias="t",
                     writer_properties=props, streamed_exec=False)
            .when_matched_delete("%s = 'DELETE' AND %s" % (q("s", CT), NEWER))
            .when_matched_update(every, "%s = 'UPSERT' AND %s" % (q("s", CT), NEWER))
            .when_not_matched_insert(every, "%s = 'UPSERT'" % q("s", CT))
            .execute())


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(input_path, table_dir, batch, decoder):
    if decoder == "orjson":
        import orjson
        loads = orjson.loads
    else:
        assert decoder == "json", decoder
        loads = json.loads
    props = WriterProperties(compression="ZSTD", compression_level=1)
    phases = {"read_decode": 0.0, "last_change": 0.0, "tombstones_read": 0.0,
              "tombstones_merge": 0.0, "table_merge": 0.0}
    merge_totals = {}
    t0, c0 = time.perf_counter(), cpu()
    tomb_dir = os.path.join(table_dir, "_tombstones")
    write_deltalake(table_dir, TABLE.empty_table())
    write_deltalake(tomb_dir, TOMBSTONES.empty_table())
    dt, tomb = DeltaTable(table_dir), DeltaTable(tomb_dir)
    changes = batches = commits = 0
    with open(input_path, "rb") as f:
        while True:
            t = time.perf_counter()
            lines = []
            for line in f:
                lines.append(line)
                if len(lines) == batch:
                    break
            if not lines:
                break
            cols = decode(lines, loads)
            t2 = time.perf_counter()
            phases["read_decode"] += t2 - t
            winners = last_changes(cols)
            t3 = time.perf_counter()
            phases["last_change"] += t3 - t2
            numbered = winners[SEQ].null_count < winners.num_rows
            if numbered or tomb.version() > 0:
                live = drop_stale(tomb, winners)
                t4 = time.perf_counter()
                phases["tombstones_read"] += t4 - t3
                if record_deletes(tomb, live, props) is not None:
                    commits += 1
                t3 = time.perf_counter()
                phases["tombstones_merge"] += t3 - t4
            else:
                live = winners
            m = merge_into(dt, live, props)
            phases["table_merge"] += time.perf_counter() - t3
            for k, v in m.items():
                merge_totals[k] = merge_totals.get(k, 0) + v
            commits += 1
            changes += len(lines)
            batches += 1
    secs, cpu_secs = time.perf_counter() - t0, cpu() - c0
    out = {"changes": changes, "batches": batches, "commits": commits, "version": dt.version(),
           "secs": secs, "cpu_secs": cpu_secs,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "phases": {k: round(v, 3) for k, v in phases.items()}, "merge": merge_totals,
           "deltalake": DELTALAKE, "decoder": decoder}
    print(json.dumps(out))


def winners(input_path):
    """Per key the winning change: the highest number wins (later on a tie)."""
    winner = {}
    with open(input_path, "rb") as f:
        for line in f:
            c = json.loads(base64.b64decode(json.loads(line)["data"]))
            seq = normalize(c[SEQ])
            old = winner.get(c["id"])
            if old is None or seq >= old[SEQ]:
                winner[c["id"]] = dict(c, **{SEQ: seq})
    return winner


def model(input_path):
    """Rows the input must leave, by key."""
    return sorted(({col: c.get(col) for col in COLUMNS} for c in winners(input_path).values()
                   if c.get(CT, "UPSERT") == "UPSERT"), key=lambda r: r["id"])


def model_tombstones(input_path):
    """subsink's tombstones (issue 43): the keys whose winner is a numbered DELETE, by key."""
    return sorted(({"id": c["id"], SEQ: c[SEQ]} for c in winners(input_path).values()
                   if c.get(CT) == "DELETE"), key=lambda r: r["id"])


def history(path):
    """Files of the snapshot, and what the log's commits added and removed over all versions."""
    log = os.path.join(path, "_delta_log")
    added = removed = added_bytes = live = peak = 0
    versions = sorted(int(n[:-5]) for n in os.listdir(log) if n.endswith(".json"))
    for v in versions:
        with open(os.path.join(log, "%020d.json" % v)) as f:
            for line in f:
                a = json.loads(line)
                if "add" in a:
                    added += 1
                    added_bytes += a["add"]["size"]
                    live += 1
                elif "remove" in a:
                    removed += 1
                    live -= 1
        peak = max(peak, live)
    return {"versions": len(versions), "files": live, "peak_files": peak, "files_added": added,
            "files_removed": removed, "mb_written": round(added_bytes / 1e6, 2)}


def rows_of(path, sort_key):
    t = DeltaTable(path).to_pyarrow_table()
    return t.schema, sorted(t.to_pylist(), key=sort_key)


def check(input_path, a, ta, b, tb):
    by_id = lambda r: r["id"]
    schema_a, rows_a = rows_of(a, by_id)
    schema_b, rows_b = rows_of(b, by_id)
    tomb_a = rows_of(ta, by_id)[1] if DeltaTable.is_deltatable(ta) else []
    tomb_b = rows_of(tb, by_id)[1] if DeltaTable.is_deltatable(tb) else []
    expected = model(input_path)
    out = {
        "rows": [len(rows_a), len(rows_b)], "model_rows": len(expected),
        "equal": rows_a == rows_b, "model_equal": rows_a == expected,
        "schemas_equal": schema_a == schema_b,
        # subsink's tombstones follow the model (no tombstone for a DELETE that lost to a newer
        # row); the peer keeps one for every numbered DELETE, so the two are not compared.
        "tombstones": [len(tomb_a), len(tomb_b)],
        "tombstones_model_equal": [{"id": r["id"], SEQ: r[SEQ]} for r in tomb_a]
        == model_tombstones(input_path),
        "a": history(a), "b": history(b),
    }
    if not out["schemas_equal"]:
        out["schemas"] = [str(schema_a), str(schema_b)]
    for name, got in (("equal", rows_b), ("model_equal", expected)):
        if not out[name]:
            diff = [(x, y) for x, y in zip(rows_a, got) if x != y][:3]
            out["first_differences_" + name] = diff
    print(json.dumps(out))
    ok = (out["equal"] and out["model_equal"] and out["schemas_equal"]
          and out["tombstones_model_equal"])
    sys.exit(0 if ok else 1)


def main():
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "json")
    elif sys.argv[1] == "check":
        check(*sys.argv[2:7])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
