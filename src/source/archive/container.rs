//! An Avro object container read block by block from a stream: the header (schema, codec, sync
//! marker), then one data block at a time — at most one block (and its decompressed form) is
//! held, whatever the object's size. Every failure says which record it broke at.

use std::io::Read;

/// Why an archived object could not be read further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {record}: {reason}")]
pub struct Broken {
    /// Index (from 0) of the first record that could not be read.
    pub record: u64,
    pub reason: String,
}

/// The codecs of an Avro container (the four subsink writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Null,
    Deflate,
    Snappy,
    Zstd,
}

/// The container's header.
#[derive(Debug, Clone)]
pub struct Header {
    /// The writer schema (`avro.schema`), as written.
    pub schema: String,
    codec: Codec,
    sync: [u8; 16],
}

/// A container read block by block.
pub struct Container<R: Read> {
    input: R,
    pub header: Header,
    /// Records handed out so far (blocks fully read).
    records: u64,
    raw: Vec<u8>,
    plain: Vec<u8>,
}

/// A block's records: `count` datums in `data`.
pub struct Block<'a> {
    pub count: u64,
    pub data: &'a [u8],
    /// Index of the block's first record in the object.
    pub first: u64,
}

/// Largest block accepted (a corrupt size must not make us allocate gigabytes): 1 GiB.
const MAX_BLOCK: u64 = 1 << 30;

