//! Stream positions: where a message sits in an ordered, partitioned stream (a partition of a
//! topic read by a consumer group), and what a destination can say about them. The shared
//! vocabulary of `--exactly-once` with a positioned source: the source hands out messages with
//! their typed [`Position`] on their receipts (no sink and no settle side reads it back from the
//! `message_id`), a sink keeps each stream's records in order and records how far it holds each
//! ([`StreamKey`]: a Delta `txn` application id, a derived object name, rows found again by their
//! `message_id`), and before a stream's first record the source asks the destination how far it
//! holds it ([`DurableStreams::held_through`]).
//!
//! Every string made here is part of what earlier runs wrote (table `txn`s, object names, row ids)
//! and must stay as it is, so that a later run resumes them.

use std::sync::Arc;

/// One partition of one stream, read by one reader: what a position is counted in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// Who made the position (given by the source, e.g. `subsink-<source>`).
    pub scheme: Arc<str>,
    /// Who reads the stream (a consumer group).
    pub reader: Arc<str>,
    /// The stream (a topic). It holds no `/`.
    pub stream: String,
    /// The partition of the stream.
    pub part: i32,
}

impl StreamKey {
    /// The stream's application id in a table's log (a Delta `txn`):
    /// `SCHEME/READER/STREAM/PART`. A stream name holds no `/`, so read from the right the form
    /// is unambiguous whatever the reader's name holds.
    pub fn app_id(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.scheme, self.reader, self.stream, self.part
        )
    }

    /// What the name of a file whose first record is at `first` is derived from:
    /// `SCHEME\nREADER\nSTREAM\nPART\nFIRST`.
    pub fn seed(&self, first: i64) -> String {
        format!(
            "{}\n{}\n{}\n{}\n{first}",
            self.scheme, self.reader, self.stream, self.part
        )
    }

    /// The `message_id` of the stream's record at `offset` (`STREAM/PART/OFFSET`).
    pub fn message_id(&self, offset: i64) -> String {
        format!("{}/{}/{offset}", self.stream, self.part)
    }

    /// What the `message_id`s of the stream's records start with: `STREAM/PART/`.
    pub fn id_prefix(&self) -> String {
        format!("{}/{}/", self.stream, self.part)
    }
}

impl std::fmt::Display for StreamKey {
    /// `STREAM/PART`: the stream in logs and errors, and a file group.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.stream, self.part)
    }
}

/// Where a message sits: its stream and its offset there. Made once by a positioned source, it
/// rides on the message's receipt ([`crate::message::Receipt::position`]) and its settle
/// reference to the sinks and the settle side, which never parse the `message_id` it renders
/// ([`Position::message_id`]) back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub key: StreamKey,
    pub offset: i64,
}

impl Position {
    /// The `message_id` of the record at this position (`STREAM/PART/OFFSET`).
    pub fn message_id(&self) -> String {
        self.key.message_id(self.offset)
    }
}

/// A `message_id` taken apart into stream, partition and offset (`STREAM/PART/OFFSET`; a stream
/// name holds no `/`); `None` for another form. The one reading of the form, for what is read
/// back from where earlier runs wrote it (an object's records, a table's rows) and for a settle
/// side handed ids only.
pub fn parse_message_id(id: &str) -> Option<(&str, i32, i64)> {
    let mut it = id.rsplitn(3, '/');
    let offset = it.next()?.parse().ok()?;
    let part = it.next()?.parse().ok()?;
    let stream = it.next()?;
    Some((stream, part, offset))
}

/// The SQL expressions (BigQuery's dialect) that take the `message_id`s of `column` apart as
/// [`parse_message_id`] does: the partition's prefix (`STREAM/PART/`, [`StreamKey::id_prefix`])
/// and the offset, as an INT64.
pub fn message_id_sql(column: &str) -> (String, String) {
    (
        format!("REGEXP_EXTRACT({column}, r'^(.*/)[0-9]+$')"),
        format!("CAST(REGEXP_EXTRACT({column}, r'/([0-9]+)$') AS INT64)"),
    )
}

