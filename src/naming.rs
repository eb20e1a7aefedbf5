//! Object names: `<prefix><UTC datetime><sep><uuid><suffix>` (docs/contract.md §3.3, §3.4). Pure, table-tested.
//!
//! A [`DatetimeFormat`] is parsed once, at config validation, from the subscription's
//! `filenameDatetimeFormat`; rendering can then not fail. The grammar (docs/contract.md §3.4):
//!
//! ```text
//! format     = 1*( matcher | separator ) ;  with the multiplicity rules below
//! matcher    = "YYYY" | "YY" | "MM" | "DD" | "hh" | "mm" | "ss" | "T" | "Z" | "+00:00" ;
//! separator  = "-" | "_" | ":" | "/" ;
//! ```
//!
//! * Tokenisation is case-sensitive (`MM` month, `mm` minute) and greedy (`YYYY` before `YY`,
//!   `+00:00` is one token), so `MMM` leaves a stray `M` and is rejected.
//! * Year (`YYYY` or `YY`), month, day, hour, minute and second are required, each exactly once.
//! * `T` at most once; one zone matcher at most: `Z` or `+00:00`, not both.
//! * The empty string means Pub/Sub's default rendering `YYYY-MM-DDThh:mm:ss+00:00`.
//!
//! Times are rendered in UTC with seconds precision (sub-seconds truncated, docs/contract.md §6 Q18).
//!
//! The trailing-separator rule: a format ending with a separator (`- _ : /`) uses that character
//! in place of the `_` between the datetime and the uuid (see [`object_name`]).

use std::fmt::Write as _;

use chrono::{DateTime, Datelike, Timelike, Utc};

/// Length of the `<uuid>` part of an object name: a hyphenated UUID v4 (docs/contract.md §6 Q1).
pub const UUID_LEN: usize = 36;

/// Pub/Sub's rendering when `filenameDatetimeFormat` is empty.
pub const DEFAULT_FORMAT: &str = "YYYY-MM-DDThh:mm:ss+00:00";

/// The separator characters of the grammar.
const SEPARATORS: [char; 4] = ['-', '_', ':', '/'];

/// Why a `filenameDatetimeFormat` was rejected. Positions are 0-based character indices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    /// A character that starts no matcher and is no separator (`.`, space, digits, other letters).
    #[error(
        "unknown character {ch:?} at position {position}; a format is made of the matchers \
         YYYY YY MM DD hh mm ss T Z +00:00 and the separators - _ : /"
    )]
    UnknownCharacter { ch: char, position: usize },

    /// A matcher letter that does not complete a matcher, e.g. the third `M` of `MMM`.
    #[error("stray {ch:?} at position {position}: not part of a matcher (did you mean {hint}?)")]
    StrayLetter {
        ch: char,
        position: usize,
        hint: &'static str,
    },

    /// A `+` that does not start `+00:00`.
    #[error("'+' at position {position} must start the zone matcher +00:00")]
    IncompleteOffset { position: usize },

    /// A matcher that may appear once appears again.
    #[error("{}", duplicate_message(.what, .first, .second, *.position))]
    Duplicate {
        /// `year`, `month`, `day`, `hour`, `minute`, `second`, `T`, `Z` or `+00:00`.
        what: &'static str,
        first: &'static str,
        second: &'static str,
        /// Position of the second occurrence.
        position: usize,
    },

    /// Both zone matchers are present.
    #[error(
        "Z and +00:00 are exclusive (at most one zone matcher); the second at position {position}"
    )]
    ZoneExclusive { position: usize },

    /// One or more required matchers are absent.
    #[error(
        "missing required matcher{}: {}",
        if .missing.len() > 1 { "s" } else { "" },
        .missing.join(", ")
    )]
    Missing { missing: Vec<&'static str> },

    /// A partition's `publishTime` without any date or time matcher.
    #[error("no matcher: a partition's publishTime needs at least one of YYYY YY MM DD hh mm ss")]
    NoMatcher,

    /// A partition's `publishTime` with a `/`, which would split its value over two directories.
    #[error(
        "'/' at position {position}: a partition's value is one directory; use one partition \
         per level (e.g. {{\"name\": \"year\", \"publishTime\": \"YYYY\"}} then \
         {{\"name\": \"month\", \"publishTime\": \"MM\"}})"
    )]
    Slash { position: usize },
}

