//! [`RegisterSink`]: how a sink is named by where it writes, implemented in each sink's
//! `register.rs` and asked through the registry's list ([`crate::sink::registry`]).

use crate::config::ValidSubscription;

use super::options::WriterOptions;
use super::spec::SinkSpec;
use super::table::TableSink;

/// How a sink is named by where it writes: each sink's `register.rs` implements it for a unit
/// type. A sink claims nothing by default.
pub trait RegisterSink {
    /// The sink of `--bucket-url url` (a Cloud Storage subscription's objects), if it takes that
    /// URL.
    fn bucket(
        _sub: &ValidSubscription,
        _url: &str,
        _opts: &WriterOptions,
    ) -> Option<Result<SinkSpec, String>> {
        None
    }

    /// The table sink of `--table-url url` (a BigQuery subscription's rows), if it takes that URL:
    /// its own checks of the rows, then its [`SinkSpec`] ([`super::table_sink`] runs the shared ones).
    fn table(_url: &str) -> Option<Box<dyn TableSink>> {
        None
    }
}
