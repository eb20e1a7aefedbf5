//! Tombstones stay bounded (issue 43): change data capture into a Delta table in a local folder,
//! through the library's MERGE ([`subsink::sink::delta::DeltaTable::merge_changes`], what the Delta sink
//! calls per commit), over a run that deletes a million distinct keys. Each commit upserts
//! `SUBSINK_BENCH_KEYS` new keys and deletes the keys the previous commit upserted, all numbered;
//! the keys are spread over the whole key space (a multiplicative hash of a counter), so no key
//! range of a batch skips another batch's files: only the retention window bounds what a commit
//! reads. The table itself stays at one commit's keys.
//!
//! Printed per commit: its wall time (the MERGE of the tombstone table and the table's, the
//! expiry of old tombstones included), the tombstone table's rows (all, and the ones in force:
//! written inside the window) and the table's rows — counted after the commit, not timed. At the
//! end: the mean time of each tenth of the run, so a growth shows as a rising column.
//!
//! `CARGO_TARGET_DIR=… cargo bench --bench cdc_tombstones`. Environment:
//! * `SUBSINK_BENCH_COMMITS` — commits (default 101: 100 of them delete, 1,010,000 upserts and
//!   1,000,000 deletes in all at the default size);
//! * `SUBSINK_BENCH_KEYS` — keys upserted (and deleted one commit later) per commit (default
//!   10000);
//! * `SUBSINK_BENCH_RETENTION` — the delete retention window (`--table-delete-retention`;
//!   default `3s`, a few dozen commits of this run on the machine of docs/benchmarks.md; `1000d`:
//!   nothing expires, as before issue 43);
//! * `SUBSINK_BENCH_SPREAD` — `0`: keys in counter order instead, so each batch is a key range
//!   of its own and the key-range read skips the other batches' tombstone files (the case where
//!   nothing needs to expire for a commit to stay flat);
//! * `SUBSINK_BENCH_DIR` — scratch folder (default a temp dir).

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use subsink::message::Message;
use subsink::sink::delta::DeltaTable;
use subsink::table::cdc::{with_change_columns, PrimaryKey, CHANGE_TYPE};
use subsink::table::{RowBuilder, RowOptions, SchemaMode, TableSchema};
use subsink::upload::Destination;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Key number `n`: spread over the key space (an odd multiplier is a bijection mod 2^62), or
/// `n` itself with `SUBSINK_BENCH_SPREAD=0`.
fn key(n: u64) -> i64 {
    static SPREAD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *SPREAD.get_or_init(|| env_num("SUBSINK_BENCH_SPREAD", 1) != 0) {
        (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) & ((1 << 62) - 1)) as i64
    } else {
        n as i64
    }
}

/// One commit's changes: UPSERTs of keys `new`, DELETEs of keys `old`, numbered by `commit`.
fn changes(
    rows: &mut RowBuilder,
    commit: u64,
    new: std::ops::Range<u64>,
    old: std::ops::Range<u64>,
) -> RecordBatch {
    let seq = format!("{:X}", commit + 1);
    let mut push = |i: u64, body: String| {
        let m = Message {
            data: body.into_bytes().into(),
            message_id: format!("{commit}-{i}"),
            ..Default::default()
        };
        rows.append(&m).expect("a valid change");
    };
    for n in old {
        push(
            n,
            format!(
                r#"{{"id":{},"_CHANGE_TYPE":"DELETE","_CHANGE_SEQUENCE_NUMBER":"{seq}"}}"#,
                key(n)
            ),
        );
    }
    for n in new {
        push(
            n,
            format!(
                r#"{{"id":{},"name":"row {n}","qty":{},"_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"{seq}"}}"#,
                key(n),
                n % 1000
            ),
        );
    }
    rows.finish()
}

