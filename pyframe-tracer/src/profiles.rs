//! Framework profiles: which functions of an engine to watch and what workload to read, as data (embedded TOML
//! files under `pyframe-tracer/profiles/`), never as code.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::watch_spec::{func_of, WatchSpec};

/// What a watched function means for the engine's loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// One call per engine iteration.
    Anchor,
    /// Called inside an iteration; carries workload or splits its time.
    Phase,
    /// Watched only during deep dives.
    DeepDive,
}

/// One watch of a profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileWatch {
    /// `MODULE:QUALNAME[name=EXPR;...]`.
    pub spec: String,
    /// Its role.
    pub role: Role,
    /// For the source check only (`tests/tools/profile_check.py`): the class (`module:Class`)
    /// of a parameter the source leaves unannotated or annotates as `Any`, so the check can
    /// follow the spec's attribute path from it.
    #[serde(default)]
    pub param_types: std::collections::BTreeMap<String, String>,
    /// For an anchor of a pipelined loop (vLLM's batch queue): the phase (`module:qualname`)
    /// that finishes a batch. An anchor call without it inside only queued work; it opens the
    /// next iteration instead of being one.
    #[serde(default)]
    pub completes_with: Option<String>,
    /// For an anchor that launches a batch whose result a later call on the same thread
    /// processes (SGLang: `run_batch`, then `process_batch_result`; its overlap loop processes
    /// a batch's result after launching the next batch): that phase (`module:qualname`). An
    /// iteration then runs from the anchor call's start to the end of the call that processed
    /// its batch, calls paired in order.
    #[serde(default)]
    pub closed_by: Option<String>,
}

/// An anchor function of a profile: its calls are the engine's iterations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorFunc {
    /// `module:qualname`.
    pub func: String,
    /// See [`ProfileWatch::completes_with`].
    pub completes_with: Option<String>,
    /// See [`ProfileWatch::closed_by`].
    pub closed_by: Option<String>,
}

impl AnchorFunc {
    /// An anchor each of whose calls is one iteration.
    pub fn plain(func: &str) -> Self {
        Self {
            func: func.to_string(),
            completes_with: None,
            closed_by: None,
        }
    }
}

/// The releases a profile was checked against: `tests/profiles.rs` checks every watch against
/// the source of each.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verified {
    /// The PyPI distribution.
    pub package: String,
    /// Its versions.
    pub versions: Vec<String>,
    /// The enum (`module:Class`) whose values `[iteration]`'s modes are, if any.
    #[serde(default)]
    pub mode_enum: Option<String>,
    /// The values its members must have in each release.
    #[serde(default)]
    pub mode_values: std::collections::BTreeMap<String, i64>,
}

/// A framework profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name (`vllm`, `sglang`, `generic`).
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// Any of these in the target's `sys.modules` identifies the framework.
    pub detect_modules: Vec<String>,
    /// Substrings of an engine process's comm or cmdline (for discovering engines on the host).
    pub detect_process: Vec<String>,
    /// Functions to watch.
    pub watch: Vec<ProfileWatch>,
    /// Which extracted fields describe an iteration's workload.
    #[serde(default)]
    pub iteration: IterationFields,
    /// The releases this profile was checked against (none for a profile of no framework).
    #[serde(default)]
    pub verified: Option<Verified>,
}

/// Names of the extracted fields (of the anchor or of a phase inside it) that carry an
/// iteration's workload; any may be absent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IterationFields {
    /// Requests in the batch.
    pub batch: Option<String>,
    /// An anchor call without a positive `batch` is not an iteration (the engine loop ran
    /// with nothing to compute).
    #[serde(default)]
    pub require_batch: bool,
    /// Tokens computed in the iteration.
    pub tokens: Option<String>,
    /// Requests scheduled for the first time.
    pub new_requests: Option<String>,
    /// Tokens in the KV cache that the batch's attention reads.
    pub context_tokens: Option<String>,
    /// `context_tokens` counts only what was cached before this iteration: add `tokens`.
    #[serde(default)]
    pub context_excludes_step: bool,
    /// The engine's forward-mode field, and which of its values mean which stage.
    pub mode: Option<String>,
    /// Mode values of prefill iterations.
    #[serde(default)]
    pub prefill_modes: Vec<i64>,
    /// Mode values of decode iterations.
    #[serde(default)]
    pub decode_modes: Vec<i64>,
    /// Mode values of mixed iterations.
    #[serde(default)]
    pub mixed_modes: Vec<i64>,
}

