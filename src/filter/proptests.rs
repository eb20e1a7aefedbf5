//! "Survives fuzzing without a panic": arbitrary text and grammar-shaped token soups go through
//! `parse` and, when they parse, `matches` and a Display round trip. Random syntax trees, printed
//! with random (valid) spacing, negation spelling, parentheses and escapes, must parse back to the
//! same tree and evaluate as a separate reference evaluator says.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::{is_ident_byte, parser, Expr, Filter, FilterError, MAX_FILTER_BYTES};

const KEYS: &[&str] = &[
    "domain",
    "region",
    "a",
    "b-c",
    "x_1",
    "a.b",
    "with space",
    "",
    "é",
    "q\"uote",
    "back\\slash",
];

const VALUES: &[&str] = &[
    "com",
    "co",
    "us-east1",
    "us-",
    "us",
    "",
    "x",
    "é",
    "tab\there",
    "\u{1}\u{85}\u{7f}",
    "\"quoted\"",
    "😀",
];

/// Real tokens of the grammar, near-misses, and whole predicates to raise the share of soups that
/// parse.
const TOKENS: &[&str] = &[
    "attributes",
    "hasPrefix",
    ":",
    ".",
    "=",
    "!=",
    "(",
    ")",
    ",",
    "AND",
    "OR",
    "NOT",
    "-",
    "and",
    "or",
    "not",
    "domain",
    "region",
    "a",
    "x-y",
    "\"com\"",
    "\"us-\"",
    "\"us-east1\"",
    "\"a.b\"",
    "\"\"",
    "\"\\x41\"",
    "\"\\u00e9\"",
    "\"\\377\"",
    "\"\\U0001F600\"",
    "\"\\q\"",
    "\"\\",
    "\"",
    "\\",
    "'",
    "é",
    "attributes:domain",
    "attributes:missing",
    "attributes.domain = \"com\"",
    "attributes.region != \"eu\"",
    "hasPrefix(attributes.region, \"us\")",
    "attributes:",
    "attributes.",
    "hasPrefix(",
];

const SEPARATORS: &[&str] = &["", " ", " ", " ", "  ", "\t", "\n"];

/// Pieces of an operand in a shaped soup: what opens and closes it (mostly balanced), and the
/// operand; each list mixes valid pieces with near-misses.
const WRAPS: &[(&str, &str)] = &[
    ("", ""),
    ("", ""),
    ("NOT ", ""),
    ("-", ""),
    ("(", ")"),
    ("( ", " )"),
    ("NOT (", ")"),
    ("-(", ")"),
    ("((", "))"),
    ("(", ""),
    ("", ")"),
    ("not ", ""),
    ("NOT", ""),
    ("- ", ""),
    ("--", ""),
];
const OPERANDS: &[&str] = &[
    "attributes:domain",
    "attributes:missing",
    "attributes.domain = \"com\"",
    "attributes.region != \"eu\"",
    "hasPrefix(attributes.region, \"us\")",
    "attributes:\"a.b\"",
    "attributes.\"x y\"=\"\\x41\\n\"",
    "attributes.domain = com",
    "attributes:",
    "hasPrefix(attributes.a)",
    "\"str\"",
    "()",
    "attributes.k = \"\\q\"",
];
const OPERATORS: &[&str] = &[" AND ", " OR ", "\tAND\n", " and ", "AND", " ", ""];

/// Edits applied to valid text to get near-valid text.
#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, &'static str),
    Delete(usize, usize),
    Replace(usize, usize, &'static str),
}

fn attrs_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        select(KEYS).prop_map(str::to_owned),
        select(VALUES).prop_map(str::to_owned),
        0..6,
    )
}

fn attr_sets() -> impl Strategy<Value = Vec<BTreeMap<String, String>>> {
    proptest::collection::vec(attrs_strategy(), 1..4)
}

fn text_strategy(pool: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![
        4 => select(pool).prop_map(str::to_owned),
        1 => any::<String>(),
    ]
    .boxed()
}

fn expr_strategy() -> impl Strategy<Value = Expr> {
    let key = || text_strategy(KEYS);
    let value = || text_strategy(VALUES);
    let leaf = prop_oneof![
        key().prop_map(Expr::Present),
        (key(), value()).prop_map(|(k, v)| Expr::Equals(k, v)),
        (key(), value()).prop_map(|(k, v)| Expr::NotEquals(k, v)),
        (key(), value()).prop_map(|(k, v)| Expr::HasPrefix(k, v)),
    ];
    leaf.prop_recursive(6, 48, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
            proptest::collection::vec(inner.clone(), 2..5).prop_map(Expr::And),
            proptest::collection::vec(inner, 2..5).prop_map(Expr::Or),
        ]
    })
}

