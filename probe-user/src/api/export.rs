//! Every observed iteration as a CSV row in the LatencyPrism schema (what `stallscope fit`
//! reads), plus stallscope's own columns.
//!
//! The live vLLM profile knows each batch's total KV context, not prompt and generated
//! lengths apart: `avg_input_length` holds the mean context per request and
//! `avg_output_length` is 0 (W_kv = B·(L_in + L_out) is exact either way); the `max_*`
//! columns repeat the means.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};

use model::Iteration;

/// The header line.
pub const HEADER: &str = "job_name,start_ts,duration_us,batch_size,avg_input_length,max_input_length,avg_output_length,max_output_length,num_tokens,stage,predicted_us";

/// An open export file.
pub struct IterationCsv {
    out: BufWriter<File>,
    offset_ns: i128,
}

impl IterationCsv {
    /// Creates (truncates) the file and writes the header.
    pub fn create(path: &Path) -> Result<Self> {
        let f = File::create(path).with_context(|| {
            format!(
                "cannot create the iteration export {}: set [state] iterations_csv to a writable path or \"\"",
                path.display()
            )
        })?;
        let mut out = BufWriter::new(f);
        writeln!(out, "{HEADER}")?;
        Ok(Self {
            out,
            offset_ns: crate::os::clock::realtime_offset_ns(),
        })
    }

    /// Appends one iteration of engine `pid`.
    pub fn write(&mut self, pid: u32, i: &Iteration, predicted_us: Option<f64>) -> Result<()> {
        let w = &i.workload;
        let start_us = (i.start_ns as i128 + self.offset_ns) as f64 / 1e3;
        writeln!(
            self.out,
            "pid{pid},{start_us:.3},{:.3},{},{:.2},{:.2},{:.2},{:.2},{},{},{}",
            i.duration_us(),
            w.batch,
            w.input_len,
            w.input_len,
            w.output_len,
            w.output_len,
            w.tokens,
            i.stage.as_str(),
            predicted_us.map_or(String::new(), |p| format!("{p:.1}")),
        )?;
        Ok(())
    }

    /// Flushes buffered rows.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.out.flush()?)
    }
}
