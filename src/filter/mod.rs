//! The Pub/Sub subscription filter language (docs/contract.md §2.5, §6 Q6): parsed once, when the subscription
//! is validated, then evaluated against each message's attributes. A message that does not match
//! is settled without being written (Pub/Sub acknowledges it for the subscriber).
//!
//! ```text
//! filter    = [ ws expr ws ] ;                          empty ⇒ every message matches
//! expr      = unary { WS "AND" WS unary }               one operator per chain:
//!           | unary { WS "OR"  WS unary } ;             mixing AND and OR needs parentheses
//! unary     = [ "NOT" WS | "-" ] primary ;
//! primary   = "(" ws expr ws ")" | predicate ;
//! predicate = "attributes" ":" key                      key present
//!           | "attributes" "." key ws "="  ws string    key present and equal
//!           | "attributes" "." key ws "!=" ws string    key absent, or present and different
//!           | "hasPrefix" "(" ws "attributes" "." key ws "," ws string ws ")" ;
//! key       = ident | string ;        ident = 1*( ALPHA | DIGIT | "_" | "-" )
//! string    = DQUOTE *( char | escape ) DQUOTE ;
//! escape    = "\" ( DQUOTE | "\" | "'" | "a" | "b" | "f" | "n" | "r" | "t" | "v"
//!                 | "x" 2HEXDIG | "u" 4HEXDIG | "U" 8HEXDIG | 3ODIGIT ) ;
//! ```
//!
//! Where the contract is silent, this module decides (each is pinned by a test in `tests.rs`):
//! * Positions in errors are 0-based byte offsets into the filter text.
//! * `ws` is any run of space, tab, CR, LF; `WS` is at least one of them. Nothing else is
//!   whitespace. `-` is followed directly by its operand (`- attributes:a` is rejected).
//! * One negation per operand, as the grammar says: `NOT NOT attributes:a` and `--x` are rejected;
//!   `NOT (NOT attributes:a)` is fine.
//! * Keywords are exact: `AND`, `OR`, `NOT`, `attributes`, `hasPrefix`. Any other spelling of the
//!   operators (`and`, `Or`) gets its own error telling the user to write them upper-case.
//! * `\xHH` and the octal `\OOO` escapes denote the code points U+0000–U+00FF (as in CEL; filter
//!   values are Unicode strings, not bytes), so `\377` is the largest octal escape. `\u` and `\U`
//!   must name a Unicode scalar value (no surrogates, at most U+10FFFF).
//! * Raw control characters (Unicode `Cc`, tab included) inside a literal are rejected: docs/contract.md §2.5 says
//!   non-printing characters must be escaped. Other characters, any script, are taken as they are.
//! * Only double-quoted literals exist; `'x'` is rejected.
//! * An empty quoted key (`attributes:""`) is accepted; it only matches an attribute named "".
//! * Parentheses and negations nest at most [`MAX_DEPTH`] deep. A filter within the 256-byte
//!   limit cannot reach that depth, so the guard never rejects a filter Pub/Sub would accept; it
//!   only keeps the recursive parser off the end of the stack whatever it is given.
//!
//! [`Filter`]'s `Display` is a canonical form: one space around operators and after `NOT`, `NOT`
//! for negation, redundant parentheses dropped, keys quoted only when they must be, literals
//! escaped minimally. It parses back to an equal `Filter`. It can be longer than the text it came
//! from (`-x` becomes `NOT x`), so it is not guaranteed to fit the 256-byte limit.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

mod parser;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

/// Longest filter Pub/Sub accepts, in bytes of UTF-8 text (docs/contract.md §2.5).
pub const MAX_FILTER_BYTES: usize = 256;

/// Deepest nesting of parentheses and negations the parser follows (each `(`, `NOT` and `-`
/// counts one level). Unreachable within [`MAX_FILTER_BYTES`]; see the module docs.
pub const MAX_DEPTH: usize = 256;

