//! A small gradient-boosted regression-tree ensemble (squared loss, histogram splits).
//!
//! Why our own: the sentinel predicts one iteration at a time on the daemon's hot path, so
//! prediction must take about a microsecond. The trees are stored flat (one `Vec<Node>` for
//! the whole ensemble, children by index; [`crate::compiled`] lays them out for prediction),
//! and fitting bins every feature once into at most 256 quantile bins so a split search is one
//! pass over the rows. smartcore's
//! `XGRegressor` (the library option the field notes measured) predicts in ~22 µs per row;
//! this ensemble's figures are in BENCHMARKS.md.

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// Marks a leaf in [`Node::feature`].
pub(crate) const LEAF: u32 = u32::MAX;

/// Training parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GbdtParams {
    /// Boosting rounds (trees).
    pub rounds: usize,
    /// Maximum depth of each tree.
    pub max_depth: usize,
    /// Shrinkage applied to every tree.
    pub learning_rate: f64,
    /// Fewest training rows in a leaf.
    pub min_samples_leaf: usize,
    /// Most histogram bins per feature (2..=256).
    pub max_bins: usize,
    /// L2 regularisation of leaf values.
    pub lambda: f64,
    /// The loss minimised (in log space when `log_target`).
    pub loss: Loss,
    /// Fit ln(y) instead of y: the error the sentinel watches is relative, and iteration
    /// durations span orders of magnitude.
    pub log_target: bool,
}

impl Default for GbdtParams {
    fn default() -> Self {
        Self {
            rounds: 200,
            max_depth: 5,
            learning_rate: 0.1,
            min_samples_leaf: 20,
            max_bins: 255,
            lambda: 1.0,
            loss: Loss::Absolute,
            log_target: true,
        }
    }
}

/// Training loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// Squared error: leaves are regularised means of the residuals.
    Squared,
    /// Absolute error: splits follow the residuals' signs, leaves are their medians. Robust
    /// to the rare iterations that carry hidden work (a prefill the workload columns miss).
    Absolute,
}

/// One tree node; a leaf when `feature == u32::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Split feature, or `u32::MAX` for a leaf.
    pub feature: u32,
    /// Rows with `x[feature] <= threshold` go left.
    pub threshold: f64,
    /// Left child (index into the ensemble's nodes).
    pub left: u32,
    /// Right child.
    pub right: u32,
    /// Leaf value (already scaled by the learning rate).
    pub value: f64,
}

/// A fitted ensemble.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gbdt {
    /// Number of input features.
    pub n_features: usize,
    /// Initial prediction (mean or median of the target, in log space when `log_target`).
    pub base: f64,
    /// Whether predictions are exp() of the ensemble's sum.
    pub log_target: bool,
    /// Root node of each tree.
    pub roots: Vec<u32>,
    /// Every tree's nodes.
    pub nodes: Vec<Node>,
}

