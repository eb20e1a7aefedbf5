//! The registration point of sources. Each source's folder implements [`Register`] (the
//! `--source` values it takes, its flags, the [`SourceSpec`] they make) and [`Connect`] (its
//! constructor); the list below names each source once. From it come every source's flags
//! ([`SourceArgs`], each source's own `Args` flattened under its heading), the one check of their
//! compatibility ([`SourceArgs::spec`], errors [`FlagsError`], exit 2) and [`connect`].
//!
//! Adding a source: a folder under `source/` implementing both traits, its `pub mod` line in
//! `source/mod.rs`, and its line in the list.

use clap::Args;

pub use crate::connect::{
    Connect, FlagsError, Register, SharedFlags, SourceError, SourceSpec, SourceValue,
};
pub use crate::source::pubsub::PubsubArgs;

use crate::cli::heading;
use crate::config::ValidSubscription;
use crate::connect::{Connected, Context, Entry};
use crate::receipt::PositionedSource;
use crate::source;

/// Every source, in the order of their flags in `--help`; a `--source` value goes to the first
/// that claims it.
macro_rules! sources {
    ($($field:ident: $source:ty,)*) => {
        /// Every source's flags (`subsink run`).
        #[derive(Debug, Clone, Args)]
        #[command(next_help_heading = heading::SOURCE)]
        pub struct SourceArgs {
            /// Where messages come from: the help is each source's own ([`Register::HELP`]).
            #[arg(long, default_value = "-", value_parser = |v: &str| SourceValue::parse(v, REGISTERED),
                help = SourceValue::help(REGISTERED))]
            pub source: SourceValue,
            $(#[command(flatten)] pub $field: <$source as Register>::Args,)*
        }

        const REGISTERED: &[Entry] = &[$(Entry::of::<$source>(stringify!($field)),)*];

        /// How refusals of `--exactly-once` name the sources whose messages carry a position.
        pub const POSITIONED: PositionedSource =
            Entry::positioned(&[$(<$source as Register>::POSITIONED,)*]);

        impl SourceArgs {
            /// The named source's spec, after the flags of every other source were found unused.
            fn dispatch(&self, shared: &SharedFlags<'_>) -> Result<SourceSpec, FlagsError> {
                let named = self.source.entry().name;
                $(if named != stringify!($field) {
                    if let Some(e) = <$source as Register>::misplaced(&self.$field) {
                        return Err(e);
                    }
                })*
                self.shared_rules(shared)?;
                $(if named == stringify!($field) {
                    return <$source as Register>::spec(&self.source.value, &self.$field, shared);
                })*
                unreachable!("{named} is registered")
            }
        }
    };
}

sources! {
    file: source::file::build::File,
    pubsub: source::pubsub::build::Pubsub,
    nats: source::nats::build::Nats,
    kafka: source::kafka::build::Kafka,
    push: source::push::build::Push,
    archive: source::archive::build::Archive,
    memory: source::memory::Memory,
}

impl SourceArgs {
    /// The source the flags name, for `sub`: every compatibility rule of the source flags, checked
    /// here and only here. `default_publish_time_micros`: `publishTime` for input lines without one
    /// (`--fixed-time`).
    pub fn spec(
        &self,
        sub: &ValidSubscription,
        default_publish_time_micros: Option<i64>,
    ) -> Result<SourceSpec, FlagsError> {
        let shared = SharedFlags {
            subscription: sub,
            checkpoint: self.file.checkpoint.clone(),
            dead_letter: self.file.dead_letter.clone(),
            on_bad_input: self.file.on_bad_input,
            max_outstanding_messages: self.pubsub.max_outstanding_messages,
            max_outstanding_bytes: self.pubsub.max_outstanding_bytes,
            default_publish_time_micros,
        };
        let entry = self.source.entry();
        if shared.dead_letter.is_some() && sub.bigquery.is_none() && !entry.dead_letter_any_writer {
            return Err(FlagsError::DeadLetterNeedsTable);
        }
        self.dispatch(&shared)
    }

    /// The rules of the shared flags that hold for every source.
    fn shared_rules(&self, shared: &SharedFlags<'_>) -> Result<(), FlagsError> {
        match (self.source.entry().keeper, &shared.checkpoint) {
            (Some(keeper), Some(_)) => Err(FlagsError::CheckpointOnBroker { keeper }),
            _ => Ok(()),
        }
    }
}