fn duplicate_message(what: &str, first: &str, second: &str, position: usize) -> String {
    if what == first {
        // `T`, `Z`, `+00:00`: the token is its own name.
        format!("{what} given twice; the second at position {position}")
    } else if first == second {
        format!("{what} given twice ({first}); the second at position {position}")
    } else {
        format!("{what} given twice ({first} and {second}); the second at position {position}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Year4,
    Year2,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    T,
    Z,
    Offset,
    Sep(char),
}

impl Token {
    /// The token's spelling in a format.
    fn text(self) -> &'static str {
        match self {
            Token::Year4 => "YYYY",
            Token::Year2 => "YY",
            Token::Month => "MM",
            Token::Day => "DD",
            Token::Hour => "hh",
            Token::Minute => "mm",
            Token::Second => "ss",
            Token::T => "T",
            Token::Z => "Z",
            Token::Offset => "+00:00",
            Token::Sep('-') => "-",
            Token::Sep('_') => "_",
            Token::Sep(':') => ":",
            Token::Sep(_) => "/",
        }
    }

    /// Bytes this token renders to (years 0–9999).
    fn rendered_len(self) -> usize {
        match self {
            Token::Year4 => 4,
            Token::Offset => 6,
            Token::T | Token::Z | Token::Sep(_) => 1,
            _ => 2,
        }
    }

    /// Which multiplicity slot the token occupies (`None` for separators).
    fn slot(self) -> Option<(usize, &'static str)> {
        match self {
            Token::Year4 | Token::Year2 => Some((0, "year")),
            Token::Month => Some((1, "month")),
            Token::Day => Some((2, "day")),
            Token::Hour => Some((3, "hour")),
            Token::Minute => Some((4, "minute")),
            Token::Second => Some((5, "second")),
            Token::T => Some((6, "T")),
            Token::Z => Some((7, "Z")),
            Token::Offset => Some((7, "+00:00")),
            Token::Sep(_) => None,
        }
    }
}

/// Greedy, case-sensitive matchers in the order they are tried.
const MATCHERS: [(&str, Token); 10] = [
    ("YYYY", Token::Year4),
    ("YY", Token::Year2),
    ("MM", Token::Month),
    ("DD", Token::Day),
    ("hh", Token::Hour),
    ("mm", Token::Minute),
    ("ss", Token::Second),
    ("+00:00", Token::Offset),
    ("T", Token::T),
    ("Z", Token::Z),
];

/// Required matchers as named in [`NamingError::Missing`], by slot.
const REQUIRED: [&str; 6] = ["YYYY or YY", "MM", "DD", "hh", "mm", "ss"];

/// A parsed `filenameDatetimeFormat` (docs/contract.md §3.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatetimeFormat {
    /// The format as given; empty for Pub/Sub's default.
    text: String,
    /// The effective tokens ([`DEFAULT_FORMAT`]'s when `text` is empty).
    tokens: Vec<Token>,
}

impl Default for DatetimeFormat {
    /// Pub/Sub's default rendering, `YYYY-MM-DDThh:mm:ss+00:00` (an empty format string).
    fn default() -> Self {
        DatetimeFormat {
            text: String::new(),
            tokens: tokenize(DEFAULT_FORMAT)
                .map(|t| t.into_iter().map(|(tok, _)| tok).collect())
                .unwrap_or_default(),
        }
    }
}

impl DatetimeFormat {
    /// Parses a format; the empty string is Pub/Sub's default rendering.
    pub fn parse(s: &str) -> Result<DatetimeFormat, NamingError> {
        if s.is_empty() {
            return Ok(DatetimeFormat::default());
        }
        let tokens = tokenize(s)?;
        check_multiplicity(&tokens, true)?;
        Ok(DatetimeFormat {
            text: s.to_string(),
            tokens: tokens.into_iter().map(|(tok, _)| tok).collect(),
        })
    }

    /// Parses a partition's `publishTime` (docs/contract.md §7): the same matchers and separators,
    /// each matcher at most once, none required but at least one date or time matcher, and no
    /// `/` (a partition's value is one directory).
    pub fn parse_partition(s: &str) -> Result<DatetimeFormat, NamingError> {
        let tokens = tokenize(s)?;
        if let Some(&(_, position)) = tokens.iter().find(|(t, _)| *t == Token::Sep('/')) {
            return Err(NamingError::Slash { position });
        }
        check_multiplicity(&tokens, false)?;
        if !tokens
            .iter()
            .any(|(t, _)| t.slot().is_some_and(|(slot, _)| slot < 6))
        {
            return Err(NamingError::NoMatcher);
        }
        Ok(DatetimeFormat {
            text: s.to_string(),
            tokens: tokens.into_iter().map(|(tok, _)| tok).collect(),
        })
    }

    /// The format as given (empty for the default rendering).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the format's last character is a separator, which then replaces the `_`
    /// between the datetime and the uuid. False for the default rendering.
    pub fn ends_with_separator(&self) -> bool {
        matches!(self.tokens.last(), Some(Token::Sep(_)))
    }

