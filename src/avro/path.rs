//! Where in a datum a value is: the path that both the encoder's JSON errors and the table
//! mapping's cell errors carry, so that no caller has to find it again in an error's text.

use std::fmt;

/// One step from a value to a value inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A record field (or a column's sub-field), by name.
    Field(String),
    /// An array item, by position.
    Index(usize),
    /// A map entry, by key.
    Key(String),
    /// The branch of a wrapped union value (`{"string": …}`), by the name the value gave.
    Branch(String),
}

/// The path from a datum's root to a value inside it. Built while unwinding from the failure, so
/// segments are added outermost last ([`DatumPath::push_outer`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatumPath {
    /// Innermost first.
    segments: Vec<Segment>,
}

impl DatumPath {
    /// Adds `segment` in front of the path: the step from the enclosing value.
    pub fn push_outer(&mut self, segment: Segment) {
        self.segments.push(segment);
    }

    /// The steps, outermost first.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter().rev()
    }

    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }

    /// The path as a field of a row error: `customer.tier`, `items[2].sku`, `props["k"]`, or `$`
    /// for the root.
    pub fn field(&self) -> String {
        if self.is_root() {
            return "$".to_string();
        }
        let mut out = String::new();
        for (i, segment) in self.segments().enumerate() {
            match segment {
                Segment::Field(name) if i == 0 => out.push_str(name),
                _ => write_segment(&mut out, segment),
            }
        }
        out
    }
}

fn write_segment(out: &mut String, segment: &Segment) {
    use fmt::Write;
    // Writing to a String cannot fail.
    let _ = match segment {
        Segment::Field(name) => write!(out, ".{name}"),
        Segment::Index(i) => write!(out, "[{i}]"),
        Segment::Key(key) => write!(out, "[{key:?}]"),
        Segment::Branch(name) => write!(out, "<{name}>"),
    };
}

/// A path from its steps, outermost first.
impl FromIterator<Segment> for DatumPath {
    fn from_iter<I: IntoIterator<Item = Segment>>(outermost_first: I) -> Self {
        let mut segments: Vec<Segment> = outermost_first.into_iter().collect();
        segments.reverse();
        DatumPath { segments }
    }
}

/// `$.customer.tier`, `$.items[2]`, `$.props["k"]`, `$.note<string>`; `$` for the root.
impl fmt::Display for DatumPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::from("$");
        for segment in self.segments() {
            write_segment(&mut out, segment);
        }
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(outermost_first: &[Segment]) -> DatumPath {
        outermost_first.iter().cloned().collect()
    }

    #[test]
    fn paths_read_as_in_the_messages_and_as_row_fields() {
        use Segment::*;
        let root = DatumPath::default();
        assert_eq!((root.to_string(), root.field()), ("$".into(), "$".into()));
        let p = path(&[
            Field("customer".into()),
            Branch("Customer".into()),
            Field("tags".into()),
            Index(2),
        ]);
        assert_eq!(p.to_string(), "$.customer<Customer>.tags[2]");
        assert_eq!(p.field(), "customer<Customer>.tags[2]");
        // A key with `: ` or quotes stays one segment: nothing is re-parsed from text.
        let p = path(&[
            Field("props".into()),
            Key("a: \"b\"".into()),
            Field("value".into()),
        ]);
        assert_eq!(p.to_string(), r#"$.props["a: \"b\""].value"#);
        assert_eq!(p.field(), r#"props["a: \"b\""].value"#);
        assert_eq!(path(&[Index(0)]).field(), "[0]");
    }
}
