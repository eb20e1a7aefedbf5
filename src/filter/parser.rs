//! Recursive-descent parser over the raw text. Whitespace is significant in places (around
//! `AND`/`OR`, after `NOT`, never after `-` or inside `attributes:key`), so there is no separate
//! tokeniser: each rule reads the bytes it needs from a cursor.

use super::{is_ident_byte, Expr, FilterError, MAX_DEPTH};

/// Parses the grammar without the byte limit (the caller checks it). `None` is the empty filter.
pub(super) fn parse(text: &str) -> Result<Option<Expr>, FilterError> {
    let mut p = Parser {
        src: text,
        pos: 0,
        depth: 0,
    };
    p.skip_ws();
    if p.at_end() {
        return Ok(None);
    }
    let expr = p.expr()?;
    p.skip_ws();
    if !p.at_end() {
        return Err(p.unexpected("AND, OR or the end of the filter"));
    }
    Ok(Some(expr))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    And,
    Or,
}

struct Parser<'a> {
    src: &'a str,
    /// Byte offset of the next unread byte; always on a char boundary.
    pos: usize,
    /// Open parentheses and negations around the current point.
    depth: usize,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Bytes that can make up a keyword (`AND`, `attributes`, ...). `-` is left out so that
/// `AND-attributes:a` reads as `AND` followed by a missing space, not as one odd word.
fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    /// Skips `ws`; true when at least one whitespace byte was skipped.
    fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while self.peek().is_some_and(is_ws) {
            self.pos += 1;
        }
        self.pos > start
    }

    /// The keyword-shaped word at the cursor (possibly empty).
    fn word(&self) -> &'a str {
        let rest = self.rest();
        let len = rest.bytes().take_while(|&b| is_word_byte(b)).count();
        &rest[..len]
    }

    /// How the text at the cursor is named in an error.
    fn found(&self) -> String {
        let rest = self.rest();
        match rest.bytes().next() {
            None => "end of filter".to_owned(),
            Some(b) if is_ws(b) => "whitespace".to_owned(),
            Some(b'"') => "a string literal".to_owned(),
            Some(b) if is_ident_byte(b) => {
                let len = rest.bytes().take_while(|&b| is_ident_byte(b)).count();
                format!("`{}`", &rest[..len])
            }
            Some(_) => {
                let c = rest.chars().next().unwrap_or_default();
                if c.is_control() {
                    format!("`{}`", c.escape_debug())
                } else {
                    format!("`{c}`")
                }
            }
        }
    }

    fn unexpected(&self, expected: impl Into<String>) -> FilterError {
        FilterError::Unexpected {
            position: self.pos,
            expected: expected.into(),
            found: self.found(),
        }
    }

    /// Consumes `token` or fails saying `expected`.
    fn expect(&mut self, token: &str, expected: &str) -> Result<(), FilterError> {
        if self.rest().starts_with(token) {
            self.pos += token.len();
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// After a keyword: an operand must follow, separated by whitespace.
    fn ws_after(&mut self, keyword: &'static str) -> Result<(), FilterError> {
        if self.at_end() {
            return Err(self.unexpected(format!("an operand after {keyword}")));
        }
        if !self.skip_ws() {
            return Err(FilterError::MissingWhitespace {
                position: self.pos,
                side: "after",
                keyword,
            });
        }
        Ok(())
    }

    /// Enters one level of parentheses or negation at `position`.
    fn nest(&mut self, position: usize) -> Result<(), FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(FilterError::TooDeep {
                position,
                limit: MAX_DEPTH,
            });
        }
        Ok(())
    }

    /// `expr = unary { WS op WS unary }` with one `op` per chain.
    fn expr(&mut self) -> Result<Expr, FilterError> {
        let mut items = vec![self.unary()?];
        let mut chain_op = None;
        loop {
            let before = self.pos;
            let had_ws = self.skip_ws();
            let word = self.word();
            let (op, keyword) = match word {
                "AND" => (Op::And, "AND"),
                "OR" => (Op::Or, "OR"),
                _ if word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or") => {
                    return Err(FilterError::KeywordCase {
                        position: self.pos,
                        found: word.to_owned(),
                        keyword: if word.len() == 3 { "AND" } else { "OR" },
                    });
                }
                _ => {
                    // Not an operator: the chain ends here and the caller decides what may follow.
                    self.pos = before;
                    break;
                }
            };
            if !had_ws {
                return Err(FilterError::MissingWhitespace {
                    position: self.pos,
                    side: "before",
                    keyword,
                });
            }
            if chain_op.is_some_and(|prev| prev != op) {
                return Err(FilterError::MixedAndOr { position: self.pos });
            }
            chain_op = Some(op);
            self.pos += keyword.len();
            self.ws_after(keyword)?;
            items.push(self.unary()?);
        }
        Ok(match chain_op {
            None => items.pop().expect("a chain has its first operand"),
            Some(op) => chain(op, items),
        })
    }

    /// `unary = [ "NOT" WS | "-" ] primary`
    fn unary(&mut self) -> Result<Expr, FilterError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
            if self.at_end() || self.peek().is_some_and(is_ws) {
                return Err(self.unexpected("an operand directly after '-'"));
            }
            return self.negated(start);
        }
        let word = self.word();
        if word == "NOT" {
            self.pos += word.len();
            self.ws_after("NOT")?;
            return self.negated(start);
        }
        if word.eq_ignore_ascii_case("not") {
            return Err(FilterError::KeywordCase {
                position: start,
                found: word.to_owned(),
                keyword: "NOT",
            });
        }
        self.primary()
    }

    fn negated(&mut self, start: usize) -> Result<Expr, FilterError> {
        self.nest(start)?;
        let inner = self.primary()?;
        self.depth -= 1;
        Ok(Expr::Not(Box::new(inner)))
    }

    /// `primary = "(" ws expr ws ")" | predicate`
    fn primary(&mut self) -> Result<Expr, FilterError> {
        let start = self.pos;
        if self.peek() == Some(b'(') {
            self.nest(start)?;
            self.pos += 1;
            self.skip_ws();
            if self.peek() == Some(b')') {
                return Err(self.unexpected("an expression after '('"));
            }
            let inner = self.expr()?;
            self.skip_ws();
            if self.peek() != Some(b')') {
                return Err(self.unexpected(format!(
                    "AND, OR or ')' closing the '(' at position {start}"
                )));
            }
            self.pos += 1;
            self.depth -= 1;
            return Ok(inner);
        }
        match self.word() {
            "attributes" => self.attribute_predicate(),
            "hasPrefix" => self.has_prefix(),
            _ => Err(self.unexpected(
                "a predicate (attributes:KEY, attributes.KEY = \"v\", attributes.KEY != \"v\", \
                 hasPrefix(attributes.KEY, \"p\")), NOT, '-' or '('",
            )),
        }
    }

    /// `attributes:key`, `attributes.key = "v"`, `attributes.key != "v"`.
    fn attribute_predicate(&mut self) -> Result<Expr, FilterError> {
        self.pos += "attributes".len();
        match self.peek() {
            Some(b':') => {
                self.pos += 1;
                Ok(Expr::Present(self.key("':'")?))
            }
            Some(b'.') => {
                self.pos += 1;
                let key = self.key("'.'")?;
                self.skip_ws();
                let not_equal = if self.rest().starts_with("!=") {
                    self.pos += 2;
                    true
                } else if self.peek() == Some(b'=') {
                    self.pos += 1;
                    false
                } else {
                    return Err(self.unexpected(
                        "'=' or '!=' after attributes.KEY (attributes:KEY tests presence)",
                    ));
                };
                self.skip_ws();
                let value = if not_equal {
                    self.string("a string literal after '!='")?
                } else {
                    self.string("a string literal after '='")?
                };
                Ok(if not_equal {
                    Expr::NotEquals(key, value)
                } else {
                    Expr::Equals(key, value)
                })
            }
            _ => Err(self.unexpected("':' or '.' after attributes")),
        }
    }

    /// `hasPrefix(attributes.key, "p")`
    fn has_prefix(&mut self) -> Result<Expr, FilterError> {
        self.pos += "hasPrefix".len();
        self.expect("(", "'(' directly after hasPrefix")?;
        self.skip_ws();
        const FIRST: &str = "attributes.KEY as the first argument of hasPrefix";
        if self.word() != "attributes" {
            return Err(self.unexpected(FIRST));
        }
        self.pos += "attributes".len();
        self.expect(".", FIRST)?;
        let key = self.key("'.'")?;
        self.skip_ws();
        self.expect(",", "',' after the first argument of hasPrefix")?;
        self.skip_ws();
        let prefix = self.string("a string literal as the second argument of hasPrefix")?;
        self.skip_ws();
        self.expect(")", "')' after the second argument of hasPrefix")?;
        Ok(Expr::HasPrefix(key, prefix))
    }

    /// `key = ident | string`; `after` names the punctuation before it, for the error.
    fn key(&mut self, after: &str) -> Result<String, FilterError> {
        match self.peek() {
            Some(b'"') => self.literal(),
            Some(b) if is_ident_byte(b) => {
                let rest = self.rest();
                let len = rest.bytes().take_while(|&b| is_ident_byte(b)).count();
                self.pos += len;
                Ok(rest[..len].to_owned())
            }
            _ => Err(self.unexpected(format!(
                "an attribute key after {after} (letters, digits, '_', '-', or a string literal)"
            ))),
        }
    }

    /// A string literal where `expected` describes it, for the error when there is none.
    fn string(&mut self, expected: &str) -> Result<String, FilterError> {
        if self.peek() == Some(b'"') {
            self.literal()
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// `string = DQUOTE *( char | escape ) DQUOTE`, cursor on the opening quote.
    fn literal(&mut self) -> Result<String, FilterError> {
        let open = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.rest().chars().next() else {
                return Err(FilterError::UnterminatedString { position: open });
            };
            match c {
                '"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                '\\' => out.push(self.escape(open)?),
                c if c.is_control() => {
                    return Err(FilterError::UnescapedControl {
                        position: self.pos,
                        ch: c,
                    });
                }
                c => {
                    out.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
    }

    /// One escape, cursor on the backslash; `open` is the literal's opening quote.
    fn escape(&mut self, open: usize) -> Result<char, FilterError> {
        let backslash = self.pos;
        let invalid = |reason: String| FilterError::InvalidEscape {
            position: backslash,
            reason,
        };
        let Some(c) = self.src[backslash + 1..].chars().next() else {
            return Err(FilterError::UnterminatedString { position: open });
        };
        self.pos = backslash + 1 + c.len_utf8();
        let simple = match c {
            '"' => Some('"'),
            '\\' => Some('\\'),
            '\'' => Some('\''),
            'a' => Some('\x07'),
            'b' => Some('\x08'),
            'f' => Some('\x0c'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\x0b'),
            _ => None,
        };
        if let Some(ch) = simple {
            return Ok(ch);
        }
        let (digits, radix) = match c {
            'x' => (2, 16),
            'u' => (4, 16),
            'U' => (8, 16),
            '0'..='7' => {
                // The first digit is the one just read.
                self.pos = backslash + 1;
                (3, 8)
            }
            _ => {
                return Err(invalid(format!(
                    "`\\{}` is not an escape; use \\\" \\\\ \\' \\a \\b \\f \\n \\r \\t \\v \
                     \\xHH \\uHHHH \\UHHHHHHHH or three octal digits",
                    c.escape_debug()
                )))
            }
        };
        let bytes = &self.src.as_bytes()[self.pos..];
        let ok = bytes.len() >= digits
            && bytes[..digits]
                .iter()
                .all(|&b| char::from(b).is_digit(radix));
        if !ok {
            return Err(invalid(if radix == 8 {
                "an octal escape needs exactly three octal digits (\\000 to \\377)".to_owned()
            } else {
                format!("`\\{c}` needs exactly {digits} hex digits")
            }));
        }
        // All ASCII digits, so this slice is on char boundaries.
        let text = &self.src[self.pos..self.pos + digits];
        self.pos += digits;
        let value = u32::from_str_radix(text, radix).expect("checked digits fit in u32");
        if radix == 8 && value > 0o377 {
            return Err(invalid(format!("`\\{text}` is above \\377")));
        }
        char::from_u32(value).ok_or_else(|| {
            invalid(format!(
                "`\\{c}{text}` is not a Unicode scalar value (surrogate or above U+10FFFF)"
            ))
        })
    }
}

/// Builds a chain, splicing in operands that are chains of the same operator (they came from
/// parentheses, which change nothing there).
fn chain(op: Op, items: Vec<Expr>) -> Expr {
    let mut flat = Vec::with_capacity(items.len());
    for item in items {
        match (op, item) {
            (Op::And, Expr::And(inner)) | (Op::Or, Expr::Or(inner)) => flat.extend(inner),
            (_, item) => flat.push(item),
        }
    }
    match op {
        Op::And => Expr::And(flat),
        Op::Or => Expr::Or(flat),
    }
}
