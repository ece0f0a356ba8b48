//! Network delay: netem on loopback for the engine's API port only.

use std::{process::Command, sync::atomic::AtomicBool, time::Instant};

use anyhow::{bail, Context, Result};

use crate::{hold, Onset, Params};

/// Largest delay (at intensity 1).
const MAX_DELAY_MS: f64 = 50.0;
/// Largest loss (at intensity 1), percent.
const MAX_LOSS_PCT: f64 = 2.0;

fn tc(args: &[&str]) -> Result<String> {
    let out = Command::new("tc")
        .args(args)
        .output()
        .context("cannot run tc (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "tc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The qdiscs on loopback, removed on drop.
struct LoopbackQdisc;

impl Drop for LoopbackQdisc {
    fn drop(&mut self) {
        let _ = tc(&["qdisc", "del", "dev", "lo", "root"]);
    }
}

/// A prio qdisc on `lo` whose third band is netem; u32 filters send only packets from or to
/// the API port there. Refuses to run if `lo` already has a root qdisc of someone else's.
pub fn delay(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let port = p
        .port
        .context("network-delay needs the engine's API port: give it with --port")?
        .to_string();
    let existing = tc(&["qdisc", "show", "dev", "lo"])?;
    if existing
        .lines()
        .any(|l| l.contains(" root ") && !l.starts_with("qdisc noqueue"))
    {
        bail!(
            "loopback already has a root qdisc ({}): not touching it",
            existing.trim()
        );
    }
    let delay = format!("{:.1}ms", MAX_DELAY_MS * p.intensity);
    let loss = format!("{:.2}%", MAX_LOSS_PCT * p.intensity);
    let deadline = Instant::now() + p.duration;
    tc(&[
        "qdisc", "add", "dev", "lo", "root", "handle", "1:", "prio", "bands", "3", "priomap", "1",
        "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1",
    ])
    .context("the prio qdisc for netem is not available (modprobe sch_prio sch_netem)")?;
    let guard = LoopbackQdisc;
    tc(&[
        "qdisc", "add", "dev", "lo", "parent", "1:3", "handle", "30:", "netem", "delay", &delay,
        "loss", &loss,
    ])
    .context("netem is not available (modprobe sch_netem)")?;
    for dir in ["sport", "dport"] {
        tc(&[
            "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", dir, &port, "0xffff", "flowid", "1:3",
        ])?;
    }
    onset.now();
    hold(deadline, stop);
    drop(guard);
    Ok(format!(
        "netem delay {delay} loss {loss} on lo for port {port} only, removed after"
    ))
}
