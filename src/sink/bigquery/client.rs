//! BigQuery's two APIs as the BigQuery sink uses them: REST `tables.get` (the table's schema, at
//! startup) and `jobs.query` (`--exactly-once` with a positioned source: the offsets the table holds), and the
//! Storage Write API over gRPC (`CreateWriteStream`, `AppendRows`,
//! `FinalizeWriteStream`, `BatchCommitWriteStreams`, `GetWriteStream`).
//!
//! An `http://` endpoint (an emulator) is plaintext without credentials; an `https://` one (by
//! default Google's) uses TLS and the process's Google credentials ([`crate::gauth`], shared with
//! the Pub/Sub source and Cloud Storage: `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's file, the
//! metadata server). `SUBSINK_GOOGLE_AUTH=always` sends credentials to `http://` endpoints too.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1 as pb;
use pb::big_query_write_client::BigQueryWriteClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use crate::gauth::{AuthError, AuthMode, GoogleAuth};
use crate::table::TableSchema;

/// Google's REST endpoint.
pub const GOOGLE_REST: &str = "https://bigquery.googleapis.com";
/// Google's Storage Write API endpoint.
pub const GOOGLE_STORAGE: &str = "https://bigquerystorage.googleapis.com";

/// Errors talking to BigQuery.
#[derive(Debug, thiserror::Error)]
pub enum BigQueryError {
    #[error("BigQuery endpoint {url:?}: {reason}")]
    Endpoint { url: String, reason: String },
    #[error("Google credentials: {0}")]
    Auth(#[from] AuthError),
    #[error("tables.get {table}: {reason}")]
    TableGet {
        table: String,
        reason: String,
        retryable: bool,
    },
    #[error("tables.get {table}: the table's schema: {reason}")]
    Schema { table: String, reason: String },
    #[error("{call} {target}: {status}")]
    Grpc {
        call: &'static str,
        target: String,
        status: Box<tonic::Status>,
    },
    #[error("{call} {target}: {reason}")]
    Refused {
        call: &'static str,
        target: String,
        reason: String,
    },
    #[error("jobs.query in project {project}: {reason}")]
    Query {
        project: String,
        reason: String,
        retryable: bool,
    },
}

impl BigQueryError {
    /// Can trying again later help? Network faults, server errors, throttling and aborted
    /// transactions can pass; a missing table, a refused request or denied credentials do not.
    pub fn retryable(&self) -> bool {
        match self {
            BigQueryError::TableGet { retryable, .. } | BigQueryError::Query { retryable, .. } => {
                *retryable
            }
            BigQueryError::Grpc { status, .. } => status_retryable(status),
            // A token endpoint or metadata server that failed for now; a refused grant is final.
            BigQueryError::Auth(e) => e.retryable(),
            _ => false,
        }
    }
}

pub(super) fn status_retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Cancelled
    ) || broken_connection(s)
}

/// A status tonic made itself for a broken connection: `Unknown` ("error reading a body from
/// connection") carrying the hyper/io error as its source. A status the server sent has no
/// source, and `Unknown` from the server is not retried.
fn broken_connection(s: &tonic::Status) -> bool {
    s.code() == Code::Unknown && std::error::Error::source(s).is_some()
}

/// A BigQuery table: `projects/{project}/datasets/{dataset}/tables/{table}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRef {
    pub project: String,
    pub dataset: String,
    pub table: String,
}

impl TableRef {
    /// `bigquery://PROJECT/DATASET/TABLE`, or `bigquery` (also `bigquery://`) alone for the table
    /// `bigqueryConfig.table` names (`project.dataset.table`; `project:dataset.table` too).
    pub fn from_url(url: &str, config_table: &str) -> Result<TableRef, String> {
        let rest = url
            .strip_prefix("bigquery://")
            .or_else(|| (url == "bigquery").then_some(""))
            .ok_or_else(|| format!("--table-url {url:?}: a BigQuery table is bigquery://PROJECT/DATASET/TABLE or bigquery"))?;
        if rest.is_empty() {
            return Self::from_config(config_table).map_err(|e| {
                format!("--table-url bigquery: bigqueryConfig.table {config_table:?}: {e}")
            });
        }
        let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        match parts[..] {
            [p, d, t] if !p.is_empty() && !d.is_empty() && !t.is_empty() => Ok(TableRef {
                project: p.into(),
                dataset: d.into(),
                table: t.into(),
            }),
            _ => Err(format!(
                "--table-url {url:?}: a BigQuery table is bigquery://PROJECT/DATASET/TABLE (three non-empty parts)"
            )),
        }
    }

