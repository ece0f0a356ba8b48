//! Sampled tracing: CUPTI's activity kinds on for `on` out of every `every`, so that the
//! engine pays CUPTI's per-launch cost only that share of the time.
//!
//! The phases are laid on CLOCK_MONOTONIC itself (on while `now % every < on`), not on the
//! moment an agent started: the agents in an engine's processes (one per tensor-parallel
//! worker) then trace the same stretches, and an iteration that spans them is either seen by
//! all or by none. The daemon writes the sampling into the channel header
//! ([`crate::channel::Channel::set_sampling`]); the agent reads it between flushes and reports
//! each change of its own state as an [`crate::channel::Event::Tracing`], stamped after the
//! kinds are on and before they go off, so a span between an on and the next off was traced
//! whole.

use std::{fmt, str::FromStr, time::Duration};

/// How much of the time CUPTI traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sampling {
    /// Traced ms of each period (ignored when `every_ms` is 0).
    pub on_ms: u32,
    /// The period, ms; 0: always on.
    pub every_ms: u32,
}

impl Sampling {
    /// Tracing all the time.
    pub const ALWAYS: Sampling = Sampling {
        on_ms: 0,
        every_ms: 0,
    };

    /// Whether tracing never stops.
    pub fn always(&self) -> bool {
        self.every_ms == 0 || self.on_ms >= self.every_ms
    }

    /// Whether tracing is on at `now_ns` (CLOCK_MONOTONIC).
    pub fn is_on(&self, now_ns: u64) -> bool {
        self.always() || now_ns % ms(self.every_ms) < ms(self.on_ms)
    }

    /// The next time after `now_ns` at which [`Sampling::is_on`] changes (`None`: never).
    pub fn next_change(&self, now_ns: u64) -> Option<u64> {
        if self.always() {
            return None;
        }
        let (every, on) = (ms(self.every_ms), ms(self.on_ms));
        let phase = now_ns % every;
        let base = now_ns - phase;
        Some(if phase < on { base + on } else { base + every })
    }

    /// The share of the time traced, 0..=1.
    pub fn duty(&self) -> f64 {
        if self.always() {
            1.0
        } else {
            f64::from(self.on_ms) / f64::from(self.every_ms)
        }
    }

    /// The header word: `on_ms` in the low half, `every_ms` in the high one.
    pub fn word(&self) -> u64 {
        u64::from(self.on_ms) | u64::from(self.every_ms) << 32
    }

    /// From a header word.
    pub fn from_word(w: u64) -> Sampling {
        Sampling {
            on_ms: w as u32,
            every_ms: (w >> 32) as u32,
        }
    }
}

fn ms(v: u32) -> u64 {
    u64::from(v) * 1_000_000
}

/// Why a sampling text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU sampling {text:?}: {why}; write \"always\" or ON/EVERY, e.g. \"1s/10s\"")]
pub struct ParseSamplingError {
    text: String,
    why: String,
}

impl FromStr for Sampling {
    type Err = ParseSamplingError;

    /// `always`, or `ON/EVERY` as two durations (`500ms/5s`), ON shorter than EVERY, both
    /// whole milliseconds of at least 100 ms (the agent switches between its flushes).
    fn from_str(s: &str) -> Result<Sampling, ParseSamplingError> {
        let err = |why: &str| ParseSamplingError {
            text: s.to_string(),
            why: why.to_string(),
        };
        if s.trim() == "always" {
            return Ok(Sampling::ALWAYS);
        }
        let (on, every) = s.split_once('/').ok_or_else(|| err("no '/'"))?;
        let parse = |t: &str| -> Result<u32, ParseSamplingError> {
            let d = humantime::parse_duration(t.trim()).map_err(|e| err(&e.to_string()))?;
            if d < Duration::from_millis(100) || d.subsec_nanos() % 1_000_000 != 0 {
                return Err(err(&format!(
                    "{t:?} is not a whole number of milliseconds of at least 100 ms"
                )));
            }
            u32::try_from(d.as_millis()).map_err(|_| err(&format!("{t:?} is too long")))
        };
        let (on_ms, every_ms) = (parse(on)?, parse(every)?);
        if on_ms >= every_ms {
            return Err(err("ON must be shorter than EVERY (or write \"always\")"));
        }
        Ok(Sampling { on_ms, every_ms })
    }
}

impl fmt::Display for Sampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.always() {
            return f.write_str("always");
        }
        let d = |v: u32| humantime::format_duration(Duration::from_millis(v.into()));
        write!(f, "{}/{}", d(self.on_ms), d(self.every_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_parse_or_name_the_problem() {
        type Want = Result<(u32, u32), &'static str>;
        let cases: [(&str, Want); 7] = [
            ("always", Ok((0, 0))),
            ("1s/10s", Ok((1000, 10_000))),
            ("500ms/5s", Ok((500, 5000))),
            ("1s", Err("no '/'")),
            ("10s/1s", Err("ON must be shorter")),
            ("50ms/1s", Err("at least 100 ms")),
            ("1x/2s", Err("1x")),
        ];
        for (text, want) in cases {
            let got = text.parse::<Sampling>();
            match want {
                Ok((on_ms, every_ms)) => {
                    assert_eq!(got, Ok(Sampling { on_ms, every_ms }), "{text}")
                }
                Err(part) => {
                    let e = got.expect_err(text).to_string();
                    assert!(e.contains(part) && e.contains("1s/10s"), "{text}: {e}");
                }
            }
        }
    }

    #[test]
    fn phases_follow_the_monotonic_clock() {
        let s: Sampling = "1s/10s".parse().unwrap();
        let sec = 1_000_000_000u64;
        let cases = [
            (0, true, 1),
            (sec / 2, true, 1),
            (sec, false, 10),
            (9 * sec, false, 10),
            (10 * sec + 1, true, 11),
        ];
        for (now, on, next_s) in cases {
            assert_eq!(s.is_on(now), on, "at {now}");
            assert_eq!(s.next_change(now), Some(next_s * sec), "at {now}");
        }
        assert!((s.duty() - 0.1).abs() < 1e-12);
        assert_eq!(Sampling::from_word(s.word()), s);
        assert_eq!(s.to_string(), "1s/10s");
        assert!(Sampling::ALWAYS.is_on(12345) && Sampling::ALWAYS.next_change(1).is_none());
    }
}