    /// Renders `t` (UTC, seconds precision, sub-seconds truncated).
    pub fn render(&self, t: DateTime<Utc>) -> String {
        let mut out = String::with_capacity(self.rendered_len());
        for tok in &self.tokens {
            // Writing into a String cannot fail.
            let _ = match tok {
                Token::Year4 => write!(out, "{:04}", t.year()),
                Token::Year2 => write!(out, "{:02}", t.year().rem_euclid(100)),
                Token::Month => write!(out, "{:02}", t.month()),
                Token::Day => write!(out, "{:02}", t.day()),
                Token::Hour => write!(out, "{:02}", t.hour()),
                Token::Minute => write!(out, "{:02}", t.minute()),
                Token::Second => write!(out, "{:02}", t.second()),
                Token::T | Token::Z | Token::Offset | Token::Sep(_) => out.write_str(tok.text()),
            };
        }
        out
    }

    /// Bytes of a rendered datetime (exact for years 0–9999).
    pub fn rendered_len(&self) -> usize {
        self.tokens.iter().map(|t| t.rendered_len()).sum()
    }
}

impl std::str::FromStr for DatetimeFormat {
    type Err = NamingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DatetimeFormat::parse(s)
    }
}

impl std::fmt::Display for DatetimeFormat {
    /// The effective format: [`DEFAULT_FORMAT`] when none was given.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.text.is_empty() {
            f.write_str(DEFAULT_FORMAT)
        } else {
            f.write_str(&self.text)
        }
    }
}

/// Splits a format into tokens with their 0-based character positions.
fn tokenize(s: &str) -> Result<Vec<(Token, usize)>, NamingError> {
    let chars: Vec<char> = s.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    'outer: while i < chars.len() {
        let rest = &chars[i..];
        for (text, tok) in MATCHERS {
            let n = text.len(); // matchers are ASCII
            if rest.len() >= n && rest[..n].iter().copied().eq(text.chars()) {
                tokens.push((tok, i));
                i += n;
                continue 'outer;
            }
        }
        let ch = rest[0];
        if SEPARATORS.contains(&ch) {
            tokens.push((Token::Sep(ch), i));
            i += 1;
            continue;
        }
        let hint = match ch {
            'Y' => Some("YYYY or YY (year)"),
            'M' => Some("MM (month)"),
            'D' => Some("DD (day)"),
            'h' => Some("hh (hour)"),
            'm' => Some("mm (minute)"),
            's' => Some("ss (second)"),
            _ => None,
        };
        return Err(match (ch, hint) {
            (_, Some(hint)) => NamingError::StrayLetter {
                ch,
                position: i,
                hint,
            },
            ('+', None) => NamingError::IncompleteOffset { position: i },
            _ => NamingError::UnknownCharacter { ch, position: i },
        });
    }
    Ok(tokens)
}

/// Enforces "required matchers exactly once, optional ones at most once, one zone".
fn check_multiplicity(tokens: &[(Token, usize)], required: bool) -> Result<(), NamingError> {
    let mut seen: [Option<Token>; 8] = [None; 8];
    for &(tok, position) in tokens {
        let Some((slot, what)) = tok.slot() else {
            continue;
        };
        if let Some(first) = seen[slot] {
            if slot == 7 && first != tok {
                return Err(NamingError::ZoneExclusive { position });
            }
            return Err(NamingError::Duplicate {
                what,
                first: first.text(),
                second: tok.text(),
                position,
            });
        }
        seen[slot] = Some(tok);
    }
    if !required {
        return Ok(());
    }
    let missing: Vec<&'static str> = REQUIRED
        .iter()
        .enumerate()
        .filter(|(slot, _)| seen[*slot].is_none())
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(NamingError::Missing { missing })
    }
}

/// The object name `<prefix><datetime><sep><uuid><suffix>` (docs/contract.md §3.3): `<sep>` is `_` unless
/// the format ends with a separator, which then stands in for it.
pub fn object_name(
    prefix: &str,
    fmt: &DatetimeFormat,
    t: DateTime<Utc>,
    uuid: &str,
    suffix: &str,
) -> String {
    let datetime = fmt.render(t);
    let mut name =
        String::with_capacity(prefix.len() + datetime.len() + 1 + uuid.len() + suffix.len());
    name.push_str(prefix);
    name.push_str(&datetime);
    if !fmt.ends_with_separator() {
        name.push('_');
    }
    name.push_str(uuid);
    name.push_str(suffix);
    name
}

/// `prefix` split at its last `/`: its directory (with the `/`) and its file-name part (where
/// partitioned paths put their directories, [`crate::paths`]).
pub fn split_prefix(prefix: &str) -> (&str, &str) {
    match prefix.rfind('/') {
        Some(i) => prefix.split_at(i + 1),
        None => ("", prefix),
    }
}

/// The byte length of every object name this configuration produces (years 0–9999, a
/// [`UUID_LEN`]-character uuid), for GCS's 1024-byte object-name limit.
pub fn max_rendered_len(prefix: &str, fmt: &DatetimeFormat, suffix: &str) -> usize {
    let sep = usize::from(!fmt.ends_with_separator());
    prefix.len() + fmt.rendered_len() + sep + UUID_LEN + suffix.len()
}

