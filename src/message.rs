//! The message model and its Pub/Sub JSON wire form (docs/contract.md §1).

mod attributes;
pub mod fields;

pub use attributes::{Attributes, Iter as AttributesIter};

/// One Pub/Sub message, as a writer sees it.
///
/// Attributes are kept sorted by key ([`Attributes`]) so every output (Avro maps, JSON metadata)
/// lists them in one deterministic order, which golden-file tests rely on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// Payload bytes (decoded from base64). `Bytes`, so a source can decode many payloads into one
    /// allocation (the file source decodes a whole block's payloads into one arena).
    pub data: bytes::Bytes,
    pub attributes: Attributes,
    pub message_id: String,
    /// Publish time in microseconds since the Unix epoch, UTC (nanoseconds truncated, docs/contract.md §6 Q18).
    pub publish_time_micros: i64,
    /// Empty when the message has none.
    pub ordering_key: String,
}

/// Where a message came from in its source, and what the source needs to settle it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Receipt {
    /// Byte offset of the start of the message's line (file source).
    pub start: u64,
    /// Byte offset just past the message's line (file source).
    pub end: u64,
    /// 1-based line number (file source), for error messages.
    pub line: u64,
    /// Pull form: the ack id the message came with.
    pub ack_id: Option<String>,
    /// Pull form: the delivery attempt the message came with.
    pub delivery_attempt: Option<i32>,
    /// A positioned source (Kafka): where the message sits in its stream, typed, so that no sink
    /// and no settle side reads it back from the `message_id` (shared: cheap to clone).
    pub position: Option<std::sync::Arc<crate::position::Position>>,
}

/// A message together with its receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub msg: Message,
    pub receipt: Receipt,
}

/// What a malformed input line broke. Every variant but `Json` (text that is not JSON at all)
/// names the field as a path (`attributes.k`, `message.data`; `line` for the line itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The line (or the pull form's `message`) is JSON but not an object.
    #[error("field `{field}`: a message must be a JSON object (a PubsubMessage), got {found}")]
    NotObject { field: String, found: &'static str },
    /// A field of the wrong JSON type.
    #[error("field `{field}`: expected {expected}, got {found}")]
    Type {
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("field `{field}`: invalid base64: {reason}")]
    Base64 { field: String, reason: String },
    #[error("field `{field}`: not an RFC 3339 timestamp ({value:?}): {reason}")]
    PublishTime {
        field: String,
        value: String,
        reason: String,
    },
    /// Neither `data` nor an attribute: not a Pub/Sub message.
    #[error(
        "field `{field}`: a message needs non-empty data or at least one attribute (Pub/Sub refuses to \
         publish one with neither)"
    )]
    Empty { field: String },
    /// A field the wire form does not have (`what` names the object it is in, `known` its
    /// fields): Pub/Sub's REST API refuses one, so it is bad input, never silently dropped.
    #[error(
        "field `{field}`: unknown field{} ({what} has {}; Pub/Sub refuses unknown fields)",
        nearest.map(|n| format!(", did you mean `{n}`?")).unwrap_or_default(),
        fields::listed(known)
    )]
    Unknown {
        field: String,
        nearest: Option<&'static str>,
        what: &'static str,
        known: &'static [&'static str],
    },
    /// An archived object that cannot be read on (the archive source: object and record).
    #[error("{0}")]
    Archive(String),
    /// A line longer than the file source's `--max-line-bytes` (`bytes`: the line without its
    /// newline). It was passed over in bounded memory, never held whole.
    #[error("{bytes} bytes, over the {} line limit (--max-line-bytes)", show_bytes(*limit))]
    LineTooLong { bytes: u64, limit: u64 },
}

/// A size for a message: `14 MiB` when it is a whole number of MiB (or KiB), else `N bytes`.
fn show_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// Defaults for fields a wire message may leave out (documented in docs/sources.md, Input format). A missing
/// `messageId` is left empty here: the source fills it in (the file source with the line number).
#[derive(Debug, Clone, Copy)]
pub struct WireDefaults {
    /// `publishTime` when absent; `None` = the time the worker reads the line.
    pub publish_time_micros: Option<i64>,
}

impl WireDefaults {
    fn publish_time_micros(&self) -> i64 {
        self.publish_time_micros
            .unwrap_or_else(|| chrono::Utc::now().timestamp_micros())
    }
}

mod wire {
    use std::borrow::Cow;

