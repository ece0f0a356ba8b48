//! The fitted baseline: the GBDT that predicts a decode iteration's duration from its
//! workload, and the upper control limit (UCL) of its positive prediction error, computed
//! from out-of-fold residuals (in-sample residuals understate sigma by 5–40 %).

use serde::{Deserialize, Serialize};

use crate::{
    compiled::Compiled,
    eval::{accuracy, Accuracy},
    features::Workload,
    gbdt::{Gbdt, GbdtParams},
    ModelError,
};

/// Version of the persisted model format.
pub const FORMAT_VERSION: u32 = 2;

/// One healthy iteration: its workload and measured duration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// What the iteration computed.
    pub workload: Workload,
    /// How long it took, µs.
    pub duration_us: f64,
}

/// Baseline fitting parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BaselineParams {
    /// The regressor's parameters.
    pub gbdt: GbdtParams,
    /// Folds for the out-of-fold residuals (contiguous blocks, so neighbours in time stay
    /// together).
    pub folds: usize,
    /// UCL = min(μ + k·σ, θmax).
    pub k_sigma: f64,
    /// Ceiling of the UCL (a relative error, 0.5 = 50 %).
    pub theta_max: f64,
    /// Floor of the UCL: slowdowns below this relative error never alert, however tight
    /// the training residuals were (0 = no floor).
    pub theta_min: f64,
    /// ε of the error E = max(0, (y − ŷ)/(y + ε)), µs.
    pub epsilon_us: f64,
}

impl Default for BaselineParams {
    fn default() -> Self {
        Self {
            gbdt: GbdtParams::default(),
            folds: 5,
            k_sigma: 3.0,
            theta_max: 0.5,
            theta_min: 0.0,
            epsilon_us: 1.0,
        }
    }
}

/// Identifies what a baseline was fitted for; a model is reused only for the same one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Framework profile (`vllm`, `sglang`, ...).
    pub framework: String,
    /// Served model (its name or path).
    pub model: String,
    /// Hardware the engine runs on (CPU model and count, GPUs).
    pub hardware: String,
}

impl Fingerprint {
    /// A file-name-safe key.
    pub fn key(&self) -> String {
        let raw = format!("{}-{}-{}", self.framework, self.model, self.hardware);
        let mut h: u64 = 0xcbf29ce484222325;
        for b in raw.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
        let slug: String = self
            .framework
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("{slug}-{h:016x}")
    }
}

/// The control limit and the statistics it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ucl {
    /// Mean of the out-of-fold errors E.
    pub mean: f64,
    /// Their standard deviation.
    pub sigma: f64,
    /// k of μ + kσ.
    pub k_sigma: f64,
    /// θmax.
    pub theta_max: f64,
    /// θmin (models saved before it existed read as 0).
    #[serde(default)]
    pub theta_min: f64,
    /// min(μ + kσ, θmax), raised to θmin.
    pub limit: f64,
}

/// A fitted baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// [`FORMAT_VERSION`] when written.
    pub format: u32,
    /// What it was fitted for.
    pub fingerprint: Fingerprint,
    /// Training samples.
    pub samples: usize,
    /// Out-of-fold accuracy on the training samples.
    pub oof_accuracy: Accuracy,
    /// ε of the error, µs.
    pub epsilon_us: f64,
    /// The control limit.
    pub ucl: Ucl,
    /// The regressor.
    pub gbdt: Gbdt,
    /// Median duration of the training steps that computed no token, µs (see
    /// [`Baseline::predict`]); none when there were none (and in models saved before it).
    #[serde(default)]
    pub empty_step_us: Option<f64>,
    /// The batches the training samples held; none when there were none.
    pub coverage: Option<Coverage>,
    /// The regressor laid out for prediction (built from `gbdt` when fitted or read; empty
    /// when it cannot be: then `gbdt` is walked).
    #[serde(skip)]
    compiled: Compiled,
}