/// Why an object name does not follow a subscription's naming rule (see [`check_object_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameMismatch {
    #[error("the name does not end with the suffix {suffix:?}")]
    Suffix { suffix: String },
    #[error("{found:?} (before the suffix) is not a hyphenated UUID: {reason}")]
    Uuid { found: String, reason: String },
    #[error("expected {expected:?} between the datetime and the uuid, found {found:?}")]
    Separator { expected: char, found: String },
    #[error("{found:?} does not match the datetime format {format}: {reason}")]
    Datetime {
        found: String,
        format: String,
        reason: String,
    },
    #[error(
        "the name does not start with the prefix {prefix:?} (found {found:?} before the datetime)"
    )]
    Prefix { prefix: String, found: String },
}

/// The parts of a name that follows the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameParts {
    /// The datetime the name carries (UTC, seconds).
    pub datetime: DateTime<Utc>,
    pub uuid: uuid::Uuid,
    /// What precedes the prefix: empty for a bare object name, the bucket's location (ending with
    /// `/`) for a full path or URL.
    pub location: String,
}

/// Checks `name` against `<prefix><datetime><sep><uuid><suffix>` (docs/contract.md §3.3) and returns its
/// parts. `name` may be a bare object name or a full path or URL of the object: the prefix must
/// then follow a `/` (the bucket root is wherever the prefix starts).
///
/// The name is parsed from the end, whose length the format fixes: suffix, 36-character uuid,
/// separator, the datetime's [`DatetimeFormat::rendered_len`] characters, then the prefix.
pub fn check_object_name(
    name: &str,
    prefix: &str,
    fmt: &DatetimeFormat,
    suffix: &str,
) -> Result<NameParts, NameMismatch> {
    let rest = name
        .strip_suffix(suffix)
        .ok_or_else(|| NameMismatch::Suffix {
            suffix: suffix.to_string(),
        })?;
    let split = |s: &str, n: usize| -> (String, String) {
        let chars: Vec<char> = s.chars().collect();
        let at = chars.len().saturating_sub(n);
        (
            chars[..at].iter().collect::<String>(),
            chars[at..].iter().collect::<String>(),
        )
    };
    let (rest, uuid_text) = split(rest, UUID_LEN);
    let uuid = if uuid_text.len() == UUID_LEN && uuid_text.as_bytes()[8] == b'-' {
        uuid::Uuid::try_parse(&uuid_text).map_err(|e| NameMismatch::Uuid {
            found: uuid_text.clone(),
            reason: e.to_string(),
        })?
    } else {
        return Err(NameMismatch::Uuid {
            found: uuid_text,
            reason: format!("expected {UUID_LEN} characters like 8-4-4-4-12 hex digits"),
        });
    };
    let rest = if fmt.ends_with_separator() {
        rest
    } else {
        let (before, sep) = split(&rest, 1);
        if sep != "_" {
            return Err(NameMismatch::Separator {
                expected: '_',
                found: sep,
            });
        }
        before
    };
    let (before, datetime_text) = split(&rest, fmt.rendered_len());
    let datetime = fmt
        .parse_rendered(&datetime_text)
        .map_err(|reason| NameMismatch::Datetime {
            found: datetime_text.clone(),
            format: fmt.to_string(),
            reason,
        })?;
    let location = before
        .strip_suffix(prefix)
        .filter(|loc| loc.is_empty() || loc.ends_with('/') || prefix.starts_with('/'))
        .ok_or_else(|| NameMismatch::Prefix {
            prefix: prefix.to_string(),
            found: before.rsplit('/').next().unwrap_or_default().to_string(),
        })?;
    Ok(NameParts {
        datetime,
        uuid,
        location: location.to_string(),
    })
}

impl DatetimeFormat {
    /// Reads back a datetime this format rendered (a two-digit year is taken as 20YY).
    pub fn parse_rendered(&self, text: &str) -> Result<DateTime<Utc>, String> {
        let mut rest = text;
        let (mut y, mut mo, mut d, mut h, mut mi, mut s) = (0i32, 0u32, 0u32, 0u32, 0u32, 0u32);
        for tok in &self.tokens {
            let n = tok.rendered_len();
            let field = rest
                .get(..n)
                .ok_or_else(|| format!("too short for {}", tok.text()))?;
            rest = &rest[n..];
            let num = || -> Result<u32, String> {
                if field.bytes().all(|b| b.is_ascii_digit()) {
                    Ok(field.parse().expect("digits"))
                } else {
                    Err(format!("{field:?} is not {} digits for {}", n, tok.text()))
                }
            };
            match tok {
                Token::Year4 => y = num()? as i32,
                Token::Year2 => y = 2000 + num()? as i32,
                Token::Month => mo = num()?,
                Token::Day => d = num()?,
                Token::Hour => h = num()?,
                Token::Minute => mi = num()?,
                Token::Second => s = num()?,
                _ if field == tok.text() => {}
                _ => return Err(format!("expected {:?}, found {field:?}", tok.text())),
            }
        }
        if !rest.is_empty() {
            return Err(format!("{rest:?} left over"));
        }
        chrono::NaiveDate::from_ymd_opt(y, mo, d)
            .and_then(|date| date.and_hms_opt(h, mi, s))
            .map(|t| t.and_utc())
            .ok_or_else(|| "not a valid date and time".to_string())
    }
}

