//! A fitted [`Gbdt`] laid out for prediction on the sentinel's hot path.
//!
//! Walking the ensemble's nodes takes a data-dependent branch at every level of every tree,
//! and the branch predictor cannot learn them (each iteration's workload takes other paths):
//! most of a walk's time is mispredictions. Here every tree is a complete binary tree of the
//! ensemble's depth, in breadth-first order, so one level down is `i = 2i + 1 + (x > t)` with
//! no branch, and the trees' chains are independent for the CPU to overlap. A leaf above the
//! last level is carried down: the split nodes under it compare with +inf and every leaf
//! slot under it holds its value, so whichever way they go (even on NaN) they reach it.
//!
//! Splits compare ranks, not values: each feature's thresholds are kept sorted, a row's
//! value becomes its rank among them once per prediction (how many lie below it), and a split
//! holds its threshold's rank. `x <= t_k` exactly when fewer than `k + 1` thresholds lie
//! below `x`, so the walk takes the same turns, and a split packs into 4 bytes instead of 16:
//! an ensemble of 200 trees of depth 5 keeps its splits in 25 KiB, within L1.
//!
//! Predictions are bit-for-bit those of [`Gbdt::predict`]: the same turns (`x <= t` goes
//! left, NaN right), the same leaf values added to the same base in the same tree order.

use crate::gbdt::Gbdt;

/// The deepest ensemble laid out (a tree takes 2^depth leaf slots); deeper ones are walked.
pub const MAX_DEPTH: u32 = 10;

/// Trees whose chains are stepped together.
const LANES: usize = 8;
/// Rows are ranked into an array this long, so a feature index needs no bounds check.
const MAX_FEATURES: usize = 8;
/// The rank of NaN, above every threshold's rank: NaN goes right at every split.
const NAN_RANK: u16 = u16::MAX;

/// The layout; empty (predicting nothing) when the ensemble is too deep or has no tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Compiled {
    depth: u32,
    trees: usize,
    /// Per feature, its thresholds (the padding's +inf included) sorted, each once.
    thresholds: Vec<Vec<f64>>,
    /// Per tree, its 2^depth − 1 split nodes: the feature in the high 16 bits, the rank of the
    /// threshold in the low 16.
    splits: Vec<u32>,
    /// Per tree, its 2^depth leaf slots, left to right.
    leaves: Vec<f64>,
    base: f64,
    log_target: bool,
}

impl Compiled {
    /// Lays `g` out; None when a tree is deeper than [`MAX_DEPTH`], a feature has more
    /// thresholds than a 16-bit rank holds, a threshold is NaN, or there is no tree. `g` must
    /// be valid ([`Gbdt::validate`]).
    pub fn new(g: &Gbdt) -> Option<Compiled> {
        let depth = g.roots.iter().map(|&r| depth_of(g, r)).max()?;
        if depth > MAX_DEPTH || g.n_features > MAX_FEATURES {
            return None;
        }
        let inner = (1usize << depth) - 1;
        let mut c = Compiled {
            depth,
            trees: g.roots.len(),
            thresholds: Vec::new(),
            splits: Vec::new(),
            leaves: vec![0.0; (inner + 1) * g.roots.len()],
            base: g.base,
            log_target: g.log_target,
        };
        // (feature, threshold) of every split slot; padding compares feature 0 with +inf.
        let mut slots = vec![(0u32, f64::INFINITY); inner * g.roots.len()];
        for (t, &root) in g.roots.iter().enumerate() {
            c.place(g, &mut slots, t, root, 0, 0);
        }
        let mut thresholds = vec![Vec::new(); g.n_features.max(1)];
        for &(f, t) in &slots {
            if t.is_nan() {
                return None;
            }
            thresholds.get_mut(f as usize)?.push(t);
        }
        for t in &mut thresholds {
            t.sort_by(f64::total_cmp);
            // -0.0 and 0.0 merge: every comparison treats them alike.
            t.dedup_by(|a, b| a == b);
            if t.len() >= usize::from(NAN_RANK) {
                return None;
            }
        }
        c.splits = slots
            .iter()
            .map(|&(f, t)| f << 16 | thresholds[f as usize].partition_point(|&u| u < t) as u32)
            .collect();
        c.thresholds = thresholds;
        Some(c)
    }

    /// Puts node `n` of `g` at breadth-first position `pos` (level `level`) of tree `t`,
    /// its split into `slots`.
    fn place(
        &mut self,
        g: &Gbdt,
        slots: &mut [(u32, f64)],
        t: usize,
        n: u32,
        pos: usize,
        level: u32,
    ) {
        let inner = (1usize << self.depth) - 1;
        let node = &g.nodes[n as usize];
        if node.feature == crate::gbdt::LEAF {
            // Every leaf slot under `pos`: (pos + 1)·2^(depth − level) − 1 is the leftmost.
            let span = 1usize << (self.depth - level);
            let first = (pos + 1) * span - 1 - inner;
            let at = t * (inner + 1) + first;
            self.leaves[at..at + span].fill(node.value);
            return;
        }
        slots[t * inner + pos] = (node.feature, node.threshold);
        self.place(g, slots, t, node.left, 2 * pos + 1, level + 1);
        self.place(g, slots, t, node.right, 2 * pos + 2, level + 1);
    }

