//! How much an injection slowed the engine, by the engine's own clock: vLLM's iteration log
//! (`--enable-logging-iteration-details`), read apart from stallscope's export so that the
//! detector is judged against a measure it did not make.
//!
//! The log's stamps have whole seconds, so a trial is measured over the whole seconds inside
//! its healthy lead and inside its injection. Two ratios come out:
//! - the **decode period** (injection over lead): the time of the window less vLLM's elapsed
//!   time of its prefill and mixed steps, per decode-only step. Everything that delays the
//!   next decode step counts, the scheduler and pauses of the whole process included, while a
//!   prefill arriving in one window and not the other does not. This is the slowdown the
//!   evaluation reports. A window without a decode step (the engine stuck, or in one long
//!   prefill) falls back to all steps per second, counting at least one: a lower bound.
//! - vLLM's **elapsed time** per decode-only step (injection median over lead median): it spans
//!   only the forward pass and sampling, so a stall in the scheduler does not show in it.

use std::path::Path;

use anyhow::{Context, Result};
use vllm_log::Seconds;

/// One logged step: its whole second (Unix), vLLM's elapsed time and whether it was
/// decode-only.
#[derive(Debug, Clone, Copy)]
struct Step {
    second: i64,
    elapsed_ms: f64,
    decode: bool,
    /// The workload: requests and tokens.
    batch: u64,
    tokens: u64,
}

/// The engine's steps from its log.
#[derive(Debug, Default)]
pub struct EngineLog {
    /// In log order, which is time order.
    steps: Vec<Step>,
}

/// A trial's slowdown as the engine measured it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Slowdown {
    /// The decode period in the injection over that in the lead (see the module's doc).
    pub step: f64,
    /// Median decode-only elapsed time in the injection over that of the lead (None when
    /// either has no decode-only step).
    pub elapsed: Option<f64>,
}

impl EngineLog {
    /// Reads vLLM's log; stamps are taken as UTC in the year of `now_unix_s`.
    pub fn read(path: &Path, now_unix_s: i64) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the engine's log {}", path.display()))?;
        Ok(Self::parse(&text, vllm_log::year_of(now_unix_s)))
    }

    fn parse(text: &str, year: i64) -> Self {
        let steps = vllm_log::parse(text)
            .into_iter()
            .filter_map(|it| {
                Some(Step {
                    second: it.stamp?.unix_s(year),
                    elapsed_ms: it.elapsed_ms,
                    decode: it.is_decode(),
                    batch: it.batch(),
                    tokens: it.tokens(),
                })
            })
            .collect();
        Self { steps }
    }

    /// Whether the log holds any stamped step.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The whole seconds inside `[from_us, to_us)` and the steps logged in them (None
    /// without a whole second).
    fn window(&self, from_us: f64, to_us: f64) -> Option<Seconds> {
        let first = (from_us / 1e6).ceil() as i64;
        let end = (to_us / 1e6).floor() as i64;
        let mut w = Seconds::new(first, end)?;
        for s in self
            .steps
            .iter()
            .filter(|s| (first..end).contains(&s.second))
        {
            w.add(s.elapsed_ms, s.decode);
        }
        Some(w)
    }

    /// The slowdown of an injection over `[inject_from_us, inject_to_us)` against the lead
    /// `[lead_from_us, inject_from_us)`: None when either spans no whole second or the lead
    /// has no decode step (no load: nothing to compare).
    pub fn slowdown(
        &self,
        lead_from_us: f64,
        inject_from_us: f64,
        inject_to_us: f64,
    ) -> Option<Slowdown> {
        let lead = self.window(lead_from_us, inject_from_us)?;
        let inj = self.window(inject_from_us, inject_to_us)?;
        let lead_period = lead.decode_period()?;
        let step = match inj.decode_period() {
            Some(p) => p / lead_period,
            // Stuck, or one long prefill: all steps per second, at least one.
            None => (inj.ms / inj.steps.max(1) as f64) / (lead.ms / lead.steps as f64),
        };
        let elapsed = match (
            median(lead.decode_elapsed_ms),
            median(inj.decode_elapsed_ms),
        ) {
            (Some(a), Some(b)) if a > 0.0 => Some(b / a),
            _ => None,
        };
        Some(Slowdown { step, elapsed })
    }
}