/// The part of a name configuration an unstorable name is blamed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamePart {
    Prefix,
    DatetimeFormat,
    Suffix,
}

/// Names a prefix, format and suffix would produce that no store subsink writes to can hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "object names would look like {example:?}, with {problem}; subsink writes through \
     object_store, whose paths cannot hold empty, `.` or `..` segments or ASCII control \
     characters, so every message would fail"
)]
pub struct UnstorableName {
    /// Which field to fix.
    pub part: NamePart,
    /// A name the configuration produces.
    pub example: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Check that every name `<prefix><datetime><sep><uuid><suffix>` is a valid object_store path,
/// as the upload needs: no empty segment (`a//b`), no `.` or `..` segment, no ASCII control
/// character. One leading `/` is allowed: object_store drops it, and the name reported and
/// recorded is the stored one (`ObjectUpload::name`). The datetime renders digits and fixed text in
/// fixed places and the uuid is hex and `-`, so one sample name stands for all of them.
pub fn check_storable(
    prefix: &str,
    fmt: &DatetimeFormat,
    suffix: &str,
) -> Result<(), UnstorableName> {
    const SAMPLE_UUID: &str = "00000000-0000-4000-8000-000000000000";
    let t = DateTime::<Utc>::from_timestamp(1_695_615_000, 0).unwrap_or_default();
    let name = object_name(prefix, fmt, t, SAMPLE_UUID, suffix);
    let suffix_start = name.len() - suffix.len();
    // The part a byte range of `name` belongs to: all in the prefix, all in the suffix, or else
    // the datetime (alone, or where it meets the prefix).
    let part_of = |start: usize, end: usize| {
        if end <= prefix.len() {
            NamePart::Prefix
        } else if start >= suffix_start {
            NamePart::Suffix
        } else {
            NamePart::DatetimeFormat
        }
    };
    let fail = |part, problem: String| {
        Err(UnstorableName {
            part,
            example: name.clone(),
            problem,
        })
    };
    if let Some(i) = name.find(|c: char| c.is_ascii_control()) {
        let c = name[i..].chars().next().unwrap_or_default();
        return fail(part_of(i, i + 1), format!("the control character {c:?}"));
    }
    // As `Path::parse`: one leading and one trailing `/` are dropped (a suffix ending in `/` has
    // its own rule).
    let skip = usize::from(name.starts_with('/'));
    let body = name[skip..].strip_suffix('/').unwrap_or(&name[skip..]);
    let mut start = skip;
    for segment in body.split('/') {
        let end = start + segment.len();
        let problem = match segment {
            "" => Some("an empty path segment (`//`)".to_string()),
            "." | ".." => Some(format!("a `{segment}` path segment")),
            _ => None,
        };
        if let Some(problem) = problem {
            // The segment with the `/` on either side of it.
            return fail(part_of(start.saturating_sub(1), end + 1), problem);
        }
        start = end + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2023, 9, 25, 4, 10, 0).unwrap()
    }

    /// docs/contract.md §3.3 worked examples: prefix `prod_`, suffix `_archive`, 2023-09-25 04:10:00 UTC, uuid `U`.
    #[test]
    fn spec_worked_examples() {
        let cases = [
            ("", "prod_2023-09-25T04:10:00+00:00_U_archive"),
            (
                "YYYY-MM-DD/hh_mm_ssZ",
                "prod_2023-09-25/04_10_00Z_U_archive",
            ),
            ("YYYY-MM-DDThh_mm_ss-", "prod_2023-09-25T04_10_00-U_archive"),
            ("YY/MM/DD/hh/mm/ss/", "prod_23/09/25/04/10/00/U_archive"),
            ("YYYYMMDDhhmmss", "prod_20230925041000_U_archive"),
            ("hh:mm:ss_DD-MM-YYYY", "prod_04:10:00_25-09-2023_U_archive"),
        ];
        for (format, want) in cases {
            let fmt = DatetimeFormat::parse(format).unwrap_or_else(|e| panic!("{format}: {e}"));
            let got = object_name("prod_", &fmt, t0(), "U", "_archive");
            assert_eq!(got, want, "format {format:?}");
            assert_eq!(fmt.as_str(), format);
            // With a real uuid the length is exactly the computed maximum.
            let uuid = "0123456789abcdef0123456789abcdef0123";
            assert_eq!(
                object_name("prod_", &fmt, t0(), uuid, "_archive").len(),
                max_rendered_len("prod_", &fmt, "_archive"),
                "format {format:?}"
            );
        }
    }

