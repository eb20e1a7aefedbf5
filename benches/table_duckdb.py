"""The table-writer bench's job done with DuckDB: NDJSON of Pub/Sub messages (REST form) -> one
zstd Parquet file of the rows a BigQuery subscription with use_table_schema and write_metadata
writes (benches/table_events.schema.json plus subscription_name, message_id, publish_time,
attributes as JSON text). DuckDB reads the envelope, base64-decodes `data`,
`json_transform_strict`s it to the typed schema (a value that does not convert fails the job, as it
fails the message in subsink, instead of becoming NULL; `coupon`, the one field the payloads may
leave out, is read on its own) and `COPY ... TO` Parquet, on all cores.

Fair to both sides: zstd at level 1, subsink's level (parquet's default; DuckDB's own default is 3);
the time is measured inside the script around the job (connect, query, file written), so Python's
start-up and `import duckdb` do not count; CPU seconds likewise cover the job only. Peak RSS is the
process's. After the clock stops the output is checked as strictly as subsink's: COPY's row count
and the Parquet file's own row count must both equal the input's line count (`EXPECTED_ROWS`).

Prints one JSON line: {"rows", "file_rows", "secs", "cpu_secs", "peak_rss_mib", "bytes", "duckdb"}.

usage: table_duckdb.py INPUT.ndjson OUTPUT.parquet EXPECTED_ROWS   (needs scripts/setup-test-env's .venv)
"""
import json
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
    '"device":{"model":"VARCHAR","os_version":"BIGINT","locale":"VARCHAR"}}'
)

QUERY = f"""
COPY (
  SELECT r.*,
         coupon,
         '{SUBSCRIPTION}' AS subscription_name,
         messageId AS message_id,
         publishTime AS publish_time,
         attributes::VARCHAR AS attributes
  FROM (
    SELECT json_transform_strict(payload, '{PAYLOAD}') AS r,
           json_extract_string(payload, '$.coupon') AS coupon,
           messageId, publishTime, attributes
    FROM (SELECT decode(from_base64(data)) AS payload, messageId, publishTime, attributes
          FROM read_ndjson({{input}}, columns = {{data: 'VARCHAR', attributes: 'JSON',
                                                 messageId: 'VARCHAR', publishTime: 'TIMESTAMPTZ'}}))
  )
) TO {{output}} (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)
"""


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main():
    src, dst, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if os.path.exists(dst):
        os.remove(dst)
    query = QUERY.replace("{input}", quote(src)).replace("{output}", quote(dst))
    cpu0 = cpu()
    start = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET preserve_insertion_order = false")
    n = con.execute(query).fetchone()[0]
    secs = time.perf_counter() - start
    cpu_secs = cpu() - cpu0
    # Checked after the clock: the rows COPY reports and the rows the file holds.
    file_rows = con.execute(
        f"SELECT sum(row_group_num_rows) FROM (SELECT DISTINCT row_group_id, row_group_num_rows "
        f"FROM parquet_metadata({quote(dst)}))").fetchone()[0]
    if n != expected or file_rows != expected:
        sys.exit(f"duckdb wrote {n} rows, the file holds {file_rows}; expected {expected}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows": n, "file_rows": file_rows, "secs": secs, "cpu_secs": cpu_secs,
                      "peak_rss_mib": peak, "bytes": os.path.getsize(dst),
                      "duckdb": duckdb.__version__}))


main()