impl Gbdt {
    /// Fits `y` from the rows of `x` (each of length `n_features`).
    pub fn fit(x: &[Vec<f64>], y: &[f64], params: &GbdtParams) -> Result<Gbdt, ModelError> {
        let n = x.len();
        if n == 0 || n != y.len() {
            return Err(ModelError::Training(format!(
                "need as many targets as rows and at least one row (rows {n}, targets {})",
                y.len()
            )));
        }
        let n_features = x[0].len();
        if x.iter().any(|r| r.len() != n_features) {
            return Err(ModelError::Training("rows have different lengths".into()));
        }
        if x.iter().flatten().chain(y).any(|v| !v.is_finite()) {
            return Err(ModelError::Training("non-finite value in the data".into()));
        }
        if params.log_target && y.iter().any(|&v| v <= 0.0) {
            return Err(ModelError::Training(
                "a log-target model needs positive durations".into(),
            ));
        }
        let target: Vec<f64> = if params.log_target {
            y.iter().map(|v| v.ln()).collect()
        } else {
            y.to_vec()
        };
        let base = match params.loss {
            Loss::Squared => target.iter().sum::<f64>() / n as f64,
            Loss::Absolute => {
                let mut v = target.clone();
                *v.select_nth_unstable_by(n / 2, f64::total_cmp).1
            }
        };
        let binned = Binned::new(x, params.max_bins.clamp(2, 256));
        let mut residual: Vec<f64> = target.iter().map(|t| t - base).collect();
        let mut model = Gbdt {
            n_features,
            base,
            log_target: params.log_target,
            roots: Vec::with_capacity(params.rounds),
            nodes: Vec::new(),
        };
        let mut rows: Vec<u32> = (0..n as u32).collect();
        let mut hist = vec![(0.0f64, 0u32); 256 * n_features];
        let mut grad = vec![0.0; n];
        for _ in 0..params.rounds {
            for (g, r) in grad.iter_mut().zip(&residual) {
                *g = match params.loss {
                    Loss::Squared => *r,
                    Loss::Absolute => r.signum() * f64::from(*r != 0.0),
                };
            }
            let mut b = TreeBuilder {
                binned: &binned,
                grad: &grad,
                residual: &mut residual,
                params,
                nodes: &mut model.nodes,
                hist: &mut hist,
            };
            let root = b.grow(&mut rows, 0);
            model.roots.push(root);
        }
        Ok(model)
    }

    /// Predicts one row (`x.len() == n_features`).
    #[inline]
    pub fn predict(&self, x: &[f64]) -> f64 {
        let mut sum = self.base;
        for &root in &self.roots {
            let mut i = root as usize;
            loop {
                let node = &self.nodes[i];
                if node.feature == LEAF {
                    sum += node.value;
                    break;
                }
                i = if x[node.feature as usize] <= node.threshold {
                    node.left
                } else {
                    node.right
                } as usize;
            }
        }
        if self.log_target {
            sum.exp()
        } else {
            sum
        }
    }

