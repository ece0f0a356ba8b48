//! `stallscope fleet deep-dive`: one synchronized deep dive of a serving group, carried by
//! Alertmanager. It posts an alert naming the group to Alertmanager's API; Alertmanager routes
//! it to every node's webhook (`POST /api/v1/alertmanager`), and each node's daemon starts its
//! capture at the alert's start plus its `[fleet] lead`, the same wall-clock instant for all.
//!
//! `stallscope fleet merge`: the group's deep dive from the shared store, as one Perfetto
//! trace of every node (a process group per node) and the group's index.

use std::{net::ToSocketAddrs, time::Duration};

use anyhow::{bail, Context, Result};
use perfetto_writer::merge::{self, Part};
use serde_json::json;

use crate::fleet::{index::group_dir, store::Store, upload::rebuild_index};

#[derive(Debug, clap::Subcommand)]
pub enum FleetCommand {
    /// Ask every node of a serving group for one deep dive at a common instant, through
    /// Alertmanager (its route must send the group's alerts to each node's webhook).
    DeepDive(DeepDiveArgs),
    /// Merge a serving group's deep dive from the shared store ([store] of the configuration)
    /// into one Perfetto trace, a process group per node on one wall-clock time line; rebuild
    /// and print the group's index (JSON).
    Merge(MergeArgs),
}

#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The configuration file whose [store] names the store (as `stallscope run --config`).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// The serving group.
    #[arg(long)]
    pub group: String,
    /// The group deep dive's instant (ns since the epoch, as in the index); default: the
    /// group's latest.
    #[arg(long)]
    pub instant: Option<u64>,
    /// Where the merged trace goes.
    #[arg(long, short)]
    pub out: std::path::PathBuf,
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
        FleetCommand::Merge(a) => merge(a),
    }
}

fn merge(a: &MergeArgs) -> Result<()> {
    let cfg = crate::config::Config::load(a.config.as_deref())?;
    if cfg.store.endpoint.is_empty() {
        bail!("no store to merge from: set [store] endpoint and bucket in the file given with --config");
    }
    let store = Store::open(&cfg.store)?;
    let instant = match a.instant {
        Some(t) => t,
        None => {
            let prefix = format!("groups/{}/", a.group);
            store
                .list(&prefix)?
                .iter()
                .filter_map(|k| {
                    k.strip_prefix(&prefix)?
                        .split('/')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .max()
                .with_context(|| {
                    format!(
                        "the store has no deep dive of group {:?} (under {})",
                        a.group,
                        store.key(&prefix)
                    )
                })?
        }
    };
    let index = rebuild_index(&store, &a.group, instant)?;
    if index.nodes.is_empty() {
        bail!(
            "the store has no node's entry for group {:?} at instant {instant}",
            a.group
        );
    }
    let traces: Vec<Vec<u8>> = index
        .nodes
        .iter()
        .map(|n| store.get(&n.trace))
        .collect::<Result<_>>()?;
    let parts: Vec<Part> = index
        .nodes
        .iter()
        .zip(&traces)
        .map(|(n, t)| Part {
            name: &n.node,
            trace: t,
        })
        .collect();
    let out = std::fs::File::create(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let merged = merge::merge(&parts, std::io::BufWriter::new(out))
        .map_err(|e| anyhow::anyhow!("merging the nodes' traces: {e}"))?;
    let mut doc = serde_json::to_value(&index)?;
    doc["merged_trace"] = json!(a.out.display().to_string());
    doc["merged_events"] = json!(merged.events);
    doc["index_key"] = json!(store.key(&format!("{}/index.json", group_dir(&a.group, instant))));
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
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