/// The positive prediction error E = max(0, (y − ŷ)/(y + ε)): only slower-than-predicted
/// counts.
#[inline]
pub fn positive_error(actual_us: f64, predicted_us: f64, epsilon_us: f64) -> f64 {
    ((actual_us - predicted_us) / (actual_us + epsilon_us)).max(0.0)
}

/// The slowdown (observed over predicted duration) an error E stands for: E = 1 − 1/s (ε
/// aside), so s = 1/(1 − E).
pub fn slowdown_of_error(e: f64) -> f64 {
    1.0 / (1.0 - e).max(1e-9)
}

/// The error E of an iteration `slowdown` times its prediction (0 for none slower).
pub fn error_of_slowdown(slowdown: f64) -> f64 {
    1.0 - 1.0 / slowdown.max(1.0)
}

/// The prediction for `w`: `empty_step_us` for a step that computed no token, where
/// training had such steps (see [`Baseline::predict`]), else the regressor's.
#[inline]
fn predicted(empty_step_us: Option<f64>, w: &Workload, regressor: impl FnOnce() -> f64) -> f64 {
    match empty_step_us {
        Some(e) if w.tokens == 0.0 => e,
        _ => regressor(),
    }
}

/// The batches a model was fitted on. A tree ensemble does not extrapolate: a batch outside
/// them is predicted as the nearest one it saw, however much longer or shorter it takes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    /// The smallest and largest batch size.
    pub batch: (f64, f64),
    /// Some batch ran alone (no `overlap_tokens`).
    pub alone: bool,
    /// Some batch shared a pipeline with others (`overlap_tokens` above 0).
    pub overlapped: bool,
}

impl Coverage {
    /// What `samples` hold; none for no sample.
    fn of(samples: &[Sample]) -> Option<Coverage> {
        samples.iter().map(|s| &s.workload).fold(None, |c, w| {
            let alone = w.overlap_tokens == 0.0;
            Some(match c {
                None => Coverage {
                    batch: (w.batch, w.batch),
                    alone,
                    overlapped: !alone,
                },
                Some(c) => Coverage {
                    batch: (c.batch.0.min(w.batch), c.batch.1.max(w.batch)),
                    alone: c.alone || alone,
                    overlapped: c.overlapped || !alone,
                },
            })
        })
    }

    /// Whether `w`'s batch size is within the range and the model saw batches run as it
    /// ran: alone, or beside others.
    pub fn covers(&self, w: &Workload) -> bool {
        let (lo, hi) = self.batch;
        (lo..=hi).contains(&w.batch)
            && if w.overlap_tokens == 0.0 {
                self.alone
            } else {
                self.overlapped
            }
    }
}

/// Whether `coverage` covers `w` (none: every workload is).
fn covers(coverage: Option<Coverage>, w: &Workload) -> bool {
    coverage.is_none_or(|c| c.covers(w))
}

/// The median duration of the samples that computed no token.
fn empty_step_us(samples: &[Sample]) -> Option<f64> {
    let mut d: Vec<f64> = samples
        .iter()
        .filter(|s| s.workload.tokens == 0.0)
        .map(|s| s.duration_us)
        .collect();
    d.sort_by(f64::total_cmp);
    d.get(d.len() / 2).copied()
}

fn fit_gbdt(samples: &[Sample], params: &GbdtParams) -> Result<Gbdt, ModelError> {
    let x: Vec<Vec<f64>> = samples
        .iter()
        .map(|s| s.workload.features().to_vec())
        .collect();
    let y: Vec<f64> = samples.iter().map(|s| s.duration_us).collect();
    Gbdt::fit(&x, &y, params)
}