impl Profile {
    /// Its anchors. An engine runs one of them (vLLM: `step`, or `step_with_batch_queue` when
    /// batches overlap), chosen when it starts.
    pub fn anchors(&self) -> Vec<AnchorFunc> {
        self.watch
            .iter()
            .filter(|w| w.role == Role::Anchor)
            .map(|w| AnchorFunc {
                func: func_of(&w.spec).to_string(),
                completes_with: w.completes_with.clone(),
                closed_by: w.closed_by.clone(),
            })
            .collect()
    }

    /// The parallel rank an engine process's title names after the profile's process name
    /// (SGLang `sglang::scheduler_DP1_TP0` gives `DP1_TP0`, vLLM `VLLM::EngineCore_DP1` gives
    /// `DP1`); None for a title without one or not of this profile.
    pub fn rank(&self, cmdline: &str) -> Option<String> {
        let title = cmdline.split(['\0', ' ']).next()?;
        self.detect_process
            .iter()
            .find_map(|p| title.strip_prefix(p.as_str()))
            .map(|rest| rest.trim_start_matches('_'))
            .filter(|rank| !rank.is_empty())
            .map(str::to_string)
    }

    /// The parsed specs with the given roles.
    pub fn specs(&self, roles: &[Role]) -> Result<Vec<(WatchSpec, Role)>> {
        self.watch
            .iter()
            .filter(|w| roles.contains(&w.role))
            .map(|w| {
                Ok((
                    w.spec
                        .parse::<WatchSpec>()
                        .map_err(|e| Error::Profile(format!("{}: {e}", self.name)))?,
                    w.role,
                ))
            })
            .collect()
    }
}

const BUILTIN: &[(&str, &str)] = &[
    ("vllm", include_str!("../profiles/vllm.toml")),
    ("sglang", include_str!("../profiles/sglang.toml")),
    ("generic", include_str!("../profiles/generic.toml")),
];

/// Every built-in profile.
pub fn builtin() -> Vec<Profile> {
    BUILTIN
        .iter()
        .map(|(name, text)| {
            toml::from_str(text).unwrap_or_else(|e| panic!("built-in profile {name}: {e}"))
        })
        .collect()
}

/// The built-in profile called `name`.
pub fn by_name(name: &str) -> Result<Profile> {
    builtin()
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| {
            let names: Vec<_> = BUILTIN.iter().map(|(n, _)| *n).collect();
            Error::Profile(format!(
                "no profile named {name:?}; built-in profiles: {}",
                names.join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_read_from_the_process_title() {
        let (sglang, vllm) = (by_name("sglang").unwrap(), by_name("vllm").unwrap());
        let table = [
            (&sglang, "sglang::scheduler_DP0", Some("DP0")),
            (
                &sglang,
                "sglang::scheduler_DP1_PP1_TP3\0",
                Some("DP1_PP1_TP3"),
            ),
            (&sglang, "sglang::scheduler", None),
            (&sglang, "python -m sglang.launch_server", None),
            (&vllm, "VLLM::EngineCore_DP1", Some("DP1")),
            (&vllm, "VLLM::EngineCore", None),
        ];
        for (profile, title, rank) in table {
            assert_eq!(profile.rank(title).as_deref(), rank, "{title}");
        }
    }

    #[test]
    fn builtin_profiles_parse_and_engines_have_anchors() {
        for p in builtin() {
            let specs = p
                .specs(&[Role::Anchor, Role::Phase, Role::DeepDive])
                .unwrap();
            let anchors = p.anchors();
            if p.name == "generic" {
                assert_eq!(specs.len(), 0);
            } else {
                assert!(!anchors.is_empty(), "{}: an anchor", p.name);
                // A completing or closing phase is one the profile watches.
                let ends = anchors
                    .iter()
                    .flat_map(|a| [a.completes_with.as_ref(), a.closed_by.as_ref()]);
                for c in ends.flatten() {
                    assert!(
                        p.watch
                            .iter()
                            .any(|w| w.role == Role::Phase && func_of(&w.spec) == c),
                        "{}: {c} ends an anchor's iterations but is not a phase",
                        p.name
                    );
                }
                assert!(
                    !p.detect_modules.is_empty() && !p.detect_process.is_empty(),
                    "{}",
                    p.name
                );
            }
        }
        assert!(by_name("nope")
            .unwrap_err()
            .to_string()
            .contains("vllm, sglang, generic"));
    }
}
