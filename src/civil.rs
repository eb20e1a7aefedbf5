//! Civil dates and times in their usual fixed-width forms (`YYYY-MM-DD`, `HH:MM:SS[.F]`), read
//! without building chrono values: shared by the table writer's literals and the wire format's
//! publish times. Each function accepts only what the general parser of its caller accepts, with
//! the same value, and says `None` for everything else.

/// Days since 1970-01-01 of a valid proleptic Gregorian date of year ≥ 1 (Howard Hinnant's
/// `days_from_civil`): what chrono computes, without building a `NaiveDate` per value.
pub(crate) fn days_from_civil(y: u32, m: u32, d: u32) -> i32 {
    let y = i64::from(y) - i64::from(m <= 2);
    let (era, yoe) = (y / 400, y % 400); // y ≥ 0
    let mp = (i64::from(m) + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) as i32
}

pub(crate) fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400)) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Two ASCII digits at `b[i]`, `b[i + 1]` (in bounds) as a number, or 100 when they are not
/// digits (an out-of-range value every caller rejects).
#[inline]
fn two_digits(b: &[u8], i: usize) -> u32 {
    let (h, l) = (b[i].wrapping_sub(b'0'), b[i + 1].wrapping_sub(b'0'));
    if h > 9 || l > 9 {
        100
    } else {
        u32::from(h) * 10 + u32::from(l)
    }
}

/// The usual form of a DATE literal, `YYYY-MM-DD` (two-digit month and day), at the start of
/// `b`, if it is a valid date: days since 1970-01-01. `None` otherwise: the general parser then
/// decides, and gives the same value for every literal this accepts.
pub(crate) fn fixed_date(b: &[u8]) -> Option<i32> {
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (hi, lo) = (two_digits(b, 0), two_digits(b, 2));
    let (m, d) = (two_digits(b, 5), two_digits(b, 8));
    if hi > 99 || lo > 99 {
        return None;
    }
    let y = hi * 100 + lo;
    if y == 0 || !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// The usual form of a TIME literal, `HH:MM:SS[.F{1,6}]`, at the start of `b`, if in range: µs
/// since midnight and the length of the literal. `None` otherwise (see [`fixed_date`]).
pub(crate) fn fixed_time(b: &[u8]) -> Option<(i64, usize)> {
    if b.len() < 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let (h, mi, s) = (two_digits(b, 0), two_digits(b, 3), two_digits(b, 6));
    if h > 23 || mi > 59 || s > 59 {
        return None;
    }
    let mut micros = 0;
    let mut len = 8;
    if b.get(8) == Some(&b'.') {
        let mut n = 0;
        while let Some(&c) = b.get(9 + n) {
            let d = c.wrapping_sub(b'0');
            if d > 9 || n == 6 {
                break;
            }
            micros = micros * 10 + u32::from(d);
            n += 1;
        }
        if n == 0 {
            return None;
        }
        micros *= 10u32.pow(6 - n as u32);
        len = 9 + n;
    }
    // A seventh digit (or one after the seconds) is the general parser's to word.
    if b.get(len).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some((
        i64::from((h * 60 + mi) * 60 + s) * 1_000_000 + i64::from(micros),
        len,
    ))
}

/// `YYYY-MM-DD(T|t| )HH:MM:SS[.F]` at the start of `b`: µs since 1970-01-01T00:00 and the
/// length; `None` otherwise (see [`fixed_date`]).
pub(crate) fn fixed_datetime(b: &[u8]) -> Option<(i64, usize)> {
    let days = fixed_date(b)?;
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let (t, len) = fixed_time(b.get(11..)?)?;
    Some((i64::from(days) * 86_400_000_000 + t, 11 + len))
}
