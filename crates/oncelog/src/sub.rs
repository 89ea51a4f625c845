//! `oncelog sub create | get | delete | list | link | unlink`: the subscription API (protocol
//! sections 6 and 7) from the command line, built on `oncelog_client::Subscriptions`. Errors are
//! the server's (`code` and `message`), exit status 1 like every client subcommand.

use std::time::Duration;

use oncelog_client::SubscriptionConfig;

use crate::commands::CliError;
use crate::conn::Conn;

#[derive(clap::Subcommand)]
pub enum SubCommand {
    /// Create a subscription, or confirm one with exactly this configuration exists; prints it
    /// as JSON, then `created` or `existing`. Another configuration under the ID is refused (409).
    Create(CreateArgs),
    /// Print a subscription as JSON: its configuration, generation, status and linked streams
    /// with their acknowledged and tail offsets.
    Get(IdArgs),
    /// Delete a subscription (its streams are untouched).
    Delete(IdArgs),
    /// One line per subscription: id, type, pattern (`-` for none) and generation, tab-separated.
    List(ListArgs),
    /// Link more streams to a subscription by name (at their current tails).
    Link(LinkArgs),
    /// Remove the explicit link of one stream.
    Unlink(UnlinkArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("streams").args(["pattern", "stream"]).required(true).multiple(true)))]
#[command(group(clap::ArgGroup::new("delivery").args(["webhook_url", "wake_stream"]).required(true)))]
pub struct CreateArgs {
    #[command(flatten)]
    conn: Conn,
    /// Subscription id.
    id: String,
    /// Link every stream whose path matches, existing or created later (`*` one path segment,
    /// `**` any number).
    #[arg(long)]
    pattern: Option<String>,
    /// Link this stream by name (repeatable).
    #[arg(long, value_name = "PATH")]
    stream: Vec<String>,
    /// Announce work with signed POSTs to this URL.
    #[arg(long, value_name = "URL")]
    webhook_url: Option<String>,
    /// Pull-wake: announce work as events on this JSON stream; workers claim it.
    #[arg(long, value_name = "PATH")]
    wake_stream: Option<String>,
    /// How long a claim or webhook delivery holds the work without an ack: a number with s, m,
    /// h or d. Without it, the server's default (30s).
    #[arg(long, value_parser = crate::token::parse_duration)]
    lease_ttl: Option<Duration>,
    /// Free text kept with the subscription.
    #[arg(long)]
    description: Option<String>,

    /// Path prefix transactional commits may write under (repeatable); with access control on,
    /// commits may only write there.
    #[arg(long = "output")]
    outputs: Vec<String>,
}

/// A subcommand that only names a subscription.
#[derive(clap::Args)]
pub struct IdArgs {
    #[command(flatten)]
    conn: Conn,
    /// Subscription id.
    id: String,
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    conn: Conn,
}

#[derive(clap::Args)]
pub struct LinkArgs {
    #[command(flatten)]
    conn: Conn,
    /// Subscription id.
    id: String,
    /// Streams to link (their paths under the URL).
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(clap::Args)]
pub struct UnlinkArgs {
    #[command(flatten)]
    conn: Conn,
    /// Subscription id.
    id: String,
    /// The stream to unlink.
    path: String,
}

fn print_json(v: &serde_json::Value) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(v).map_err(|e| CliError::Io(e.into()))?);
    Ok(())
}

pub async fn run(cmd: SubCommand) -> Result<(), CliError> {
    match cmd {
        SubCommand::Create(a) => create(a).await,
        SubCommand::Get(a) => print_json(&a.conn.client(None)?.subscriptions().get(&a.id).await?.raw),
        SubCommand::Delete(a) => Ok(a.conn.client(None)?.subscriptions().delete(&a.id).await?),
        SubCommand::List(a) => list(a).await,
        SubCommand::Link(a) => {
            let paths: Vec<&str> = a.paths.iter().map(String::as_str).collect();
            Ok(a.conn.client(None)?.subscriptions().add_streams(&a.id, &paths).await?)
        }
        SubCommand::Unlink(a) => Ok(a.conn.client(None)?.subscriptions().remove_stream(&a.id, &a.path).await?),
    }
}

async fn create(a: CreateArgs) -> Result<(), CliError> {
    let mut config = match (a.webhook_url, a.wake_stream) {
        (Some(url), None) => SubscriptionConfig::webhook(url),
        (None, Some(wake)) => SubscriptionConfig::pull_wake(wake),
        // clap's `delivery` group: exactly one of them.
        _ => return Err(CliError::OneDelivery),
    };
    if let Some(p) = a.pattern {
        config = config.pattern(p);
    }
    for s in a.stream {
        config = config.stream(s);
    }
    if let Some(t) = a.lease_ttl {
        config = config.lease_ttl(t);
    }
    config.description = a.description;
    config.outputs = a.outputs;
    let (created, info) = a.conn.client(None)?.subscriptions().put(&a.id, &config).await?;
    print_json(&info.raw)?;
    println!("{}", if created { "created" } else { "existing" });
    Ok(())
}

async fn list(a: ListArgs) -> Result<(), CliError> {
    use std::io::Write;
    let subs = a.conn.client(None)?.subscriptions().list().await?;
    let mut out = std::io::stdout().lock();
    for s in subs {
        let field = |k: &str| match &s[k] {
            serde_json::Value::String(v) => v.clone(),
            serde_json::Value::Null => "-".to_owned(),
            v => v.to_string(),
        };
        writeln!(out, "{}\t{}\t{}\t{}", field("id"), field("type"), field("pattern"), field("generation"))?;
    }
    out.flush()?;
    Ok(())
}
