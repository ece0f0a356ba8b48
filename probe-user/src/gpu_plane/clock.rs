//! CUPTI's clock (CLOCK_REALTIME by default on Linux x86-64) mapped onto CLOCK_MONOTONIC, the
//! trace clock, from the agent's calibration samples: a CUPTI reading between two monotonic
//! readings.

/// Samples kept; the tightest recent one sets the offset.
const KEEP: usize = 16;

/// One calibration sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// cuptiGetTimestamp.
    pub cupti_ns: u64,
    /// CLOCK_MONOTONIC just before.
    pub mono_before_ns: u64,
    /// CLOCK_MONOTONIC just after.
    pub mono_after_ns: u64,
}

/// The mapping from CUPTI time to CLOCK_MONOTONIC.
#[derive(Debug, Default, Clone)]
pub struct ClockMap {
    recent: Vec<Sample>,
    /// Every sample's offset, for the alignment report.
    offsets: Vec<i64>,
}

impl ClockMap {
    /// Takes a sample.
    pub fn add(&mut self, s: Sample) {
        if s.mono_after_ns < s.mono_before_ns {
            return;
        }
        if self.recent.len() == KEEP {
            self.recent.remove(0);
        }
        self.recent.push(s);
        self.offsets.push(Self::offset_of(&s));
    }

    fn offset_of(s: &Sample) -> i64 {
        let mid = s.mono_before_ns / 2 + s.mono_after_ns / 2;
        mid as i64 - s.cupti_ns as i64
    }

    fn best(&self) -> Option<&Sample> {
        self.recent
            .iter()
            .min_by_key(|s| s.mono_after_ns - s.mono_before_ns)
    }

    /// Whether any sample has arrived.
    pub fn ready(&self) -> bool {
        !self.recent.is_empty()
    }

    /// `cupti_ns` on CLOCK_MONOTONIC (`None` before the first sample).
    pub fn to_monotonic(&self, cupti_ns: u64) -> Option<u64> {
        let off = Self::offset_of(self.best()?);
        Some((cupti_ns as i64 + off).max(0) as u64)
    }

    /// Half the bracket of the tightest recent sample: how far the offset can be off at the
    /// moment it was taken, ns.
    pub fn uncertainty_ns(&self) -> Option<u64> {
        self.best()
            .map(|s| (s.mono_after_ns - s.mono_before_ns).div_ceil(2))
    }

    /// Largest distance between any sample's offset and the median offset, ns: how much the
    /// two clocks moved against each other over the session.
    pub fn drift_ns(&self) -> Option<u64> {
        if self.offsets.is_empty() {
            return None;
        }
        let mut v = self.offsets.clone();
        v.sort_unstable();
        let median = v[v.len() / 2];
        v.iter().map(|o| o.abs_diff(median)).max()
    }

    /// Samples taken.
    pub fn samples(&self) -> usize {
        self.offsets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_sample_sets_the_offset() {
        let mut c = ClockMap::default();
        assert!(!c.ready());
        assert_eq!(c.to_monotonic(5), None);
        // Realtime is 1e18 ahead of monotonic; the first sample is loose (10 µs bracket).
        c.add(Sample {
            cupti_ns: 1_000_000_000_000_010_000,
            mono_before_ns: 0,
            mono_after_ns: 20_000,
        });
        c.add(Sample {
            cupti_ns: 1_000_000_000_001_000_000,
            mono_before_ns: 999_900,
            mono_after_ns: 1_000_100,
        });
        assert_eq!(c.uncertainty_ns(), Some(100));
        assert_eq!(c.to_monotonic(1_000_000_000_002_000_000), Some(2_000_000));
        assert_eq!(c.drift_ns(), Some(0));
        assert_eq!(c.samples(), 2);
    }

    #[test]
    fn drift_is_reported_and_bad_samples_ignored() {
        let mut c = ClockMap::default();
        for (i, skew) in [0i64, 300, -200].iter().enumerate() {
            let mono = 1_000_000 * (i as u64 + 1);
            c.add(Sample {
                cupti_ns: (mono as i64 + 5_000_000 + skew) as u64,
                mono_before_ns: mono - 10,
                mono_after_ns: mono + 10,
            });
        }
        assert_eq!(c.drift_ns(), Some(300));
        c.add(Sample {
            cupti_ns: 1,
            mono_before_ns: 10,
            mono_after_ns: 5,
        });
        assert_eq!(c.samples(), 3);
    }
}
