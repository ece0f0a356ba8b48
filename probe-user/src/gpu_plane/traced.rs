//! The stretches of time an agent traced, from its [`Event::Tracing`] switches: where GPU
//! figures mean something under sampling ([`cupti_sys::sampling`]). Outside them, no kernel
//! means no record, not an idle GPU.

use cupti_sys::channel::Event;

/// Traced spans on CLOCK_MONOTONIC, in order; the last may still be open.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Traced {
    spans: Vec<(u64, Option<u64>)>,
}

impl Traced {
    /// Takes a switch (any other event is ignored).
    pub fn take(&mut self, e: &Event) {
        match *e {
            Event::Tracing { on: true, at_ns } if !matches!(self.spans.last(), Some((_, None))) => {
                self.spans.push((at_ns, None));
            }
            Event::Tracing { on: false, at_ns } => {
                if let Some((_, end @ None)) = self.spans.last_mut() {
                    *end = Some(at_ns);
                }
            }
            _ => {}
        }
    }

    /// Whether `[start, end]` lies inside one traced span (an open span reaches `now`, which
    /// the caller has checked `end` against).
    pub fn covers(&self, start: u64, end: u64) -> bool {
        self.spans
            .iter()
            .any(|&(on, off)| on <= start && off.is_none_or(|off| end <= off))
    }

    /// Forgets spans that ended before `t`.
    pub fn forget_before(&mut self, t: u64) {
        self.spans
            .retain(|&(_, off)| off.is_none_or(|off| off >= t));
    }

    /// The spans clipped to `[from, to]`, an open one ending at `to`.
    pub fn within(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        self.spans
            .iter()
            .map(|&(on, off)| (on.max(from), off.unwrap_or(to).min(to)))
            .filter(|(a, b)| a < b)
            .collect()
    }

    /// The spans of `events` (one agent's), in order.
    pub fn of(events: &[super::GpuEvent]) -> Traced {
        let mut t = Traced::default();
        for e in events {
            t.take(&e.event);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(on: bool, at_ns: u64) -> Event {
        Event::Tracing { on, at_ns }
    }

    #[test]
    fn spans_follow_the_switches() {
        let mut t = Traced::default();
        for e in [
            switch(true, 10),
            switch(true, 12),
            switch(false, 20),
            switch(false, 21),
            switch(true, 40),
        ] {
            t.take(&e);
        }
        let cases = [
            ((10, 20), true),
            ((11, 19), true),
            ((9, 15), false),
            ((15, 25), false),
            ((25, 35), false),
            ((41, 1000), true),
        ];
        for ((a, b), covered) in cases {
            assert_eq!(t.covers(a, b), covered, "[{a}, {b}]");
        }
        assert_eq!(t.within(0, 50), vec![(10, 20), (40, 50)]);
        assert_eq!(t.within(15, 45), vec![(15, 20), (40, 45)]);
        t.forget_before(30);
        assert_eq!(t.within(0, 50), vec![(40, 50)]);
    }
}
