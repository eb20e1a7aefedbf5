"""The table-writer bench's job done with DuckDB: NDJSON of Pub/Sub messages (REST form) -> one
zstd Parquet file of the rows a BigQuery subscription with use_table_schema and write_metadata
writes (benches/table_events.schema.json plus subscription_name, message_id, publish_time,
attributes as JSON text). DuckDB reads the envelope, base64-decodes `data`, `json_transform`s it to
the typed schema and `COPY ... TO` Parquet, on all cores. Prints msgs/s, MB/s (input), CPU seconds
and peak RSS.

usage: table_duckdb.py INPUT.ndjson OUTPUT.parquet   (needs scripts/setup-test-env's .venv)
"""
import os
import resource
import sys
import time

import duckdb

SUBSCRIPTION = "projects/bench/subscriptions/bench"

# benches/table_events.schema.json in DuckDB types: NUMERIC = DECIMAL(38, 9), TIMESTAMP =
# TIMESTAMPTZ, REPEATED = a list, RECORD = a struct.
PAYLOAD = (
    '{"event_id":"VARCHAR","user_name":"VARCHAR","quantity":"BIGINT","score":"DOUBLE",'
    '"is_test":"BOOLEAN","amount":"DECIMAL(38,9)","event_time":"TIMESTAMPTZ",'
    '"event_date":"DATE","local_time":"TIME","tags":["VARCHAR"],'
    '"device":{"model":"VARCHAR","os_version":"BIGINT","locale":"VARCHAR"},"coupon":"VARCHAR"}'
)

QUERY = f"""
COPY (
  SELECT r.*,
         '{SUBSCRIPTION}' AS subscription_name,
         messageId AS message_id,
         publishTime AS publish_time,
         attributes::VARCHAR AS attributes
  FROM (
    SELECT json_transform(decode(from_base64(data)), '{PAYLOAD}') AS r,
           messageId, publishTime, attributes
    FROM read_ndjson({{input}}, columns = {{data: 'VARCHAR', attributes: 'JSON',
                                           messageId: 'VARCHAR', publishTime: 'TIMESTAMPTZ'}})
  )
) TO {{output}} (FORMAT parquet, COMPRESSION zstd)
"""


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def main():
    src, dst = sys.argv[1], sys.argv[2]
    size = os.path.getsize(src)
    if os.path.exists(dst):
        os.remove(dst)
    start = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET preserve_insertion_order = false")
    query = QUERY.replace("{input}", quote(src)).replace("{output}", quote(dst))
    n = con.execute(query).fetchone()[0]
    secs = time.perf_counter() - start
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"duckdb {duckdb.__version__}: {n} msgs in {secs:.2f} s: {n / secs:,.0f} msgs/s, "
          f"{size / secs / 1e6:,.1f} MB/s input, CPU {ru.ru_utime + ru.ru_stime:.1f} s, "
          f"peak RSS {ru.ru_maxrss / 1024:.0f} MiB, output {os.path.getsize(dst) / 1e6:.1f} MB")


main()
