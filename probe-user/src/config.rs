//! Daemon configuration: an embedded default (`config/default.toml`) or a user file.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use serde::Deserialize;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

/// The daemon's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// What to watch.
    pub watch: WatchConfig,
    /// Periodic logging.
    pub report: ReportConfig,
}

/// What the daemon watches.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    /// Explicit pids.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Substrings of comm or cmdline that select processes automatically.
    #[serde(default)]
    pub process_patterns: Vec<String>,
    /// Rescan period for `process_patterns`.
    #[serde(with = "humantime_serde_compat")]
    pub rescan_interval: Duration,
}

/// Periodic logging.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// Period of the per-thread accounting log.
    #[serde(with = "humantime_serde_compat")]
    pub interval: Duration,
}

impl Config {
    /// Parses a configuration document; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        toml::from_str(text).with_context(|| format!("invalid configuration in {origin}"))
    }

    /// The embedded default, or the file at `path`.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        match path {
            None => Self::parse(DEFAULT_CONFIG, "the embedded default configuration"),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read configuration file {}", p.display()))?;
                Self::parse(&text, &p.display().to_string())
            }
        }
    }
}

/// Durations written like `2s` or `500ms`.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_parses() {
        let c = Config::load(None).unwrap();
        assert!(c
            .watch
            .process_patterns
            .iter()
            .any(|p| p.contains("EngineCore")));
        assert_eq!(c.report.interval, Duration::from_secs(10));
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_rejected() {
        let bad = DEFAULT_CONFIG.replace("interval = \"10s\"", "interval = \"ten\"");
        assert!(Config::parse(&bad, "x").is_err());
        let extra = format!("{DEFAULT_CONFIG}\n[nonsense]\nx = 1\n");
        assert!(Config::parse(&extra, "x").is_err());
    }
}
