//! The command line's flags, as clap `Args` structs the binary flattens into its subcommands, and
//! what they build: the subscription, the writer's options, the process's resources. A source's
//! flags live with the source ([`crate::registry`] gathers them); flags are parsed into typed
//! values by clap ([`values`]) and checked once, before anything starts (exit 2).
//!
//! `subsink run -h` groups the flags under the headings below. Every flag can also be given by
//! an environment variable, `SUBSINK_<FLAG>` ([`env`]).

pub mod destination;
pub mod env;
pub mod subscription;
pub mod transforms;
pub mod validate;
pub mod values;

use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::config::LimitsMode;
use crate::resources::Resources;

/// Help headings, one spelling for every struct that uses them.
pub mod heading {
    pub const SOURCE: &str = "Source";
    pub const DESTINATION: &str = "Destination";
    pub const BATCHING: &str = "Batching";
    pub const PUBSUB: &str = "Pub/Sub";
    pub const NATS: &str = "NATS";
    pub const PUSH: &str = "Push";
    pub const TABLES: &str = "Tables and BigQuery";
    pub const DELIVERY: &str = "Delivery and retries";
    pub const OPERATING: &str = "Operating";
}

/// `--limits`: Pub/Sub's numeric limits enforced exactly or lifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LimitsArg {
    Pubsub,
    Extended,
}

impl From<LimitsArg> for LimitsMode {
    fn from(l: LimitsArg) -> LimitsMode {
        match l {
            LimitsArg::Pubsub => LimitsMode::Pubsub,
            LimitsArg::Extended => LimitsMode::Extended,
        }
    }
}

/// Flags of the process: the shared upload slots and memory budget, shutdown, telemetry (`run` and
/// `serve`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::OPERATING)]
pub struct ServiceArgs {
    /// Bytes the open files and the files being uploaded may hold in memory, over every
    /// subscription of the process; near it the largest open file is finalized early (reason
    /// `memory`). `0` or `none`: no budget beyond the file limits.
    #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = values::size_or_none)]
    pub memory_limit: values::SizeLimit,
    /// On SIGTERM / SIGINT: how long finalizing and uploading open files may take.
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = values::duration)]
    pub shutdown_grace: Duration,
    /// Finalized files being made durable at once, over every subscription of the process.
    #[arg(long, default_value_t = 2)]
    pub max_concurrent_uploads: usize,
    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on HOST:PORT
    /// (e.g. 0.0.0.0:9090).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
}

impl ServiceArgs {
    /// The process's upload slots and memory budget (`--max-concurrent-uploads`, `--memory-limit`).
    pub fn resources(&self) -> Resources {
        Resources::new(self.max_concurrent_uploads, self.memory_limit.0)
    }
}