    #[test]
    fn no_prefix_no_suffix() {
        let fmt = DatetimeFormat::default();
        assert_eq!(
            object_name("", &fmt, t0(), "U", ""),
            "2023-09-25T04:10:00+00:00_U"
        );
    }

    #[test]
    fn default_is_empty_string() {
        let fmt = DatetimeFormat::default();
        assert_eq!(DatetimeFormat::parse("").unwrap(), fmt);
        assert_eq!(fmt.as_str(), "");
        assert_eq!(fmt.to_string(), DEFAULT_FORMAT);
        assert!(!fmt.ends_with_separator());
        assert_eq!(fmt.render(t0()), "2023-09-25T04:10:00+00:00");
        assert_eq!(
            fmt.render(t0()),
            DatetimeFormat::parse(DEFAULT_FORMAT).unwrap().render(t0())
        );
        assert_eq!(fmt.rendered_len(), 25);
    }

    #[test]
    fn render_truncates_subseconds() {
        let t = t0() + chrono::Duration::milliseconds(999);
        assert_eq!(
            DatetimeFormat::default().render(t),
            "2023-09-25T04:10:00+00:00"
        );
    }

    #[test]
    fn ends_with_separator_per_last_token() {
        for (format, want) in [
            ("YYYY-MM-DDThh:mm:ss-", true),
            ("YYYY-MM-DDThh:mm:ss_", true),
            ("YYYY-MM-DDThh:mm:ss:", true),
            ("YYYY-MM-DDThh:mm:ss/", true),
            ("YYYY-MM-DDhh:mm:ssT", false),
            ("YYYY-MM-DDThh:mm:ssZ", false),
            ("YYYY-MM-DDThh:mm:ss+00:00", false),
            ("YYYY-MM-DDThh:mm:ss", false),
        ] {
            assert_eq!(
                DatetimeFormat::parse(format).unwrap().ends_with_separator(),
                want,
                "{format}"
            );
        }
    }

    /// docs/contract.md §3.4 invalid cases; each message names the rule and the position or token.
    #[test]
    fn invalid_formats() {
        use NamingError::*;
        let cases: Vec<(&str, NamingError, &str)> = vec![
            (
                "YY-YYYY-MM-DDhhmmss",
                Duplicate {
                    what: "year",
                    first: "YY",
                    second: "YYYY",
                    position: 3,
                },
                "year given twice (YY and YYYY); the second at position 3",
            ),
            (
                "YYYY-MMM-DDhhmmss",
                StrayLetter {
                    ch: 'M',
                    position: 7,
                    hint: "MM (month)",
                },
                "stray 'M' at position 7",
            ),
            (
                "YYYY-MM-DDThh:mm",
                Missing {
                    missing: vec!["ss"],
                },
                "missing required matcher: ss",
            ),
            (
                "hh:mm:ss",
                Missing {
                    missing: vec!["YYYY or YY", "MM", "DD"],
                },
                "missing required matchers: YYYY or YY, MM, DD",
            ),
            (
                "YYYY-MM-DD",
                Missing {
                    missing: vec!["hh", "mm", "ss"],
                },
                "missing required matchers: hh, mm, ss",
            ),
            (
                "YYYY.MM.DDhhmmss",
                UnknownCharacter {
                    ch: '.',
                    position: 4,
                },
                "unknown character '.' at position 4",
            ),
            (
                "YYYY MM DD hhmmss",
                UnknownCharacter {
                    ch: ' ',
                    position: 4,
                },
                "unknown character ' ' at position 4",
            ),
            (
                "YYYYxMMDDhhmmss",
                UnknownCharacter {
                    ch: 'x',
                    position: 4,
                },
                "unknown character 'x' at position 4",
            ),
            (
                "yyyyMMDDhhmmss",
                UnknownCharacter {
                    ch: 'y',
                    position: 0,
                },
                "unknown character 'y' at position 0",
            ),
            (
                "YYYYMMDDHHmmss",
                UnknownCharacter {
                    ch: 'H',
                    position: 8,
                },
                "unknown character 'H' at position 8",
            ),
            (
                "YYYY1MMDDhhmmss",
                UnknownCharacter {
                    ch: '1',
                    position: 4,
                },
                "unknown character '1' at position 4",
            ),
            (
                "YYYYMMDDhhmmss00",
                UnknownCharacter {
                    ch: '0',
                    position: 14,
                },
                "unknown character '0' at position 14",
            ),
            (
                "YYYYMMDDhhmmssZ+00:00",
                ZoneExclusive { position: 15 },
                "Z and +00:00 are exclusive",
            ),
            (
                "YYYYMMDDhhmmss+00:00Z",
                ZoneExclusive { position: 20 },
                "Z and +00:00 are exclusive",
            ),
            (
                "YYYYMMDDThhmmssT",
                Duplicate {
                    what: "T",
                    first: "T",
                    second: "T",
                    position: 15,
                },
                "T given twice; the second at position 15",
            ),
            (
                "YYYYMMDDhhmmssZZ",
                Duplicate {
                    what: "Z",
                    first: "Z",
                    second: "Z",
                    position: 15,
                },
                "Z given twice",
            ),
            (
                "YYYYMMDDhhmmss+00:00+00:00",
                Duplicate {
                    what: "+00:00",
                    first: "+00:00",
                    second: "+00:00",
                    position: 20,
                },
                "+00:00 given twice",
            ),
            (
                "YYYYMMDDhhmmssMM",
                Duplicate {
                    what: "month",
                    first: "MM",
                    second: "MM",
                    position: 14,
                },
                "month given twice (MM); the second at position 14",
            ),
            (
                "YYYYMMDDhhmmss+01:00",
                IncompleteOffset { position: 14 },
                "'+' at position 14 must start the zone matcher +00:00",
            ),
            (
                "YYYMMDDhhmmss",
                StrayLetter {
                    ch: 'Y',
                    position: 2,
                    hint: "YYYY or YY (year)",
                },
                "stray 'Y' at position 2",
            ),
            (
                "YYYYMMDDhhmms",
                StrayLetter {
                    ch: 's',
                    position: 12,
                    hint: "ss (second)",
                },
                "did you mean ss (second)?",
            ),
            (
                "YYYYMMDDthhmmss",
                UnknownCharacter {
                    ch: 't',
                    position: 8,
                },
                "unknown character 't' at position 8",
            ),
            (
                "YYYY-MM-DD\nhh:mm:ss",
                UnknownCharacter {
                    ch: '\n',
                    position: 10,
                },
                "unknown character '\\n' at position 10",
            ),
            (
                "YYYY-MM-DD–hh:mm:ss",
                UnknownCharacter {
                    ch: '–',
                    position: 10,
                },
                "unknown character '–' at position 10",
            ),
        ];
        for (format, want, message) in cases {
            let err = DatetimeFormat::parse(format).expect_err(format);
            assert_eq!(err, want, "{format:?}");
            let text = err.to_string();
            assert!(
                text.contains(message),
                "{format:?}: {text:?} lacks {message:?}"
            );
        }
    }