    /// Whether there is a layout to predict with.
    pub fn is_empty(&self) -> bool {
        self.trees == 0
    }

    /// Predicts one row (`x.len()` at least the ensemble's features).
    #[inline]
    pub fn predict(&self, x: &[f64]) -> f64 {
        let mut rank = [NAN_RANK; MAX_FEATURES];
        for (f, (r, t)) in rank.iter_mut().zip(&self.thresholds).enumerate() {
            let v = x.get(f).copied().unwrap_or(0.0);
            if !v.is_nan() {
                *r = t.partition_point(|&u| u < v) as u16;
            }
        }
        let inner = (1usize << self.depth) - 1;
        let step = |s: &[u32], i: usize| {
            let s = s[i];
            // Left exactly when the walk goes left (`x <= t`), so NaN goes right as there.
            let left = rank[(s >> 16) as usize % MAX_FEATURES] <= s as u16;
            2 * i + 2 - usize::from(left)
        };
        let mut sum = self.base;
        let groups = self.trees / LANES;
        for g in 0..groups {
            let s = &self.splits[g * LANES * inner..][..LANES * inner];
            let mut at = [0usize; LANES];
            for _ in 0..self.depth {
                for (lane, i) in at.iter_mut().enumerate() {
                    *i = step(&s[lane * inner..][..inner], *i);
                }
            }
            let leaves = &self.leaves[g * LANES * (inner + 1)..][..LANES * (inner + 1)];
            for (lane, i) in at.iter().enumerate() {
                sum += leaves[lane * (inner + 1) + i - inner];
            }
        }
        for tree in groups * LANES..self.trees {
            let s = &self.splits[tree * inner..][..inner];
            let mut i = 0;
            for _ in 0..self.depth {
                i = step(s, i);
            }
            sum += self.leaves[tree * (inner + 1) + i - inner];
        }
        if self.log_target {
            sum.exp()
        } else {
            sum
        }
    }
}

/// Levels below node `n` to its deepest leaf (a leaf: 0). Children come after their parent
/// in a valid ensemble, so this ends.
fn depth_of(g: &Gbdt, n: u32) -> u32 {
    let node = &g.nodes[n as usize];
    if node.feature == crate::gbdt::LEAF {
        0
    } else {
        1 + depth_of(g, node.left).max(depth_of(g, node.right))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gbdt::{GbdtParams, Loss};

    #[test]
    fn predictions_are_bit_for_bit_the_walked_ensembles() {
        let mut r = crate::synthetic::XorShift::new(7);
        let x: Vec<Vec<f64>> = (0..3000)
            .map(|_| vec![r.uniform() * 32.0, r.uniform() * 1000.0, r.uniform()])
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|v| 20.0 + v[0] + if v[1] > 400.0 { 9.0 } else { 0.0 } + v[2])
            .collect();
        // Shallow and deep trees, both losses, tree counts that leave a remainder of lanes.
        for (depth, rounds, loss) in [
            (1, 7, Loss::Squared),
            (3, 50, Loss::Absolute),
            (5, 101, Loss::Absolute),
            (8, 30, Loss::Squared),
        ] {
            let params = GbdtParams {
                max_depth: depth,
                rounds,
                loss,
                min_samples_leaf: 5,
                ..GbdtParams::default()
            };
            let g = Gbdt::fit(&x, &y, &params).unwrap();
            let c = Compiled::new(&g).unwrap();
            // Rows seen in training, rows between and beyond them, and a NaN.
            let probes = x.iter().take(500).cloned().chain(
                (0..500).map(|i| vec![i as f64 * 0.1 - 5.0, i as f64 * 2.5, (i % 3) as f64 - 0.5]),
            );
            for row in probes.chain([vec![f64::NAN, 10.0, 0.5]]) {
                assert_eq!(
                    c.predict(&row).to_bits(),
                    g.predict(&row).to_bits(),
                    "depth {depth}, row {row:?}"
                );
            }
        }
    }

    #[test]
    fn too_deep_or_empty_ensembles_are_not_laid_out() {
        let mut g =
            Gbdt::fit(&[vec![1.0], vec![2.0]], &[1.0, 2.0], &GbdtParams::default()).unwrap();
        assert!(Compiled::new(&g).is_some_and(|c| !c.is_empty()));
        g.roots.clear();
        assert!(Compiled::new(&g).is_none());
    }
}
