//! Iteration tables in the LatencyPrism schema (`job_name, start_ts, duration_us,
//! batch_size, avg_input_length, max_input_length, avg_output_length, max_output_length`),
//! which is also what stallscope writes when it exports iterations (plus `num_tokens`,
//! `overlap_tokens` and `stage`). Parsing works on text already read; the caller does the I/O.

use crate::{features::Workload, ModelError};

/// One row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `job_name`, empty if the column is absent.
    pub job: String,
    /// `start_ts` (µs since the epoch), if present.
    pub start_us: Option<f64>,
    /// `duration_us`, if present.
    pub duration_us: Option<f64>,
    /// The workload columns.
    pub workload: Workload,
    /// `stage` (`prefill`, `decode`, `mixed`), if present.
    pub stage: Option<crate::Stage>,
}

/// Columns every row needs to be predicted.
pub const WORKLOAD_COLUMNS: [&str; 3] = ["batch_size", "avg_input_length", "avg_output_length"];

/// Parses CSV text with a header. `need_duration`: fitting needs `duration_us`.
/// `overlap_tokens` is optional (0 without it). `num_tokens` is optional: without it, a table with `job_name`, `start_ts` and
/// `max_output_length` (vLLM's iteration log as LatencyPrism publishes it) gets each step's
/// tokens reconstructed from its job's next row ([`crate::steps`]); any other table, one token
/// per request (a decode step's).
pub fn parse_csv(text: &str, need_duration: bool) -> Result<Vec<Row>, ModelError> {
    let mut r = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header = r
        .headers()
        .map_err(|e| ModelError::Data(format!("cannot read the header: {e}")))?
        .clone();
    let col = |name: &str| header.iter().position(|h| h == name);
    let mut required: Vec<&str> = WORKLOAD_COLUMNS.to_vec();
    if need_duration {
        required.push("duration_us");
    }
    let missing: Vec<&str> = required
        .iter()
        .copied()
        .filter(|c| col(c).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(ModelError::Data(format!(
            "missing column(s) {}: the table needs {} (LatencyPrism schema)",
            missing.join(", "),
            required.join(", ")
        )));
    }
    let [b, li, lo] = WORKLOAD_COLUMNS.map(|c| col(c).expect("checked"));
    let (dur, job, start, tokens, stage, max_out, overlap) = (
        col("duration_us"),
        col("job_name"),
        col("start_ts"),
        col("num_tokens"),
        col("stage"),
        col("max_output_length"),
        col("overlap_tokens"),
    );
    let reconstruct = tokens.is_none() && job.is_some() && start.is_some();
    let max_out = max_out.filter(|_| reconstruct);
    let (mut rows, mut logged) = (Vec::new(), Vec::new());
    for (i, rec) in r.records().enumerate() {
        let line = i + 2;
        let rec = rec.map_err(|e| ModelError::Data(format!("line {line}: {e}")))?;
        let num = |c: usize| -> Result<f64, ModelError> {
            let s = rec.get(c).unwrap_or("");
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    ModelError::Data(format!(
                        "line {line}, column {}: {s:?} is not a non-negative number",
                        &header[c]
                    ))
                })
        };
        let batch = num(b)?;
        let stage = match stage.and_then(|c| rec.get(c)) {
            None | Some("") => None,
            Some("prefill") => Some(crate::Stage::Prefill),
            Some("decode") => Some(crate::Stage::Decode),
            Some("mixed") => Some(crate::Stage::Mixed),
            Some(other) => {
                return Err(ModelError::Data(format!(
                    "line {line}, column stage: {other:?} is not prefill, decode or mixed"
                )))
            }
        };
        if let Some(c) = max_out {
            logged.push(crate::steps::Logged {
                max_output: num(c)?,
            });
        }
        rows.push(Row {
            stage,
            job: job.and_then(|c| rec.get(c)).unwrap_or("").to_string(),
            start_us: start.map(num).transpose()?,
            duration_us: dur.map(num).transpose()?,
            workload: Workload {
                batch,
                input_len: num(li)?,
                output_len: num(lo)?,
                tokens: tokens.map(num).transpose()?.unwrap_or(batch),
                overlap_tokens: overlap.map(num).transpose()?.unwrap_or(0.0),
            },
        });
    }
    if need_duration && rows.iter().any(|r| r.duration_us.is_some_and(|d| d <= 0.0)) {
        return Err(ModelError::Data("a duration_us is zero".into()));
    }
    if max_out.is_some() {
        crate::steps::reconstruct_tokens(&mut rows, &logged);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_latencyprism_schema() {
        let t = "job_name,start_ts,duration_us,batch_size,avg_input_length,max_input_length,avg_output_length,max_output_length\n\
                 in128_out128_conc1,1765199066979670.00,29493.61,1,128.00,128,73.00,73\n";
        let rows = parse_csv(t, true).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].job, "in128_out128_conc1");
        assert_eq!(rows[0].duration_us, Some(29493.61));
        assert_eq!(rows[0].workload.features()[3], 201.0);
        assert_eq!(rows[0].workload.tokens, 1.0);
        assert_eq!(rows[0].stage, None);
        let t =
            "batch_size,avg_input_length,avg_output_length,stage\n8,300,0,decode\n1,9,0,prefill\n";
        let stages: Vec<_> = parse_csv(t, false)
            .unwrap()
            .iter()
            .map(|r| r.stage)
            .collect();
        assert_eq!(
            stages,
            [Some(crate::Stage::Decode), Some(crate::Stage::Prefill)]
        );
        assert!(parse_csv(&t.replace("prefill", "warmup"), false).is_err());
    }

    #[test]
    fn names_missing_columns_and_bad_cells() {
        let e = parse_csv("batch_size,duration_us\n1,2\n", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("avg_input_length, avg_output_length"), "{e}");
        let e = parse_csv(
            "batch_size,avg_input_length,avg_output_length\n1,x,3\n",
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 2") && e.contains("avg_input_length"),
            "{e}"
        );
        // Prediction input needs no duration.
        assert_eq!(
            parse_csv(
                "batch_size,avg_input_length,avg_output_length\n2,3,4\n",
                false
            )
            .unwrap()
            .len(),
            1
        );
    }
}