fn soup_strategy() -> impl Strategy<Value = String> {
    proptest::collection::vec((select(TOKENS), select(SEPARATORS)), 0..24).prop_map(|parts| {
        parts
            .into_iter()
            .flat_map(|(token, sep)| [token, sep])
            .collect()
    })
}

/// Operands joined by one operator (sometimes another, or a broken one), each piece sometimes
/// wrong: near-valid filters, so chains, nesting and mixing are reached far more often than by
/// flat soups.
fn shaped_soup_strategy() -> impl Strategy<Value = String> {
    let unit = || {
        (
            prop_oneof![3 => Just(0usize), 2 => 1..5usize, 1 => 5..WRAPS.len()],
            prop_oneof![3 => 0..7usize, 1 => 7..OPERANDS.len()],
        )
            .prop_map(|(w, o)| format!("{}{}{}", WRAPS[w].0, OPERANDS[o], WRAPS[w].1))
    };
    let joint = prop_oneof![6 => Just(None), 1 => select(OPERATORS).prop_map(Some)];
    (
        0..2usize,
        unit(),
        proptest::collection::vec((joint, unit()), 0..5),
    )
        .prop_map(|(chain_op, first, rest)| {
            let mut text = first;
            for (op, unit) in rest {
                text.push_str(op.unwrap_or(OPERATORS[chain_op]));
                text.push_str(&unit);
            }
            text
        })
}

/// A valid printed tree with a few random edits (insert, delete or replace at a char boundary).
fn mutated_strategy() -> impl Strategy<Value = String> {
    let edit = prop_oneof![
        (any::<usize>(), select(TOKENS)).prop_map(|(at, t)| Edit::Insert(at, t)),
        (any::<usize>(), 1..4usize).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), 1..4usize, select(TOKENS)).prop_map(|(at, n, t)| Edit::Replace(at, n, t)),
    ];
    (
        expr_strategy(),
        proptest::collection::vec(any::<u8>(), 0..32),
        proptest::collection::vec(edit, 0..3),
    )
        .prop_map(|(e, noise, edits)| {
            let mut text = noisy(&e, &noise);
            for edit in edits {
                let boundary = |at: usize, text: &str| {
                    let mut at = at % (text.len() + 1);
                    while !text.is_char_boundary(at) {
                        at -= 1;
                    }
                    at
                };
                let span = |at: usize, n: usize, text: &str| {
                    let end = text[at..]
                        .char_indices()
                        .nth(n)
                        .map_or(text.len(), |(i, _)| at + i);
                    at..end
                };
                match edit {
                    Edit::Insert(at, t) => {
                        let at = boundary(at, &text);
                        text.insert_str(at, t);
                    }
                    Edit::Delete(at, n) => {
                        let at = boundary(at, &text);
                        text.replace_range(span(at, n, &text), "");
                    }
                    Edit::Replace(at, n, t) => {
                        let at = boundary(at, &text);
                        text.replace_range(span(at, n, &text), t);
                    }
                }
            }
            text
        })
}

/// docs/contract.md §2.5 restated, independently of `Expr::eval`.
fn reference(e: &Expr, a: &BTreeMap<String, String>) -> bool {
    match e {
        Expr::Present(k) => a.contains_key(k),
        Expr::Equals(k, v) => matches!(a.get(k), Some(x) if x == v),
        Expr::NotEquals(k, v) => !matches!(a.get(k), Some(x) if x == v),
        Expr::HasPrefix(k, p) => match a.get(k) {
            None => false,
            Some(x) => x.starts_with(p.as_str()),
        },
        Expr::Not(inner) => !reference(inner, a),
        Expr::And(items) => items.iter().fold(true, |acc, i| acc & reference(i, a)),
        Expr::Or(items) => items.iter().fold(false, |acc, i| acc | reference(i, a)),
    }
}

/// The tree the parser builds for a printed `e`: same-operator chains spliced.
fn normalize(e: Expr) -> Expr {
    match e {
        Expr::Not(inner) => Expr::Not(Box::new(normalize(*inner))),
        Expr::And(items) => Expr::And(
            items
                .into_iter()
                .map(normalize)
                .flat_map(|i| match i {
                    Expr::And(inner) => inner,
                    other => vec![other],
                })
                .collect(),
        ),
        Expr::Or(items) => Expr::Or(
            items
                .into_iter()
                .map(normalize)
                .flat_map(|i| match i {
                    Expr::Or(inner) => inner,
                    other => vec![other],
                })
                .collect(),
        ),
        leaf => leaf,
    }
}

/// Prints a tree as valid but non-canonical text, every choice taken from `noise`.
struct Noisy<'a> {
    noise: std::iter::Cycle<std::slice::Iter<'a, u8>>,
    out: String,
}

