"""The Python pipeline the archive replay bench (benches/archive_replay.rs) measures subsink
against: read every Avro object of an archive (Avro with metadata) with fastavro, build one Arrow
table per object with pyarrow (the columns subsink's no-schema table writer makes with
writeMetadata: data, subscription_name, message_id, publish_time, attributes as JSON text), and
append it to a Delta table with deltalake.write_deltalake, in zstd level 1 Parquet as subsink writes
it (deltalake's own default is snappy). Prints {"messages": N}. The bench reads both tables back
afterwards (benches/archive_replay_check.py): same rows, columns, values and codec.

usage: archive_replay.py ARCHIVE_DIR TABLE_DIR
"""
import json
import os
import sys

import fastavro
import pyarrow as pa
from deltalake import WriterProperties, write_deltalake

archive, table = sys.argv[1], sys.argv[2]
names = sorted(
    os.path.join(root, f)
    for root, _, files in os.walk(archive)
    for f in files
    if not f.startswith(".")
)
schema = pa.schema(
    [
        ("data", pa.binary()),
        ("subscription_name", pa.string()),
        ("message_id", pa.string()),
        ("publish_time", pa.timestamp("us", tz="UTC")),
        ("attributes", pa.string()),
    ]
)
props = WriterProperties(compression="ZSTD", compression_level=1)
total = 0
for name in names:
    cols = {k: [] for k in schema.names}
    with open(name, "rb") as f:
        for r in fastavro.reader(f):
            cols["data"].append(r["data"])
            cols["subscription_name"].append("projects/bench/subscriptions/replay")
            cols["message_id"].append(r["message_id"])
            cols["publish_time"].append(r["publish_time"])
            cols["attributes"].append(json.dumps(r["attributes"], sort_keys=True, separators=(",", ":")))
    batch = pa.table(cols, schema=schema)
    total += batch.num_rows
    write_deltalake(table, batch, mode="append", writer_properties=props)
print(json.dumps({"messages": total}))
sys.stdout.flush()
os._exit(0)