    /// Checks the structure (child indices, features) so a loaded file cannot make
    /// [`Gbdt::predict`] index out of bounds or loop.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |what: String| Err(ModelError::Corrupt(what));
        if self.n_features == 0 {
            return bad("the model has no features".into());
        }
        if !self.base.is_finite() {
            return bad("the base prediction is not finite".into());
        }
        let len = self.nodes.len() as u32;
        for &r in &self.roots {
            if r >= len {
                return bad(format!("tree root {r} is outside the {len} nodes"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.feature == LEAF {
                if !n.value.is_finite() {
                    return bad(format!("leaf {i} has a non-finite value"));
                }
                continue;
            }
            // Children always come after their parent: no cycles.
            if n.feature as usize >= self.n_features
                || n.left as usize <= i
                || n.right as usize <= i
                || n.left >= len
                || n.right >= len
                || n.threshold.is_nan()
            {
                return bad(format!("node {i} is malformed"));
            }
        }
        Ok(())
    }
}

/// Every feature quantised to at most 256 bins, row-major.
struct Binned {
    n_features: usize,
    /// `bins[row * n_features + f]`.
    bins: Vec<u8>,
    /// Per feature: bin `b` holds the values `<= thresholds[b]` (and above the previous one).
    thresholds: Vec<Vec<f64>>,
}

impl Binned {
    fn new(x: &[Vec<f64>], max_bins: usize) -> Self {
        let n_features = x[0].len();
        let thresholds: Vec<Vec<f64>> = (0..n_features)
            .map(|f| {
                let mut v: Vec<f64> = x.iter().map(|r| r[f]).collect();
                v.sort_by(f64::total_cmp);
                v.dedup();
                let cuts: Vec<f64> = if v.len() <= max_bins {
                    v
                } else {
                    let mut c: Vec<f64> = (1..=max_bins)
                        .map(|i| v[(i * v.len() / max_bins).min(v.len()) - 1])
                        .collect();
                    c.dedup();
                    c
                };
                // Midpoints between consecutive distinct values.
                cuts.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect()
            })
            .collect();
        let mut bins = Vec::with_capacity(x.len() * n_features);
        for row in x {
            for (f, t) in thresholds.iter().enumerate() {
                bins.push(t.partition_point(|&c| c < row[f]) as u8);
            }
        }
        Self {
            n_features,
            bins,
            thresholds,
        }
    }
}

struct TreeBuilder<'a> {
    binned: &'a Binned,
    /// What splits fit: the residuals (squared loss) or their signs (absolute loss).
    grad: &'a [f64],
    residual: &'a mut [f64],
    params: &'a GbdtParams,
    nodes: &'a mut Vec<Node>,
    hist: &'a mut Vec<(f64, u32)>,
}

/// The best split of one node: feature, bin, gain.
struct Split {
    feature: usize,
    bin: u8,
    gain: f64,
}

impl TreeBuilder<'_> {
    /// Grows the subtree of `rows`, returns its node index, and subtracts its leaf values
    /// from the rows' residuals.
    fn grow(&mut self, rows: &mut [u32], depth: usize) -> u32 {
        let me = self.nodes.len() as u32;
        self.nodes.push(Node {
            feature: LEAF,
            threshold: 0.0,
            left: 0,
            right: 0,
            value: 0.0,
        });
        let split = if depth < self.params.max_depth
            && rows.len() >= 2 * self.params.min_samples_leaf.max(1)
        {
            self.best_split(rows)
        } else {
            None
        };
        match split {
            None => {
                let value = self.params.learning_rate * self.leaf_value(rows);
                for &r in rows.iter() {
                    self.residual[r as usize] -= value;
                }
                self.nodes[me as usize].value = value;
            }
            Some(s) => {
                let nf = self.binned.n_features;
                let bins = &self.binned.bins;
                let mut mid = 0;
                for i in 0..rows.len() {
                    if bins[rows[i] as usize * nf + s.feature] <= s.bin {
                        rows.swap(i, mid);
                        mid += 1;
                    }
                }
                let (l, r) = rows.split_at_mut(mid);
                let left = self.grow(l, depth + 1);
                let right = self.grow(r, depth + 1);
                self.nodes[me as usize] = Node {
                    feature: s.feature as u32,
                    threshold: self.binned.thresholds[s.feature][s.bin as usize],
                    left,
                    right,
                    value: 0.0,
                };
            }
        }
        me
    }

    fn leaf_value(&self, rows: &[u32]) -> f64 {
        match self.params.loss {
            Loss::Squared => {
                let sum: f64 = rows.iter().map(|&r| self.residual[r as usize]).sum();
                sum / (rows.len() as f64 + self.params.lambda)
            }
            Loss::Absolute => {
                let mut v: Vec<f64> = rows.iter().map(|&r| self.residual[r as usize]).collect();
                let mid = v.len() / 2;
                *v.select_nth_unstable_by(mid, f64::total_cmp).1
            }
        }
    }

