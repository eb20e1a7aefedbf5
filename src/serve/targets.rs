//! Where each discovered subscription writes: `--bucket-url-template` and `--table-url-template`
//! expanded for it, and its table's schema file from `--table-schemas`.

use std::path::PathBuf;

use crate::config::ValidSubscription;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("{flag} {template:?}: unknown placeholder {{{name}}}; it may use {allowed}")]
    Unknown {
        flag: &'static str,
        template: String,
        name: String,
        allowed: String,
    },
    #[error("{flag} {template:?}: unbalanced brace at position {position}")]
    Brace {
        flag: &'static str,
        template: String,
        position: usize,
    },
    #[error("{flag} {template:?}: never uses {needed}, so every {what} would map to one place")]
    Constant {
        flag: &'static str,
        template: String,
        needed: &'static str,
        what: &'static str,
    },
    #[error(
        "bigqueryConfig.table {table:?}: expected PROJECT.DATASET.TABLE (or PROJECT:DATASET.TABLE)"
    )]
    Table { table: String },
    /// A subscription of a kind whose template was not given: no place is made up for it.
    #[error("no {flag}: this {what} subscription has nowhere to write (serve writes only where a template names)")]
    NoTemplate {
        flag: &'static str,
        what: &'static str,
    },
    /// Neither template: serve would export nothing.
    #[error("give --bucket-url-template (e.g. file:///data/{{bucket}}, s3://{{bucket}}) and/or --table-url-template (e.g. s3://lake/{{dataset}}/{{table}}): where the project's buckets and tables are; serve does not write to a local folder it was not given")]
    NoTemplates,
}

/// A URL with `{name}` placeholders, checked once at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    text: String,
}