/// Why a filter was rejected. A configuration error: retrying cannot help, the filter text has to
/// change. Every variant but [`FilterError::TooLong`] carries the 0-based byte position of the
/// problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// The raw text is over [`MAX_FILTER_BYTES`].
    #[error("filter is {len} bytes; the limit is {limit}")]
    TooLong { len: usize, limit: usize },

    /// Something other than what the grammar allows at this point.
    #[error("position {position}: expected {expected}, found {found}")]
    Unexpected {
        position: usize,
        /// What the grammar allows here, e.g. `a string literal after '='`.
        expected: String,
        /// What is there instead, e.g. `` `value` `` or `end of filter`.
        found: String,
    },

    /// `a AND b OR c`: the second operator of a chain differs from the first.
    #[error("position {position}: AND and OR cannot be mixed without parentheses")]
    MixedAndOr { position: usize },

    /// An operator spelt in the wrong case, e.g. `and`.
    #[error(
        "position {position}: `{found}` is not an operator; write {keyword} (operators are upper-case)"
    )]
    KeywordCase {
        position: usize,
        found: String,
        keyword: &'static str,
    },

    /// `attributes:a AND(...)`, `NOT(...)`: whitespace missing next to a keyword.
    #[error("position {position}: whitespace is required {side} {keyword}")]
    MissingWhitespace {
        position: usize,
        /// `before` or `after`.
        side: &'static str,
        keyword: &'static str,
    },

    /// A string literal with no closing quote; the position is its opening quote.
    #[error("position {position}: string literal is not closed (no matching '\"')")]
    UnterminatedString { position: usize },

    /// A backslash escape outside the escape set; the position is the backslash.
    #[error("position {position}: invalid escape: {reason}")]
    InvalidEscape { position: usize, reason: String },

    /// A raw control character inside a string literal.
    #[error(
        "position {position}: control character {ch:?} must be escaped inside a string literal"
    )]
    UnescapedControl { position: usize, ch: char },

    /// Parentheses and negations nested deeper than [`MAX_DEPTH`].
    #[error("position {position}: parentheses and negations nest deeper than {limit} levels")]
    TooDeep { position: usize, limit: usize },
}

impl FilterError {
    /// The 0-based byte position of the problem; `None` for [`FilterError::TooLong`].
    pub fn position(&self) -> Option<usize> {
        match self {
            FilterError::TooLong { .. } => None,
            FilterError::Unexpected { position, .. }
            | FilterError::MixedAndOr { position }
            | FilterError::KeywordCase { position, .. }
            | FilterError::MissingWhitespace { position, .. }
            | FilterError::UnterminatedString { position }
            | FilterError::InvalidEscape { position, .. }
            | FilterError::UnescapedControl { position, .. }
            | FilterError::TooDeep { position, .. } => Some(*position),
        }
    }
}

/// A parsed subscription filter. `Filter::default()` is the empty filter, which matches every
/// message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `None` for the empty filter.
    expr: Option<Expr>,
}

/// The syntax tree. Chains are flattened (`a AND (b AND c)` is one `And` of three), and redundant
/// parentheses leave no trace, so equal trees mean equal canonical text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    /// `attributes:key`
    Present(String),
    /// `attributes.key = "value"`
    Equals(String, String),
    /// `attributes.key != "value"`
    NotEquals(String, String),
    /// `hasPrefix(attributes.key, "prefix")`
    HasPrefix(String, String),
    /// `NOT x` or `-x`
    Not(Box<Expr>),
    /// Two or more operands.
    And(Vec<Expr>),
    /// Two or more operands.
    Or(Vec<Expr>),
}

