//! [`Attributes`]: a message's attributes, as a sorted map of strings in one buffer.
//!
//! A message's attributes are read far more often than changed, and most messages carry a few small
//! ones. A `BTreeMap<String, String>` costs two allocations per attribute to build and as many
//! frees to drop — on another thread, as parser threads build messages and the writer drops them.
//! `Attributes` keeps every key and value of a message in one [`Bytes`]: a parser copies them into
//! its per-block arena (where the payloads go too), and dropping the message is one reference
//! count decrement.

use std::collections::BTreeMap;
use std::fmt;

use bytes::{Bytes, BytesMut};

/// Ends every key and every value in the buffer: a byte that never occurs in UTF-8 text.
const END: u8 = 0xFF;

/// A message's attributes: string keys to string values, in key order (byte order, as `str`
/// compares), each key once.
///
/// The order is the one every output relies on (Avro maps, JSON metadata, golden files), as a
/// `BTreeMap` iterates. Building from pairs with a repeated key keeps the last value, as inserting
/// them one by one into a map would.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// `key END value END` for every attribute, sorted by key, keys unique. Every piece between
    /// two `END`s is UTF-8 (it was copied from a `&str`), which [`Iter`] relies on. One map has one
    /// encoding, so equal buffers are equal maps and the other way round.
    buf: Bytes,
    len: usize,
}

impl Attributes {
    /// No attributes.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many attributes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of every key and value together (what batch limits count), without walking
    /// them: the buffer less one `END` per key and per value.
    pub fn text_len(&self) -> usize {
        self.buf.len() - 2 * self.len
    }

    /// The attributes as `(key, value)`, in key order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            rest: &self.buf,
            left: self.len,
        }
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub fn values(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        for (k, v) in self {
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Some(v),
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Set `key` to `value`; the value it had before, if any. Rebuilds the buffer: for the few
    /// changes a source or the dead-letter path makes, not for building a map from many pairs
    /// (collect those instead).
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        let old = self.get(&key).map(str::to_string);
        let mut pairs: Vec<(&str, &str)> = self.iter().filter(|&(k, _)| k != key).collect();
        pairs.push((&key, &value));
        *self = Self::from_pairs(&mut pairs);
        old
    }

    /// Remove `key`; its value, if it had one.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let old = self.get(key)?.to_string();
        let mut pairs: Vec<(&str, &str)> = self.iter().filter(|&(k, _)| k != key).collect();
        *self = Self::from_pairs(&mut pairs);
        Some(old)
    }

    /// The attributes `pairs` name (in any order; of a repeated key the last), copied into
    /// `arena` (grown when too small), so that the attributes of many messages share one
    /// allocation. Sorts `pairs`.
    pub fn from_unsorted(pairs: &mut [(&str, &str)], arena: &mut BytesMut) -> Self {
        if pairs.is_empty() {
            return Self::default();
        }
        // Stable: of equal keys the last stays last, and is the one kept. Pairs already in
        // strictly increasing order (the usual case) hold no repeated key.
        let unique = pairs.windows(2).all(|w| w[0].0 < w[1].0);
        if !unique {
            pairs.sort_by(|a, b| a.0.cmp(b.0));
        }
        let size: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if arena.capacity() - arena.len() < size {
            arena.reserve(size.max(64 << 10));
        }
        let start = arena.len();
        let mut len = 0;
        for (i, (k, v)) in pairs.iter().enumerate() {
            if !unique && pairs.get(i + 1).is_some_and(|next| next.0 == *k) {
                continue; // a later pair has this key
            }
            arena.extend_from_slice(k.as_bytes());
            arena.extend_from_slice(&[END]);
            arena.extend_from_slice(v.as_bytes());
            arena.extend_from_slice(&[END]);
            len += 1;
        }
        let buf = take_from(arena, start);
        Self { buf, len }
    }

    /// Append the attributes to `out` as a JSON object, `{"k":"v",…}` in key order (`{}` when
    /// there are none), as serde_json writes a map — when no key or value needs escaping (a `"`,
    /// `\\` or control character); otherwise write nothing and say `false`. One pass over the
    /// buffer instead of one per piece.
    pub fn write_json_plain(&self, out: &mut Vec<u8>) -> bool {
        if self.len == 0 {
            out.extend_from_slice(b"{}");
            return true;
        }
        // `END` (0xFF) is neither a quote, a backslash nor a control character.
        if crate::jsonscan::needs_escape(&self.buf) {
            return false;
        }
        // Each `END` becomes `":"` or `","` (three bytes) after `{"`; the last one's `",` is then
        // overwritten by `"}` and its third byte dropped.
        let size = self.buf.len() + 4 * self.len + 1;
        let at = out.len();
        out.resize(at + size + 1, 0);
        let dst = &mut out[at..];
        dst[..2].copy_from_slice(b"{\"");
        let mut j = 2;
        let mut key = true;
        for &b in self.buf.iter() {
            if b == END {
                dst[j..j + 3].copy_from_slice(if key { b"\":\"" } else { b"\",\"" });
                j += 3;
                key = !key;
            } else {
                dst[j] = b;
                j += 1;
            }
        }
        dst[j - 3..j - 1].copy_from_slice(b"\"}");
        debug_assert_eq!(j - 1, size);
        out.truncate(at + size);
        true
    }

    /// [`Attributes::from_unsorted`] into a buffer of its own.
    fn from_pairs(pairs: &mut [(&str, &str)]) -> Self {
        let size = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        Self::from_unsorted(pairs, &mut BytesMut::with_capacity(size))
    }

    /// As a `BTreeMap` (what the Pub/Sub and BigQuery client types hold).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// The attributes of an [`Attributes`], in key order.