    /// A JSON string taken as raw bytes: serde_json then skips UTF-8 validation, which base64 text
    /// does not need (decoding rejects anything that is not base64).
    pub(super) struct RawStr<'a>(pub Cow<'a, [u8]>);

    impl<'de: 'a, 'a> serde::Deserialize<'de> for RawStr<'a> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = RawStr<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a base64 string")
                }
                fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                    Ok(RawStr(Cow::Borrowed(v)))
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Self::Value, E> {
                    Ok(RawStr(Cow::Owned(v.to_vec())))
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                    Ok(RawStr(Cow::Borrowed(v.as_bytes())))
                }
                fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                    Ok(RawStr(Cow::Owned(v.as_bytes().to_vec())))
                }
            }
            d.deserialize_bytes(V)
        }
    }

    /// A JSON object only: the derived `Deserialize` of a struct also reads a JSON array
    /// positionally (`["aGk="]` would be a message with that data), which a line must not be.
    pub(super) struct Object<T>(pub T);

    impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(std::marker::PhantomData<T>);
            impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
                type Value = Object<T>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    map: A,
                ) -> Result<Self::Value, A::Error> {
                    T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
                }
            }
            d.deserialize_map(V(std::marker::PhantomData))
        }
    }

    /// One NDJSON line: a `PubsubMessage`, or the pull form `{ackId, message, deliveryAttempt}`
    /// whose `message` is again a `Line` (its own `ackId`/`message` are then simply absent). One
    /// struct for both instead of `#[serde(flatten)]`: flatten buffers the whole line into an
    /// intermediate tree, which costs a third of the parse time.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Line<'a> {
        #[serde(borrow, default)]
        pub data: Option<RawStr<'a>>,
        #[serde(default)]
        pub attributes: Option<super::Attributes>,
        #[serde(borrow, default, rename = "messageId", alias = "message_id")]
        pub message_id: Option<Cow<'a, str>>,
        #[serde(borrow, default, rename = "publishTime", alias = "publish_time")]
        pub publish_time: Option<Cow<'a, str>>,
        #[serde(borrow, default, rename = "orderingKey", alias = "ordering_key")]
        pub ordering_key: Option<Cow<'a, str>>,
        #[serde(default, rename = "ackId", alias = "ack_id")]
        pub ack_id: Option<String>,
        #[serde(borrow, default)]
        pub message: Option<Box<Object<Line<'a>>>>,
        #[serde(default, rename = "deliveryAttempt", alias = "delivery_attempt")]
        pub delivery_attempt: Option<i32>,
    }
}

impl Message {
    /// Parse one NDJSON line (a `PubsubMessage` in REST JSON, or the pull form).
    /// Returns the message and, for the pull form, `(ackId, deliveryAttempt)`.
    pub fn from_json_line(
        line: &[u8],
        defaults: WireDefaults,
    ) -> Result<(Message, Option<String>, Option<i32>), WireError> {
        Self::from_json_line_in(line, defaults, &mut bytes::BytesMut::new())
    }

    /// [`Message::from_json_line`], decoding the payload into `arena` (grown when too small), so
    /// the payloads of many lines share one allocation.
    pub fn from_json_line_in(
        line: &[u8],
        defaults: WireDefaults,
        arena: &mut bytes::BytesMut,
    ) -> Result<(Message, Option<String>, Option<i32>), WireError> {
        if let Some(m) = fast::parse(line, defaults, arena) {
            return Ok((m, None, None));
        }
        // JSON text is UTF-8; serde_json checks only the strings it keeps, so a bad byte in an
        // ignored field would pass (found by fuzzing). Only lines off the fast path pay for this.
        if let Err(e) = std::str::from_utf8(line) {
            return Err(WireError::Json(format!(
                "invalid UTF-8 at byte {}",
                e.valid_up_to()
            )));
        }
        let parsed: wire::Object<wire::Line<'_>> = serde_json::from_slice(line)
            .map_err(|e| diagnose(line, || WireError::Json(e.to_string())))?;
        let parsed = parsed.0;
        if parsed.misplaced() {
            // One struct reads both forms: a message field beside the pull form's `message`, or
            // a pull-form field without it (or inside it), is unknown where it stands.
            return Err(diagnose(line, || WireError::Json("misplaced field".into())));
        }
        let (m, ack_id, attempt, path) = match parsed.message {
            Some(inner) => (inner.0, parsed.ack_id, parsed.delivery_attempt, "message."),
            None => (parsed, None, None, ""),
        };
        let data = match m.data {
            None => bytes::Bytes::new(),
            Some(raw) if raw.0.is_empty() => bytes::Bytes::new(),
            Some(raw) => decode_base64_in(&raw.0, arena).map_err(|reason| WireError::Base64 {
                field: format!("{path}data"),
                reason,
            })?,
        };
        let publish_time_micros = match m.publish_time.as_deref() {
            None | Some("") => defaults.publish_time_micros(),
            Some(t) => parse_rfc3339_micros(t).map_err(|reason| WireError::PublishTime {
                field: format!("{path}publishTime"),
                value: t.to_string(),
                reason,
            })?,
        };
        let attributes = m.attributes.unwrap_or_default();
        if data.is_empty() && attributes.is_empty() {
            return Err(WireError::Empty {
                field: if path.is_empty() { "line" } else { "message" }.to_string(),
            });
        }
        let message_id = m.message_id.map(Cow::into_owned).unwrap_or_default();
        Ok((
            Message {
                data,
                attributes,
                message_id,
                publish_time_micros,
                ordering_key: m.ordering_key.map(Cow::into_owned).unwrap_or_default(),
            },
            ack_id,
            attempt,
        ))
    }