async fn table_rows(t: &DeltaTable, dir: &std::path::Path) -> usize {
    let _ = t;
    // deltalake's own reader would do as well; the count of the newest snapshot's rows.
    let dt =
        deltalake_core::open_table(url::Url::from_directory_path(dir).expect("an absolute path"))
            .await
            .expect("the table");
    let ctx = deltalake_core::datafusion::prelude::SessionContext::new();
    dt.update_datafusion_session(&ctx.state())
        .expect("a session");
    let df = ctx
        .read_table(dt.table_provider().await.expect("a provider"))
        .expect("a scan");
    df.count().await.expect("a count")
}

fn main() {
    let commits = env_num("SUBSINK_BENCH_COMMITS", 101);
    let keys = env_num("SUBSINK_BENCH_KEYS", 10_000);
    let retention_text =
        std::env::var("SUBSINK_BENCH_RETENTION").unwrap_or_else(|_| "3s".to_string());
    let retention = subsink::config::gcloud::parse_duration(&retention_text)
        .unwrap_or_else(|e| panic!("SUBSINK_BENCH_RETENTION: {e}"));
    let scratch = tempfile::tempdir().expect("a temp dir");
    let dir = std::env::var("SUBSINK_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| scratch.path().to_path_buf())
        .join(format!("tombstones-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the scratch folder");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");

    let schema = TableSchema::from_json(
        r#"[{"name":"id","type":"INT64","mode":"REQUIRED"},{"name":"name","type":"STRING"},{"name":"qty","type":"INT64"}]"#,
    )
    .expect("the schema");
    let key_cols = PrimaryKey::new(&["id".to_string()], &schema).expect("the key");
    let opts = RowOptions {
        mode: SchemaMode::UseTableSchema,
        ..Default::default()
    };
    let mut rows = RowBuilder::new(&with_change_columns(&schema).expect("pseudo-columns"), opts)
        .expect("a row builder");
    rows.check_changes(&key_cols).expect("change columns");
    let rows_schema = rows.schema();
    let table_schema = arrow_schema::Schema::new(
        rows_schema
            .fields()
            .iter()
            .filter(|f| f.name() != CHANGE_TYPE)
            .cloned()
            .collect::<Vec<_>>(),
    );
    let props = subsink::table::default_writer_properties();
    let url = format!("file://{}", dir.display());
    let dest = Destination::from_url(&url).expect("a destination");

    println!(
        "cdc_tombstones: {commits} commits, {keys} upserts + {keys} deletes (the previous commit's keys) each, retention {retention_text}, {url}"
    );
    println!("commit  ms        tombstones  in_force  table_rows");
    let mut times = Vec::with_capacity(commits as usize);
    rt.block_on(async {
        let mut t = DeltaTable::open_or_create(&dest, &table_schema)
            .await
            .expect("the table");
        t.set_delete_retention(retention);
        let run = Instant::now();
        for c in 0..commits {
            let new = c * keys..(c + 1) * keys;
            let old = if c == 0 {
                0..0
            } else {
                (c - 1) * keys..c * keys
            };
            let batch = changes(&mut rows, c, new, old);
            let start = Instant::now();
            t.merge_changes(&Arc::clone(&rows_schema), &[batch], &key_cols, &[], &props)
                .await
                .expect("a MERGE");
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            times.push(ms);
            let (all, live) = t
                .tombstone_rows(&key_cols)
                .await
                .expect("the tombstones")
                .unwrap_or((0, 0));
            let n = table_rows(&t, &dir).await;
            println!("{c:>6}  {ms:>8.1}  {all:>10}  {live:>8}  {n:>10}");
        }
        println!(
            "deleted {} distinct keys in {:.1} s",
            commits.saturating_sub(1) * keys,
            run.elapsed().as_secs_f64()
        );
    });
    let tenth = (times.len() / 10).max(1);
    let means: Vec<String> = times
        .chunks(tenth)
        .map(|c| format!("{:.0}", c.iter().sum::<f64>() / c.len() as f64))
        .collect();
    println!("mean ms per tenth of the run: {}", means.join(" "));
    if std::env::var("SUBSINK_BENCH_DIR").is_ok() {
        println!("kept: {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