impl UrlTemplate {
    /// The template as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Parse `text`: braces balanced, every placeholder in `allowed`, at least one of `allowed`
    /// used (a constant template would send every subscription to the same place).
    pub fn parse(
        flag: &'static str,
        text: &str,
        allowed: &[&'static str],
        what: &'static str,
    ) -> Result<UrlTemplate, TemplateError> {
        let mut used = 0;
        let mut rest = text;
        let mut pos = 0;
        while let Some(i) = rest.find(['{', '}']) {
            if rest.as_bytes()[i] == b'}' {
                return Err(TemplateError::Brace {
                    flag,
                    template: text.into(),
                    position: pos + i,
                });
            }
            let close = rest[i..].find('}').ok_or(TemplateError::Brace {
                flag,
                template: text.into(),
                position: pos + i,
            })?;
            let name = &rest[i + 1..i + close];
            if !allowed.contains(&name) {
                return Err(TemplateError::Unknown {
                    flag,
                    template: text.into(),
                    name: name.into(),
                    allowed: allowed
                        .iter()
                        .map(|a| format!("{{{a}}}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            used += 1;
            pos += i + close + 1;
            rest = &rest[i + close + 1..];
        }
        if used == 0 {
            return Err(TemplateError::Constant {
                flag,
                template: text.into(),
                needed: allowed.first().copied().unwrap_or(""),
                what,
            });
        }
        Ok(UrlTemplate { text: text.into() })
    }

    /// Substitute each `{name}` by its value, percent-encoded outside `A-Z a-z 0-9 - . _ ~` so
    /// a name never adds a path segment or breaks the URL.
    pub fn expand(&self, vars: &[(&str, &str)]) -> String {
        let mut out = self.text.clone();
        for (name, value) in vars {
            out = out.replace(&format!("{{{name}}}"), &encode(value));
        }
        out
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `PROJECT.DATASET.TABLE` or `PROJECT:DATASET.TABLE` (the project may hold a domain:
/// `example.com:proj`) → its three parts.
pub fn split_table(table: &str) -> Result<(String, String, String), TemplateError> {
    let bad = || TemplateError::Table {
        table: table.into(),
    };
    let (project, rest) = match table.rfind(':') {
        Some(i) => (&table[..i], &table[i + 1..]),
        None => {
            let mut parts = table.rsplitn(3, '.');
            let (t, d, p) = (
                parts.next().ok_or_else(bad)?,
                parts.next().ok_or_else(bad)?,
                parts.next().ok_or_else(bad)?,
            );
            if [p, d, t].iter().any(|s| s.is_empty()) {
                return Err(bad());
            }
            return Ok((p.into(), d.into(), t.into()));
        }
    };
    let (dataset, t) = rest.split_once('.').ok_or_else(bad)?;
    if [project, dataset, t].iter().any(|s| s.is_empty()) || t.contains('.') {
        return Err(bad());
    }
    Ok((project.into(), dataset.into(), t.into()))
}

/// Where discovered subscriptions write: the two templates (either may be absent: subscriptions
/// of that kind are then not exported) and the schema folder.
#[derive(Debug, Clone)]
pub struct Targets {
    pub bucket_url: Option<UrlTemplate>,
    pub table_url: Option<UrlTemplate>,
    /// `--table-schemas DIR`: `PROJECT.DATASET.TABLE.json` files in BigQuery's JSON schema format.
    pub table_schemas: Option<PathBuf>,
}

/// Where one subscription writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Bucket {
        url: String,
    },
    Table {
        url: String,
        /// The table's schema file, when `--table-schemas` has one for it.
        schema: Option<PathBuf>,
    },
}

impl Targets {
    pub const BUCKET_FLAG: &'static str = "--bucket-url-template";
    pub const TABLE_FLAG: &'static str = "--table-url-template";

    /// Parse the two templates (`file:///data/{bucket}`, `s3://{bucket}`;
    /// `s3://lake/{project}/{dataset}/{table}`).
    pub fn new(
        bucket_url: &str,
        table_url: &str,
        table_schemas: Option<PathBuf>,
    ) -> Result<Targets, TemplateError> {
        Self::from_flags(Some(bucket_url), Some(table_url), table_schemas)
    }

    /// The templates as given on the command line: at least one of them
    /// ([`TemplateError::NoTemplates`] otherwise); there is no local default.
    pub fn from_flags(
        bucket_url: Option<&str>,
        table_url: Option<&str>,
        table_schemas: Option<PathBuf>,
    ) -> Result<Targets, TemplateError> {
        if bucket_url.is_none() && table_url.is_none() {
            return Err(TemplateError::NoTemplates);
        }
        Ok(Targets {
            bucket_url: bucket_url
                .map(|t| UrlTemplate::parse(Self::BUCKET_FLAG, t, &["bucket"], "bucket"))
                .transpose()?,
            table_url: table_url
                .map(|t| {
                    UrlTemplate::parse(
                        Self::TABLE_FLAG,
                        t,
                        &["table", "dataset", "project"],
                        "table",
                    )
                })
                .transpose()?,
            table_schemas,
        })
    }

    /// The destination of a validated subscription.
    pub fn target(&self, sub: &ValidSubscription) -> Result<Target, TemplateError> {
        if let Some(bq) = &sub.bigquery {
            let (project, dataset, table) = split_table(&bq.table)?;
            let template = self.table_url.as_ref().ok_or(TemplateError::NoTemplate {
                flag: Self::TABLE_FLAG,
                what: "BigQuery",
            })?;
            let url = template.expand(&[
                ("project", &project),
                ("dataset", &dataset),
                ("table", &table),
            ]);
            let schema = self
                .table_schemas
                .as_ref()
                .map(|d| d.join(format!("{project}.{dataset}.{table}.json")))
                .filter(|p| p.is_file());
            return Ok(Target::Table { url, schema });
        }
        let bucket = sub
            .storage
            .as_ref()
            .map(|s| s.bucket.as_str())
            .unwrap_or_default();
        let template = self.bucket_url.as_ref().ok_or(TemplateError::NoTemplate {
            flag: Self::BUCKET_FLAG,
            what: "Cloud Storage",
        })?;
        Ok(Target::Bucket {
            url: template.expand(&[("bucket", bucket)]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_and_reject_mistakes() {
        let t = Targets::new(
            "s3://{bucket}",
            "file:///lake/{project}/{dataset}/{table}",
            None,
        )
        .unwrap();
        assert_eq!(
            t.bucket_url
                .as_ref()
                .unwrap()
                .expand(&[("bucket", "my-bkt")]),
            "s3://my-bkt"
        );
        assert_eq!(
            t.table_url.as_ref().unwrap().expand(&[
                ("project", "p"),
                ("dataset", "d"),
                ("table", "events/x y")
            ]),
            "file:///lake/p/d/events%2Fx%20y"
        );
        assert!(matches!(
            UrlTemplate::parse(
                "--bucket-url-template",
                "s3://{bukket}",
                &["bucket"],
                "bucket"
            ),
            Err(TemplateError::Unknown { .. })
        ));
        assert!(matches!(
            UrlTemplate::parse(
                "--bucket-url-template",
                "s3://{bucket",
                &["bucket"],
                "bucket"
            ),
            Err(TemplateError::Brace { position: 5, .. })
        ));
        let e = UrlTemplate::parse("--bucket-url-template", "s3://one", &["bucket"], "bucket")
            .unwrap_err();
        assert!(e.to_string().contains("never uses bucket"), "{e}");
    }

    #[test]
    fn table_names_split_in_both_forms() {
        let t = |s: &str| split_table(s).map(|(p, d, t)| format!("{p}|{d}|{t}"));
        assert_eq!(t("proj.ds.events").unwrap(), "proj|ds|events");
        assert_eq!(t("proj:ds.events").unwrap(), "proj|ds|events");
        assert_eq!(
            t("example.com:proj:ds.events").unwrap(),
            "example.com:proj|ds|events"
        );
        assert!(t("ds.events").is_err());
        assert!(t("proj:ds").is_err());
        assert!(t("a..b").is_err());
    }
}
