//! A `useTopicSchema` subscription's topic schema, read from Pub/Sub the way its export reads it:
//! `GetTopic` gives the topic's `schemaSettings` (the schema, the encoding of messages that carry
//! no `googclient_schemaencoding`, the allowed revision range) and `ListSchemaRevisions` every
//! revision's definition. Each message is then written with the schema of its own
//! `googclient_schemarevisionid`; one whose revision is not listed (or that names none) with the
//! topic's newest allowed revision (docs/contract.md §6 Q8). A revision committed while `serve`
//! runs is read (`GetSchema name@revision`) when its first message comes; the topic's schema
//! settings are part of what discovery compares, so changing them restarts the export. Discovery
//! keeps what it read ([`TopicSchemaCache`]): revisions are listed again only when a topic's schema
//! settings change.

use std::collections::BTreeMap;

use crate::config::{OutputFormat, ValidSubscription};
use crate::encode::topic::{
    FetchRevision, SchemaEncoding, TopicSchema, TopicSchemaSource, TopicSchemas,
};
use crate::pubsub::{proto, PubsubClient, PubsubError};

/// What the subscription's topic is called once the topic is deleted.
const DELETED_TOPIC: &str = "_deleted-topic_";
/// What the topic's schema is called once the schema is deleted.
const DELETED_SCHEMA: &str = "_deleted-schema_";

/// A topic's schema as `serve` exports with it.
#[derive(Debug, Clone)]
pub struct FetchedTopicSchema {
    /// The schemas, by revision, for the writers.
    pub source: TopicSchemaSource,
    /// The topic's schema settings (schema, encoding, first and last revision): when they change,
    /// so does the subscription's export.
    pub settings: Vec<String>,
}

/// Why a topic's schema could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TopicSchemaError {
    /// The topic has no usable Avro schema: not exported until it changes.
    #[error("{0}")]
    Invalid(String),
    /// Pub/Sub could not be asked (it may pass): retried at the next discovery.
    #[error("{0}")]
    Unreachable(String),
}

/// Does `sub` write with its topic's schema (`avroConfig.useTopicSchema` or
/// `bigqueryConfig.useTopicSchema`)?
pub fn uses_topic_schema(sub: &ValidSubscription) -> bool {
    sub.storage.as_ref().is_some_and(|s| {
        matches!(
            s.output,
            OutputFormat::Avro {
                use_topic_schema: true,
                ..
            }
        )
    }) || sub.bigquery.as_ref().is_some_and(|b| b.use_topic_schema)
}

/// Every revision of the schema of `topic` (`projects/{p}/topics/{t}`).
pub async fn fetch_topic_schema(
    client: &PubsubClient,
    topic: &str,
) -> Result<FetchedTopicSchema, TopicSchemaError> {
    TopicSchemaCache::default().fetch(client, topic).await
}

/// The topic schemas discovery has read, by topic, kept from one discovery to the next.
///
/// Each discovery asks `GetTopic` once per topic (its schema settings may have changed), and
/// `ListSchemaRevisions` only for a topic whose schema settings (schema, encoding, first and last
/// revision) differ from the ones its kept schemas were read with. Subscriptions of one topic
/// share its schemas (and what they learn of revisions met later). Revisions committed after a
/// topic's schemas were read are read when their first message comes, as in a running export;
/// a message that names no revision, or one that does not exist, is read with the newest
/// revision known when the topic's schemas were read. Failures are not kept.
#[derive(Debug, Default)]
pub struct TopicSchemaCache {
    kept: std::collections::HashMap<String, FetchedTopicSchema>,
    /// This discovery's answers, by topic (failures too: asked once per discovery).
    round: std::collections::HashMap<String, Result<FetchedTopicSchema, TopicSchemaError>>,
    listings: u64,
}

impl TopicSchemaCache {
    /// A discovery begins: every topic is asked again.
    pub fn begin(&mut self) {
        self.round.clear();
    }

    /// A discovery ended: the schemas of topics it did not ask for are dropped.
    pub fn end(&mut self) {
        let round = &self.round;
        self.kept.retain(|topic, _| round.contains_key(topic));
    }

    /// How many times a topic's revisions were listed (`ListSchemaRevisions`).
    pub fn listings(&self) -> u64 {
        self.listings
    }

    /// The schema of `topic`: this discovery's answer, else read ([`TopicSchemaCache`]).
    pub async fn get(
        &mut self,
        client: &PubsubClient,
        topic: &str,
    ) -> Result<FetchedTopicSchema, TopicSchemaError> {
        if let Some(r) = self.round.get(topic) {
            return r.clone();
        }
        let r = self.fetch(client, topic).await;
        self.round.insert(topic.to_string(), r.clone());
        r
    }