/// The source of `spec` and its settle side, from the source's constructor (`build.rs` in its
/// folder), which also holds it to the process's memory budget.
pub async fn connect(spec: SourceSpec, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    spec.connect(ctx).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        source: SourceArgs,
    }

    /// A subscription with a `bigqueryConfig` (`table`) or a `cloudStorageConfig`.
    fn subscription(table: bool) -> ValidSubscription {
        let config = match table {
            true => r#""bigqueryConfig": {"table": "proj.ds.tbl"}"#,
            false => r#""cloudStorageConfig": {"bucket": "bkt", "maxDuration": "60s"}"#,
        };
        let json = format!(
            r#"{{"name": "projects/proj/subscriptions/sub", "topic": "projects/proj/topics/top",
                "ackDeadlineSeconds": 600, {config}}}"#
        );
        let r = crate::config::Subscription::from_str_any(&json, "test").unwrap();
        crate::config::validate(&r, None).unwrap()
    }

    fn spec(table: bool, args: &[&str]) -> Result<SourceSpec, FlagsError> {
        let flags =
            Flags::try_parse_from(std::iter::once("subsink").chain(args.iter().copied())).unwrap();
        flags.source.spec(&subscription(table), None)
    }

    /// Every rule, each with its own error (the binary exits 2 for all).
    #[test]
    fn flags_that_do_not_go_together() {
        let nats = [
            "--source",
            "nats://h:4222",
            "--nats-stream",
            "S",
            "--nats-consumer",
            "C",
        ];
        let with = |base: &[&'static str], more: &[&'static str]| -> Vec<&'static str> {
            base.iter().chain(more).copied().collect()
        };
        let cases: Vec<(bool, Vec<&str>, &str)> = vec![
            (
                false,
                vec!["--dead-letter", "dl"],
                "applies to the table writer",
            ),
            (
                true,
                vec![
                    "--source",
                    "push",
                    "--listen",
                    "h:1",
                    "--no-spool",
                    "--dead-letter",
                    "dl",
                ],
                "Pub/Sub dead-letters",
            ),
            (
                true,
                vec!["--source", "pubsub", "--dead-letter", "dl"],
                "Pub/Sub dead-letters",
            ),
            (
                true,
                with(&nats, &["--dead-letter", "dl"]),
                "--nats-dead-letter-subject",
            ),
            (false, vec!["--checkpoint", "cp"], "needs a file source"),
            (
                false,
                vec!["--source", "pubsub", "--checkpoint", "cp"],
                "Pub/Sub keeps",
            ),
            (
                false,
                vec!["--source", "push", "--listen", "h:1", "--checkpoint", "cp"],
                "Pub/Sub keeps",
            ),
            (
                false,
                with(&nats, &["--checkpoint", "cp"]),
                "JetStream keeps",
            ),
            (false, vec!["--nats-consumer", "C"], "need --source nats://"),
            (
                false,
                vec!["--source", "nats://h:4222", "--nats-stream", "S"],
                "give --nats-stream",
            ),
            (false, vec!["--source", "push"], "needs --listen"),
            (
                false,
                vec!["--source", "push", "--listen", "h:1", "--push-jwks", "k"],
                "need --push-audience",
            ),
            (
                false,
                vec!["--source", "pubsub", "--pubsub-streams", "17"],
                "1–16 streams",
            ),
        ];
        for (table, args, want) in cases {
            let e = spec(table, &args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(e.to_string().contains(want), "{args:?}: {e}");
        }
        // The named source's spec: a broker for NATS and Pub/Sub, a file by default.
        let named =
            |args: &[&str]| SourceValue::parse(args.get(1).unwrap_or(&"-"), REGISTERED).unwrap();
        assert!(spec(true, &nats).is_ok_and(|s| s.is_broker()));
        assert_eq!(named(&nats).source(), "nats");
        assert!(spec(false, &["--source", "pubsub"]).is_ok_and(|s| s.is_broker()));
        assert!(spec(false, &[]).is_ok_and(|s| !s.is_broker()));
        assert_eq!(named(&[]).source(), "file");
    }

    #[test]
    fn source_values() {
        let kind = |v: &str| SourceValue::parse(v, REGISTERED).map(|s| (s.source(), s.to_string()));
        assert_eq!(kind("-"), Ok(("file", "stdin".into())));
        assert_eq!(kind("in.ndjson"), Ok(("file", "in.ndjson".into())));
        assert_eq!(kind("pubsub"), Ok(("pubsub", "pubsub".into())));
        assert_eq!(kind("push"), Ok(("push", "push".into())));
        assert_eq!(kind("tls://h:4222"), Ok(("nats", "tls://h:4222".into())));
        assert_eq!(
            kind("s3://bucket/dir/"),
            Ok(("archive", "s3://bucket/dir/".into()))
        );
        assert_eq!(
            kind("kafka://b:9092,c:9092"),
            Ok(("kafka", "kafka://b:9092,c:9092".into()))
        );
        // A password in a URL is never shown.
        assert_eq!(
            kind("nats://u:secret@h:4222"),
            Ok(("nats", "nats://***@h:4222".into()))
        );
        assert!(SourceValue::parse("ftp://x", REGISTERED)
            .unwrap_err()
            .contains("is not a source"));
    }
}