#[derive(Clone)]
pub struct Iter<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iter<'a> {
    /// The next piece of the buffer, up to its `END`.
    fn piece(&mut self) -> &'a str {
        // Pieces are short: a plain loop beats `memchr`'s call and set-up.
        let end = self
            .rest
            .iter()
            .position(|&b| b == END)
            .expect("every piece ends with END");
        let piece = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        debug_assert!(std::str::from_utf8(piece).is_ok());
        // SAFETY: `Attributes::buf` is built only from whole `&str`s, each followed by `END`, a
        // byte no UTF-8 text contains; so the bytes before the next `END` are one of those `&str`s.
        unsafe { std::str::from_utf8_unchecked(piece) }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let k = self.piece();
        Some((k, self.piece()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Attributes {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Attributes {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let owned: Vec<(K, V)> = iter.into_iter().collect();
        let mut pairs: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_ref()))
            .collect();
        Self::from_pairs(&mut pairs)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Extend<(K, V)> for Attributes {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        let added: Vec<(K, V)> = iter.into_iter().collect();
        let mut pairs: Vec<(&str, &str)> = self.iter().collect();
        pairs.extend(added.iter().map(|(k, v)| (k.as_ref(), v.as_ref())));
        *self = Self::from_pairs(&mut pairs);
    }
}

impl From<BTreeMap<String, String>> for Attributes {
    fn from(map: BTreeMap<String, String>) -> Self {
        map.iter().collect()
    }
}

impl From<&BTreeMap<String, String>> for Attributes {
    fn from(map: &BTreeMap<String, String>) -> Self {
        map.iter().collect()
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> From<[(K, V); N]> for Attributes {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<Attributes> for BTreeMap<String, String> {
    fn from(a: Attributes) -> Self {
        a.to_map()
    }
}

impl From<&Attributes> for BTreeMap<String, String> {
    fn from(a: &Attributes) -> Self {
        a.to_map()
    }
}

impl crate::filter::AttributeMap for Attributes {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

/// `attributes["k"]`: the value of `k`; panics when there is none, as a map's index does.
impl std::ops::Index<&str> for Attributes {
    type Output = str;

    fn index(&self, key: &str) -> &str {
        self.get(key)
            .unwrap_or_else(|| panic!("no attribute {key:?}"))
    }
}

impl fmt::Debug for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Attributes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

/// A map of strings; of a repeated key the last value, as for a `BTreeMap`.
impl<'de> serde::Deserialize<'de> for Attributes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Attributes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Attributes, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(256));
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(pairs.into_iter().collect())
            }
        }
        d.deserialize_map(V)
    }
}

