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
pub const HEADER: &str = "job_name,start_ts,duration_us,batch_size,avg_input_length,max_input_length,avg_output_length,max_output_length,num_tokens,stage,predicted_us,overlap_tokens";

/// An open export file.
pub struct IterationCsv {
    out: BufWriter<File>,
    offset_ns: i128,
}

impl IterationCsv {
    /// Creates (truncates) the file and writes the header.
    pub fn create(path: &Path) -> Result<Self> {
        let f = sys_util::private::create_file(path).with_context(|| {
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
        // One write per row: BufWriter flushes only between writes, so a reader of the file
        // sees whole rows (a `writeln!` writes a row in pieces and a flush can cut it).
        let row = format!(
            "pid{pid},{start_us:.3},{:.3},{},{:.2},{:.2},{:.2},{:.2},{},{},{},{}\n",
            i.duration_us(),
            w.batch,
            w.input_len,
            w.input_len,
            w.output_len,
            w.output_len,
            w.tokens,
            i.stage.as_str(),
            predicted_us.map_or(String::new(), |p| format!("{p:.1}")),
            w.overlap_tokens,
        );
        self.out.write_all(row.as_bytes())?;
        Ok(())
    }

    /// Flushes buffered rows.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.out.flush()?)
    }
}

#[cfg(test)]
mod tests {
    use model::{Stage, Workload};

    use super::*;

    /// A reader of the file while the daemon appends to it (the vLLM test does so) finds only
    /// whole rows, whatever the buffer's fill when it spills.
    #[test]
    fn the_file_never_ends_in_a_partial_row() {
        let path =
            std::env::temp_dir().join(format!("stallscope-export-{}.csv", std::process::id()));
        let mut csv = IterationCsv::create(&path).unwrap();
        let mut spills = 0;
        for n in 0..2000u64 {
            let i = Iteration {
                start_ns: n * 30_000_000,
                end_ns: n * 30_000_000 + 27_123_456 + n,
                stage: Stage::Decode,
                workload: Workload {
                    batch: (n % 13) as f64,
                    input_len: 100.0 + n as f64 / 7.0,
                    output_len: 0.0,
                    tokens: (n % 13) as f64,
                    overlap_tokens: 0.0,
                },
            };
            csv.write(4242, &i, (n % 2 == 0).then_some(27_000.0 + n as f64))
                .unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            if !text.is_empty() {
                spills += 1;
                assert!(
                    text.ends_with('\n'),
                    "a cut row after {n} rows: {:?}",
                    &text[text.len() - 40..]
                );
            }
        }
        std::fs::remove_file(&path).unwrap();
        assert!(
            spills > 0,
            "the buffer never spilled: the test checked nothing"
        );
    }
}