impl Noisy<'_> {
    fn pick(&mut self, n: u8) -> u8 {
        self.noise.next().copied().unwrap_or(0) % n
    }

    /// `ws`: optional whitespace.
    fn ws(&mut self) {
        let s = ["", "", " ", "  ", "\t", "\n", "\r\n"][usize::from(self.pick(7))];
        self.out.push_str(s);
    }

    /// `WS`: required whitespace.
    fn ws1(&mut self) {
        let s = [" ", " ", "  ", "\t", "\n", " \r\n "][usize::from(self.pick(6))];
        self.out.push_str(s);
    }

    fn key(&mut self, k: &str) {
        if !k.is_empty() && k.bytes().all(is_ident_byte) && self.pick(3) > 0 {
            self.out.push_str(k);
        } else {
            self.literal(k);
        }
    }

    fn literal(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            let raw_ok = !matches!(c, '"' | '\\') && !c.is_control();
            let code = u32::from(c);
            match self.pick(6) {
                0 | 1 if raw_ok => self.out.push(c),
                2 if code <= 0xff => self.out.push_str(&format!("\\x{code:02X}")),
                3 if code <= 0o377 => self.out.push_str(&format!("\\{code:03o}")),
                4 if code <= 0xffff => self.out.push_str(&format!("\\u{code:04x}")),
                _ => {
                    let named = match c {
                        '"' => Some("\\\""),
                        '\\' => Some("\\\\"),
                        '\'' => Some("\\'"),
                        '\x07' => Some("\\a"),
                        '\x08' => Some("\\b"),
                        '\x0c' => Some("\\f"),
                        '\n' => Some("\\n"),
                        '\r' => Some("\\r"),
                        '\t' => Some("\\t"),
                        '\x0b' => Some("\\v"),
                        _ => None,
                    };
                    match named {
                        Some(n) if self.pick(2) == 0 => self.out.push_str(n),
                        _ => self.out.push_str(&format!("\\U{code:08X}")),
                    }
                }
            }
        }
        self.out.push('"');
    }

    /// An operand that must be a `primary` (after a negation): chains and negations get
    /// parentheses, predicates sometimes.
    fn primary(&mut self, e: &Expr) {
        let must = matches!(e, Expr::And(_) | Expr::Or(_) | Expr::Not(_));
        if must || self.pick(4) == 0 {
            self.parenthesized(e);
        } else {
            self.expr(e);
        }
    }

    /// An operand of a chain (`unary`): chains get parentheses.
    fn unary(&mut self, e: &Expr) {
        let must = matches!(e, Expr::And(_) | Expr::Or(_));
        if must || self.pick(5) == 0 {
            self.parenthesized(e);
        } else {
            self.expr(e);
        }
    }

    fn parenthesized(&mut self, e: &Expr) {
        self.out.push('(');
        self.ws();
        self.expr(e);
        self.ws();
        self.out.push(')');
    }

    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::Present(k) => {
                self.out.push_str("attributes:");
                self.key(k);
            }
            Expr::Equals(k, v) | Expr::NotEquals(k, v) => {
                self.out.push_str("attributes.");
                self.key(k);
                self.ws();
                let op = if matches!(e, Expr::Equals(..)) {
                    "="
                } else {
                    "!="
                };
                self.out.push_str(op);
                self.ws();
                self.literal(v);
            }
            Expr::HasPrefix(k, p) => {
                self.out.push_str("hasPrefix(");
                self.ws();
                self.out.push_str("attributes.");
                self.key(k);
                self.ws();
                self.out.push(',');
                self.ws();
                self.literal(p);
                self.ws();
                self.out.push(')');
            }
            Expr::Not(inner) => {
                if self.pick(2) == 0 {
                    self.out.push('-');
                } else {
                    self.out.push_str("NOT");
                    self.ws1();
                }
                self.primary(inner);
            }
            Expr::And(items) | Expr::Or(items) => {
                let op = if matches!(e, Expr::And(_)) {
                    "AND"
                } else {
                    "OR"
                };
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.ws1();
                        self.out.push_str(op);
                        self.ws1();
                    }
                    self.unary(item);
                }
            }
        }
    }
}

fn noisy(e: &Expr, noise: &[u8]) -> String {
    let zero = [0u8];
    let noise = if noise.is_empty() { &zero[..] } else { noise };
    let mut p = Noisy {
        noise: noise.iter().cycle(),
        out: String::new(),
    };
    p.ws();
    p.unary(e);
    p.ws();
    p.out
}