    /// The REST JSON form of this message (`PubsubMessage`), as one line without newline.
    pub fn to_json_line(&self) -> String {
        let mut obj = serde_json::Map::new();
        use base64::Engine as _;
        obj.insert(
            "data".into(),
            base64::engine::general_purpose::STANDARD
                .encode(&self.data)
                .into(),
        );
        if !self.attributes.is_empty() {
            obj.insert(
                "attributes".into(),
                serde_json::to_value(&self.attributes).expect("string map"),
            );
        }
        obj.insert("messageId".into(), self.message_id.clone().into());
        obj.insert(
            "publishTime".into(),
            format_rfc3339_micros(self.publish_time_micros).into(),
        );
        if !self.ordering_key.is_empty() {
            obj.insert("orderingKey".into(), self.ordering_key.clone().into());
        }
        serde_json::Value::Object(obj).to_string()
    }
}

use std::borrow::Cow;

/// A line serde could not read as a message: name the field that broke it. Only on the error
/// path, so the line is parsed a second time, into a `serde_json::Value`, to walk it; text that is
/// not JSON keeps serde_json's error (with its line and column), `otherwise`.
fn diagnose(line: &[u8], otherwise: impl FnOnce() -> WireError) -> WireError {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
        return otherwise();
    };
    check_shape(&v, "").unwrap_or_else(otherwise)
}

impl wire::Line<'_> {
    /// A field of the other form: a message field beside the pull form's `message`, a pull-form
    /// field inside `message` or without it.
    fn misplaced(&self) -> bool {
        let received = |l: &wire::Line<'_>| {
            l.ack_id.is_some() || l.message.is_some() || l.delivery_attempt.is_some()
        };
        match &self.message {
            None => self.ack_id.is_some() || self.delivery_attempt.is_some(),
            Some(inner) => {
                received(&inner.0)
                    || self.data.is_some()
                    || self.attributes.is_some()
                    || self.message_id.is_some()
                    || self.publish_time.is_some()
                    || self.ordering_key.is_some()
            }
        }
    }
}

/// The first key of `obj` that is not one of `known`, as an error naming the nearest known name.
pub fn unknown_field(
    obj: &serde_json::Map<String, serde_json::Value>,
    path: &str,
    known: &'static [&'static str],
    what: &'static str,
) -> Option<WireError> {
    let key = obj.keys().find(|k| !known.contains(&k.as_str()))?;
    Some(WireError::Unknown {
        field: format!("{path}{key}"),
        nearest: fields::nearest(key, known),
        what,
        known,
    })
}

/// The JSON kind of a value, for error messages.
fn kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first field of `v` (a line, or the pull form's `message` at `path`) that the wire form
/// does not have, or whose JSON type is not the wire form's; `None` when every field is known
/// and has its type.
fn check_shape(v: &serde_json::Value, path: &str) -> Option<WireError> {
    use serde_json::Value;
    let Value::Object(obj) = v else {
        return Some(WireError::NotObject {
            field: match path.trim_end_matches('.') {
                "" => "line",
                inner => inner,
            }
            .to_string(),
            found: kind(v),
        });
    };
    let unknown = match (path, obj.get("message")) {
        ("", Some(m)) if !m.is_null() => {
            unknown_field(obj, path, fields::RECEIVED, "a pull-form line")
        }
        _ => unknown_field(obj, path, fields::MESSAGE, "a PubsubMessage"),
    };
    if unknown.is_some() {
        return unknown;
    }
    let wrong = |key: &str, expected: &'static str, found: &Value| {
        Some(WireError::Type {
            field: format!("{path}{key}"),
            expected,
            found: match found {
                Value::String(_) | Value::Array(_) | Value::Object(_) => kind(found).to_string(),
                other => other.to_string(),
            },
        })
    };
    for (key, value) in obj {
        let field = match key.as_str() {
            "messageId" | "message_id" => "messageId",
            "publishTime" | "publish_time" => "publishTime",
            "orderingKey" | "ordering_key" => "orderingKey",
            "ackId" | "ack_id" => "ackId",
            "deliveryAttempt" | "delivery_attempt" => "deliveryAttempt",
            other => other,
        };
        match (field, value) {
            (_, Value::Null) => {}
            ("data" | "messageId" | "publishTime" | "orderingKey" | "ackId", Value::String(_)) => {}
            ("data" | "messageId" | "publishTime" | "orderingKey" | "ackId", other) => {
                return wrong(key, "a string", other)
            }
            ("attributes", Value::Object(attrs)) => {
                for (k, a) in attrs {
                    if !a.is_string() {
                        return wrong(&format!("attributes.{k}"), "a string", a);
                    }
                }
            }
            ("attributes", other) => return wrong(key, "an object of strings", other),
            ("deliveryAttempt", Value::Number(n))
                if n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()) => {}
            ("deliveryAttempt", other) => return wrong(key, "a 32-bit integer", other),
            ("message", inner) => {
                if let Some(e) = check_shape(inner, &format!("{path}message.")) {
                    return Some(e);
                }
            }
            _ => {}
        }
    }
    None
}