    /// `YY-YYYY` alone: the duplicate year is reported before the missing matchers.
    #[test]
    fn duplicate_reported_before_missing() {
        let err = DatetimeFormat::parse("YY-YYYY").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("year given twice (YY and YYYY)"),
            "{err}"
        );
    }

    #[test]
    fn two_digit_year_and_early_years() {
        let fmt = DatetimeFormat::parse("YY-MM-DD_hh-mm-ss").unwrap();
        let t = Utc.with_ymd_and_hms(2005, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(fmt.render(t), "05-01-02_03-04-05");
        let fmt = DatetimeFormat::parse("YYYY").map(|_| ()).unwrap_err();
        assert!(matches!(fmt, NamingError::Missing { .. }));
        let t = Utc.with_ymd_and_hms(7, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(
            DatetimeFormat::default().render(t),
            "0007-01-02T03:04:05+00:00"
        );
    }

    /// The chrono `strftime` equivalent of a token, to cross-check rendering.
    fn strftime(tok: Token) -> &'static str {
        match tok {
            Token::Year4 => "%Y",
            Token::Year2 => "%y",
            Token::Month => "%m",
            Token::Day => "%d",
            Token::Hour => "%H",
            Token::Minute => "%M",
            Token::Second => "%S",
            other => other.text(),
        }
    }

    /// Any valid format: the matchers in any order, each optional matcher present or not, and
    /// runs of separators between them.
    fn valid_format() -> impl Strategy<Value = (String, Vec<Token>)> {
        let year = prop_oneof![Just(Token::Year4), Just(Token::Year2)];
        let zone = prop_oneof![Just(None), Just(Some(Token::Z)), Just(Some(Token::Offset))];
        let seps = proptest::collection::vec(proptest::sample::select(SEPARATORS.to_vec()), 0..3);
        (
            year,
            any::<bool>(),
            zone,
            proptest::collection::vec(seps, 11),
        )
            .prop_flat_map(|(year, t, zone, seps)| {
                let mut matchers = vec![
                    year,
                    Token::Month,
                    Token::Day,
                    Token::Hour,
                    Token::Minute,
                    Token::Second,
                ];
                if t {
                    matchers.push(Token::T);
                }
                matchers.extend(zone);
                (Just(matchers).prop_shuffle(), Just(seps))
            })
            .prop_map(|(matchers, seps)| {
                let mut text = String::new();
                let mut tokens = Vec::new();
                for (i, m) in matchers.into_iter().enumerate() {
                    for &c in &seps[i] {
                        text.push(c);
                        tokens.push(Token::Sep(c));
                    }
                    text.push_str(m.text());
                    tokens.push(m);
                }
                for &c in &seps[10] {
                    text.push(c);
                    tokens.push(Token::Sep(c));
                }
                (text, tokens)
            })
    }

    proptest! {
        #[test]
        fn valid_formats_render_to_fixed_length(
            (format, tokens) in valid_format(),
            secs in -62_167_219_200i64..253_402_300_800, // 0000-01-01 ..= 9999-12-31T23:59:59
            nanos in 0u32..1_000_000_000,
        ) {
            let fmt = DatetimeFormat::parse(&format).unwrap();
            prop_assert_eq!(&fmt.tokens, &tokens);
            let t = Utc.timestamp_opt(secs, nanos).unwrap();
            let rendered = fmt.render(t);
            prop_assert_eq!(rendered.len(), fmt.rendered_len());
            prop_assert!(rendered
                .chars()
                .all(|c| c.is_ascii_digit() || "-_:/TZ+".contains(c)));
            let chrono_fmt: String = tokens.iter().map(|&t| strftime(t)).collect();
            prop_assert_eq!(&rendered, &t.format(&chrono_fmt).to_string());
            prop_assert_eq!(
                fmt.ends_with_separator(),
                format.ends_with(|c| SEPARATORS.contains(&c))
            );
            let name = object_name("p/", &fmt, t, &"u".repeat(UUID_LEN), ".x");
            prop_assert_eq!(name.len(), max_rendered_len("p/", &fmt, ".x"));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "[YMDhmsTZ+0:_/\\-. a-z]{0,30}") {
            if let Ok(fmt) = DatetimeFormat::parse(&s) {
                let rendered = fmt.render(t0());
                prop_assert!(rendered
                    .chars()
                    .all(|c| c.is_ascii_digit() || "-_:/TZ+".contains(c)));
                prop_assert_eq!(rendered.len(), fmt.rendered_len());
            }
        }
    }

    #[test]
    fn names_read_back_with_their_parts() {
        let u = "1ad2a4c8-5f10-4b6e-9d39-2f3c5b0e7a11";
        let fmt = DatetimeFormat::default();
        let name = object_name("prod_", &fmt, t0(), u, "_archive");
        let parts = check_object_name(&name, "prod_", &fmt, "_archive").unwrap();
        assert_eq!(parts.datetime, t0());
        assert_eq!(parts.uuid.to_string(), u);
        assert_eq!(parts.location, "");
        let full = format!("/data/bucket/{name}");
        let parts = check_object_name(&full, "prod_", &fmt, "_archive").unwrap();
        assert_eq!(parts.location, "/data/bucket/");
        // A trailing separator stands in for the `_`.
        let slash = DatetimeFormat::parse("YYYY/MM/DD/hh/mm/ss/").unwrap();
        let name = object_name("logs/", &slash, t0(), u, ".avro");
        assert_eq!(
            check_object_name(&name, "logs/", &slash, ".avro")
                .unwrap()
                .datetime,
            t0()
        );
        let yy = DatetimeFormat::parse("YYMMDDhhmmssZ").unwrap();
        let name = object_name("", &yy, t0(), u, "");
        assert_eq!(
            check_object_name(&name, "", &yy, "").unwrap().datetime,
            t0()
        );
    }

    #[test]
    fn mismatches_name_the_broken_part() {
        let u = "1ad2a4c8-5f10-4b6e-9d39-2f3c5b0e7a11";
        let fmt = DatetimeFormat::default();
        let name = object_name("prod_", &fmt, t0(), u, ".avro");
        assert!(matches!(
            check_object_name(&name, "prod_", &fmt, ".txt"),
            Err(NameMismatch::Suffix { .. })
        ));
        assert!(matches!(
            check_object_name(&name, "dev_", &fmt, ".avro"),
            Err(NameMismatch::Prefix { .. })
        ));
        let bad_uuid = name.replace("1ad2a4c8", "1ad2a4cX");
        assert!(matches!(
            check_object_name(&bad_uuid, "prod_", &fmt, ".avro"),
            Err(NameMismatch::Uuid { .. })
        ));
        let other = DatetimeFormat::parse("YYYY-MM-DD/hh:mm:ssZ").unwrap();
        let e = check_object_name(&name, "prod_", &other, ".avro").unwrap_err();
        assert!(matches!(e, NameMismatch::Datetime { .. }), "{e}");
        let bad_date = name.replace("2023-09-25", "2023-02-30");
        let e = check_object_name(&bad_date, "prod_", &fmt, ".avro").unwrap_err();
        assert!(e.to_string().contains("not a valid date"), "{e}");
        // The prefix must start the object name, not sit inside a longer path segment.
        let e = check_object_name(&format!("xprod_{}", &name[5..]), "prod_", &fmt, ".avro");
        assert!(matches!(e, Err(NameMismatch::Prefix { .. })), "{e:?}");
    }
}
