//! `stallscope fleet deep-dive`: one synchronized deep dive of a serving group, carried by
//! Alertmanager. It posts an alert naming the group to Alertmanager's API; Alertmanager routes
//! it to every node's webhook (`POST /api/v1/alertmanager`), and each node's daemon starts its
//! capture at the alert's start plus its `[fleet] lead`, the same wall-clock instant for all.

use std::{net::ToSocketAddrs, time::Duration};

use anyhow::{bail, Context, Result};
use serde_json::json;

#[derive(Debug, clap::Subcommand)]
pub enum FleetCommand {
    /// Ask every node of a serving group for one deep dive at a common instant, through
    /// Alertmanager (its route must send the group's alerts to each node's webhook).
    DeepDive(DeepDiveArgs),
}

#[derive(Debug, clap::Args)]
pub struct DeepDiveArgs {
    /// The serving group (the value of the group label the daemons' [fleet] group matches).
    #[arg(long)]
    pub group: String,
    /// Alertmanager's base URL, http://HOST:9093.
    #[arg(long)]
    pub alertmanager: String,
    /// The alert label that names a serving group ([fleet] group_label).
    #[arg(long, default_value = "serving_group")]
    pub group_label: String,
    /// The alert's name.
    #[arg(long, default_value = "StallscopeDeepDive")]
    pub alertname: String,
    /// How long the alert stays active (Alertmanager resolves it after).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub active_for: Duration,
}

pub fn run(cmd: &FleetCommand) -> Result<()> {
    match cmd {
        FleetCommand::DeepDive(a) => deep_dive(a),
    }
}

fn deep_dive(a: &DeepDiveArgs) -> Result<()> {
    let Some((authority, "" | "/")) = sys_util::http::split_url(&a.alertmanager) else {
        bail!(
            "--alertmanager {:?} is not Alertmanager's base URL: write it as http://HOST:9093",
            a.alertmanager
        );
    };
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))?;
    let now = std::time::SystemTime::now();
    let alert = json!([{
        "labels": {"alertname": a.alertname, a.group_label.as_str(): a.group},
        "annotations": {"summary": format!("stallscope fleet deep-dive of group {}", a.group)},
        "startsAt": humantime::format_rfc3339_nanos(now).to_string(),
        "endsAt": humantime::format_rfc3339_nanos(now + a.active_for).to_string(),
    }]);
    let r = sys_util::http::request_to(
        addr,
        "POST",
        "/api/v2/alerts",
        "Content-Type: application/json\r\n",
        &alert.to_string(),
        Duration::from_secs(10),
    )
    .with_context(|| format!("posting the alert to Alertmanager at {}", a.alertmanager))?;
    if r.status != 200 {
        bail!(
            "Alertmanager at {} refused the alert (HTTP {}): {}",
            a.alertmanager,
            r.status,
            r.body.trim()
        );
    }
    println!(
        "{}",
        json!({
            "group": a.group,
            "alert": a.alertname,
            "starts_at": humantime::format_rfc3339_nanos(now).to_string(),
            "note": "each node of the group captures from starts_at plus its [fleet] lead",
        })
    );
    Ok(())
}