/// A steady window's usual pace, to judge an alert inside it by.
#[derive(Debug)]
pub struct Pace<'a> {
    log: &'a EngineLog,
    /// Median elapsed time of the decode-only steps per workload seen at least
    /// [`MIN_SAMPLES`] times.
    usual_ms: std::collections::HashMap<(u64, u64), f64>,
    /// Median decode period over the window's whole seconds.
    usual_period: Option<f64>,
}

/// Steps of one workload before its median is trusted.
const MIN_SAMPLES: usize = 20;

/// How an alert's span compares with the usual pace, by the engine's own log.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Judged {
    /// Median over the span's decode-only steps of elapsed time over the usual for their
    /// workload.
    pub elapsed: Option<f64>,
    /// The span's decode period over the window's usual one.
    pub period: Option<f64>,
}

impl EngineLog {
    /// The usual pace over `[from_us, to_us)`.
    pub fn pace(&self, from_us: f64, to_us: f64) -> Pace<'_> {
        let (first, end) = ((from_us / 1e6).ceil() as i64, (to_us / 1e6).floor() as i64);
        let mut by: std::collections::HashMap<(u64, u64), Vec<f64>> = Default::default();
        for s in self
            .steps
            .iter()
            .filter(|s| s.decode && (first..end).contains(&s.second))
        {
            by.entry((s.batch, s.tokens))
                .or_default()
                .push(s.elapsed_ms);
        }
        let usual_ms = by
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_SAMPLES)
            .filter_map(|(k, v)| Some((k, median(v)?)))
            .collect();
        let periods: Vec<f64> = (first..end)
            .filter_map(|sec| {
                self.window(sec as f64 * 1e6, (sec + 1) as f64 * 1e6)?
                    .decode_period()
            })
            .collect();
        Pace {
            log: self,
            usual_ms,
            usual_period: median(periods),
        }
    }
}

impl Pace<'_> {
    /// The window's median decode period, ms.
    pub fn usual_period(&self) -> Option<f64> {
        self.usual_period
    }

    /// The engine's pace over the whole seconds that `[from_us, to_us)` touches.
    pub fn judge(&self, from_us: f64, to_us: f64) -> Judged {
        let (first, end) = (
            (from_us / 1e6).floor(),
            (to_us / 1e6).ceil().max((from_us / 1e6).floor() + 1.0),
        );
        let w = self.log.window(first * 1e6, end * 1e6);
        let ratios: Vec<f64> = self
            .log
            .steps
            .iter()
            .filter(|s| s.decode && s.second >= first as i64 && s.second < end as i64)
            .filter_map(|s| Some(s.elapsed_ms / self.usual_ms.get(&(s.batch, s.tokens))?))
            .collect();
        Judged {
            elapsed: median(ratios),
            period: match (w.and_then(|w| w.decode_period()), self.usual_period) {
                (Some(p), Some(u)) if u > 0.0 => Some(p / u),
                _ => None,
            },
        }
    }
}

/// One iteration of stallscope's export (any stage), as it is looked for in the log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exported {
    /// End, µs (Unix).
    pub end_us: f64,
    /// Requests in it, both stages.
    pub batch: u64,
    /// Tokens computed in it, both stages.
    pub tokens: u64,
}

/// How far a logged step's stamp may lie from stallscope's end of the same iteration, s: the
/// stamp is the whole second its line was written, just after the step.
const MATCH_SLACK_S: i64 = 3;