    async fn fetch(
        &mut self,
        client: &PubsubClient,
        topic: &str,
    ) -> Result<FetchedTopicSchema, TopicSchemaError> {
        let (settings, encoding) = match schema_settings(client, topic).await {
            Ok(s) => s,
            Err(e) => {
                // A topic whose schema went away (deleted, or the topic changed to none) reads
                // its revisions afresh when it has one again, even under the same name.
                if matches!(e, TopicSchemaError::Invalid(_)) {
                    self.kept.remove(topic);
                }
                return Err(e);
            }
        };
        if let Some(kept) = self.kept.get(topic) {
            if kept.settings == settings_key(&settings, encoding) {
                return Ok(kept.clone());
            }
        }
        self.kept.remove(topic);
        self.listings += 1;
        let listed = client
            .list_schema_revisions(&settings.schema)
            .await
            .map_err(|e| failed(&e))?;
        let fetch = std::sync::Arc::new(PubsubRevisions {
            client: client.clone(),
            schema: settings.schema.clone(),
            encoding,
        });
        let got = from_revisions(topic, &settings, encoding, listed, Some(fetch))?;
        self.kept.insert(topic.to_string(), got.clone());
        Ok(got)
    }
}

/// The schema settings of `topic` and the encoding of its messages, or why it has no schema.
async fn schema_settings(
    client: &PubsubClient,
    topic: &str,
) -> Result<(proto::SchemaSettings, SchemaEncoding), TopicSchemaError> {
    if topic == DELETED_TOPIC {
        return Err(TopicSchemaError::Invalid(
            "useTopicSchema: the subscription's topic was deleted, so it has no schema".into(),
        ));
    }
    let t = client.get_topic(topic).await.map_err(|e| failed(&e))?;
    let settings = t.schema_settings.unwrap_or_default();
    if settings.schema.is_empty() {
        return Err(TopicSchemaError::Invalid(format!(
            "useTopicSchema: topic {topic} has no schema"
        )));
    }
    if settings.schema == DELETED_SCHEMA {
        return Err(TopicSchemaError::Invalid(format!(
            "useTopicSchema: the schema of topic {topic} was deleted"
        )));
    }
    let encoding = match proto::Encoding::try_from(settings.encoding) {
        Ok(proto::Encoding::Binary) => SchemaEncoding::Binary,
        _ => SchemaEncoding::Json,
    };
    Ok((settings, encoding))
}

/// What a topic's schemas were read with ([`FetchedTopicSchema::settings`]).
fn settings_key(settings: &proto::SchemaSettings, encoding: SchemaEncoding) -> Vec<String> {
    vec![
        settings.schema.clone(),
        format!("{encoding:?}"),
        settings.first_revision_id.clone(),
        settings.last_revision_id.clone(),
    ]
}

/// Reads a revision first met while running: `GetSchema name@revision`, on the process's runtime.
#[derive(Debug)]
struct PubsubRevisions {
    client: PubsubClient,
    schema: String,
    encoding: SchemaEncoding,
}

impl FetchRevision for PubsubRevisions {
    fn fetch(&self, revision: &str) -> Result<Option<TopicSchema>, String> {
        // Called from a writer, inside the runtime: a worker thread may block once it has handed
        // its other tasks on (multi-thread runtime only, which is what `serve` runs on).
        let handle = tokio::runtime::Handle::try_current().map_err(|e| e.to_string())?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(
                "not on a multi-thread runtime: revisions are not read while running".into(),
            );
        }
        let name = format!("{}@{revision}", self.schema);
        let got = tokio::task::block_in_place(|| handle.block_on(self.client.get_schema(&name)));
        match got {
            Ok(s) if s.r#type == proto::schema::Type::Avro as i32 => {
                TopicSchema::parse(&s.definition, self.encoding)
                    .map(Some)
                    .map_err(|e| format!("schema {name}: {e}"))
            }
            Ok(_) => Err(format!("schema {name} is not an Avro schema")),
            Err(e) if e.code() == Some(tonic::Code::NotFound) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The schemas of `listed` (the revisions of `settings.schema`), each read with `encoding` as the
/// default; the fallback is `settings.last_revision_id` when listed, else the newest revision.
/// Revisions met later are asked of `fetch`.
fn from_revisions(
    topic: &str,
    settings: &proto::SchemaSettings,
    encoding: SchemaEncoding,
    listed: Vec<proto::Schema>,
    fetch: Option<std::sync::Arc<dyn FetchRevision>>,
) -> Result<FetchedTopicSchema, TopicSchemaError> {
    let name = &settings.schema;
    let newest = listed
        .iter()
        .max_by_key(|s| {
            s.revision_create_time
                .as_ref()
                .map_or((0, 0), |t| (t.seconds, t.nanos))
        })
        .map(|s| s.revision_id.clone());
    let mut revisions = BTreeMap::new();
    for s in listed {
        if s.r#type != proto::schema::Type::Avro as i32 {
            let kind = proto::schema::Type::try_from(s.r#type)
                .map_or_else(|_| s.r#type.to_string(), |t| t.as_str_name().to_string());
            return Err(TopicSchemaError::Invalid(format!(
                "useTopicSchema: schema {name} (revision {}) of topic {topic} is {kind}; subsink \
                 writes with Avro topic schemas only",
                s.revision_id
            )));
        }
        let schema = TopicSchema::parse(&s.definition, encoding).map_err(|e| {
            TopicSchemaError::Invalid(format!(
                "useTopicSchema: schema {name} revision {} of topic {topic}: {e}",
                s.revision_id
            ))
        })?;
        revisions.insert(s.revision_id, schema);
    }
    let fallback_id = Some(settings.last_revision_id.clone())
        .filter(|id| revisions.contains_key(id))
        .or(newest)
        .ok_or_else(|| {
            TopicSchemaError::Invalid(format!(
                "useTopicSchema: schema {name} of topic {topic} has no revisions"
            ))
        })?;
    let fallback = revisions[&fallback_id].clone();
    let mut schemas = TopicSchemas::new(fallback, revisions);
    if let Some(fetch) = fetch {
        schemas = schemas.with_fetch(fetch);
    }
    Ok(FetchedTopicSchema {
        source: TopicSchemaSource::Fetched {
            origin: format!("the schema {name} of topic {topic}"),
            schemas,
        },
        settings: settings_key(settings, encoding),
    })
}

fn failed(e: &PubsubError) -> TopicSchemaError {
    if e.retryable() {
        TopicSchemaError::Unreachable(format!("useTopicSchema: {e}"))
    } else {
        TopicSchemaError::Invalid(format!("useTopicSchema: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn rev(id: &str, secs: i64, definition: &str) -> proto::Schema {
        proto::Schema {
            name: "projects/p/schemas/s".into(),
            r#type: proto::schema::Type::Avro as i32,
            definition: definition.into(),
            revision_id: id.into(),
            revision_create_time: Some(prost_types::Timestamp {
                seconds: secs,
                nanos: 0,
            }),
        }
    }

    const V1: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}"#;
    const V2: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"string"},{"name":"b","type":["null","long"],"default":null}]}"#;

