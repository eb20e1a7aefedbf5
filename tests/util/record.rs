//! A TCP proxy in front of a gRPC (HTTP/2, plaintext) server that passes every byte unchanged and
//! records both directions of every connection, so that a test can read what a client sent on the
//! wire and what the server answered.
//!
//! [`RecordProxy::requests`] and [`RecordProxy::responses`] cut the recording into gRPC messages:
//! the HTTP/2 frames (after the client's 24-byte connection preface) are split by their 9-byte
//! headers, the payloads of the DATA frames are joined per stream, and each stream's bytes are
//! split into gRPC length-prefixed messages (a compression flag byte, a 4-byte big-endian length,
//! the protobuf message). HEADERS frames (HPACK) are not decoded: a test tells its calls apart by
//! their messages. [`proto_fields`] reads a protobuf message's fields, enough to walk to a bytes
//! field of a known message.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// The recording of one connection: what the client sent, what the server sent.
#[derive(Default)]
struct Conn {
    up: Vec<u8>,
    down: Vec<u8>,
}

/// The proxy; it stops serving new connections when dropped.
pub struct RecordProxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<Arc<Mutex<Conn>>>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl RecordProxy {
    /// A proxy to `127.0.0.1:upstream`, passing and recording everything.
    pub fn start(upstream: u16) -> RecordProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<Arc<Mutex<Conn>>>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (all, st) = (conns.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let conn = Arc::new(Mutex::new(Conn::default()));
                all.lock().unwrap().push(conn.clone());
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let up = conn.clone();
                std::thread::spawn(move || pump(client, server, &up, true));
                std::thread::spawn(move || pump(s2, c2, &conn, false));
            }
        });
        RecordProxy { port, conns, stop }
    }

    /// `http://127.0.0.1:PORT`, for `--bigquery-storage-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every byte the clients sent, connection after connection.
    pub fn sent(&self) -> Vec<u8> {
        self.each(|c| c.up.clone()).concat()
    }

    /// The gRPC messages the clients sent: per connection, per HTTP/2 stream in the order the
    /// streams began, each stream's messages in order. Panics on a compressed message.
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.each(|c| {
            let frames = c
                .up
                .strip_prefix(PREFACE)
                .unwrap_or_else(|| panic!("no HTTP/2 preface: {:?}", &c.up[..c.up.len().min(24)]));
            grpc_messages(frames)
        })
        .concat()
    }

    /// The gRPC messages the server sent back, as [`RecordProxy::requests`].
    pub fn responses(&self) -> Vec<Vec<u8>> {
        self.each(|c| grpc_messages(&c.down)).concat()
    }

    fn each<T>(&self, f: impl Fn(&Conn) -> T) -> Vec<T> {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|c| f(&c.lock().unwrap()))
            .collect()
    }
}

impl Drop for RecordProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copy `from` to `to`, recording what passes (`up`: the client's side).
fn pump(mut from: TcpStream, mut to: TcpStream, conn: &Mutex<Conn>, up: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut c = conn.lock().unwrap();
            if up { &mut c.up } else { &mut c.down }.extend_from_slice(&buf[..n]);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// The gRPC messages in HTTP/2 `frames` (one direction of a connection, without the preface).
/// A frame cut off at the end (the connection was recorded mid-frame) is left out.
fn grpc_messages(frames: &[u8]) -> Vec<Vec<u8>> {
    // DATA payloads per stream id, and the order the streams first carried DATA.
    let mut data: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut order: Vec<u32> = Vec::new();
    let mut i = 0;
    while i + 9 <= frames.len() {
        let h = &frames[i..i + 9];
        let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        if i + 9 + len > frames.len() {
            break;
        }
        let mut payload = &frames[i + 9..i + 9 + len];
        i += 9 + len;
        if kind != 0 {
            continue;
        }
        if flags & 0x8 != 0 {
            // PADDED: a pad length byte first, that many bytes of padding last.
            let pad = payload[0] as usize;
            payload = &payload[1..payload.len() - pad];
        }
        if !data.contains_key(&stream) {
            order.push(stream);
        }
        data.entry(stream).or_default().extend_from_slice(payload);
    }
    let mut out = Vec::new();
    for s in order {
        let bytes = &data[&s];
        let mut j = 0;
        while j + 5 <= bytes.len() {
            assert_eq!(bytes[j], 0, "a compressed gRPC message on stream {s}");
            let len = u32::from_be_bytes([bytes[j + 1], bytes[j + 2], bytes[j + 3], bytes[j + 4]])
                as usize;
            if j + 5 + len > bytes.len() {
                break;
            }
            out.push(bytes[j + 5..j + 5 + len].to_vec());
            j += 5 + len;
        }
    }
    out
}

/// A protobuf field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proto<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Proto<'a> {
    /// A length-delimited field's bytes (a string, bytes or a message).
    pub fn bytes(&self) -> &'a [u8] {
        match self {
            Proto::Bytes(b) => b,
            other => panic!("not a length-delimited field: {other:?}"),
        }
    }
}

fn varint(buf: &[u8], i: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = buf[*i];
        *i += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return v;
        }
    }
    panic!("a varint longer than 10 bytes")
}

/// The fields of protobuf message `buf`, in order: (field number, value). Panics on bytes that
/// are not a protobuf message.
pub fn proto_fields(buf: &[u8]) -> Vec<(u32, Proto<'_>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < buf.len() {
        let key = varint(buf, &mut i);
        let (field, wire) = ((key >> 3) as u32, key & 7);
        let v = match wire {
            0 => Proto::Varint(varint(buf, &mut i)),
            1 => {
                let v = u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
                i += 8;
                Proto::Fixed64(v)
            }
            2 => {
                let len = varint(buf, &mut i) as usize;
                let v = &buf[i..i + len];
                i += len;
                Proto::Bytes(v)
            }
            5 => {
                let v = u32::from_le_bytes(buf[i..i + 4].try_into().unwrap());
                i += 4;
                Proto::Fixed32(v)
            }
            w => panic!("protobuf wire type {w} at byte {i}"),
        };
        out.push((field, v));
    }
    out
}

/// The first field `number` of message `buf`, if any.
pub fn proto_field(buf: &[u8], number: u32) -> Option<Proto<'_>> {
    proto_fields(buf)
        .into_iter()
        .find(|(n, _)| *n == number)
        .map(|(_, v)| v)
}

/// The field numbers of message `buf`, in order (a message's shape, for asserting which fields an
/// answer carries).
pub fn proto_numbers(buf: &[u8]) -> Vec<u32> {
    proto_fields(buf).into_iter().map(|(n, _)| n).collect()
}