/// What `arena` holds from `start` on, split off as one `Bytes` (the arena keeps its spare room).
/// `start` is 0 but for a caller that left bytes behind: the split then costs no reference count
/// of its own (two splits each cost one, 1% of a table run).
pub(crate) fn take_from(arena: &mut BytesMut, start: usize) -> Bytes {
    let mut piece = arena.split();
    if start > 0 {
        bytes::Buf::advance(&mut piece, start);
    }
    piece.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_len_counts_keys_and_values() {
        for pairs in [
            &[][..],
            &[("k", "v")][..],
            &[("tenant", "t-7"), ("é", ""), ("", "ü")][..],
        ] {
            let a: Attributes = pairs.iter().copied().collect();
            let want: usize = a.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert_eq!(a.text_len(), want, "{pairs:?}");
        }
    }

    #[test]
    fn plain_json_is_serde_jsons_map_or_nothing() {
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[("k", "v")],
            &[("type", "event.v1"), ("source", "bench"), ("tenant", "t-7")],
            &[("", ""), ("é", "ü\u{7f}"), ("a b", "c/d")],
        ];
        for pairs in cases {
            let a: Attributes = pairs.iter().copied().collect();
            let mut out = b"x".to_vec();
            assert!(a.write_json_plain(&mut out), "{pairs:?}");
            let want = serde_json::to_string(&map(pairs)).unwrap();
            assert_eq!(std::str::from_utf8(&out[1..]).unwrap(), want, "{pairs:?}");
        }
        for pairs in [
            [("k", "a\"b")],
            [("k\\", "v")],
            [("k", "line\n")],
            [("\u{1}", "v")],
        ] {
            let a: Attributes = pairs.iter().copied().collect();
            let mut out = b"x".to_vec();
            assert!(!a.write_json_plain(&mut out), "{pairs:?}");
            assert_eq!(out, b"x", "nothing written for {pairs:?}");
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_come_sorted_and_the_last_duplicate_wins() {
        let a = Attributes::from([("b", "1"), ("a", "2"), ("c", "3"), ("a", "4"), ("", "e")]);
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            [("", "e"), ("a", "4"), ("b", "1"), ("c", "3")]
        );
        assert_eq!(a.len(), 4);
        assert_eq!(a.keys().collect::<Vec<_>>(), ["", "a", "b", "c"]);
        assert_eq!(a.values().collect::<Vec<_>>(), ["e", "4", "1", "3"]);
        // Byte order, as `str` and a `BTreeMap` order keys.
        let b = Attributes::from([("é", ""), ("Z", ""), ("z", ""), ("\u{0}", "")]);
        assert_eq!(b.keys().collect::<Vec<_>>(), ["\u{0}", "Z", "z", "é"]);
    }

    #[test]
    fn get_insert_remove() {
        let mut a = Attributes::new();
        assert!(a.is_empty());
        assert_eq!(a.get("k"), None);
        assert_eq!(a.insert("k".into(), "v".into()), None);
        assert_eq!(a.insert("a".into(), "".into()), None);
        assert_eq!(a.insert("k".into(), "w".into()), Some("v".into()));
        assert_eq!(a.get("k"), Some("w"));
        assert_eq!(&a["a"], "");
        assert!(a.contains_key("a") && !a.contains_key("b"));
        assert_eq!(a.len(), 2);
        assert_eq!(a.remove("b"), None);
        assert_eq!(a.remove("a"), Some(String::new()));
        assert_eq!(a, Attributes::from([("k", "w")]));
        assert_eq!(a.remove("k"), Some("w".into()));
        assert_eq!(a, Attributes::new());
    }

    #[test]
    fn equals_the_map_it_came_from() {
        let m = map(&[("x", "1"), ("y", "\u{ff}\""), ("long key", "")]);
        let a = Attributes::from(m.clone());
        assert_eq!(BTreeMap::from(&a), m);
        assert_eq!(a, m.iter().collect());
        assert_ne!(a, Attributes::from([("x", "1")]));
        assert_eq!(format!("{a:?}"), format!("{m:?}"));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&m).unwrap()
        );
        let back: Attributes = serde_json::from_str(r#"{"b":"1","a":"2","b":"3"}"#).unwrap();
        assert_eq!(back, Attributes::from([("a", "2"), ("b", "3")]));
        assert!(serde_json::from_str::<Attributes>(r#"{"a":1}"#).is_err());
    }

    #[test]
    fn many_share_one_arena() {
        let mut arena = BytesMut::new();
        let a = Attributes::from_unsorted(&mut [("k", "v")], &mut arena);
        let b = Attributes::from_unsorted(&mut [("b", "2"), ("a", "1")], &mut arena);
        assert_eq!(a, Attributes::from([("k", "v")]));
        assert_eq!(b, Attributes::from([("a", "1"), ("b", "2")]));
        assert_eq!(
            Attributes::from_unsorted(&mut [], &mut arena),
            Attributes::new()
        );
    }

    proptest::proptest! {
        /// Built, changed and read like a `BTreeMap`.
        #[test]
        fn behaves_like_a_btree_map(
            pairs in proptest::collection::vec(("[a-cé\u{0}]{0,3}", "[a-z\u{ff}]{0,3}"), 0..12),
            ops in proptest::collection::vec((proptest::prelude::any::<bool>(), "[a-cé]{0,2}", "[xy]{0,2}"), 0..8),
        ) {
            let mut want: BTreeMap<String, String> = pairs.iter().cloned().collect();
            let mut got: Attributes = pairs.iter().cloned().collect();
            proptest::prop_assert_eq!(&BTreeMap::from(&got), &want);
            for (insert, k, v) in ops {
                if insert {
                    proptest::prop_assert_eq!(got.insert(k.clone(), v.clone()), want.insert(k, v));
                } else {
                    proptest::prop_assert_eq!(got.remove(&k), want.remove(&k));
                }
                proptest::prop_assert_eq!(got.len(), want.len());
                proptest::prop_assert!(got.iter().eq(want.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
                for k in want.keys() {
                    proptest::prop_assert_eq!(got.get(k), want.get(k).map(String::as_str));
                }
                proptest::prop_assert_eq!(got.get("zz"), None);
                proptest::prop_assert_eq!(&got, &Attributes::from(want.clone()));
            }
        }
    }
}