impl Baseline {
    /// Fits the regressor on every sample and the UCL on its out-of-fold errors: those of
    /// the samples whose batch the other folds cover (all, when none is), as the sentinel
    /// judges only batches like those its model saw
    /// ([`crate::SentinelParams::learn_unseen_batches`]).
    pub fn fit(
        samples: &[Sample],
        params: &BaselineParams,
        fingerprint: Fingerprint,
    ) -> Result<Baseline, ModelError> {
        let folds = params.folds.max(2);
        if samples.len() < folds * 2 {
            return Err(ModelError::Training(format!(
                "{} samples are too few for {folds}-fold residuals",
                samples.len()
            )));
        }
        let mut oof = vec![0.0; samples.len()];
        let mut covered = vec![true; samples.len()];
        for f in 0..folds {
            let (lo, hi) = (f * samples.len() / folds, (f + 1) * samples.len() / folds);
            let train: Vec<Sample> = samples[..lo]
                .iter()
                .chain(&samples[hi..])
                .copied()
                .collect();
            let (m, empty) = (fit_gbdt(&train, &params.gbdt)?, empty_step_us(&train));
            let coverage = Coverage::of(&train);
            for i in lo..hi {
                let w = &samples[i].workload;
                oof[i] = predicted(empty, w, || m.predict(&w.features()));
                covered[i] = covers(coverage, w);
            }
        }
        let actual: Vec<f64> = samples.iter().map(|s| s.duration_us).collect();
        let any_covered = covered.contains(&true);
        let errors: Vec<f64> = actual
            .iter()
            .zip(&oof)
            .zip(&covered)
            .filter(|(_, &c)| c || !any_covered)
            .map(|((&a, &p), _)| positive_error(a, p, params.epsilon_us))
            .collect();
        let n = errors.len() as f64;
        let mean = errors.iter().sum::<f64>() / n;
        let sigma = (errors.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / n).sqrt();
        Ok(Baseline {
            format: FORMAT_VERSION,
            fingerprint,
            samples: samples.len(),
            oof_accuracy: accuracy(&actual, &oof),
            epsilon_us: params.epsilon_us,
            ucl: Ucl {
                mean,
                sigma,
                k_sigma: params.k_sigma,
                theta_max: params.theta_max,
                theta_min: params.theta_min,
                limit: (mean + params.k_sigma * sigma)
                    .min(params.theta_max)
                    .max(params.theta_min),
            },
            gbdt: fit_gbdt(samples, &params.gbdt)?,
            empty_step_us: empty_step_us(samples),
            coverage: Coverage::of(samples),
            compiled: Compiled::default(),
        }
        .compiled())
    }

    /// With the regressor laid out for prediction.
    fn compiled(mut self) -> Baseline {
        self.compiled = Compiled::new(&self.gbdt).unwrap_or_default();
        self
    }

    /// Predicted duration of an iteration, µs. A step that computed no token (0 `tokens`:
    /// every request of its batch had finished) ran no model, so the regressor, which scales
    /// with the work, does not describe it: it is predicted at the median of such steps in
    /// training, where there were any. A live engine's profile counts only steps that run
    /// the model, so only tables (LatencyPrism's, see [`crate::steps`]) have them.
    #[inline]
    pub fn predict(&self, w: &Workload) -> f64 {
        predicted(self.empty_step_us, w, || {
            if self.compiled.is_empty() {
                self.gbdt.predict(&w.features())
            } else {
                self.compiled.predict(&w.features())
            }
        })
    }

    /// Whether batches like `w`'s were among the training samples ([`Coverage::covers`]).
    pub fn covers(&self, w: &Workload) -> bool {
        covers(self.coverage, w)
    }

