//! The message id of a Kafka record, `TOPIC/PARTITION/OFFSET`: made by the Kafka source, read back
//! by its settle side and by `--exactly-once` objects (the last record of a file found by name).

/// Topic and partition.
pub type Tp = (String, i32);

/// `TOPIC/PARTITION/OFFSET` → its parts (a topic name holds no `/`).
pub fn parse_id(id: &str) -> Option<(Tp, i64)> {
    let mut it = id.rsplitn(3, '/');
    let offset = it.next()?.parse().ok()?;
    let partition = it.next()?.parse().ok()?;
    let topic = it.next()?;
    Some(((topic.to_string(), partition), offset))
}