/// The fast path of the wire parser: the common shape of a REST `PubsubMessage` line — an object
/// of `data`, `attributes` (string → string), `messageId`, `publishTime`, `orderingKey`, strings
/// without escapes — parsed in one pass without serde. Anything else (escapes, `null`, the pull
/// form, unknown or repeated keys, a value that fails to decode) returns `None`, and serde_json
/// parses the line instead, so results and error messages are serde_json's. A property test
/// checks that both paths agree.
mod fast {
    use super::{decode_base64_in, parse_rfc3339_micros, Attributes, Message, WireDefaults};

    /// At most this many attributes on the fast path (a line with more takes the general one).
    const MAX_ATTRIBUTES: usize = 32;

    struct Cursor<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Cursor<'a> {
        fn ws(&mut self) {
            while let Some(&c) = self.b.get(self.i) {
                if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                    self.i += 1;
                } else {
                    break;
                }
            }
        }

        fn eat(&mut self, c: u8) -> Option<()> {
            self.ws();
            (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
        }

        fn peek(&mut self) -> Option<u8> {
            self.ws();
            self.b.get(self.i).copied()
        }

        /// A string without escapes or control characters, as raw bytes, and whether it holds
        /// a byte ≥ 0x80 (keys and short values: scanned in place, [`crate::jsonscan::special`]).
        fn raw_string(&mut self) -> Option<(&'a [u8], bool)> {
            self.eat(b'"')?;
            let rest = &self.b[self.i..];
            let (end, high) = crate::jsonscan::special(rest)?;
            if rest[end] != b'"' {
                return None; // an escape or a control character: the general path
            }
            self.i += end + 1;
            Some((&rest[..end], high))
        }

        /// A key.
        fn key(&mut self) -> Option<&'a [u8]> {
            self.raw_string().map(|(k, _)| k)
        }

        /// The base64 text of `data`, up to its closing quote (long: found with `memchr`). A
        /// backslash or a control character in it is left to the decoder, which refuses both.
        fn base64(&mut self) -> Option<&'a [u8]> {
            self.eat(b'"')?;
            let rest = &self.b[self.i..];
            let end = memchr::memchr(b'"', rest)?;
            self.i += end + 1;
            Some(&rest[..end])
        }

        /// A string as UTF-8 text (JSON forbids raw control characters in strings).
        fn string(&mut self) -> Option<&'a str> {
            let (s, high) = self.raw_string()?;
            if high {
                std::str::from_utf8(s).ok()
            } else {
                // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8.
                Some(unsafe { std::str::from_utf8_unchecked(s) })
            }
        }
    }

    pub(super) fn parse(
        line: &[u8],
        defaults: WireDefaults,
        arena: &mut bytes::BytesMut,
    ) -> Option<Message> {
        let mut c = Cursor { b: line, i: 0 };
        c.eat(b'{')?;
        let mut m = Message::default();
        let mut publish_time = None;
        let mut seen = 0u8;
        if c.peek()? != b'}' {
            loop {
                let key = c.key()?;
                c.eat(b':')?;
                let bit = match key {
                    b"data" => {
                        let b64 = c.base64()?;
                        if !b64.is_empty() {
                            m.data = decode_base64_in(b64, arena).ok()?;
                        }
                        1
                    }
                    b"attributes" => {
                        c.eat(b'{')?;
                        let mut pairs = [("", ""); MAX_ATTRIBUTES];
                        let mut n = 0;
                        if c.peek()? != b'}' {
                            loop {
                                let k = c.string()?;
                                c.eat(b':')?;
                                let v = c.string()?;
                                *pairs.get_mut(n)? = (k, v);
                                n += 1;
                                if c.eat(b',').is_none() {
                                    break;
                                }
                            }
                        }
                        c.eat(b'}')?;
                        let pairs = &mut pairs[..n];
                        m.attributes = Attributes::from_unsorted(pairs, arena);
                        if m.attributes.len() != n {
                            return None; // a repeated key: serde_json keeps the last; let it decide
                        }
                        2
                    }
                    b"messageId" | b"message_id" => {
                        m.message_id = c.string()?.to_string();
                        4
                    }
                    b"publishTime" | b"publish_time" => {
                        publish_time = Some(c.string()?);
                        8
                    }
                    b"orderingKey" | b"ordering_key" => {
                        m.ordering_key = c.string()?.to_string();
                        16
                    }
                    _ => return None,
                };
                if seen & bit != 0 {
                    return None; // a repeated key: serde_json reports it
                }
                seen |= bit;
                if c.eat(b',').is_none() {
                    break;
                }
            }
        }
        c.eat(b'}')?;
        c.ws();
        if c.i != line.len() {
            return None;
        }
        if m.data.is_empty() && m.attributes.is_empty() {
            return None; // not a message; the general path says why
        }
        m.publish_time_micros = match publish_time {
            None | Some("") => defaults.publish_time_micros(),
            Some(t) => parse_rfc3339_micros(t).ok()?,
        };
        Some(m)
    }
}