    /// `project.dataset.table` (the project may hold a `:` and dots of a domain:
    /// `example.com:proj.dataset.table`), or `project:dataset.table`.
    pub fn from_config(table: &str) -> Result<TableRef, String> {
        let mut it = table.rsplitn(3, '.');
        let (t, d, p) = (it.next(), it.next(), it.next());
        let (p, d) = match (p, d) {
            (Some(p), Some(d)) => (p.to_string(), d.to_string()),
            // `project:dataset.table`
            (None, Some(pd)) => match pd.rsplit_once(':') {
                Some((p, d)) => (p.to_string(), d.to_string()),
                None => return Err("expected project.dataset.table".into()),
            },
            _ => return Err("expected project.dataset.table".into()),
        };
        let t = t.unwrap_or_default().to_string();
        if p.is_empty() || d.is_empty() || t.is_empty() {
            return Err("expected project.dataset.table".into());
        }
        Ok(TableRef {
            project: p,
            dataset: d,
            table: t,
        })
    }

    /// `projects/P/datasets/D/tables/T`: the parent of its write streams.
    pub fn path(&self) -> String {
        format!(
            "projects/{}/datasets/{}/tables/{}",
            self.project, self.dataset, self.table
        )
    }

    /// Its default stream (at-least-once, rows visible once appended).
    pub fn default_stream(&self) -> String {
        format!("{}/streams/_default", self.path())
    }
}

impl std::fmt::Display for TableRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.project, self.dataset, self.table)
    }
}

/// A client of both APIs. Cheap to clone (one HTTP/2 channel, one HTTP client).
#[derive(Clone)]
pub struct BigQueryClient {
    rest: String,
    storage: String,
    http: reqwest::Client,
    channel: Channel,
    /// Credentials of REST calls: `None` for a plaintext (emulator) endpoint, unless
    /// `SUBSINK_GOOGLE_AUTH=always`.
    auth_rest: Option<Arc<GoogleAuth>>,
    /// Credentials of Storage Write calls, the same way.
    auth_storage: Option<Arc<GoogleAuth>>,
}

impl std::fmt::Debug for BigQueryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigQueryClient")
            .field("rest", &self.rest)
            .field("storage", &self.storage)
            .field(
                "auth_rest",
                &self.auth_rest.as_ref().map(|a| a.source_name()),
            )
            .field(
                "auth_storage",
                &self.auth_storage.as_ref().map(|a| a.source_name()),
            )
            .finish()
    }
}

/// Largest response message accepted (AppendRows answers are small; schemas can be large).
const MAX_DECODE_BYTES: usize = 64 << 20;

