//! Table tests: docs/contract.md §2.5's examples, every escape, every error kind with its position, and the
//! decisions listed in the module docs.

use std::collections::BTreeMap;

use super::{parser, Expr, Filter, FilterError, MAX_DEPTH, MAX_FILTER_BYTES};

fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The attributes of docs/contract.md §2.5's example table.
fn spec_attrs() -> BTreeMap<String, String> {
    attrs(&[("domain", "com"), ("region", "us-east1")])
}

fn parse(text: &str) -> Filter {
    Filter::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

fn error(text: &str) -> String {
    match Filter::parse(text) {
        Ok(f) => panic!("{text:?} should be rejected, parsed as {f:?}"),
        Err(e) => e.to_string(),
    }
}

fn eq(key: &str, value: &str) -> Filter {
    Filter {
        expr: Some(Expr::Equals(key.to_owned(), value.to_owned())),
    }
}

#[test]
fn spec_example_table() {
    let table = [
        ("attributes:domain", true),
        ("NOT attributes:missing", true),
        ("attributes.domain = \"com\"", true),
        ("attributes.domain != \"com\"", false),
        ("attributes.missing != \"com\"", true),
        ("hasPrefix(attributes.region, \"us-\")", true),
        ("hasPrefix(attributes.missing, \"us-\")", false),
        ("attributes:domain AND attributes.region = \"eu\"", false),
        ("attributes:domain OR attributes.region = \"eu\"", true),
        (
            "(attributes:domain OR attributes:x) AND NOT attributes:y",
            true,
        ),
    ];
    let a = spec_attrs();
    for (text, want) in table {
        assert_eq!(parse(text).matches(&a), want, "{text}");
    }
    assert_eq!(
        error("attributes:a AND attributes:b OR attributes:c"),
        "position 30: AND and OR cannot be mixed without parentheses"
    );
}

#[test]
fn empty_and_whitespace_only_match_everything() {
    for text in ["", " ", "\t\n\r  "] {
        let f = parse(text);
        assert!(f.is_empty(), "{text:?}");
        assert!(f.matches(&BTreeMap::new()));
        assert!(f.matches(&spec_attrs()));
        assert_eq!(f.to_string(), "");
        assert_eq!(f, Filter::default());
    }
    assert!(!parse("attributes:a").is_empty());
}

#[test]
fn predicate_semantics() {
    let a = attrs(&[("k", "value"), ("empty", "")]);
    let table = [
        ("attributes:k", true),
        ("attributes:K", false), // keys are case-sensitive
        ("attributes:empty", true),
        ("attributes.empty = \"\"", true),
        ("attributes.missing = \"\"", false),
        ("attributes.missing != \"\"", true),
        ("attributes.k = \"VALUE\"", false), // values are case-sensitive
        ("attributes.k = \"val\"", false),   // exact, not prefix
        ("attributes.k != \"val\"", true),
        ("hasPrefix(attributes.k, \"\")", true),
        ("hasPrefix(attributes.k, \"value\")", true),
        ("hasPrefix(attributes.k, \"values\")", false),
        ("hasPrefix(attributes.missing, \"\")", false),
    ];
    for (text, want) in table {
        assert_eq!(parse(text).matches(&a), want, "{text}");
    }
}

#[test]
fn negation_with_not_and_minus() {
    let a = spec_attrs();
    let table = [
        ("NOT attributes:domain", false),
        ("-attributes:domain", false),
        ("-attributes:missing", true),
        ("-attributes.domain = \"com\"", false),
        ("-hasPrefix(attributes.region, \"us\")", false),
        ("-(attributes:domain AND attributes:missing)", true),
        ("NOT (attributes:domain AND attributes:missing)", true),
        ("NOT\t\n(attributes:missing)", true),
        ("NOT (NOT attributes:domain)", true),
        ("-(-attributes:domain)", true),
        ("attributes:domain AND -attributes:missing", true),
        ("attributes:missing OR NOT attributes:domain", false),
    ];
    for (text, want) in table {
        assert_eq!(parse(text).matches(&a), want, "{text}");
    }
    // `-` and `NOT` build the same tree.
    assert_eq!(
        parse("-attributes:a AND -(attributes:b OR attributes:c)"),
        parse("NOT attributes:a AND NOT (attributes:b OR attributes:c)")
    );
}

#[test]
fn nested_parentheses() {
    let a = spec_attrs();
    let table = [
        ("(attributes:domain)", true),
        ("((((attributes:domain))))", true),
        ("( attributes:domain )", true),
        (
            "((attributes:domain OR attributes:x) AND (NOT attributes:y OR attributes.region = \"eu\"))",
            true,
        ),
        (
            "(attributes:x OR (attributes:domain AND (attributes:y OR hasPrefix(attributes.region, \"us-\"))))",
            true,
        ),
        (
            "attributes:domain AND (attributes:x OR (attributes:y AND attributes:region))",
            false,
        ),
        ("(attributes:a AND attributes:b) OR attributes:domain", true),
        ("attributes:domain AND (attributes:b OR attributes:region)", true),
    ];
    for (text, want) in table {
        assert_eq!(parse(text).matches(&a), want, "{text}");
    }
    // Parentheses around a chain of the same operator change nothing.
    assert_eq!(
        parse("attributes:a AND (attributes:b AND attributes:c)"),
        parse("attributes:a AND attributes:b AND attributes:c")
    );
    assert_eq!(parse("((attributes:a))"), parse("attributes:a"));
}

#[test]
fn long_chains_of_one_operator() {
    let and = "attributes:a AND attributes:b AND attributes:c AND attributes:d";
    let or = "attributes:a OR attributes:b OR attributes:c OR attributes:d";
    let all = attrs(&[("a", ""), ("b", ""), ("c", ""), ("d", "")]);
    let one = attrs(&[("c", "")]);
    assert!(parse(and).matches(&all));
    assert!(!parse(and).matches(&one));
    assert!(parse(or).matches(&one));
    assert!(!parse(or).matches(&BTreeMap::new()));
}

#[test]
fn quoted_keys() {
    let a = attrs(&[
        ("iana.org/language_tag", "en"),
        ("a.b", "x"),
        ("with space", "yes"),
        ("", "empty key"),
        ("q\"uote", "1"),
    ]);
    let table = [
        ("attributes:\"iana.org/language_tag\"", true),
        ("attributes.\"iana.org/language_tag\" = \"en\"", true),
        ("attributes.\"a.b\" = \"x\"", true),
        ("attributes.\"a.b\" != \"x\"", false),
        ("hasPrefix(attributes.\"with space\", \"ye\")", true),
        ("attributes:\"\"", true),
        ("attributes:\"q\\\"uote\"", true),
        ("attributes:\"plain\"", false),
    ];
    for (text, want) in table {
        assert_eq!(parse(text).matches(&a), want, "{text}");
    }
    // A quoted identifier is the same key as the bare one.
    assert_eq!(parse("attributes:\"abc\""), parse("attributes:abc"));
    // Identifiers take letters, digits, '_' and '-'.
    assert!(parse("attributes:x_Y-9").matches(&attrs(&[("x_Y-9", "")])));
}

#[test]
fn every_escape() {
    let table = [
        (r#"\""#, "\""),
        (r"\\", "\\"),
        (r"\'", "'"),
        (r"\a", "\x07"),
        (r"\b", "\x08"),
        (r"\f", "\x0c"),
        (r"\n", "\n"),
        (r"\r", "\r"),
        (r"\t", "\t"),
        (r"\v", "\x0b"),
        (r"\x41", "A"),
        (r"\x7e\x7E", "~~"),
        (r"\xe9", "é"), // \xHH is a code point, not a byte
        (r"\x00", "\0"),
        (r"\u00e9", "é"),
        (r"\u20AC", "€"),
        (r"\U0001F600", "😀"),
        (r"\U0010FFFF", "\u{10FFFF}"),
        (r"\101", "A"),
        (r"\000", "\0"),
        (r"\377", "ÿ"),
        (r"\0411", "!1"), // exactly three octal digits
        (r"a\tb\\c", "a\tb\\c"),
        ("é漢字", "é漢字"), // raw non-ASCII needs no escape
        ("'", "'"),
    ];
    for (escaped, want) in table {
        let text = format!("attributes.k = \"{escaped}\"");
        assert_eq!(parse(&text), eq("k", want), "{text}");
    }
    // Escapes work in quoted keys too.
    assert_eq!(parse(r#"attributes."\x61" = """#), eq("a", ""));
}

#[test]
fn errors_name_position_and_what_was_expected() {
    let table = [
        // byte limit
        (
            "x".repeat(300),
            "filter is 300 bytes; the limit is 256".to_owned(),
        ),
        // mixing
        (
            "attributes:a AND attributes:b OR attributes:c".into(),
            "position 30: AND and OR cannot be mixed without parentheses".into(),
        ),
        (
            "attributes:a OR attributes:b AND attributes:c".into(),
            "position 29: AND and OR cannot be mixed without parentheses".into(),
        ),
        (
            "(attributes:a AND attributes:b OR attributes:c) OR attributes:d".into(),
            "position 31: AND and OR cannot be mixed without parentheses".into(),
        ),
        // literals
        (
            "attributes.key = value".into(),
            "position 17: expected a string literal after '=', found `value`".into(),
        ),
        (
            "attributes.key != value".into(),
            "position 18: expected a string literal after '!=', found `value`".into(),
        ),
        (
            "attributes.a = 'x'".into(),
            "position 15: expected a string literal after '=', found `'`".into(),
        ),
        (
            "attributes.a == \"x\"".into(),
            "position 14: expected a string literal after '=', found `=`".into(),
        ),
        (
            "attributes.a = \"abc".into(),
            "position 15: string literal is not closed (no matching '\"')".into(),
        ),
        (
            "attributes.a = \"abc\\".into(),
            "position 15: string literal is not closed (no matching '\"')".into(),
        ),
        (
            "attributes.a = \"a\tb\"".into(),
            "position 17: control character '\\t' must be escaped inside a string literal".into(),
        ),
        (
            "attributes.a = \"a\u{85}\"".into(),
            "position 17: control character '\\u{85}' must be escaped inside a string literal"
                .into(),
        ),
        // escapes
        (
            r#"attributes.a = "\q""#.into(),
            "position 16: invalid escape: `\\q` is not an escape; use \\\" \\\\ \\' \\a \\b \\f \
             \\n \\r \\t \\v \\xHH \\uHHHH \\UHHHHHHHH or three octal digits"
                .into(),
        ),
        (
            r#"attributes.a = "x\x4""#.into(),
            "position 17: invalid escape: `\\x` needs exactly 2 hex digits".into(),
        ),
        (
            r#"attributes.a = "\u00g0""#.into(),
            "position 16: invalid escape: `\\u` needs exactly 4 hex digits".into(),
        ),
        (
            r#"attributes.a = "\U0001F60""#.into(),
            "position 16: invalid escape: `\\U` needs exactly 8 hex digits".into(),
        ),
        (
            r#"attributes.a = "\uD800""#.into(),
            "position 16: invalid escape: `\\uD800` is not a Unicode scalar value (surrogate or \
             above U+10FFFF)"
                .into(),
        ),
        (
            r#"attributes.a = "\U00110000""#.into(),
            "position 16: invalid escape: `\\U00110000` is not a Unicode scalar value (surrogate \
             or above U+10FFFF)"
                .into(),
        ),
        (
            r#"attributes.a = "\400""#.into(),
            "position 16: invalid escape: `\\400` is above \\377".into(),
        ),
        (
            r#"attributes.a = "\18""#.into(),
            "position 16: invalid escape: an octal escape needs exactly three octal digits \
             (\\000 to \\377)"
                .into(),
        ),
        (
            r#"attributes.a = "\8""#.into(),
            "position 16: invalid escape: `\\8` is not an escape; use \\\" \\\\ \\' \\a \\b \\f \
             \\n \\r \\t \\v \\xHH \\uHHHH \\UHHHHHHHH or three octal digits"
                .into(),
        ),
        // keywords
        (
            "attributes:a and attributes:b".into(),
            "position 13: `and` is not an operator; write AND (operators are upper-case)".into(),
        ),
        (
            "attributes:a Or attributes:b".into(),
            "position 13: `Or` is not an operator; write OR (operators are upper-case)".into(),
        ),
        (
            "not attributes:a".into(),
            "position 0: `not` is not an operator; write NOT (operators are upper-case)".into(),
        ),
        (
            "attributes:a AND Not attributes:b".into(),
            "position 17: `Not` is not an operator; write NOT (operators are upper-case)".into(),
        ),
        // whitespace
        (
            "attributes:a AND(attributes:b)".into(),
            "position 16: whitespace is required after AND".into(),
        ),
        (
            "attributes:\"a\"AND attributes:b".into(),
            "position 14: whitespace is required before AND".into(),
        ),
        (
            "(attributes:a)OR attributes:b".into(),
            "position 14: whitespace is required before OR".into(),
        ),
        (
            "attributes:a AND-attributes:b".into(),
            "position 16: whitespace is required after AND".into(),
        ),
        (
            "NOT(attributes:a)".into(),
            "position 3: whitespace is required after NOT".into(),
        ),
        (
            "- attributes:a".into(),
            "position 1: expected an operand directly after '-', found whitespace".into(),
        ),
        // operands missing
        (
            "attributes:a AND".into(),
            "position 16: expected an operand after AND, found end of filter".into(),
        ),
        (
            "attributes:a AND ".into(),
            "position 17: expected a predicate (attributes:KEY, attributes.KEY = \"v\", \
             attributes.KEY != \"v\", hasPrefix(attributes.KEY, \"p\")), NOT, '-' or '(', found \
             end of filter"
                .into(),
        ),
        (
            "NOT".into(),
            "position 3: expected an operand after NOT, found end of filter".into(),
        ),
        (
            "-".into(),
            "position 1: expected an operand directly after '-', found end of filter".into(),
        ),
        (
            "NOT NOT attributes:a".into(),
            "position 4: expected a predicate (attributes:KEY, attributes.KEY = \"v\", \
             attributes.KEY != \"v\", hasPrefix(attributes.KEY, \"p\")), NOT, '-' or '(', found \
             `NOT`"
                .into(),
        ),
        (
            "AND attributes:a".into(),
            "position 0: expected a predicate (attributes:KEY, attributes.KEY = \"v\", \
             attributes.KEY != \"v\", hasPrefix(attributes.KEY, \"p\")), NOT, '-' or '(', found \
             `AND`"
                .into(),
        ),
        // predicates
        (
            "attributes".into(),
            "position 10: expected ':' or '.' after attributes, found end of filter".into(),
        ),
        (
            "attributes.a".into(),
            "position 12: expected '=' or '!=' after attributes.KEY (attributes:KEY tests \
             presence), found end of filter"
                .into(),
        ),
        (
            "attributes:".into(),
            "position 11: expected an attribute key after ':' (letters, digits, '_', '-', or a \
             string literal), found end of filter"
                .into(),
        ),
        (
            "attributes: a".into(),
            "position 11: expected an attribute key after ':' (letters, digits, '_', '-', or a \
             string literal), found whitespace"
                .into(),
        ),
        // parentheses
        (
            "(attributes:a".into(),
            "position 13: expected AND, OR or ')' closing the '(' at position 0, found end of \
             filter"
                .into(),
        ),
        (
            "attributes:a)".into(),
            "position 12: expected AND, OR or the end of the filter, found `)`".into(),
        ),
        (
            "()".into(),
            "position 1: expected an expression after '(', found `)`".into(),
        ),
        // trailing garbage
        (
            "attributes:a foo".into(),
            "position 13: expected AND, OR or the end of the filter, found `foo`".into(),
        ),
        (
            "attributes:a.b".into(),
            "position 12: expected AND, OR or the end of the filter, found `.`".into(),
        ),
        // hasPrefix
        (
            "hasPrefix(attributes.a)".into(),
            "position 22: expected ',' after the first argument of hasPrefix, found `)`".into(),
        ),
        (
            "hasPrefix(attributes.a, \"x\", \"y\")".into(),
            "position 27: expected ')' after the second argument of hasPrefix, found `,`".into(),
        ),
        (
            "hasPrefix(\"a\", \"x\")".into(),
            "position 10: expected attributes.KEY as the first argument of hasPrefix, found a \
             string literal"
                .into(),
        ),
        (
            "hasPrefix(attributes:a, \"x\")".into(),
            "position 20: expected attributes.KEY as the first argument of hasPrefix, found `:`"
                .into(),
        ),
        (
            "hasPrefix(attributes.a, x)".into(),
            "position 24: expected a string literal as the second argument of hasPrefix, found \
             `x`"
            .into(),
        ),
        (
            "hasPrefix (attributes.a, \"x\")".into(),
            "position 9: expected '(' directly after hasPrefix, found whitespace".into(),
        ),
    ];
    for (text, want) in table {
        assert_eq!(error(&text), want, "{text:?}");
    }
}

#[test]
fn error_positions_are_exposed() {
    let e = Filter::parse("attributes:a AND attributes:b OR attributes:c").unwrap_err();
    assert_eq!(e, FilterError::MixedAndOr { position: 30 });
    assert_eq!(e.position(), Some(30));
    let e = Filter::parse(&"a".repeat(257)).unwrap_err();
    assert_eq!(
        e,
        FilterError::TooLong {
            len: 257,
            limit: 256
        }
    );
    assert_eq!(e.position(), None);
    // Positions are byte offsets: "é" is two bytes.
    let e = Filter::parse("attributes.\"é\" = x").unwrap_err();
    assert_eq!(e.position(), Some(18));
}

/// The contract's list of invalid shapes (docs/contract.md §2.5), checked only for rejection (messages are pinned above).
#[test]
fn invalid_filters() {
    let table = [
        "attributes:a and attributes:b",                 // lower-case and
        "attributes:a or attributes:b",                  // lower-case or
        "not attributes:a",                              // lower-case not
        "attributes:a AND attributes:b OR attributes:c", // mixed
        "attributes.a = x",                              // missing quotes
        "attributes.a = \"x",                            // unterminated
        "attributes.a = x\"",                            // missing opening quote
        "(attributes:a",                                 // unbalanced
        "attributes:a)",                                 // unbalanced
        "((attributes:a)",                               // unbalanced
        "(attributes:a))",                               // unbalanced
        "()",                                            // empty parens
        "( )",                                           // empty parens
        "attributes:a ()",                               // trailing empty parens
        "attributes:a garbage",                          // trailing garbage
        "attributes:a AND attributes:b extra",           // trailing garbage
        "attributes:a \"x\"",                            // trailing literal
        "attributes.a = \"x\" \"y\"",                    // two literals
        "hasPrefix(attributes.a)",                       // one argument
        "hasPrefix(attributes.a, \"x\", \"y\")",         // three arguments
        "hasPrefix(\"x\", attributes.a)",                // swapped
        "hasPrefix(attributes.a, attributes.b)",         // attribute as prefix
        "hasPrefix(attributes:a, \"x\")",                // presence form
        "hasPrefix()",                                   // no arguments
        "hasprefix(attributes.a, \"x\")",                // wrong case
        "Attributes:a",                                  // wrong case
        "attributes:a AND",                              // dangling operator
        "OR attributes:a",                               // leading operator
        "attributes:a AND AND attributes:b",             // doubled operator
        "NOT",                                           // negation of nothing
        "NOT NOT attributes:a",                          // double negation needs parentheses
        "--attributes:a",                                // double negation needs parentheses
        "- attributes:a",                                // '-' must touch its operand
        "NOT(attributes:a)",                             // NOT needs whitespace
        "attributes:a AND(attributes:b)",                // AND needs whitespace
        "attributes : a",                                // no whitespace inside attributes:key
        "attributes .a = \"x\"",                         // no whitespace inside attributes.key
        "attributes.a \"x\"",                            // no operator
        "attributes.a < \"x\"",                          // unknown operator
        "attributes.a = \"x\\z\"",                       // unknown escape
        "attributes.a = 'x'",                            // single quotes
        "attributes",                                    // bare
        "domain",                                        // bare key
        "\"x\"",                                         // bare literal
        "attributes.a = \"x\" AND",                      // dangling
        "attributes:a && attributes:b",                  // C operators
        "attributes:a AND\u{a0}attributes:b",            // NBSP is not whitespace
    ];
    for text in table {
        assert!(Filter::parse(text).is_err(), "{text:?} should be rejected");
    }
}

#[test]
fn byte_limit_counts_utf8_bytes() {
    // 16 + 238 + 1 + 1 = 256 bytes, but only 137 characters.
    let at_limit = format!("attributes.a = \"{}x\"", "é".repeat(119));
    assert_eq!(at_limit.len(), MAX_FILTER_BYTES);
    assert!(Filter::parse(&at_limit).is_ok());
    let over = format!("attributes.a = \"{}xx\"", "é".repeat(119));
    assert_eq!(error(&over), "filter is 257 bytes; the limit is 256");
    // Whitespace counts too: the limit is on the raw text.
    let padded = format!("{}attributes:a", " ".repeat(250));
    assert_eq!(error(&padded), "filter is 262 bytes; the limit is 256");
}

#[test]
fn whitespace_variants() {
    let a = spec_attrs();
    for text in [
        "attributes:domain\tAND\nattributes:region",
        "  attributes:domain  AND  attributes:region  ",
        "\r\nattributes:domain AND\r\nattributes:region\r\n",
        "attributes.domain=\"com\" AND attributes.region!=\"x\"",
        "hasPrefix( attributes.region ,\"us\" ) AND ( attributes:domain )",
    ] {
        assert!(parse(text).matches(&a), "{text:?}");
    }
}

#[test]
fn depth_guard_stops_deep_nesting_without_overflow() {
    let deep = format!("{}attributes:a{}", "(".repeat(10_000), ")".repeat(10_000));
    // The byte limit answers first ...
    assert_eq!(error(&deep), "filter is 20012 bytes; the limit is 256");
    // ... and the grammar alone stops at the depth guard, at the first '(' too many.
    assert_eq!(
        parser::parse(&deep).unwrap_err(),
        FilterError::TooDeep {
            position: MAX_DEPTH,
            limit: MAX_DEPTH
        }
    );
    let negations = "-(".repeat(10_000);
    assert!(matches!(
        parser::parse(&negations),
        Err(FilterError::TooDeep { .. })
    ));
    let nots = "NOT (".repeat(10_000);
    assert!(matches!(
        parser::parse(&nots),
        Err(FilterError::TooDeep { .. })
    ));
    // Exactly MAX_DEPTH levels still parse and evaluate.
    let ok = format!(
        "{}attributes:a{}",
        "(".repeat(MAX_DEPTH),
        ")".repeat(MAX_DEPTH)
    );
    assert!(parser::parse(&ok).is_ok());
    // The deepest nesting that fits in 256 bytes is well inside the guard.
    let n = (MAX_FILTER_BYTES - "attributes:a".len()) / 3;
    let fits = format!("{}attributes:a{}", "-(".repeat(n), ")".repeat(n));
    assert!(fits.len() <= MAX_FILTER_BYTES);
    let f = parse(&fits);
    assert_eq!(f.matches(&attrs(&[("a", "")])), n.is_multiple_of(2));
}

#[test]
fn canonical_display() {
    let table = [
        ("attributes:a", "attributes:a"),
        ("attributes:\"abc\"", "attributes:abc"),
        (
            "attributes:\"iana.org/language_tag\"",
            "attributes:\"iana.org/language_tag\"",
        ),
        ("attributes:\"\"", "attributes:\"\""),
        ("attributes.a=\"x\"", "attributes.a = \"x\""),
        ("attributes.a  !=\"x\"", "attributes.a != \"x\""),
        (
            "hasPrefix( attributes.\"a b\" ,\"p\" )",
            "hasPrefix(attributes.\"a b\", \"p\")",
        ),
        (
            r#"attributes.a = "\x41\n\001\"\\\'\u00e9\a\b\f\r\t\v\x85""#,
            r#"attributes.a = "A\n\x01\"\\'é\a\b\f\r\t\v\x85""#,
        ),
        ("-attributes:a", "NOT attributes:a"),
        ("NOT (attributes:a)", "NOT attributes:a"),
        ("-(-attributes:a)", "NOT (NOT attributes:a)"),
        (
            "-(attributes:a OR attributes:b)",
            "NOT (attributes:a OR attributes:b)",
        ),
        ("((attributes:a))", "attributes:a"),
        (
            "attributes:a AND (attributes:b AND attributes:c)",
            "attributes:a AND attributes:b AND attributes:c",
        ),
        (
            "(attributes:a\tOR attributes:b)\nAND attributes:c",
            "(attributes:a OR attributes:b) AND attributes:c",
        ),
        (
            "attributes:a OR (attributes:b AND (attributes:c OR attributes:d))",
            "attributes:a OR (attributes:b AND (attributes:c OR attributes:d))",
        ),
    ];
    for (text, want) in table {
        let f = parse(text);
        assert_eq!(f.to_string(), want, "{text:?}");
        assert_eq!(parse(want), f, "{want:?} parses back");
    }
}

#[test]
fn from_str_is_parse() {
    let f: Filter = "attributes:a".parse().unwrap();
    assert_eq!(f, parse("attributes:a"));
    assert!("attributes:a and attributes:b".parse::<Filter>().is_err());
}