/// Standard base64 with padding, as protobuf JSON writes bytes (SIMD decoder); URL-safe and
/// unpadded input is accepted too, as protobuf JSON parsers do.
pub fn decode_base64(s: &[u8]) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    if let Ok(v) = base64_simd::STANDARD.decode_to_vec(s) {
        return Ok(v);
    }
    match STANDARD.decode(s) {
        Ok(v) => Ok(v),
        Err(first) => {
            const LENIENT: GeneralPurposeConfig = GeneralPurposeConfig::new()
                .with_decode_padding_mode(DecodePaddingMode::Indifferent);
            let std_lenient = GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT);
            let url_lenient = GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT);
            std_lenient
                .decode(s)
                .or_else(|_| url_lenient.decode(s))
                .or_else(|_| URL_SAFE.decode(s))
                .map_err(|_| first.to_string())
        }
    }
}

/// [`decode_base64`] into `arena`: the SIMD decoder writes straight into the arena's spare room.
fn decode_base64_in(s: &[u8], arena: &mut bytes::BytesMut) -> Result<bytes::Bytes, String> {
    let engine = base64_simd::STANDARD;
    if let Ok(n) = engine.decoded_length(s) {
        if arena.capacity() - arena.len() < n {
            arena.reserve(n.max(256 << 10));
        }
        let start = arena.len();
        // Straight into the spare room: zeroing it first cost 0.6% of a table run.
        let out = base64_simd::Out::from_uninit_slice(&mut arena.spare_capacity_mut()[..n]);
        if let Ok(len) = engine.decode(s, out).map(|d| d.len()) {
            // SAFETY: the decoder wrote (initialized) the first `len` bytes of the spare room.
            unsafe { arena.set_len(start + len) };
            return Ok(attributes::take_from(arena, start));
        }
    }
    decode_base64(s).map(bytes::Bytes::from)
}

/// RFC 3339 → microseconds since the epoch (nanoseconds truncated toward the past).
pub fn parse_rfc3339_micros(s: &str) -> Result<i64, String> {
    // The form Pub/Sub writes, `YYYY-MM-DDTHH:MM:SS[.F{1,6}]Z`, without chrono (1% of a table
    // run); the fixed-width reader accepts none that chrono refuses and gives chrono's value.
    if let Some(body) = s.as_bytes().strip_suffix(b"Z") {
        if body.get(10) == Some(&b'T') {
            if let Some((t, len)) = crate::civil::fixed_datetime(body) {
                if len == body.len() {
                    return Ok(t);
                }
            }
        }
    }
    chrono_rfc3339_micros(s)
}

/// [`parse_rfc3339_micros`] of any form, by chrono.
fn chrono_rfc3339_micros(s: &str) -> Result<i64, String> {
    let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|e| e.to_string())?;
    let secs = t.timestamp();
    let micros = i64::from(t.timestamp_subsec_micros());
    secs.checked_mul(1_000_000)
        .and_then(|s| s.checked_add(micros))
        .ok_or_else(|| "out of range".to_string())
}