impl BigQueryClient {
    /// Clients of `rest` (REST, default [`GOOGLE_REST`]) and `storage` (gRPC, default
    /// [`GOOGLE_STORAGE`]). Connects lazily. Credentials are loaded (without network) for an
    /// `https://` endpoint, or for both with `SUBSINK_GOOGLE_AUTH=always`.
    pub fn new(rest: Option<&str>, storage: Option<&str>) -> Result<BigQueryClient, BigQueryError> {
        let rest = rest
            .unwrap_or(GOOGLE_REST)
            .trim_end_matches('/')
            .to_string();
        let storage = storage
            .unwrap_or(GOOGLE_STORAGE)
            .trim_end_matches('/')
            .to_string();
        let bad = |url: &str, reason: String| BigQueryError::Endpoint {
            url: url.to_string(),
            reason,
        };
        for url in [&rest, &storage] {
            let u = url::Url::parse(url).map_err(|e| bad(url, e.to_string()))?;
            if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
                return Err(bad(
                    url,
                    "expected http://HOST[:PORT] or https://HOST".into(),
                ));
            }
        }
        let mut ep = Endpoint::from_shared(storage.clone())
            .map_err(|e| bad(&storage, e.to_string()))?
            .user_agent(concat!("subsink/", env!("CARGO_PKG_VERSION")))
            .map_err(|e| bad(&storage, e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(300))
            .keep_alive_timeout(Duration::from_secs(20));
        if storage.starts_with("https://") {
            let host = url::Url::parse(&storage)
                .ok()
                .and_then(|u| u.host_str().map(str::to_string))
                .unwrap_or_default();
            let tls = ClientTlsConfig::new().with_native_roots().domain_name(host);
            ep = ep
                .tls_config(tls)
                .map_err(|e| bad(&storage, e.to_string()))?;
        }
        let channel = ep.connect_lazy();
        // Credentials are read now (files only, no network); the first call gets a token.
        let mode = AuthMode::from_env()?;
        let auth = |url: &str| -> Result<_, BigQueryError> {
            Ok(match mode.sends_to(url) {
                true => Some(GoogleAuth::shared()?),
                false => None,
            })
        };
        let (auth_rest, auth_storage) = (auth(&rest)?, auth(&storage)?);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| bad(&rest, e.to_string()))?;
        Ok(BigQueryClient {
            rest,
            storage,
            http,
            channel,
            auth_rest,
            auth_storage,
        })
    }

    /// `Bearer <token>` for a call to one of the endpoints, or `None` when it gets no credentials.
    async fn bearer(auth: &Option<Arc<GoogleAuth>>) -> Result<Option<String>, BigQueryError> {
        match auth {
            None => Ok(None),
            Some(a) => Ok(a.authorization().await?),
        }
    }

    /// The table's schema, read with REST `tables.get` as Pub/Sub does.
    pub async fn table_schema(&self, t: &TableRef) -> Result<TableSchema, BigQueryError> {
        let url = format!(
            "{}/bigquery/v2/projects/{}/datasets/{}/tables/{}",
            self.rest,
            enc(&t.project),
            enc(&t.dataset),
            enc(&t.table)
        );
        let fail = |reason: String, retryable: bool| BigQueryError::TableGet {
            table: t.to_string(),
            reason,
            retryable,
        };
        let mut req = self.http.get(&url);
        if let Some(b) = Self::bearer(&self.auth_rest).await? {
            req = req.header("authorization", b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| fail(format!("{url}: {e}"), true))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| fail(format!("{url}: {e}"), true))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = text.chars().take(300).collect();
            let why = if status.as_u16() == 404 {
                "the table does not exist (Pub/Sub refuses a BigQuery subscription to a missing table)".to_string()
            } else {
                format!("HTTP {status}: {excerpt}")
            };
            return Err(fail(
                why,
                status.is_server_error() || status.as_u16() == 429,
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| fail(format!("the answer is not JSON: {e}"), false))?;
        if v.get("schema").is_none() {
            return Err(BigQueryError::Schema {
                table: t.to_string(),
                reason: "the table resource has no schema".into(),
            });
        }
        // The whole resource: its schema and its primary key (tableConstraints).
        TableSchema::from_json(&v.to_string()).map_err(|e| BigQueryError::Schema {
            table: t.to_string(),
            reason: e.to_string(),
        })
    }

    /// The rows of the GoogleSQL query `sql` with the named STRING parameters `params`, run as a
    /// job of `project` with REST `jobs.query` (waiting for it with `jobs.getQueryResults` when
    /// it takes longer than the call), without the query cache (a cached answer may predate the
    /// last commit). Each row's cells as text (`None`: NULL); the first page only.
    pub async fn query(
        &self,
        project: &str,
        sql: &str,
        params: &[(&str, &str)],
    ) -> Result<Vec<Vec<Option<String>>>, BigQueryError> {
        let fail = |reason: String, retryable: bool| BigQueryError::Query {
            project: project.to_string(),
            reason,
            retryable,
        };
        let params: Vec<serde_json::Value> = params
            .iter()
            .map(|(name, value)| {
                serde_json::json!({
                    "name": name,
                    "parameterType": {"type": "STRING"},
                    "parameterValue": {"value": value},
                })
            })
            .collect();
        let body = serde_json::json!({
            "query": sql,
            "useLegacySql": false,
            "useQueryCache": false,
            "parameterMode": "NAMED",
            "queryParameters": params,
            "timeoutMs": 30_000,
        });
        let base = format!(
            "{}/bigquery/v2/projects/{}/queries",
            self.rest,
            enc(project)
        );
        let mut v = self
            .rest_json(
                self.http
                    .post(&base)
                    .header("content-type", "application/json")
                    .body(body.to_string()),
                &fail,
            )
            .await?;
        while v.get("jobComplete") == Some(&serde_json::Value::Bool(false)) {
            let job = &v["jobReference"];
            let id = job["jobId"]
                .as_str()
                .ok_or_else(|| fail("an unfinished job without a jobId".into(), false))?;
            let mut url = format!("{base}/{}?timeoutMs=30000", enc(id));
            if let Some(loc) = job["location"].as_str() {
                url.push_str(&format!("&location={}", enc(loc)));
            }
            v = self.rest_json(self.http.get(&url), &fail).await?;
        }
        let rows = v["rows"].as_array().cloned().unwrap_or_default();
        Ok(rows
            .iter()
            .map(|r| {
                r["f"]
                    .as_array()
                    .map(|cells| {
                        cells
                            .iter()
                            .map(|c| match &c["v"] {
                                serde_json::Value::String(s) => Some(s.clone()),
                                serde_json::Value::Null => None,
                                other => Some(other.to_string()),
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect())
    }

    /// Send a REST request (with credentials) and read its JSON answer; an HTTP error is
    /// `fail(reason, retryable)`: server errors and throttling can pass.
    async fn rest_json(
        &self,
        mut req: reqwest::RequestBuilder,
        fail: &(dyn Fn(String, bool) -> BigQueryError + Sync),
    ) -> Result<serde_json::Value, BigQueryError> {
        if let Some(b) = Self::bearer(&self.auth_rest).await? {
            req = req.header("authorization", b);
        }
        let resp = req.send().await.map_err(|e| fail(e.to_string(), true))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| fail(e.to_string(), true))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = text.chars().take(300).collect();
            return Err(fail(
                format!("HTTP {status}: {excerpt}"),
                status.is_server_error() || status.as_u16() == 429,
            ));
        }
        serde_json::from_slice(&body)
            .map_err(|e| fail(format!("the answer is not JSON: {e}"), false))
    }

    fn write(&self) -> BigQueryWriteClient<Channel> {
        BigQueryWriteClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    /// `msg` as a request with credentials and the routing header (`key=value`).
    async fn request<T>(
        &self,
        msg: T,
        key: &str,
        value: &str,
    ) -> Result<tonic::Request<T>, BigQueryError> {
        let mut req = tonic::Request::new(msg);
        if let Some(b) = Self::bearer(&self.auth_storage).await? {
            let v = MetadataValue::try_from(b).map_err(|_| {
                BigQueryError::Auth(AuthError::Config(
                    "the access token is not a header value".into(),
                ))
            })?;
            req.metadata_mut().insert("authorization", v);
        }
        let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        if let Ok(v) = MetadataValue::try_from(format!("{key}={encoded}")) {
            req.metadata_mut().insert("x-goog-request-params", v);
        }
        Ok(req)
    }

    /// A new PENDING stream of `t`: rows appended to it stay invisible until it is committed.
    pub async fn create_pending_stream(&self, t: &TableRef) -> Result<String, BigQueryError> {
        let parent = t.path();
        let msg = pb::CreateWriteStreamRequest {
            parent: parent.clone(),
            write_stream: Some(pb::WriteStream {
                r#type: pb::write_stream::Type::Pending as i32,
                ..Default::default()
            }),
        };
        let req = self.request(msg, "parent", &parent).await?;
        let ws = self
            .write()
            .create_write_stream(req)
            .await
            .map_err(|s| grpc("CreateWriteStream", &parent, s))?
            .into_inner();
        Ok(ws.name)
    }

    /// Open an `AppendRows` call on `stream`.
    pub async fn append_rows(&self, stream: &str) -> Result<AppendCall, BigQueryError> {
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::AppendRowsRequest>(4);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let req = self.request(outbound, "write_stream", stream).await?;
        let client = self.write();
        Ok(AppendCall {
            tx,
            pending: Some((client, req)),
            inbound: None,
            stream: stream.to_string(),
        })
    }

    /// Seal `stream` against appends; its row count.
    pub async fn finalize(&self, stream: &str) -> Result<i64, BigQueryError> {
        let req = self
            .request(
                pb::FinalizeWriteStreamRequest {
                    name: stream.to_string(),
                },
                "name",
                stream,
            )
            .await?;
        Ok(self
            .write()
            .finalize_write_stream(req)
            .await
            .map_err(|s| grpc("FinalizeWriteStream", stream, s))?
            .into_inner()
            .row_count)
    }

    /// Commit finalized PENDING `streams` of `t` atomically.
    pub async fn batch_commit(
        &self,
        t: &TableRef,
        streams: &[String],
    ) -> Result<(), BigQueryError> {
        let parent = t.path();
        let req = self
            .request(
                pb::BatchCommitWriteStreamsRequest {
                    parent: parent.clone(),
                    write_streams: streams.to_vec(),
                },
                "parent",
                &parent,
            )
            .await?;
        let resp = self
            .write()
            .batch_commit_write_streams(req)
            .await
            .map_err(|s| grpc("BatchCommitWriteStreams", &parent, s))?
            .into_inner();
        if !resp.stream_errors.is_empty() || resp.commit_time.is_none() {
            let reason = resp
                .stream_errors
                .iter()
                .map(|e| format!("{}: {}", e.entity, e.error_message))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(BigQueryError::Refused {
                call: "BatchCommitWriteStreams",
                target: parent,
                reason: if reason.is_empty() {
                    "no commit time in the answer".into()
                } else {
                    reason
                },
            });
        }
        Ok(())
    }

    /// Were the rows of the PENDING `stream` committed? `GetWriteStream`'s `commit_time` says so.
    /// A stream that reports none is finalized (so nothing more can be appended to it): an answer
    /// "already committed" (servers that do not report `commit_time`, such as the emulator)
    /// means committed; a finalized or unknown stream was not.
    pub async fn is_committed(&self, stream: &str) -> Result<bool, BigQueryError> {
        let req = self
            .request(
                pb::GetWriteStreamRequest {
                    name: stream.to_string(),
                    view: pb::WriteStreamView::Basic as i32,
                },
                "name",
                stream,
            )
            .await?;
        match self.write().get_write_stream(req).await {
            Ok(ws) if ws.get_ref().commit_time.is_some() => return Ok(true),
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => return Ok(false),
            Err(s) => return Err(grpc("GetWriteStream", stream, s)),
        }
        match self.finalize(stream).await {
            Ok(_) => Ok(false),
            Err(BigQueryError::Grpc { status, .. })
                if status.code() == Code::FailedPrecondition
                    && status.message().to_ascii_lowercase().contains("committed") =>
            {
                Ok(true)
            }
            Err(BigQueryError::Grpc { status, .. }) if status.code() == Code::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn grpc(call: &'static str, target: &str, status: tonic::Status) -> BigQueryError {
    BigQueryError::Grpc {
        call,
        target: target.to_string(),
        status: Box::new(status),
    }
}

/// The rows of one `AppendRows` request, with their writer schema.
#[derive(Clone)]
pub struct AppendRows(pb::append_rows_request::Rows);

impl AppendRows {
    /// Arrow rows: `schema` the IPC schema message, `batch` the IPC record batch message.
    pub fn arrow(schema: Bytes, batch: Bytes) -> AppendRows {
        AppendRows(pb::append_rows_request::Rows::ArrowRows(
            pb::append_rows_request::ArrowData {
                writer_schema: Some(pb::ArrowSchema {
                    serialized_schema: schema,
                }),
                rows: Some(pb::ArrowRecordBatch {
                    serialized_record_batch: batch,
                    ..Default::default()
                }),
            },
        ))
    }

    /// Protobuf rows: each a serialized message of `descriptor` (see [`super::proto`]).
    pub fn proto(descriptor: prost_types::DescriptorProto, rows: Vec<Bytes>) -> AppendRows {
        AppendRows(pb::append_rows_request::Rows::ProtoRows(
            pb::append_rows_request::ProtoData {
                writer_schema: Some(pb::ProtoSchema {
                    proto_descriptor: Some(descriptor),
                }),
                rows: Some(pb::ProtoRows {
                    serialized_rows: rows,
                }),
            },
        ))
    }
}

/// One `AppendRows` call: requests go one at a time, each answered before the next.
pub struct AppendCall {
    tx: tokio::sync::mpsc::Sender<pb::AppendRowsRequest>,
    /// The call, opened on the first request (the server answers headers only after a request).
    pending: Option<(
        BigQueryWriteClient<Channel>,
        tonic::Request<tokio_stream::wrappers::ReceiverStream<pb::AppendRowsRequest>>,
    )>,
    inbound: Option<tonic::codec::Streaming<pb::AppendRowsResponse>>,
    stream: String,
}

/// What the server said about one append.
#[derive(Debug)]
pub enum Appended {
    /// Every row is in.
    Done,
    /// No row is in: these rows (index within the request, BigQuery's message) are bad.
    RowErrors(Vec<(usize, String)>),
    /// No row is in: the request was refused as a whole (`INVALID_ARGUMENT`, or too large).
    Refused(String),
    /// The offset was already written (a retried request that had landed).
    AlreadyExists,
}

impl AppendCall {
    /// Append one request's rows: Arrow ([`AppendRows::arrow`]) or protobuf
    /// ([`AppendRows::proto`]). `offset`: for PENDING streams, the stream offset of its first row.
    pub async fn append(
        &mut self,
        rows: AppendRows,
        offset: Option<i64>,
    ) -> Result<Appended, BigQueryError> {
        // Every request names its stream and carries the writer schema (the emulator needs the
        // stream on each; a split or resent request then never depends on an earlier one).
        let msg = pb::AppendRowsRequest {
            write_stream: self.stream.clone(),
            offset,
            rows: Some(rows.0),
            ..Default::default()
        };
        let lost = || {
            grpc(
                "AppendRows",
                &self.stream,
                tonic::Status::unavailable("the AppendRows stream closed"),
            )
        };
        if self.tx.send(msg).await.is_err() {
            return Err(lost());
        }
        if let Some((mut client, req)) = self.pending.take() {
            let resp = client
                .append_rows(req)
                .await
                .map_err(|s| grpc("AppendRows", &self.stream, s))?;
            self.inbound = Some(resp.into_inner());
        }
        let inbound = self.inbound.as_mut().expect("opened above");
        let resp = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(lost()),
            Err(s) => return Err(grpc("AppendRows", &self.stream, s)),
        };
        if !resp.row_errors.is_empty() {
            return Ok(Appended::RowErrors(
                resp.row_errors
                    .iter()
                    .map(|e| (e.index.max(0) as usize, e.message.clone()))
                    .collect(),
            ));
        }
        match resp.response {
            Some(pb::append_rows_response::Response::AppendResult(_)) | None => Ok(Appended::Done),
            Some(pb::append_rows_response::Response::Error(st)) => {
                let code = Code::from_i32(st.code);
                match code {
                    Code::AlreadyExists if offset.is_some() => Ok(Appended::AlreadyExists),
                    Code::InvalidArgument => Ok(Appended::Refused(st.message)),
                    // Too large for the server (its limit may be below the one we split at).
                    Code::ResourceExhausted if st.message.contains("size") => {
                        Ok(Appended::Refused(st.message))
                    }
                    _ => Err(grpc(
                        "AppendRows",
                        &self.stream,
                        tonic::Status::new(code, st.message),
                    )),
                }
            }
        }
    }
}

impl From<Box<BigQueryError>> for crate::sink::registry::build_error::BuildError {
    /// A BigQuery table that cannot be opened or read (never the configuration's fault here).
    fn from(e: Box<BigQueryError>) -> crate::sink::registry::build_error::BuildError {
        crate::sink::registry::build_error::DestinationError {
            error: e,
            config: false,
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::{status_retryable, TableRef};

    #[test]
    fn a_broken_connection_is_retryable_an_unknown_status_from_the_server_is_not() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let broken = tonic::Status::from_error(Box::new(io));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(status_retryable(&broken));
        assert!(!status_retryable(&tonic::Status::unknown(
            "from the server"
        )));
        assert!(status_retryable(&tonic::Status::unavailable("x")));
        assert!(!status_retryable(&tonic::Status::invalid_argument("x")));
    }

    fn t(p: &str, d: &str, n: &str) -> TableRef {
        TableRef {
            project: p.into(),
            dataset: d.into(),
            table: n.into(),
        }
    }

    #[test]
    fn table_urls_and_config_tables() {
        assert_eq!(
            TableRef::from_url("bigquery://p/d/t", "x").unwrap(),
            t("p", "d", "t")
        );
        assert_eq!(
            TableRef::from_url("bigquery://p/d/t/", "x").unwrap(),
            t("p", "d", "t")
        );
        assert_eq!(
            TableRef::from_url("bigquery", "p.d.t").unwrap(),
            t("p", "d", "t")
        );
        assert_eq!(
            TableRef::from_url("bigquery://", "p:d.t").unwrap(),
            t("p", "d", "t")
        );
        assert_eq!(
            TableRef::from_config("example.com:proj.d.t").unwrap(),
            t("example.com:proj", "d", "t")
        );
        for bad in [
            "bigquery://p/d",
            "bigquery://p//t",
            "bigquery://p/d/t/u",
            "bq://p/d/t",
        ] {
            assert!(TableRef::from_url(bad, "p.d.t").is_err(), "{bad}");
        }
        for bad in ["t", "d.t", ".d.t", "p..t", "p.d."] {
            assert!(TableRef::from_config(bad).is_err(), "{bad}");
        }
        let r = t("p", "d", "t");
        assert_eq!(r.path(), "projects/p/datasets/d/tables/t");
        assert_eq!(
            r.default_stream(),
            "projects/p/datasets/d/tables/t/streams/_default"
        );
        assert_eq!(r.to_string(), "p.d.t");
    }
}