    fn best_split(&mut self, rows: &[u32]) -> Option<Split> {
        let nf = self.binned.n_features;
        let lambda = self.params.lambda;
        let min_leaf = self.params.min_samples_leaf.max(1) as u32;
        let total: f64 = rows.iter().map(|&r| self.grad[r as usize]).sum();
        let n = rows.len() as u32;
        let parent = total * total / (n as f64 + lambda);
        // Every feature's histogram in one pass over the rows (each row's bins are
        // contiguous); each bin still sums its rows in row order, as a pass per feature did.
        let hist = &mut self.hist[..nf * 256];
        hist.fill((0.0, 0));
        for &r in rows {
            let g = self.grad[r as usize];
            let bins = &self.binned.bins[r as usize * nf..][..nf];
            for (f, &b) in bins.iter().enumerate() {
                let h = &mut hist[f * 256 + b as usize];
                h.0 += g;
                h.1 += 1;
            }
        }
        let mut best: Option<Split> = None;
        for f in 0..nf {
            let n_bins = self.binned.thresholds[f].len() + 1;
            if n_bins < 2 {
                continue;
            }
            let hist = &hist[f * 256..f * 256 + n_bins];
            let (mut sl, mut nl) = (0.0, 0u32);
            for (b, &(s, c)) in hist[..n_bins - 1].iter().enumerate() {
                sl += s;
                nl += c;
                let nr = n - nl;
                if nl < min_leaf {
                    continue;
                }
                if nr < min_leaf {
                    break;
                }
                let sr = total - sl;
                let gain = sl * sl / (nl as f64 + lambda) + sr * sr / (nr as f64 + lambda) - parent;
                if gain > 1e-12 && best.as_ref().is_none_or(|s| gain > s.gain) {
                    best = Some(Split {
                        feature: f,
                        bin: b as u8,
                        gain,
                    });
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
        // Deterministic pseudo-random inputs; y is a nonlinear function of two of them.
        let mut r = crate::synthetic::XorShift::new(0x2545F4914F6CDD1D);
        let mut rnd = move || r.uniform();
        let x: Vec<Vec<f64>> = (0..n)
            .map(|_| vec![rnd() * 32.0, rnd() * 1000.0, rnd()])
            .collect();
        let y = x
            .iter()
            .map(|r| 20.0 + 0.5 * r[0] + 0.002 * r[0] * r[1] + if r[1] > 500.0 { 5.0 } else { 0.0 })
            .collect();
        (x, y)
    }

    #[test]
    fn fits_a_nonlinear_function() {
        let (x, y) = data(4000);
        let m = Gbdt::fit(&x, &y, &GbdtParams::default()).unwrap();
        m.validate().unwrap();
        let (tx, ty) = data(4500);
        let mape: f64 = tx[4000..]
            .iter()
            .zip(&ty[4000..])
            .map(|(r, t)| ((m.predict(r) - t) / t).abs())
            .sum::<f64>()
            / 500.0;
        assert!(mape < 0.03, "MAPE {mape}");
    }

    #[test]
    fn linear_target_and_constant_features_work() {
        let x: Vec<Vec<f64>> = (0..200).map(|i| vec![i as f64, 7.0]).collect();
        let y: Vec<f64> = (0..200).map(|i| i as f64 * 2.0 - 50.0).collect();
        let p = GbdtParams {
            log_target: false,
            ..GbdtParams::default()
        };
        let m = Gbdt::fit(&x, &y, &p).unwrap();
        assert!((m.predict(&[100.0, 7.0]) - 150.0).abs() < 10.0);
        // No split is ever made on the constant feature.
        assert!(m.nodes.iter().all(|n| n.feature != 1));
    }

    #[test]
    fn bad_training_data_is_refused() {
        assert!(Gbdt::fit(&[], &[], &GbdtParams::default()).is_err());
        assert!(Gbdt::fit(&[vec![1.0]], &[0.0], &GbdtParams::default()).is_err());
        assert!(Gbdt::fit(&[vec![f64::NAN]], &[1.0], &GbdtParams::default()).is_err());
    }

    #[test]
    fn validate_catches_cycles_and_bad_indices() {
        let (x, y) = data(500);
        let m = Gbdt::fit(&x, &y, &GbdtParams::default()).unwrap();
        let mut bad = m.clone();
        let split = bad.nodes.iter().position(|n| n.feature != LEAF).unwrap();
        bad.nodes[split].left = split as u32;
        assert!(bad.validate().is_err());
        let mut bad = m.clone();
        bad.roots.push(bad.nodes.len() as u32);
        assert!(bad.validate().is_err());
        let mut bad = m;
        bad.nodes[split].feature = 9;
        assert!(bad.validate().is_err());
    }
}