impl Pace<'_> {
    /// vLLM's elapsed time over the usual for its workload, averaged over the decode-only
    /// steps among `rows` that ended in `[from_us, to_us)`: the very iterations the detector
    /// judged, not the whole seconds around them (an alert raised by one slow second and
    /// held through calm ones reads as half as slow over its seconds). `rows` are consecutive
    /// rows of stallscope's export, every stage, around the span; they are found in the log as
    /// the one run of consecutive steps with the same workloads stamped within
    /// [`MATCH_SLACK_S`] of them. None when no single run matches (an iteration one side lacks,
    /// or a stretch of identical workloads too long to place) or no step has a usual time.
    pub fn iterations(&self, rows: &[Exported], from_us: f64, to_us: f64) -> Option<f64> {
        let (first, last) = (rows.first()?, rows.last()?);
        let steps = &self.log.steps;
        let lo = steps.partition_point(|s| s.second < (first.end_us / 1e6) as i64 - MATCH_SLACK_S);
        let hi = steps.partition_point(|s| s.second <= (last.end_us / 1e6) as i64 + MATCH_SLACK_S);
        let same = |j: usize| {
            steps[j..j + rows.len()]
                .iter()
                .zip(rows)
                .all(|(s, r)| (s.batch, s.tokens) == (r.batch, r.tokens))
        };
        let mut runs = (lo..(hi + 1).saturating_sub(rows.len())).filter(|&j| same(j));
        let j = runs.next()?;
        if runs.next().is_some() {
            return None;
        }
        let ratios: Vec<f64> = rows
            .iter()
            .zip(&steps[j..])
            .filter(|(r, s)| s.decode && (from_us..to_us).contains(&r.end_us))
            .filter_map(|(_, s)| Some(s.elapsed_ms / self.usual_ms.get(&(s.batch, s.tokens))?))
            .collect();
        (!ratios.is_empty()).then(|| ratios.iter().sum::<f64>() / ratios.len() as f64)
    }
}

