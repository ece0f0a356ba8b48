//! What each step of a LatencyPrism-schema table computed, reconstructed from its job's
//! consecutive rows, for tables that have no `num_tokens` column.
//!
//! vLLM's iteration log (LatencyPrism's `normal_vllm.csv`) lists the requests in decode at
//! each step: their count B, their mean and longest output so far. It does not say which
//! prompts the step also computed, and those steps run 1.2-8x a decode step's time (1,179 of
//! the table's 1,219 rows over 1.5x their job's median are such steps). Two facts of the log
//! let the neighbouring rows tell:
//! - a request that has all its tokens is listed once more at its final length, in a step
//!   that computes nothing for it, and then leaves;
//! - a new request first appears with 1 output token; its prompt ran in the step before,
//!   beside the others' decode, or in a step with no request in decode, which is not logged.
//!
//! So from step a to the next step b of the same job, with S = B × mean output and M_a the
//! longest output at a (the length every request of a job runs to), every request that stays
//! gains a token and every new one shows 1:
//!   S_b = S_a − f·M_a + B_b, which gives the requests that finished at a,
//!   f = (S_a + B_b − S_b) / M_a, and the new ones, n = B_b − (B_a − f);
//! step a computed B_a − f decode tokens and the n new prompts (n × b's mean input length).
//! One exception: when every request of a had finished and none finished in the step before
//! a, no client (the benchmark's clients each send their next request when the last one
//! ends) had a request waiting during a, so a computed nothing (0 tokens) and the new
//! prompts ran in an unlogged step. A job's last row keeps B tokens.
//!
//! On a live engine none of this is needed: stallscope's vLLM profile reads the tokens each
//! step computes from the scheduler's output.

use std::collections::HashMap;

use crate::dataset::Row;

/// What the table logs of one step, beside its workload: the longest output so far.
#[derive(Debug, Clone, Copy)]
pub struct Logged {
    /// `max_output_length`.
    pub max_output: f64,
}

/// Sets `workload.tokens` of every row from its job's next row (rows ordered by `start_us`
/// within each `job`). `logged[i]` belongs to `rows[i]`. Rows without a start time are left
/// as they are.
pub fn reconstruct_tokens(rows: &mut [Row], logged: &[Logged]) {
    debug_assert_eq!(rows.len(), logged.len());
    let mut jobs: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        if r.start_us.is_some() {
            jobs.entry(r.job.as_str()).or_default().push(i);
        }
    }
    let mut tokens = Vec::new();
    for (_, mut order) in jobs {
        order.sort_by(|&a, &b| {
            rows[a]
                .start_us
                .unwrap()
                .total_cmp(&rows[b].start_us.unwrap())
        });
        let mut finished_before = 0.0;
        for (k, &a) in order.iter().enumerate() {
            let wa = &rows[a].workload;
            let Some(&b) = order.get(k + 1) else {
                tokens.push((a, wa.batch));
                continue;
            };
            let wb = &rows[b].workload;
            let m = logged[a].max_output;
            let finished = if m > 0.0 {
                ((wa.batch * wa.output_len + wb.batch - wb.batch * wb.output_len) / m)
                    .round()
                    .clamp(0.0, wa.batch)
            } else {
                0.0
            };
            // Sums of huge cells can overflow to ∞ − ∞.
            let finished = if finished.is_nan() { 0.0 } else { finished };
            let staying = wa.batch - finished;
            let new = (wb.batch - staying).max(0.0);
            let prompts = if staying == 0.0 && finished_before == 0.0 {
                0.0
            } else {
                new * wb.input_len
            };
            tokens.push((a, staying + prompts));
            finished_before = finished;
        }
    }
    for (i, t) in tokens {
        rows[i].workload.tokens = t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::Workload;

    /// What a case names, the steps the table lists, the tokens each step computed.
    type Case = (&'static str, Vec<(f64, f64, f64)>, Vec<f64>);

    /// Rows of one job: (batch, mean output, longest output), 128-token prompts, 30 ms apart.
    fn job(steps: &[(f64, f64, f64)]) -> (Vec<Row>, Vec<Logged>) {
        steps
            .iter()
            .enumerate()
            .map(|(i, &(batch, output_len, max_output))| {
                (
                    Row {
                        job: "j".into(),
                        start_us: Some(30_000.0 * i as f64),
                        duration_us: Some(29_000.0),
                        workload: Workload {
                            batch,
                            input_len: 128.0,
                            output_len,
                            tokens: batch,
                            overlap_tokens: 0.0,
                        },
                        stage: None,
                    },
                    Logged { max_output },
                )
            })
            .unzip()
    }

    #[test]
    fn steps_are_reconstructed_from_their_neighbours() {
        let cases: [Case; 4] = [
            (
                "one request at a time: the step at its final length computes nothing",
                vec![(1.0, 127.0, 127.0), (1.0, 128.0, 128.0), (1.0, 1.0, 1.0)],
                vec![1.0, 0.0, 1.0],
            ),
            (
                "two clients: the step after a finish carries the replacement's prompt",
                vec![(2.0, 127.5, 128.0), (1.0, 128.0, 128.0), (1.0, 1.0, 1.0)],
                vec![1.0, 128.0, 1.0],
            ),
            (
                "a request leaves, its replacement's prompt runs beside 7 decodes",
                vec![
                    (8.0, 105.375, 128.0),
                    (7.0, 103.142857, 104.0),
                    (8.0, 91.25, 105.0),
                ],
                vec![7.0, 7.0 + 128.0, 8.0],
            ),
            (
                "rows out of order in the table are taken in order of start time",
                vec![(1.0, 127.0, 127.0), (1.0, 128.0, 128.0), (1.0, 1.0, 1.0)],
                vec![1.0, 0.0, 1.0],
            ),
        ];
        for (what, steps, want) in cases {
            let (mut rows, mut logged) = job(&steps);
            let mut want = want;
            if what.starts_with("rows out of order") {
                rows.reverse();
                logged.reverse();
                want.reverse();
            }
            reconstruct_tokens(&mut rows, &logged);
            let got: Vec<f64> = rows.iter().map(|r| r.workload.tokens).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn jobs_are_kept_apart_and_rows_without_a_start_left_alone() {
        let (mut a, mut la) = job(&[(1.0, 127.0, 127.0), (1.0, 128.0, 128.0)]);
        let (mut b, lb) = job(&[(4.0, 10.0, 10.0), (4.0, 11.0, 11.0)]);
        for r in &mut b {
            r.job = "k".into();
        }
        b[1].start_us = None;
        a.append(&mut b);
        la.extend(lb);
        reconstruct_tokens(&mut a, &la);
        let got: Vec<f64> = a.iter().map(|r| r.workload.tokens).collect();
        // Each job's last row keeps its batch; the row without a start keeps its own.
        assert_eq!(got, [1.0, 1.0, 4.0, 4.0]);
    }
}