    /// The model as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a baseline always serialises")
    }

    /// Reads a model written by [`Baseline::to_json`], checking everything prediction relies on.
    pub fn from_json(text: &str) -> Result<Baseline, ModelError> {
        let b: Baseline =
            serde_json::from_str(text).map_err(|e| ModelError::Corrupt(e.to_string()))?;
        if b.format != FORMAT_VERSION {
            return Err(ModelError::Format {
                found: b.format,
                supported: FORMAT_VERSION,
            });
        }
        if b.gbdt.n_features != Workload::default().features().len() {
            return Err(ModelError::Corrupt(format!(
                "the regressor takes {} features, not {}",
                b.gbdt.n_features,
                Workload::default().features().len()
            )));
        }
        if ![b.ucl.limit, b.ucl.mean, b.ucl.sigma, b.epsilon_us]
            .iter()
            .all(|v| v.is_finite())
        {
            return Err(ModelError::Corrupt("the UCL is not finite".into()));
        }
        b.gbdt.validate()?;
        Ok(b.compiled())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::decode_samples as synthetic;

    fn fp() -> Fingerprint {
        Fingerprint {
            framework: "vllm".into(),
            model: "m".into(),
            hardware: "h".into(),
        }
    }

    #[test]
    fn fits_and_sets_a_tight_ucl() {
        let b = Baseline::fit(&synthetic(3000, 7), &BaselineParams::default(), fp()).unwrap();
        assert!(b.oof_accuracy.mape_pct < 3.0, "{:?}", b.oof_accuracy);
        assert!(b.ucl.limit > b.ucl.mean && b.ucl.limit < 0.1, "{:?}", b.ucl);
        let w = synthetic(1, 99)[0];
        let p = b.predict(&w.workload);
        assert!(((p - w.duration_us) / w.duration_us).abs() < 0.05);
    }

    #[test]
    fn theta_min_floors_the_ucl() {
        let data = synthetic(1000, 5);
        let tight = Baseline::fit(&data, &BaselineParams::default(), fp()).unwrap();
        assert!(tight.ucl.limit < 0.1, "{:?}", tight.ucl);
        let params = BaselineParams {
            theta_min: 0.15,
            ..BaselineParams::default()
        };
        let floored = Baseline::fit(&data, &params, fp()).unwrap();
        assert_eq!(floored.ucl.limit, 0.15);
        assert_eq!(floored.ucl.mean, tight.ucl.mean);
        // A model saved before θmin existed still loads, with no floor.
        let old = tight.to_json().replace(",\"theta_min\":0.0", "");
        assert!(!old.contains("theta_min"));
        assert_eq!(Baseline::from_json(&old).unwrap().ucl.theta_min, 0.0);
    }

    #[test]
    fn json_round_trip_and_corruption() {
        let b = Baseline::fit(&synthetic(500, 3), &BaselineParams::default(), fp()).unwrap();
        let text = b.to_json();
        assert_eq!(Baseline::from_json(&text).unwrap(), b);
        assert!(Baseline::from_json(&text[..text.len() / 2]).is_err());
        let wrong = text.replacen(&format!("\"format\":{FORMAT_VERSION}"), "\"format\":9", 1);
        assert_ne!(wrong, text);
        assert!(matches!(
            Baseline::from_json(&wrong),
            Err(ModelError::Format { found: 9, .. })
        ));
    }

    #[test]
    fn steps_that_computed_nothing_are_predicted_apart() {
        let mut data = synthetic(1000, 4);
        let busy = data[0].workload;
        for (i, s) in data.iter_mut().enumerate().take(30) {
            s.workload.tokens = 0.0;
            s.duration_us = 300.0 + i as f64;
        }
        let b = Baseline::fit(&data, &BaselineParams::default(), fp()).unwrap();
        assert_eq!(b.empty_step_us, Some(315.0));
        let empty = Workload {
            tokens: 0.0,
            ..busy
        };
        assert_eq!(b.predict(&empty), 315.0);
        assert!(b.predict(&data[500].workload) > 1000.0);
        // A model saved before the field existed still loads, with none.
        let old = b.to_json().replace(",\"empty_step_us\":315.0", "");
        assert!(!old.contains("empty_step_us"));
        let old = Baseline::from_json(&old).unwrap();
        assert_eq!(old.empty_step_us, None);
        assert_ne!(old.predict(&empty), 315.0);
    }

    #[test]
    fn positive_error_ignores_faster_iterations() {
        assert_eq!(positive_error(100.0, 150.0, 1.0), 0.0);
        assert!((positive_error(200.0, 100.0, 0.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn fingerprint_key_is_stable_and_safe() {
        let k = fp().key();
        assert_eq!(k, fp().key());
        assert!(k
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }
}
