//! Scanning JSON string tokens: where a string's plain run of bytes ends (its closing quote, an
//! escape or a control character) and whether a byte ≥ 0x80 comes before that, so the caller
//! validates UTF-8 only when there is non-ASCII text. Shared by the wire parser
//! ([`crate::message`]) and the table rows' fast path ([`crate::table`]), which read several short
//! strings per message.

/// The index of the first `"`, `\\` or control character (< 0x20) in `b`, and whether a byte
/// ≥ 0x80 comes before it; `None` when `b` has none of them. Sixteen bytes at a time with SSE2
/// (every x86-64 has it), eight at a time elsewhere.
#[inline(always)]
pub(crate) fn special(b: &[u8]) -> Option<(usize, bool)> {
    #[allow(unused_mut)]
    let mut at = 0;
    #[allow(unused_mut)]
    let mut high = false;
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8,
            _mm_or_si128, _mm_set1_epi8,
        };
        // SAFETY: the build enables SSE2 (every x86-64 has it), and each load reads the 16
        // bytes at `at`, which `at + 16 <= b.len()` keeps inside `b` (unaligned loads).
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let below_space = _mm_set1_epi8(0x1f);
            while at + 16 <= b.len() {
                let v = _mm_loadu_si128(b.as_ptr().add(at).cast::<__m128i>());
                // A byte is a control character when min(byte, 0x1f) == byte (unsigned).
                let hit = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                    _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v),
                );
                let mask = _mm_movemask_epi8(hit) as u32;
                let top = _mm_movemask_epi8(v) as u32;
                if mask != 0 {
                    let k = mask.trailing_zeros();
                    high |= top & ((1u32 << k) - 1) != 0;
                    return Some((at + k as usize, high));
                }
                high |= top != 0;
                at += 16;
            }
        }
    }
    let (k, h) = special_swar(&b[at..])?;
    Some((at + k, high || h))
}

/// [`special`] eight bytes at a time, in plain integer arithmetic.
#[inline]
fn special_swar(b: &[u8]) -> Option<(usize, bool)> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Bytes of `w` below `n` (n ≤ 128) set their high bit; borrows only run towards higher bytes,
    // so the lowest flagged byte is the first match.
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH;
    let mut chunks = b.chunks_exact(8);
    let mut at = 0;
    let mut high = 0;
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        let m = below(w ^ (ONES * u64::from(b'"')), 1)
            | below(w ^ (ONES * u64::from(b'\\')), 1)
            | below(w, 0x20);
        if m != 0 {
            let k = m.trailing_zeros() / 8;
            // The bytes before the match, as a mask of their high bits.
            let before = (1u64 << (k * 8)).wrapping_sub(1);
            high |= w & HIGH & before;
            return Some((at + k as usize, high != 0));
        }
        high |= w & HIGH;
        at += 8;
    }
    for (k, &c) in chunks.remainder().iter().enumerate() {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return Some((at + k, high != 0));
        }
        high |= u64::from(c & 0x80);
    }
    None
}

/// Whether `s` needs escaping as a JSON string (a `"`, `\\` or control character in it).
pub(crate) fn needs_escape(s: &[u8]) -> bool {
    special(s).is_some()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`special`] must return, byte by byte.
    fn naive(b: &[u8]) -> Option<(usize, bool)> {
        let k = b
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        Some((k, b[..k].iter().any(|&c| c >= 0x80)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn special_finds_what_a_byte_loop_finds(
            // Mostly plain text, with the bytes that matter sprinkled in at any position.
            b in proptest::collection::vec(
                prop_oneof![
                    8 => 0x20u8..0x7f,
                    1 => prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20, Just(0x7f)],
                    1 => 0x80u8..=0xff,
                ],
                0..80,
            ),
            skip in 0usize..20,
        ) {
            let b = &b[skip.min(b.len())..];
            prop_assert_eq!(special(b), naive(b));
            prop_assert_eq!(special_swar(b), naive(b));
        }
    }

    #[test]
    fn special_at_every_position_of_a_long_run() {
        for len in 0..70 {
            for (c, at) in [(b'"', len), (b'\\', len), (0x1f, len), (0x00, len)] {
                let mut b = vec![b'a'; len + 5];
                b[at] = c;
                assert_eq!(special(&b), Some((at, false)), "{c:#x} at {at}");
                if at > 0 {
                    b[at - 1] = 0xc3;
                    assert_eq!(special(&b), Some((at, true)), "{c:#x} at {at}, high before");
                }
                b[at] = b'a';
                b[at + 1] = 0xe9; // after the end: not seen
                b[at + 2] = b'"';
                assert_eq!(special(&b).map(|(k, _)| k), Some(at + 2));
            }
        }
        assert_eq!(special(&[b'a'; 100]), None);
        assert_eq!(special(&[0x80; 100]), None);
        assert_eq!(
            special(&[0x7f; 33]),
            None,
            "DEL is not a control character in JSON"
        );
    }
}