/// A parsed filter prints canonically, and the canonical text parses back to the same filter
/// (through `Filter::parse` whenever it fits the byte limit).
fn assert_round_trip(f: &Filter) {
    let text = f.to_string();
    let again = Filter {
        expr: parser::parse(&text)
            .unwrap_or_else(|e| panic!("canonical {text:?} of {f:?} does not parse: {e}")),
    };
    assert_eq!(&again, f, "canonical text {text:?}");
    assert_eq!(again.to_string(), text, "canonical text is a fixed point");
    if text.len() <= MAX_FILTER_BYTES {
        assert_eq!(Filter::parse(&text).as_ref(), Ok(f));
    }
}

/// Whatever `text` is: no panic, errors point inside the text, accepted filters evaluate and
/// round-trip. Returns whether it parsed.
fn exercise(text: &str, attr_sets: &[BTreeMap<String, String>]) -> bool {
    match Filter::parse(text) {
        Ok(f) => {
            for a in attr_sets {
                let _ = f.matches(a);
            }
            assert_round_trip(&f);
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            match e.position() {
                Some(p) => assert!(p <= text.len() && text.is_char_boundary(p), "{e:?}"),
                None => assert!(matches!(e, FilterError::TooLong { .. })),
            }
            false
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>(), sets in attr_sets()) {
        exercise(&text, &sets);
    }

    #[test]
    fn arbitrary_printable_strings_never_panic(text in "\\PC{0,300}", sets in attr_sets()) {
        exercise(&text, &sets);
    }

    #[test]
    fn token_soups_never_panic(text in soup_strategy(), sets in attr_sets()) {
        exercise(&text, &sets);
    }

    #[test]
    fn shaped_soups_never_panic(text in shaped_soup_strategy(), sets in attr_sets()) {
        exercise(&text, &sets);
    }

    #[test]
    fn mutated_filters_never_panic(text in mutated_strategy(), sets in attr_sets()) {
        exercise(&text, &sets);
    }

    #[test]
    fn arbitrary_bytes_as_lossy_utf8_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        sets in attr_sets(),
    ) {
        exercise(&String::from_utf8_lossy(&bytes), &sets);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Random trees printed with random valid noise parse to the tree itself (chains spliced) and
    /// evaluate as the reference evaluator says.
    #[test]
    fn printed_trees_parse_back_and_evaluate_as_specified(
        e in expr_strategy(),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
        sets in proptest::collection::vec(attrs_strategy(), 1..8),
    ) {
        let text = noisy(&e, &noise);
        let parsed = Filter {
            expr: Some(
                parser::parse(&text)
                    .unwrap_or_else(|err| panic!("{text:?} from {e:?}: {err}"))
                    .expect("non-empty"),
            ),
        };
        for a in &sets {
            prop_assert_eq!(parsed.matches(a), reference(&e, a), "{:?} on {:?}", text, a);
        }
        let want = normalize(e);
        prop_assert_eq!(parsed.expr.as_ref(), Some(&want));
        assert_round_trip(&parsed);
        if text.len() <= MAX_FILTER_BYTES {
            prop_assert_eq!(Filter::parse(&text), Ok(parsed));
        } else {
            let is_too_long = matches!(Filter::parse(&text), Err(FilterError::TooLong { .. }));
            prop_assert!(is_too_long);
        }
    }
}

/// The soups are worth running only if a fair share of them parse, and not only the trivial ones;
/// pin those shares.
#[test]
fn token_soups_reach_the_accepting_paths() {
    const TRIES: usize = 2000;
    fn accepted(strategy: impl Strategy<Value = String>) -> (usize, usize) {
        let mut runner = TestRunner::deterministic();
        let sets = [BTreeMap::new()];
        let (mut any, mut chains) = (0, 0);
        for _ in 0..TRIES {
            let text = strategy.new_tree(&mut runner).expect("tree").current();
            if exercise(&text, &sets) {
                any += 1;
                if text.contains("AND") || text.contains("OR") {
                    chains += 1;
                }
            }
        }
        (any, chains)
    }
    let (flat, _) = accepted(soup_strategy());
    let (shaped, shaped_chains) = accepted(shaped_soup_strategy());
    let (mutated, mutated_chains) = accepted(mutated_strategy());
    assert!(flat >= 40, "only {flat} of {TRIES} flat soups parsed");
    assert!(
        shaped >= 200,
        "only {shaped} of {TRIES} shaped soups parsed"
    );
    assert!(
        shaped_chains >= 100,
        "only {shaped_chains} of {TRIES} shaped soups parsed with AND/OR"
    );
    assert!(
        mutated >= 120,
        "only {mutated} of {TRIES} mutated filters parsed"
    );
    assert!(
        mutated_chains >= 60,
        "only {mutated_chains} of {TRIES} mutated filters parsed with AND/OR"
    );
}
