//! The daemon's Prometheus metrics as OpenTelemetry instruments: each family becomes an
//! observable instrument whose callback reads the registry when the periodic reader exports,
//! each series' labels its attributes. Counters stay monotonic sums and gauges gauges. OTel
//! has no observable histogram, so a histogram family is exported as its `_count` and `_sum`
//! (its buckets stay on /metrics).

use std::{collections::BTreeSet, sync::Arc};

use opentelemetry::{
    metrics::{AsyncInstrument, Meter},
    KeyValue,
};
use prometheus::proto::{Metric, MetricType};

use crate::api::state::Shared;

/// Which families already have instruments.
pub struct Bridge {
    meter: Meter,
    shared: Arc<Shared>,
    known: BTreeSet<String>,
}

/// One value of a series read from a family.
type Read = fn(&Metric) -> f64;

impl Bridge {
    pub fn new(meter: Meter, shared: Arc<Shared>) -> Bridge {
        Bridge {
            meter,
            shared,
            known: BTreeSet::new(),
        }
    }

    /// Makes instruments for the families that have gained their first series since the last
    /// call (a labelled family is gathered only once it has one).
    pub fn refresh(&mut self) {
        for family in self.shared.metrics.gather() {
            let name = family.name().to_string();
            if !self.known.insert(name.clone()) {
                continue;
            }
            let help = family.help().to_string();
            match family.get_field_type() {
                MetricType::COUNTER => {
                    self.counter(name.clone(), help, |m| m.get_counter().get_value());
                }
                MetricType::GAUGE => {
                    let (shared, n) = (self.shared.clone(), name.clone());
                    self.meter
                        .f64_observable_gauge(name)
                        .with_description(help)
                        .with_callback(move |o| {
                            observe(&shared, &n, |m| m.get_gauge().get_value(), o)
                        })
                        .build();
                }
                MetricType::HISTOGRAM => {
                    self.counter_of(format!("{name}_count"), name.clone(), help.clone(), |m| {
                        m.get_histogram().get_sample_count() as f64
                    });
                    self.counter_of(format!("{name}_sum"), name, help, |m| {
                        m.get_histogram().get_sample_sum()
                    });
                }
                _ => {}
            }
        }
    }

    fn counter(&self, name: String, help: String, read: Read) {
        self.counter_of(name.clone(), name, help, read);
    }

    /// An observable counter `name` reading family `family`.
    fn counter_of(&self, name: String, family: String, help: String, read: Read) {
        let shared = self.shared.clone();
        self.meter
            .f64_observable_counter(name)
            .with_description(help)
            .with_callback(move |o| observe(&shared, &family, read, o))
            .build();
    }
}

/// Observes every series of `family` now.
fn observe(shared: &Shared, family: &str, read: Read, o: &dyn AsyncInstrument<f64>) {
    for f in shared
        .metrics
        .gather()
        .iter()
        .filter(|f| f.name() == family)
    {
        for m in f.get_metric() {
            let attrs: Vec<KeyValue> = m
                .get_label()
                .iter()
                .map(|l| KeyValue::new(l.name().to_string(), l.value().to_string()))
                .collect();
            o.observe(read(m), &attrs);
        }
    }
}