    fn settings(last: &str) -> proto::SchemaSettings {
        proto::SchemaSettings {
            schema: "projects/p/schemas/s".into(),
            encoding: proto::Encoding::Json as i32,
            first_revision_id: String::new(),
            last_revision_id: last.into(),
        }
    }

    /// `from_revisions` for topic `t` of JSON messages, the topic's last revision `last`.
    fn fetched(
        last: &str,
        listed: Vec<proto::Schema>,
    ) -> Result<FetchedTopicSchema, TopicSchemaError> {
        from_revisions(
            "projects/p/topics/t",
            &settings(last),
            SchemaEncoding::Json,
            listed,
            None,
        )
    }

    fn message(revision: Option<&str>) -> Message {
        let mut m = Message {
            message_id: "1".into(),
            data: bytes::Bytes::from_static(b"{}"),
            ..Default::default()
        };
        if let Some(id) = revision {
            m.attributes
                .insert("googclient_schemarevisionid".into(), id.into());
        }
        m
    }
    fn with_revision(id: &str) -> Message {
        message(Some(id))
    }

    #[test]
    fn each_revision_reads_with_its_schema_and_the_newest_is_the_fallback() {
        let got = fetched("", vec![rev("bbbb2222", 20, V2), rev("aaaa1111", 10, V1)]).unwrap();
        let TopicSchemaSource::Fetched { schemas, origin } = &got.source else {
            panic!("fetched");
        };
        let ids: Vec<String> = schemas.revisions().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["aaaa1111", "bbbb2222"]);
        assert_eq!(
            origin,
            "the schema projects/p/schemas/s of topic projects/p/topics/t"
        );
        let json = |m: &Message| schemas.of_message(m).schema_json().to_string();
        assert_eq!(json(&with_revision("aaaa1111")), V1);
        assert_eq!(json(&with_revision("bbbb2222")), V2);
        assert_eq!(json(&with_revision("cccc3333")), V2, "unknown: the newest");
        assert_eq!(json(&message(None)), V2, "none: the newest");
        // The topic's last allowed revision, when set, is the fallback.
        let got = fetched(
            "aaaa1111",
            vec![rev("aaaa1111", 10, V1), rev("bbbb2222", 20, V2)],
        )
        .unwrap();
        let TopicSchemaSource::Fetched { schemas, .. } = &got.source else {
            panic!("fetched");
        };
        assert_eq!(schemas.fallback().schema_json(), V1);
    }

    #[test]
    fn protobuf_and_broken_revisions_are_refused_with_their_name() {
        let mut proto_rev = rev("aaaa1111", 10, "syntax = \"proto3\";");
        proto_rev.r#type = proto::schema::Type::ProtocolBuffer as i32;
        let e = fetched("", vec![proto_rev]).unwrap_err().to_string();
        assert!(
            e.contains("PROTOCOL_BUFFER") && e.contains("revision aaaa1111"),
            "{e}"
        );
        let e = fetched(
            "",
            vec![rev("aaaa1111", 10, V1), rev("bbbb2222", 20, "{not json")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("revision bbbb2222"), "{e}");
        let e = fetched("", vec![]).unwrap_err().to_string();
        assert!(e.contains("no revisions"), "{e}");
    }
}
