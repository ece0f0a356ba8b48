//! Daemon configuration: an embedded default (`config/default.toml`) or a user file.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use model::{baseline::BaselineParams, detector::DetectorParams, SentinelParams};
use serde::Deserialize;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

/// The daemon's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// What to watch.
    pub watch: WatchConfig,
    /// Kernel accounting period.
    pub report: ReportConfig,
    /// The sentinel.
    pub sentinel: SentinelConfig,
    /// The HTTP listener.
    pub http: HttpConfig,
    /// Where state and logs go.
    pub state: StateConfig,
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
    #[serde(with = "duration_text")]
    pub rescan_interval: Duration,
}

/// Kernel accounting.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// Period at which per-thread accounting is read into the metrics.
    #[serde(with = "duration_text")]
    pub interval: Duration,
}

/// The sentinel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// Substrings of comm or cmdline of engine processes.
    pub engine_patterns: Vec<String>,
    /// `auto` or a profile name.
    pub framework: String,
    /// Extra watch specs (`MODULE:QUALNAME[name=EXPR;...]`): for engines without a profile,
    /// the candidates the anchor is discovered from.
    #[serde(default)]
    pub watch: Vec<String>,
    /// Ring drain period.
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// θmax.
    pub theta_max: f64,
    /// k.
    pub k_sigma: f64,
    /// W.
    pub window: usize,
    /// Consecutive iterations above the UCL before an alert starts.
    pub start_after: usize,
    /// Samples before the first fit.
    pub warmup_samples: usize,
    /// Samples between refits.
    pub refit_every: usize,
    /// Training set cap.
    pub max_training_samples: usize,
    /// Model prefill and mixed iterations too.
    pub alert_on_prefill: bool,
}

impl SentinelConfig {
    /// The parsed `watch` specs.
    pub fn watch_specs(&self) -> Result<Vec<pyframe_tracer::WatchSpec>> {
        self.watch
            .iter()
            .map(|w| {
                w.parse()
                    .map_err(|e| anyhow::anyhow!("sentinel.watch {w:?}: {e}"))
            })
            .collect()
    }

    /// The model crate's parameters.
    pub fn params(&self) -> SentinelParams {
        SentinelParams {
            baseline: BaselineParams {
                k_sigma: self.k_sigma,
                theta_max: self.theta_max,
                ..BaselineParams::default()
            },
            detector: DetectorParams {
                window: self.window,
                start_after: self.start_after,
                ..DetectorParams::default()
            },
            warmup_samples: self.warmup_samples,
            refit_every: self.refit_every,
            max_training_samples: self.max_training_samples,
            alert_on_prefill: self.alert_on_prefill,
        }
    }
}

/// The HTTP listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address and port.
    pub listen: SocketAddr,
}

/// State and logs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Directory of fitted models.
    pub dir: PathBuf,
    /// Alert log (empty: `<dir>/alerts.jsonl`).
    pub alerts_log: PathBuf,
    /// Iteration export (empty: off).
    pub iterations_csv: PathBuf,
}

impl StateConfig {
    /// The alert log's path.
    pub fn alerts_log(&self) -> PathBuf {
        if self.alerts_log.as_os_str().is_empty() {
            self.dir.join("alerts.jsonl")
        } else {
            self.alerts_log.clone()
        }
    }
}

impl Config {
    /// Parses a configuration document; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let c: Config =
            toml::from_str(text).with_context(|| format!("invalid configuration in {origin}"))?;
        c.validate()
            .with_context(|| format!("invalid configuration in {origin}"))?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        let s = &self.sentinel;
        if !(s.theta_max > 0.0 && s.theta_max.is_finite()) {
            bail!("sentinel.theta_max must be a positive number (a relative error such as 0.5)");
        }
        if !(s.k_sigma > 0.0 && s.k_sigma.is_finite()) {
            bail!("sentinel.k_sigma must be a positive number (such as 3.0)");
        }
        if s.window == 0 {
            bail!("sentinel.window must be at least 1 iteration");
        }
        if s.start_after == 0 {
            bail!("sentinel.start_after must be at least 1 iteration");
        }
        if s.warmup_samples < 20 {
            bail!("sentinel.warmup_samples must be at least 20 (the fit uses 5 folds)");
        }
        if s.poll_interval.is_zero() {
            bail!("sentinel.poll_interval must be above zero (such as \"1ms\")");
        }
        s.watch_specs()?;
        if s.framework != "auto" {
            pyframe_tracer::profiles::by_name(&s.framework)
                .map_err(|e| anyhow::anyhow!("sentinel.framework: {e}"))?;
        }
        Ok(())
    }

    /// The embedded default, or the file at `path`.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self> {
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
mod duration_text {
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
        assert_eq!(c.report.interval, Duration::from_secs(1));
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.sentinel.params().warmup_samples, 1000);
        assert_eq!(
            c.state.alerts_log(),
            PathBuf::from("/var/lib/stallscope/alerts.jsonl")
        );
    }

    #[test]
    fn bad_values_are_rejected_with_their_key() {
        let bad = DEFAULT_CONFIG.replace("interval = \"1s\"", "interval = \"ten\"");
        assert!(Config::parse(&bad, "x").is_err());
        let extra = format!("{DEFAULT_CONFIG}\n[nonsense]\nx = 1\n");
        assert!(Config::parse(&extra, "x").is_err());
        let e = Config::parse(
            &DEFAULT_CONFIG.replace("theta_max = 0.5", "theta_max = -1"),
            "x",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("theta_max"), "{e:#}");
        let e = Config::parse(
            &DEFAULT_CONFIG.replace("framework = \"auto\"", "framework = \"tgi\""),
            "x",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("no profile named"), "{e:#}");
    }
}