/// A positioned source's streams, as a run reads them: the scheme and the reader every key
/// carries, and the source's name in messages (`--exactly-once with NAME: …`). The `message_id`
/// of a positioned message is `STREAM/PART/OFFSET` ([`StreamKey::message_id`]), so its position
/// is known wherever the message goes, a file read back included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streams {
    /// The source's name in messages.
    pub name: Arc<str>,
    pub scheme: Arc<str>,
    pub reader: Arc<str>,
}

impl Streams {
    /// The key of `stream`'s partition `part`.
    pub fn key(&self, stream: &str, part: i32) -> StreamKey {
        StreamKey {
            scheme: self.scheme.clone(),
            reader: self.reader.clone(),
            stream: stream.to_string(),
            part,
        }
    }

    /// The position of the message `message_id` (`STREAM/PART/OFFSET`) read back from where an
    /// earlier run wrote it ([`parse_message_id`]); `None` for another form.
    pub fn position_of(&self, message_id: &str) -> Option<Position> {
        let (stream, part, offset) = parse_message_id(message_id)?;
        Some(Position {
            key: self.key(stream, part),
            offset,
        })
    }

    /// The position of the record at `offset` of `stream`'s partition `part`.
    pub fn at(&self, stream: &str, part: i32, offset: i64) -> Position {
        Position {
            key: self.key(stream, part),
            offset,
        }
    }

    /// The key of the file group `STREAM/PART` (an id prefix without its last `/` too).
    pub fn key_of_group(&self, group: &str) -> Option<StreamKey> {
        let (stream, part) = group.rsplit_once('/')?;
        Some(self.key(stream, part.parse().ok()?))
    }

    /// The key of an id prefix `STREAM/PART/` read back from a table ([`message_id_sql`]).
    pub fn key_of_prefix(&self, prefix: &str) -> Option<StreamKey> {
        self.key_of_group(prefix.strip_suffix('/')?)
    }
}

/// How far a destination durably holds each stream it was written (the object sink: the files
/// named from a stream's offsets; a Delta table: its `txn` versions; a BigQuery table: its rows'
/// `message_id`s). Handed to the positioned source when it connects
/// ([`crate::sink::OpenFiles::durable_streams`]).
#[async_trait::async_trait]
pub trait DurableStreams: Send + Sync {
    /// Can the destination keep its promise at all? (Objects: the store's atomic put-if-absent.)
    async fn ready(&self) -> Result<(), String> {
        Ok(())
    }

    /// What is looked up for the record at `at` with timestamp `publish_time_micros`, for the
    /// logs: an object name, an application id, a query.
    fn lookup(&self, at: &Position, publish_time_micros: i64) -> String;

    /// The last offset of `at`'s stream the destination holds durably from `at` on, found by
    /// [`DurableStreams::lookup`]; `None` when it holds nothing of the stream from `at.offset` on.
    async fn held_through(
        &self,
        at: &Position,
        publish_time_micros: i64,
    ) -> Result<Option<i64>, String>;

    /// Where records found by [`DurableStreams::held_through`] up to `last` are, for the log
    /// (`in a file of an earlier run`, …).
    fn held_in(&self, last: i64) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_render_the_strings_earlier_runs_wrote() {
        let s = Streams {
            name: "X".into(),
            scheme: "subsink-x".into(),
            reader: "g/x".into(),
        };
        let p = s.position_of("orders.eu/3/42").unwrap();
        assert_eq!(
            (p.key.stream.as_str(), p.key.part, p.offset),
            ("orders.eu", 3, 42)
        );
        assert_eq!(s.position_of("x/y"), None);
        assert_eq!(p.key.app_id(), "subsink-x/g/x/orders.eu/3");
        assert_eq!(p.key.seed(7), "subsink-x\ng/x\norders.eu\n3\n7");
        assert_eq!(p.key.to_string(), "orders.eu/3");
        assert_eq!(p.key.message_id(42), "orders.eu/3/42");
        assert_eq!(p.key.id_prefix(), "orders.eu/3/");
        assert_eq!(s.key_of_group("orders.eu/3"), Some(p.key));
    }
}
