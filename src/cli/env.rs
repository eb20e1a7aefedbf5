//! Every flag from an environment variable, as containers are configured: `--table-url` from
//! `SUBSINK_TABLE_URL`, `--max-concurrent-uploads` from `SUBSINK_MAX_CONCURRENT_UPLOADS` — the
//! flag's long name in upper snake case after `SUBSINK_`. Set once over the built command
//! ([`with_env`]), not on each flag's attribute, so a new flag gets its variable without a line
//! of its own. The command line wins over the variable; a variable counts as the flag given (a
//! flag it conflicts with is refused as on the command line). A switch takes `true`/`false`
//! (also `yes`/`no`, `on`/`off`, `1`/`0`); a repeatable flag takes one value from its variable.
//! Values are never shown: `--help` names each variable, not what it holds (flags such as
//! `--kafka-option` may carry secrets).

use clap::{Arg, Command};

/// What every variable name starts with.
pub const PREFIX: &str = "SUBSINK_";

/// Variables that are not flags and must never become one: the binary's own (`SUBSINK_LOG`,
/// `SUBSINK_GOOGLE_AUTH`, `SUBSINK_FSYNC`) and those that swap what the tests run, which CI
/// refuses (`scripts/test`'s `SWAPS`): a flag mapped to one would make CI refuse a deployment's
/// setting, or a developer's swap change a flag.
pub const RESERVED: &[&str] = &[
    "SUBSINK_LOG",
    "SUBSINK_GOOGLE_AUTH",
    "SUBSINK_BIN",
    "SUBSINK_KAFKA_BROKER",
    "SUBSINK_PUBSUB_EMULATOR",
    "SUBSINK_VENV",
    "SUBSINK_TOOLS",
    "SUBSINK_REGEN_GOLDEN",
    "SUBSINK_KAFKA_EXACT_RECORDS",
    "SUBSINK_SPOOL_KILL_MESSAGES",
    "SUBSINK_MEMORY_SMALL",
    "SUBSINK_FSYNC",
];

/// The variable of the flag `--long`: `table-url` → `SUBSINK_TABLE_URL`.
pub fn variable(long: &str) -> String {
    format!("{PREFIX}{}", long.replace('-', "_").to_ascii_uppercase())
}

/// `cmd` with every flag (an argument with a long name) of it and of its subcommands, at every
/// depth, read from its [`variable`] when the command line lacks it; values hidden in help.
pub fn with_env(cmd: Command) -> Command {
    cmd.mut_args(flag_env).mut_subcommands(with_env)
}

fn flag_env(arg: Arg) -> Arg {
    match arg.get_long().map(variable) {
        Some(name) => arg.env(name).hide_env_values(true),
        None => arg,
    }
}

/// clap's refusal of a value, naming the variable it came from when the flag was not on the
/// command line `argv` but its variable is set (clap names only the flag).
pub fn name_variable(e: clap::Error, argv: &[String]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let Some(long) = arg
        .strip_prefix("--")
        .and_then(|a| a.split([' ', '=']).next())
    else {
        return e;
    };
    let var = variable(long);
    let flag = format!("--{long}");
    let given = argv
        .iter()
        .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
    if given || std::env::var_os(&var).is_none() {
        return e;
    }
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    clap::Error::raw(e.kind(), format!("{first} (from {var})\n{rest}"))
}

/// Every (variable, flag) pair of `cmd` and its subcommands, `subcommand --flag` named in full.
pub fn variables(cmd: &Command) -> Vec<(String, String)> {
    let mut out = Vec::new();
    collect(cmd, "", &mut out);
    out
}

fn collect(cmd: &Command, path: &str, out: &mut Vec<(String, String)>) {
    for a in cmd.get_arguments() {
        if let (Some(env), Some(long)) = (a.get_env(), a.get_long()) {
            out.push((
                env.to_string_lossy().into_owned(),
                format!("{path}--{long}"),
            ));
        }
    }
    for sub in cmd.get_subcommands() {
        collect(sub, &format!("{path}{} ", sub.get_name()), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_long_flag_in_upper_snake_case() {
        assert_eq!(variable("table-url"), "SUBSINK_TABLE_URL");
        assert_eq!(variable("log-format"), "SUBSINK_LOG_FORMAT");
        let cmd = with_env(
            Command::new("t")
                .arg(Arg::new("a").long("max-line-bytes"))
                .arg(Arg::new("p"))
                .subcommand(Command::new("s").arg(Arg::new("b").long("bucket-url"))),
        );
        assert_eq!(
            variables(&cmd),
            vec![
                ("SUBSINK_MAX_LINE_BYTES".into(), "--max-line-bytes".into()),
                ("SUBSINK_BUCKET_URL".into(), "s --bucket-url".into()),
            ]
        );
    }
}