/// The upper median of `v` (None when empty).
pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of `n` steps of `ms` each in the second `10:00:ss` of 2026-11-26, decode-only
    /// or with a prefill.
    fn lines(sec: u8, n: usize, ms: f64, decode: bool) -> String {
        let context = usize::from(!decode);
        (0..n)
            .map(|i| format!("(EngineCore_DP0 pid=7) INFO 11-26 10:00:{sec:02} [core.py:300] Iteration({i}): {context} context requests, {} context tokens, 8 generation requests, 8 generation tokens, iteration elapsed time: {ms} ms\n", context * 100))
            .collect()
    }

    #[test]
    fn slowdown_is_the_decode_period_over_whole_seconds_and_the_elapsed_ratio() {
        // Lead: seconds 0-2 at a decode step every 25 ms (20 ms of it in vLLM's span), with a
        // 500 ms prefill in second 1 taking the place of 20 decode steps; injection: seconds
        // 3-4 at a step every 50 ms (30 ms in the span, the rest outside it).
        let mut text = lines(0, 40, 20.0, true);
        text += &lines(1, 20, 20.0, true);
        text += &lines(1, 1, 500.0, false);
        text += &lines(2, 40, 20.0, true);
        for s in 3..5 {
            text += &lines(s, 20, 30.0, true);
        }
        // Seconds 6-7: one 2 s prefill and nothing else.
        text += &lines(7, 1, 2000.0, false);
        text += "INFO 11-26 10:00:05 [api_server.py:1] not an iteration line\n";
        let log = EngineLog::parse(&text, 2026);
        let t0 = at(0);
        // The lead starts mid-second 0 of the clock before (not whole), the injection covers
        // 3.0-5.0: the prefill does not make the lead look slower.
        let s = log.slowdown(t0 - 0.5e6, t0 + 3e6, t0 + 5e6).unwrap();
        assert!((s.step - 2.0).abs() < 1e-9, "{s:?}");
        assert_eq!(s.elapsed, Some(1.5));
        // No decode step in the injection: all steps per second, a lower bound (one 2 s step
        // against 40 in the 3 s lead).
        let stuck = log.slowdown(t0 + 3e6, t0 + 6e6, t0 + 8e6).unwrap();
        assert!((stuck.step - 2000.0 / 75.0).abs() < 1e-9, "{stuck:?}");
        assert_eq!(stuck.elapsed, None);
        // An injection shorter than a whole second cannot be measured.
        assert_eq!(log.slowdown(t0, t0 + 3.2e6, t0 + 4.1e6), None);
        // Nothing logged in the lead: no load, no measure.
        assert_eq!(log.slowdown(t0 + 10e6, t0 + 12e6, t0 + 14e6), None);
    }

    #[test]
    fn alerts_are_judged_against_the_usual_pace_of_their_workload() {
        // 50 s at a decode step every 25 ms (20 ms of it in vLLM's span), then 2 s at a step
        // every 50 ms (30 ms in the span).
        let mut text = String::new();
        for s in 0..50 {
            text += &lines(s, 40, 20.0, true);
        }
        for s in 50..52 {
            text += &lines(s, 20, 30.0, true);
        }
        let log = EngineLog::parse(&text, 2026);
        let pace = log.pace(at(0), at(52));
        assert_eq!(pace.usual_period(), Some(25.0));
        let slow = pace.judge(at(50) + 0.2e6, at(51) + 0.5e6);
        assert_eq!(slow.elapsed, Some(1.5));
        assert_eq!(slow.period, Some(2.0));
        let calm = pace.judge(at(10) + 0.3e6, at(10) + 0.6e6);
        assert_eq!((calm.elapsed, calm.period), (Some(1.0), Some(1.0)));
    }

    #[test]
    fn an_alert_is_judged_on_the_logged_steps_of_its_own_iterations() {
        // 60 s of decode steps of 20 ms at batch 8, one every 25 ms, each second's last step a
        // prefill of 100 + second tokens; in second 30 the first 20 steps take 30 ms.
        let mut text = String::new();
        let mut rows = Vec::new();
        for s in 0..60u64 {
            for i in 0..40u64 {
                let (decode, ms) = (i < 39, if s == 30 && i < 20 { 30.0 } else { 20.0 });
                let (ctx, tokens) = if decode { (0, 8) } else { (1, 100 + s + 8) };
                text += &format!("(EngineCore_DP0 pid=7) INFO 11-26 10:00:{:02} [core.py:300] Iteration(0): {ctx} context requests, {} context tokens, 8 generation requests, 8 generation tokens, iteration elapsed time: {ms} ms\n", s, tokens - 8);
                rows.push(Exported {
                    end_us: at(s as i64) + (i + 1) as f64 * 25e3,
                    batch: 8 + ctx,
                    tokens,
                });
            }
        }
        let log = EngineLog::parse(&text, 2026);
        let pace = log.pace(at(0), at(60));
        let around = |from: f64, to: f64| -> Vec<Exported> {
            rows.iter()
                .filter(|r| (from - 3e6..to + 1e6).contains(&r.end_us))
                .copied()
                .collect()
        };
        // The slow half second alone: 1.5 x; the whole second around it: 1.25 x.
        let (a, b) = (at(30), at(30) + 0.5e6 + 1.0);
        assert_eq!(pace.iterations(&around(a, b), a, b), Some(1.5));
        let whole = pace.iterations(&around(a, at(31)), a, at(31)).unwrap();
        assert!((whole - (20.0 * 1.5 + 19.0) / 39.0).abs() < 1e-9, "{whole}");
        // A calm span reads 1.
        assert_eq!(
            pace.iterations(&around(at(10), at(11)), at(10), at(11)),
            Some(1.0)
        );
        // Rows the log does not have, or only identical workloads (no single place), match
        // nothing.
        let mut missing = around(a, b);
        missing.retain(|r| r.tokens == 8 || r.end_us > at(29));
        assert_eq!(pace.iterations(&missing, a, b), None);
        let same: Vec<Exported> = around(a, b)
            .into_iter()
            .filter(|r| r.tokens == 8)
            .take(10)
            .collect();
        assert_eq!(pace.iterations(&same, a, b), None);
    }

    /// 2026-11-26 10:00:00 UTC plus `s` seconds, µs.
    fn at(s: i64) -> f64 {
        let base = vllm_log::Stamp {
            month: 11,
            day: 26,
            hour: 10,
            minute: 0,
            second: 0,
        }
        .unix_s(2026);
        (base + s) as f64 * 1e6
    }
}