fn read_long<R: Read>(r: &mut R) -> std::io::Result<Option<i64>> {
    let mut z: u64 = 0;
    let mut shift = 0;
    let mut first = true;
    loop {
        let mut b = [0u8; 1];
        match r.read(&mut b) {
            Ok(0) if first => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        first = false;
        if shift > 63 {
            return Err(std::io::Error::other("varint longer than 10 bytes"));
        }
        z |= u64::from(b[0] & 0x7f) << shift;
        if b[0] & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    Ok(Some(((z >> 1) as i64) ^ -((z & 1) as i64)))
}

fn need_long<R: Read>(r: &mut R) -> std::io::Result<i64> {
    read_long(r)?.ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into())
}

fn read_bytes<R: Read>(r: &mut R, limit: u64) -> std::io::Result<Vec<u8>> {
    let n = need_long(r)?;
    if n < 0 || n as u64 > limit {
        return Err(std::io::Error::other(format!("bad length {n}")));
    }
    let mut v = vec![0u8; n as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn io_reason(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        "the object ends inside a block (truncated)".into()
    } else {
        e.to_string()
    }
}

impl<R: Read> Container<R> {
    /// Reads the header after the 4-byte magic `Obj\x01` (already consumed by the caller).
    pub fn open(mut input: R) -> Result<Container<R>, Broken> {
        let broken = |reason: String| Broken { record: 0, reason };
        let mut schema = None;
        let mut codec = Codec::Null;
        loop {
            let n =
                need_long(&mut input).map_err(|e| broken(format!("header: {}", io_reason(&e))))?;
            if n == 0 {
                break;
            }
            let n = if n < 0 {
                need_long(&mut input).map_err(|e| broken(format!("header: {e}")))?;
                -n
            } else {
                n
            };
            for _ in 0..n {
                let key = read_bytes(&mut input, 1 << 20)
                    .map_err(|e| broken(format!("header: {}", io_reason(&e))))?;
                let value = read_bytes(&mut input, 64 << 20)
                    .map_err(|e| broken(format!("header: {}", io_reason(&e))))?;
                match key.as_slice() {
                    b"avro.schema" => {
                        schema = Some(
                            String::from_utf8(value)
                                .map_err(|_| broken("header: avro.schema is not UTF-8".into()))?,
                        )
                    }
                    b"avro.codec" => {
                        codec = match value.as_slice() {
                            b"null" | b"" => Codec::Null,
                            b"deflate" => Codec::Deflate,
                            b"snappy" => Codec::Snappy,
                            b"zstandard" => Codec::Zstd,
                            other => {
                                return Err(broken(format!(
                                    "header: codec {:?} is not supported",
                                    String::from_utf8_lossy(other)
                                )))
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut sync = [0u8; 16];
        input
            .read_exact(&mut sync)
            .map_err(|e| broken(format!("header: {}", io_reason(&e))))?;
        let schema = schema.ok_or_else(|| broken("header: no avro.schema".into()))?;
        Ok(Container {
            input,
            header: Header {
                schema,
                codec,
                sync,
            },
            records: 0,
            raw: Vec::new(),
            plain: Vec::new(),
        })
    }

    /// The next block, `None` at the end of the object. `skip`: the block's records are not
    /// wanted (a resumed run passes what a previous one wrote) — it is read past, not decoded.
    pub fn next_block(&mut self, skip_below: u64) -> Result<Option<Block<'_>>, Broken> {
        loop {
            let record = self.records;
            let broken = |reason: String| Broken { record, reason };
            let count = match read_long(&mut self.input) {
                Ok(None) => return Ok(None),
                Ok(Some(c)) => c,
                Err(e) => return Err(broken(io_reason(&e))),
            };
            let size = need_long(&mut self.input).map_err(|e| broken(io_reason(&e)))?;
            if count < 0 || size < 0 || size as u64 > MAX_BLOCK {
                return Err(broken(format!(
                    "corrupt block header (count {count}, size {size})"
                )));
            }
            let (count, size) = (count as u64, size as usize);
            if record + count <= skip_below {
                // Read past without keeping or decoding it.
                let copied = std::io::copy(
                    &mut (&mut self.input).take(size as u64),
                    &mut std::io::sink(),
                )
                .map_err(|e| broken(io_reason(&e)))?;
                if copied < size as u64 {
                    return Err(broken(io_reason(&std::io::ErrorKind::UnexpectedEof.into())));
                }
                self.check_sync(record)?;
                self.records += count;
                continue;
            }
            self.raw.clear();
            self.raw.resize(size, 0);
            self.input
                .read_exact(&mut self.raw)
                .map_err(|e| broken(io_reason(&e)))?;
            self.check_sync(record)?;
            self.decompress().map_err(broken)?;
            self.records += count;
            let data = match self.header.codec {
                Codec::Null => &self.raw[..],
                _ => &self.plain[..],
            };
            return Ok(Some(Block {
                count,
                data,
                first: record,
            }));
        }
    }

    fn check_sync(&mut self, record: u64) -> Result<(), Broken> {
        let mut sync = [0u8; 16];
        self.input.read_exact(&mut sync).map_err(|e| Broken {
            record,
            reason: io_reason(&e),
        })?;
        if sync != self.header.sync {
            return Err(Broken {
                record,
                reason: "the block is not followed by the file's sync marker (corrupt)".into(),
            });
        }
        Ok(())
    }

    fn decompress(&mut self) -> Result<(), String> {
        self.plain.clear();
        match self.header.codec {
            Codec::Null => Ok(()),
            Codec::Deflate => flate2::read::DeflateDecoder::new(&self.raw[..])
                .take(MAX_BLOCK)
                .read_to_end(&mut self.plain)
                .map(drop)
                .map_err(|e| format!("deflate block: {e}")),
            Codec::Snappy => {
                if self.raw.len() < 4 {
                    return Err("snappy block shorter than its CRC".into());
                }
                let (body, crc) = self.raw.split_at(self.raw.len() - 4);
                let n =
                    snap::raw::decompress_len(body).map_err(|e| format!("snappy block: {e}"))?;
                if n as u64 > MAX_BLOCK {
                    return Err("snappy block too large".into());
                }
                self.plain.resize(n, 0);
                snap::raw::Decoder::new()
                    .decompress(body, &mut self.plain)
                    .map_err(|e| format!("snappy block: {e}"))?;
                let want = u32::from_be_bytes(crc.try_into().expect("4 bytes"));
                if crc32(&self.plain) != want {
                    return Err("snappy block: CRC mismatch".into());
                }
                Ok(())
            }
            Codec::Zstd => zstd::stream::read::Decoder::new(&self.raw[..])
                .map_err(|e| format!("zstandard block: {e}"))?
                .take(MAX_BLOCK)
                .read_to_end(&mut self.plain)
                .map(drop)
                .map_err(|e| format!("zstandard block: {e}")),
        }
    }
}

/// CRC-32 (IEEE), as Avro's snappy codec appends it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// Reading datums out of a block's bytes.
pub mod datum {
    /// A zig-zag varint.
    pub fn long(input: &mut &[u8]) -> Result<i64, String> {
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            let (&b, rest) = input.split_first().ok_or("datum ends inside a number")?;
            *input = rest;
            if shift > 63 {
                return Err("varint longer than 10 bytes".into());
            }
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    /// Length-prefixed bytes.
    pub fn bytes<'a>(input: &mut &'a [u8]) -> Result<&'a [u8], String> {
        let n = long(input)?;
        if n < 0 || n as usize > input.len() {
            return Err(format!("datum length {n} runs past the block"));
        }
        let (v, rest) = input.split_at(n as usize);
        *input = rest;
        Ok(v)
    }

    pub fn string(input: &mut &[u8]) -> Result<String, String> {
        let b = bytes(input)?;
        String::from_utf8(b.to_vec()).map_err(|_| "a string is not UTF-8".to_string())
    }

    /// A `map<string>`, its entries in the order written.
    pub fn string_map(input: &mut &[u8]) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        loop {
            let mut n = long(input)?;
            if n == 0 {
                return Ok(out);
            }
            if n < 0 {
                long(input)?; // the block's byte size
                n = -n;
            }
            for _ in 0..n {
                let k = string(input)?;
                let v = string(input)?;
                out.push((k, v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_known_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }
}
