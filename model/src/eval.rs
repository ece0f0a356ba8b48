//! Accuracy figures of a regressor: R², MAPE, share of predictions within 10 %.

use serde::{Deserialize, Serialize};

/// How well predictions match the truth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// Rows scored.
    pub n: usize,
    /// Coefficient of determination.
    pub r2: f64,
    /// Mean absolute percentage error, in percent.
    pub mape_pct: f64,
    /// Share of predictions within 10 % of the truth, in percent.
    pub within_10_pct: f64,
}

/// Scores `predicted` against `actual` (same length, non-empty, positive actuals).
pub fn accuracy(actual: &[f64], predicted: &[f64]) -> Accuracy {
    let n = actual.len().min(predicted.len());
    let mean = actual[..n].iter().sum::<f64>() / n as f64;
    let (mut ss_res, mut ss_tot, mut ape, mut within) = (0.0, 0.0, 0.0, 0usize);
    for (&a, &p) in actual.iter().zip(predicted) {
        ss_res += (a - p) * (a - p);
        ss_tot += (a - mean) * (a - mean);
        let rel = ((a - p) / a).abs();
        ape += rel;
        within += usize::from(rel <= 0.10);
    }
    Accuracy {
        n,
        r2: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            0.0
        },
        mape_pct: 100.0 * ape / n as f64,
        within_10_pct: 100.0 * within as f64 / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_and_biased_predictions() {
        let a = [10.0, 20.0, 30.0];
        let perfect = accuracy(&a, &a);
        assert_eq!(
            (perfect.r2, perfect.mape_pct, perfect.within_10_pct),
            (1.0, 0.0, 100.0)
        );
        let off = accuracy(&a, &[11.0, 25.0, 30.0]);
        assert!((off.mape_pct - 100.0 * (0.1 + 0.25) / 3.0).abs() < 1e-9);
        assert!((off.within_10_pct - 200.0 / 3.0).abs() < 1e-9);
    }
}
