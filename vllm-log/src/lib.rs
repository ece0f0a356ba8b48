//! vLLM's iteration log: one line per engine step,
//! `INFO MM-DD HH:MM:SS [...] Iteration(N): A context requests, B context tokens,
//! C generation requests, D generation tokens, iteration elapsed time: E ms`.
//!
//! The stamp is local time without a year; the test machines run in UTC.

/// One logged step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Iteration {
    /// vLLM's step index.
    pub index: u64,
    /// Requests in prefill.
    pub context_requests: u64,
    /// Prompt tokens computed.
    pub context_tokens: u64,
    /// Requests in decode.
    pub generation_requests: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// The step's time as vLLM measured it, ms.
    pub elapsed_ms: f64,
    /// When the line was logged (after the step's sampling), if stamped.
    pub stamp: Option<Stamp>,
}

impl Iteration {
    /// Requests in the step, both stages.
    pub fn batch(&self) -> u64 {
        self.context_requests + self.generation_requests
    }

    /// Tokens computed in the step, both stages.
    pub fn tokens(&self) -> u64 {
        self.context_tokens + self.generation_tokens
    }

    /// Whether the step only decoded (no prompt computed in it).
    pub fn is_decode(&self) -> bool {
        self.context_requests == 0 && self.generation_requests > 0
    }
}

/// The steps logged in a span of whole seconds (the stamps have no finer unit).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Seconds {
    /// The span's length, ms.
    pub ms: f64,
    /// Steps logged in it.
    pub steps: usize,
    /// vLLM's elapsed time of its prefill and mixed steps.
    pub other_ms: f64,
    /// vLLM's elapsed time of each decode-only step.
    pub decode_elapsed_ms: Vec<f64>,
}

impl Seconds {
    /// The whole seconds `first..end` (Unix) with no step yet; None when there is none.
    pub fn new(first: i64, end: i64) -> Option<Self> {
        (end > first).then(|| Self {
            ms: (end - first) as f64 * 1e3,
            ..Self::default()
        })
    }

    /// Counts one step logged in the span.
    pub fn add(&mut self, elapsed_ms: f64, decode: bool) {
        self.steps += 1;
        if decode {
            self.decode_elapsed_ms.push(elapsed_ms);
        } else {
            self.other_ms += elapsed_ms;
        }
    }

    /// The decode period: the span's time outside prefill and mixed steps, per decode-only
    /// step, ms. Everything that delays the next decode step counts in it (the scheduler,
    /// pauses of the whole process), while a prefill in one span and not another does not.
    pub fn decode_period(&self) -> Option<f64> {
        let n = self.decode_elapsed_ms.len();
        let decode_ms = self.ms - self.other_ms;
        (n > 0 && decode_ms > 0.0).then(|| decode_ms / n as f64)
    }
}

/// A log line's `MM-DD HH:MM:SS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
}

impl Stamp {
    /// Seconds since the epoch, taking the stamp as UTC in `year`.
    pub fn unix_s(&self, year: i64) -> i64 {
        let days = days_from_civil(year, self.month.into(), self.day.into());
        days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }
}

/// The UTC year `unix_s` falls in.
pub fn year_of(unix_s: i64) -> i64 {
    let mut year = 1970 + unix_s.div_euclid(31_556_952);
    while days_from_civil(year, 1, 1) * 86_400 > unix_s {
        year -= 1;
    }
    while days_from_civil(year + 1, 1, 1) * 86_400 <= unix_s {
        year += 1;
    }
    year
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The step a line logs, if it is an iteration line.
pub fn parse_line(line: &str) -> Option<Iteration> {
    let rest = &line[line.find("Iteration(")? + "Iteration(".len()..];
    let (index, rest) = rest.split_once("): ")?;
    let nums: Vec<f64> = rest
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|s| !s.is_empty() && *s != ".")
        .filter_map(|s| s.parse().ok())
        .collect();
    let [context_requests, context_tokens, generation_requests, generation_tokens, elapsed_ms, ..] =
        nums[..]
    else {
        return None;
    };
    Some(Iteration {
        index: index.parse().ok()?,
        context_requests: context_requests as u64,
        context_tokens: context_tokens as u64,
        generation_requests: generation_requests as u64,
        generation_tokens: generation_tokens as u64,
        elapsed_ms,
        stamp: stamp(line),
    })
}

fn stamp(line: &str) -> Option<Stamp> {
    let s = line.split(" INFO ").nth(1)?.get(..14)?;
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<u8>().ok();
    Some(Stamp {
        month: n(0..2)?,
        day: n(3..5)?,
        hour: n(6..8)?,
        minute: n(9..11)?,
        second: n(12..14)?,
    })
}

/// Every iteration line of a log.
pub fn parse(log: &str) -> Vec<Iteration> {
    log.lines().filter_map(parse_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decode_period_leaves_out_prefill_and_mixed_steps() {
        assert_eq!(Seconds::new(5, 5), None);
        let mut w = Seconds::new(1, 3).unwrap();
        w.add(200.0, false);
        (0..90).for_each(|_| w.add(20.0, true));
        assert_eq!((w.steps, w.other_ms), (91, 200.0));
        assert!((w.decode_period().unwrap() - 1800.0 / 90.0).abs() < 1e-9);
        assert_eq!(Seconds::new(1, 2).unwrap().decode_period(), None);
    }

    #[test]
    fn reads_an_iteration_line() {
        let line = "(EngineCore_DP0 pid=42) INFO 11-26 07:39:52 [core.py:300] Iteration(1234): 1 context requests, 57 context tokens, 7 generation requests, 7 generation tokens, iteration elapsed time: 31.25 ms";
        let it = parse_line(line).unwrap();
        assert_eq!(it.index, 1234);
        assert_eq!((it.batch(), it.tokens()), (8, 64));
        assert_eq!(it.generation_requests, 7);
        assert_eq!(it.elapsed_ms, 31.25);
        let stamp = it.stamp.unwrap();
        assert_eq!(stamp.unix_s(2026), 1_795_678_792);
        assert!(parse_line("INFO 11-26 07:39:52 [api_server.py] Started").is_none());
    }

    #[test]
    fn year_of_covers_the_year_boundaries() {
        for (unix_s, year) in [
            (0, 1970),
            (1_767_225_599, 2025),
            (1_767_225_600, 2026),
            (1_798_761_599, 2026),
        ] {
            assert_eq!(year_of(unix_s), year, "{unix_s}");
        }
    }
}
