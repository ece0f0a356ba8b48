//! `cargo xtask bench --only batch-queue`: the sentinel on vLLM's batch-queue loop
//! (`EngineCore.step_with_batch_queue`) at length: tests/batch_queue_vllm.rs against the
//! server `cargo xtask vllm up --pipeline-parallel 2` left running, its counted load 160
//! requests instead of the test's 48. It prints its table: vLLM's logged iterations against
//! the ones the daemon exported (count, and workloads in order), and the alert under a CPU hog.

use anyhow::Result;

use crate::bench_sentinel::server_state;

/// Requests of the counted load (8 in flight).
const REQUESTS: &str = "160";

pub fn run() -> Result<()> {
    let Some(server) = server_state()? else {
        println!("\n(batch-queue skipped: no vLLM server; run `cargo xtask vllm up --pipeline-parallel 2` first)");
        return Ok(());
    };
    if server["pipeline_parallel"].as_u64().unwrap_or(1) < 2 {
        println!(
            "\n(batch-queue skipped: the vLLM server is not pipelined; run `cargo xtask vllm down && cargo xtask vllm up --pipeline-parallel 2` first)"
        );
        return Ok(());
    }
    crate::vllm_test(
        "batch_queue_vllm",
        &server.to_string(),
        &[("STALLSCOPE_BATCH_QUEUE_REQUESTS", REQUESTS)],
    )
}