/// Microseconds since the epoch → RFC 3339 UTC with `Z` (0, 3 or 6 fractional digits).
pub fn format_rfc3339_micros(micros: i64) -> String {
    let t = chrono::DateTime::from_timestamp_micros(micros).unwrap_or_default();
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: WireDefaults = WireDefaults {
        publish_time_micros: Some(7),
    };

    #[test]
    fn parses_rest_form() {
        let line = br#"{"data":"SGVsbG8gV29ybGQ=","attributes":{"k":"v"},"messageId":"2070443601311540","publishTime":"2021-02-26T19:13:55.749Z","orderingKey":"user-42"}"#;
        let (m, ack, att) = Message::from_json_line(line, D).unwrap();
        assert_eq!(&m.data[..], b"Hello World");
        assert_eq!(m.attributes.get("k"), Some("v"));
        assert_eq!(m.message_id, "2070443601311540");
        assert_eq!(m.publish_time_micros, 1_614_366_835_749_000);
        assert_eq!(m.ordering_key, "user-42");
        assert_eq!((ack, att), (None, None));
    }

    #[test]
    fn parses_pull_form() {
        let line = br#"{"ackId":"A1","deliveryAttempt":3,"message":{"data":"AA==","messageId":"9","publishTime":"2021-02-26T19:13:55.123456789Z"}}"#;
        let (m, ack, att) = Message::from_json_line(line, D).unwrap();
        assert_eq!(m.data, vec![0u8]);
        assert_eq!(m.publish_time_micros, 1_614_366_835_123_456);
        assert_eq!(ack.as_deref(), Some("A1"));
        assert_eq!(att, Some(3));
    }

    #[test]
    fn defaults_for_missing_fields() {
        let (m, _, _) = Message::from_json_line(br#"{"attributes":{"a":"b"}}"#, D).unwrap();
        assert_eq!(m.message_id, "");
        assert_eq!(m.publish_time_micros, 7);
        assert!(m.data.is_empty());
    }

    #[test]
    fn errors_name_the_problem() {
        let e = Message::from_json_line(br#"{"data":"!!!"}"#, D).unwrap_err();
        assert!(
            matches!(&e, WireError::Base64 { field, .. } if field == "data"),
            "{e}"
        );
        let e = Message::from_json_line(br#"{"data":"AA==""#, D).unwrap_err();
        assert!(matches!(e, WireError::Json(_)), "{e}");
        let e = Message::from_json_line(br#"{"data":"AA==","publishTime":"yesterday"}"#, D)
            .unwrap_err();
        assert!(matches!(e, WireError::PublishTime { .. }), "{e}");
    }

    /// Issue 13: every bad-line error names the field, as a path from the line.
    #[test]
    fn bad_line_errors_name_the_field() {
        for (line, want) in [
            (
                &br#"{"attributes":{"k":1}}"#[..],
                "field `attributes.k`: expected a string, got 1",
            ),
            (
                br#"{"data":"aGk=","attributes":{"a":"x","k":null}}"#,
                "field `attributes.k`: expected a string, got null",
            ),
            (
                br#"{"data":"aGk=","attributes":{"k":{"x":"y"}}}"#,
                "field `attributes.k`: expected a string, got an object",
            ),
            (
                br#"{"data":"aGk=","attributes":["k"]}"#,
                "field `attributes`: expected an object of strings, got an array",
            ),
            (br#"{"data":5}"#, "field `data`: expected a string, got 5"),
            (
                br#"{"data":"aGk=","messageId":7}"#,
                "field `messageId`: expected a string, got 7",
            ),
            (
                br#"{"data":"aGk=","message_id":true}"#,
                "field `message_id`: expected a string, got true",
            ),
            (
                br#"{"data":"aGk=","orderingKey":[]}"#,
                "field `orderingKey`: expected a string, got an array",
            ),
            (
                br#"{"data":"aGk=","publishTime":1}"#,
                "field `publishTime`: expected a string, got 1",
            ),
            (
                br#"{"ackId":"a","deliveryAttempt":"3","message":{"data":"aGk="}}"#,
                "field `deliveryAttempt`: expected a 32-bit integer, got a string",
            ),
            (
                br#"{"ackId":"a","deliveryAttempt":4294967296,"message":{"data":"aGk="}}"#,
                "field `deliveryAttempt`: expected a 32-bit integer, got 4294967296",
            ),
            (
                br#"{"ackId":"a","message":{"attributes":{"k":2}}}"#,
                "field `message.attributes.k`: expected a string, got 2",
            ),
            (
                br#"{"ackId":"a","message":{"data":"!!"}}"#,
                "field `message.data`: invalid base64",
            ),
            (
                br#"{"ackId":"a","message":{"data":"aGk=","publishTime":"x"}}"#,
                "field `message.publishTime`: not an RFC 3339 timestamp",
            ),
        ] {
            let e = Message::from_json_line(line, D).unwrap_err().to_string();
            assert!(
                e.starts_with(want),
                "{}: {e}",
                String::from_utf8_lossy(line)
            );
        }
    }

    /// Issue 44, point 1: an unknown field is a bad line naming it and the nearest known name,
    /// never a field dropped (a typo lost the attributes and the message id, exit 0). The
    /// snake_case spellings the docs accept stay accepted.
    #[test]
    fn an_unknown_field_is_a_bad_line_naming_the_nearest_known_name() {
        const MSG: &str =
            "(a PubsubMessage has data, attributes, messageId, publishTime, orderingKey; Pub/Sub refuses unknown fields)";
        const PULL: &str =
            "(a pull-form line has ackId, message, deliveryAttempt; Pub/Sub refuses unknown fields)";
        for (line, want) in [
            (
                &br#"{"data":"aGk=","atributes":{"k":"v"},"messageID":"typo-1"}"#[..],
                format!("field `atributes`: unknown field, did you mean `attributes`? {MSG}"),
            ),
            (
                br#"{"data":"aGk=","messageID":"typo-1"}"#,
                format!("field `messageID`: unknown field, did you mean `messageId`? {MSG}"),
            ),
            (
                br#"{"data":"aGk=","publish_tme":"2021-02-26T19:13:55Z"}"#,
                format!("field `publish_tme`: unknown field, did you mean `publishTime`? {MSG}"),
            ),
            (
                br#"{"data":"aGk=","color":"red"}"#,
                format!("field `color`: unknown field {MSG}"),
            ),
            (
                br#"{"data":"aGk=","atributes":null}"#,
                format!("field `atributes`: unknown field, did you mean `attributes`? {MSG}"),
            ),
            (
                br#"{"ackId":"a","message":{"data":"aGk=","orderingkey":"k"}}"#,
                format!(
                    "field `message.orderingkey`: unknown field, did you mean `orderingKey`? {MSG}"
                ),
            ),
            (
                br#"{"ackId":"a","message":{"data":"aGk=","ackId":"b"}}"#,
                format!("field `message.ackId`: unknown field {MSG}"),
            ),
            (
                br#"{"ackId":"a","deliveryAtempt":2,"message":{"data":"aGk="}}"#,
                format!(
                    "field `deliveryAtempt`: unknown field, did you mean `deliveryAttempt`? {PULL}"
                ),
            ),
            (
                br#"{"ackId":"a","data":"aGk=","message":{"data":"aGk="}}"#,
                format!("field `data`: unknown field {PULL}"),
            ),
            (
                br#"{"data":"aGk=","ackId":"a"}"#,
                format!("field `ackId`: unknown field {MSG}"),
            ),
        ] {
            let e = Message::from_json_line(line, D).unwrap_err();
            assert_eq!(e.to_string(), want, "{}", String::from_utf8_lossy(line));
        }
        // Every spelling the docs accept is read, on both paths.
        let snake = br#"{"data":"aGk=","attributes":{"k":"v"},"message_id":"9","publish_time":"2021-02-26T19:13:55Z","ordering_key":"o"}"#;
        let (m, _, _) = Message::from_json_line(snake, D).unwrap();
        assert_eq!((m.message_id.as_str(), m.ordering_key.as_str()), ("9", "o"));
        assert_eq!(m.publish_time_micros, 1_614_366_835_000_000);
        assert_eq!(serde_path(snake).unwrap().0, m);
        let pull =
            br#"{"ack_id":"a","delivery_attempt":2,"message":{"data":"aGk=","message_id":"9"}}"#;
        let (m, ack, attempt) = Message::from_json_line(pull, D).unwrap();
        assert_eq!(
            (m.message_id.as_str(), ack.as_deref(), attempt),
            ("9", Some("a"), Some(2))
        );
    }

    /// Issue 13: a line must be a JSON object; an array was read positionally into the message.
    #[test]
    fn a_line_that_is_not_a_json_object_is_a_bad_line() {
        for (line, found) in [
            (&br#"["aGk="]"#[..], "an array"),
            (b"[1,2,3]", "an array"),
            (b"[]", "an array"),
            (b"\"aGk=\"", "a string"),
            (b"5", "a number"),
            (b"true", "a boolean"),
            (b"null", "null"),
            (b" [\"aGk=\", {\"k\": \"v\"}] ", "an array"),
        ] {
            let e = Message::from_json_line(line, D).unwrap_err();
            assert_eq!(
                e,
                WireError::NotObject {
                    field: "line".into(),
                    found
                },
                "{}",
                String::from_utf8_lossy(line)
            );
            assert!(e.to_string().contains("must be a JSON object"), "{e}");
        }
        let e = Message::from_json_line(br#"{"ackId":"a","message":["aGk="]}"#, D).unwrap_err();
        assert_eq!(
            e,
            WireError::NotObject {
                field: "message".into(),
                found: "an array"
            }
        );
    }

    /// Found by fuzzing: invalid UTF-8 inside a field the parser ignores made a line that is not
    /// JSON text pass as a message.
    #[test]
    fn invalid_utf8_anywhere_is_a_bad_line() {
        let line = b"{\"data\":\"aGk=\",\"publislTime\":\"2023-09-25T04:10:00\xa6Z\"}";
        let e = Message::from_json_line(line, D).unwrap_err();
        assert_eq!(e, WireError::Json("invalid UTF-8 at byte 49".into()));
        // In a field the fast path reads, too (it falls back to the checked path).
        let line = b"{\"data\":\"aGk=\",\"messageId\":\"\xff\"}";
        assert!(Message::from_json_line(line, D).is_err());
    }

    /// Issue 13: Pub/Sub refuses to publish a message with neither data nor attributes.
    #[test]
    fn a_message_without_data_or_attributes_is_a_bad_line() {
        for line in [
            &b"{}"[..],
            br#"{"messageId":"1"}"#,
            br#"{"data":""}"#,
            br#"{"data":null,"attributes":null}"#,
            br#"{"data":"","attributes":{}}"#,
            br#"{"messageId":"1","publishTime":"2021-02-26T19:13:55Z","orderingKey":"k"}"#,
        ] {
            let e = Message::from_json_line(line, D).unwrap_err();
            assert_eq!(
                e,
                WireError::Empty {
                    field: "line".into()
                },
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let e = Message::from_json_line(br#"{"ackId":"a","message":{"messageId":"1"}}"#, D)
            .unwrap_err();
        assert_eq!(
            e,
            WireError::Empty {
                field: "message".into()
            }
        );
        // Either one is enough.
        assert!(Message::from_json_line(br#"{"data":"AA=="}"#, D).is_ok());
        assert!(Message::from_json_line(br#"{"attributes":{"k":""}}"#, D).is_ok());
    }

    fn serde_path(line: &[u8]) -> Result<(Message, Option<String>, Option<i32>), String> {
        // Force the serde path by parsing the pull form's inner message through `message`.
        let wrapped = [&b"{\"message\":"[..], line.trim_ascii(), &b"}"[..]].concat();
        Message::from_json_line(&wrapped, D).map_err(|e| e.to_string())
    }

    #[test]
    fn fast_path_takes_the_common_shape() {
        let line = br#"{"data":"aGk=","attributes":{"a":"1","b":"2"},"messageId":"7","publishTime":"2021-02-26T19:13:55.749Z","orderingKey":"k"}"#;
        let m = fast::parse(line, D, &mut bytes::BytesMut::new()).expect("fast path");
        assert_eq!(Ok((m, None, None)), serde_path(line));
        let spaced = b" { \"data\" : \"aGk=\" ,\t\"attributes\":{ } }\r\n";
        assert!(fast::parse(spaced, D, &mut bytes::BytesMut::new()).is_some());
        for other in [
            &br#"{"data":"a\/Gk="}"#[..],
            br#"{"data":null}"#,
            br#"{"data":"aGk=","data":"aGk="}"#,
            br#"{"ackId":"x","message":{}}"#,
            br#"{"data":"aGk="} x"#,
            br#"{"attributes":{"a":"1","a":"2"}}"#,
        ] {
            assert!(
                fast::parse(other, D, &mut bytes::BytesMut::new()).is_none(),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// The fixed-width publish-time reader agrees with chrono on every string near its form:
        /// the same value where it answers, and it answers nothing chrono refuses.
        #[test]
        fn rfc3339_fast_path_is_chrono(
            y in 0u32..10000, mo in 0u32..14, d in 0u32..33, h in 0u32..25, mi in 0u32..61,
            sec in 0u32..62, frac in "[0-9]{0,10}",
            sep in proptest::sample::select(vec!["T", "T", "T", "t", " "]),
            zone in proptest::sample::select(vec!["Z", "Z", "Z", "z", "+00:00", "-01:30", ""]),
            dot in proptest::prelude::any::<bool>(),
        ) {
            let s = format!(
                "{y:04}-{mo:02}-{d:02}{sep}{h:02}:{mi:02}:{sec:02}{}{frac}{zone}",
                if dot { "." } else { "" }
            );
            let chrono = super::chrono_rfc3339_micros(&s).ok();
            let ours = parse_rfc3339_micros(&s).ok();
            proptest::prop_assert_eq!(ours, chrono, "{}", s);
        }
    }

    proptest::proptest! {
        /// The fast path agrees with serde_json on every line it accepts.
        #[test]
        fn fast_path_agrees_with_serde(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            attrs in proptest::collection::btree_map("[a-z\"\\\\ é\u{1}]{0,4}", "[a-z\"\\\\ é\u{1}/]{0,4}", 0..4),
            id in "[0-9a-z\"]{0,5}",
            key in "[a-z\\\\]{0,3}",
            micros in -10_000_000_000_000_000i64..10_000_000_000_000_000,
            spaces in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just(""), proptest::strategy::Just(" "), proptest::strategy::Just("\t")], 12),
            drop_fields in proptest::collection::vec(proptest::prelude::any::<bool>(), 5),
            junk in proptest::option::of("[,}{\":a-z0-9 ]{1,3}"),
        ) {
            use base64::Engine as _;
            let s = |i: usize| spaces[i % spaces.len()];
            let q = |v: &str| serde_json::to_string(v).unwrap();
            let mut fields = Vec::new();
            if !drop_fields[0] { fields.push(format!("{}\"data\"{}:{}{}", s(0), s(1), s(2), q(&base64::engine::general_purpose::STANDARD.encode(&data)))); }
            if !drop_fields[1] { fields.push(format!("\"attributes\":{}{}", s(3), serde_json::to_string(&attrs).unwrap())); }
            if !drop_fields[2] { fields.push(format!("\"messageId\"{}:{}", s(4), q(&id))); }
            if !drop_fields[3] { fields.push(format!("\"publishTime\":{}", q(&format_rfc3339_micros(micros)))); }
            if !drop_fields[4] { fields.push(format!("\"orderingKey\":{}{}", s(5), q(&key))); }
            let mut line = format!("{{{}{}{}}}", s(6), fields.join(&format!("{},{}", s(7), s(8))), s(9));
            if let Some(j) = &junk {
                let mut at = line.len() / 2;
                while !line.is_char_boundary(at) {
                    at += 1;
                }
                line.insert_str(at, j);
            }
            let fast = fast::parse(line.as_bytes(), D, &mut bytes::BytesMut::new());
            let full = Message::from_json_line(line.as_bytes(), D).map_err(|e| e.to_string());
            if let Some(m) = fast {
                proptest::prop_assert_eq!(Ok((m, None, None)), serde_path(line.as_bytes()));
            }
            // With or without the fast path, a line is accepted exactly when serde_json accepts
            // it, with the same message (error texts differ only in the column of the wrapper).
            match (full, serde_path(line.as_bytes())) {
                (Ok(a), Ok(b)) => proptest::prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                (a, b) => proptest::prop_assert!(false, "{:?} vs {:?}", a, b),
            }
        }
    }

    #[test]
    fn json_round_trip() {
        let m = Message {
            data: bytes::Bytes::from_static(b"x\ny"),
            attributes: [("a".to_string(), "b".to_string())].into(),
            message_id: "1".into(),
            publish_time_micros: 1_614_366_835_749_123,
            ordering_key: "k".into(),
        };
        let line = m.to_json_line();
        let (back, _, _) = Message::from_json_line(line.as_bytes(), D).unwrap();
        assert_eq!(back, m);
    }
}
