//! `subsink validate`: the subscription's own rules, and — given the table's schema — the table
//! writer's startup checks (modes, the topic schema, change data capture), without writing.

use std::path::PathBuf;

use clap::{Args, Parser};

use super::destination::{schema_file, with_primary_key, WriterArgs};
use super::heading;
use super::subscription::SubscriptionArgs;
use crate::config::ValidSubscription;
use crate::sink::registry::{table_sink, DISCARD};

/// `subsink validate`'s flags.
#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub subscription: SubscriptionArgs,
    /// A bigqueryConfig's table schema (BigQuery JSON schema or table resource): also run the
    /// table writer's startup checks against it (modes, metadata columns, change data capture).
    #[arg(long, value_name = "FILE.json", help_heading = heading::TABLES)]
    pub table_schema: Option<PathBuf>,
    /// The table's primary key (as `run`), checked with --table-schema.
    #[arg(long, value_name = "COL[,COL]", value_delimiter = ',', help_heading = heading::TABLES)]
    pub table_primary_key: Vec<String>,
    /// A Delta table's partitioning (as `run`), checked with --table-schema.
    #[arg(long, value_name = "COL|UNIT(COL)[,…]", value_delimiter = ',', help_heading = heading::TABLES)]
    pub table_partition_by: Vec<String>,
    /// The topic's Avro schema (.avsc), for useTopicSchema, checked with --table-schema.
    #[arg(long, value_name = "FILE.avsc", help_heading = heading::TABLES)]
    pub topic_schema: Option<PathBuf>,
}

/// `run`'s writer flags at their defaults.
#[derive(Parser)]
struct Defaults {
    #[command(flatten)]
    writer: WriterArgs,
}

impl ValidateArgs {
    /// The subscription, checked; with `--table-schema`, the table mapping checked as `run` does.
    pub fn check(&self) -> Result<ValidSubscription, String> {
        let sub = self.subscription.load().map_err(|e| e.to_string())?;
        let given: Vec<&str> = [
            ("--table-schema", self.table_schema.is_some()),
            ("--table-primary-key", !self.table_primary_key.is_empty()),
            ("--table-partition-by", !self.table_partition_by.is_empty()),
            ("--topic-schema", self.topic_schema.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, on)| on.then_some(flag))
        .collect();
        if given.is_empty() {
            return Ok(sub);
        }
        if sub.bigquery.is_none() {
            return Err(format!(
                "{}: checks a bigqueryConfig's table; subscription {} has none",
                given.join(", "),
                sub.name
            ));
        }
        let schema = self.table_schema.as_deref().map(schema_file).transpose()?;
        let schema = with_primary_key(schema, &self.table_primary_key)?;
        if schema.is_none() {
            // Only these are left (--table-primary-key without a schema is refused above).
            return Err(format!(
                "{}: checked against the table's columns: give the table's schema with --table-schema too",
                given.join(", ")
            ));
        }
        let mut opts = Defaults::parse_from(["subsink"])
            .writer
            .options(self.topic_schema.clone());
        opts.partition_by = self.table_partition_by.clone();
        table_sink(&sub, DISCARD, schema, "--table-schema FILE.json", &opts)?;
        Ok(sub)
    }
}