impl Filter {
    /// Parses `text`, enforcing the 256-byte limit on the raw UTF-8 text first. Empty or
    /// whitespace-only text gives the empty filter.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        if text.len() > MAX_FILTER_BYTES {
            return Err(FilterError::TooLong {
                len: text.len(),
                limit: MAX_FILTER_BYTES,
            });
        }
        parser::parse(text).map(|expr| Filter { expr })
    }

    /// True for the empty filter (matches everything).
    pub fn is_empty(&self) -> bool {
        self.expr.is_none()
    }

    /// Whether a message with these attributes passes the filter.
    pub fn matches(&self, attributes: &impl AttributeMap) -> bool {
        self.expr.as_ref().is_none_or(|e| e.eval(attributes))
    }
}

/// What a filter reads of a message: its attributes, by key. A message's attributes
/// (`message::Attributes`) and a map of strings have them.
pub trait AttributeMap {
    /// The value of attribute `key`.
    fn attribute(&self, key: &str) -> Option<&str>;
}

impl AttributeMap for BTreeMap<String, String> {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl FromStr for Filter {
    type Err = FilterError;

    fn from_str(text: &str) -> Result<Filter, FilterError> {
        Filter::parse(text)
    }
}

impl Expr {
    fn eval(&self, attrs: &impl AttributeMap) -> bool {
        match self {
            Expr::Present(key) => attrs.attribute(key).is_some(),
            Expr::Equals(key, value) => attrs.attribute(key) == Some(value.as_str()),
            // True when the key is absent (pstest: "not (present and equal)"), docs/contract.md §2.5.
            Expr::NotEquals(key, value) => attrs.attribute(key) != Some(value.as_str()),
            // False when the key is absent, docs/contract.md §2.5.
            Expr::HasPrefix(key, prefix) => {
                attrs.attribute(key).is_some_and(|v| v.starts_with(prefix))
            }
            Expr::Not(inner) => !inner.eval(attrs),
            Expr::And(items) => items.iter().all(|e| e.eval(attrs)),
            Expr::Or(items) => items.iter().any(|e| e.eval(attrs)),
        }
    }

    fn is_chain(&self) -> bool {
        matches!(self, Expr::And(_) | Expr::Or(_))
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.expr {
            None => Ok(()),
            Some(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Present(key) => write!(f, "attributes:{}", Key(key)),
            Expr::Equals(key, value) => write!(f, "attributes.{} = {}", Key(key), Literal(value)),
            Expr::NotEquals(key, value) => {
                write!(f, "attributes.{} != {}", Key(key), Literal(value))
            }
            Expr::HasPrefix(key, prefix) => {
                write!(f, "hasPrefix(attributes.{}, {})", Key(key), Literal(prefix))
            }
            // One negation per operand in the grammar: a negated negation needs parentheses.
            Expr::Not(inner) if inner.is_chain() || matches!(**inner, Expr::Not(_)) => {
                write!(f, "NOT ({inner})")
            }
            Expr::Not(inner) => write!(f, "NOT {inner}"),
            Expr::And(items) => write_chain(f, items, " AND "),
            Expr::Or(items) => write_chain(f, items, " OR "),
        }
    }
}

fn write_chain(f: &mut fmt::Formatter<'_>, items: &[Expr], op: &str) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(op)?;
        }
        if item.is_chain() {
            write!(f, "({item})")?;
        } else {
            write!(f, "{item}")?;
        }
    }
    Ok(())
}

/// Whether `b` may appear in an unquoted key.
fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// An attribute key as written in canonical text: bare when it is an identifier, else quoted.
struct Key<'a>(&'a str);

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_empty() && self.0.bytes().all(is_ident_byte) {
            f.write_str(self.0)
        } else {
            Literal(self.0).fmt(f)
        }
    }
}

/// A string literal with the escapes the grammar requires and no others.
struct Literal<'a>(&'a str);

impl fmt::Display for Literal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\x07' => f.write_str("\\a")?,
                '\x08' => f.write_str("\\b")?,
                '\x0c' => f.write_str("\\f")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                '\x0b' => f.write_str("\\v")?,
                // Every `Cc` character is at most U+009F, so two hex digits suffice.
                c if c.is_control() => write!(f, "\\x{:02x}", u32::from(c))?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}
