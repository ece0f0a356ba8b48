//! A steady load on an engine's OpenAI-compatible completions endpoint on loopback, so that
//! `stallscope evaluate` needs nothing but a running engine: `concurrency` threads, each with
//! one request in flight, of seeded random prompt and output lengths (greedy, `ignore_eos`, so
//! that every request runs to its length whatever the weights).

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sys_util::http;

/// Words of the prompts: common Python tokens, one token each in most code-trained
/// vocabularies, so that a prompt's token count follows its word count.
const WORDS: [&str; 16] = [
    "def", "return", "self", "import", "from", "class", "if", "else", "for", "in", "None", "True",
    "while", "with", "as", "pass",
];
/// Prompt words and output tokens: from a few to a few hundred, so that the batch's context
/// and lengths vary as in serving.
const PROMPT_WORDS: std::ops::RangeInclusive<usize> = 16..=400;
const OUTPUT_TOKENS: std::ops::RangeInclusive<u32> = 16..=256;
/// The longest one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// The load while it runs; stopped (and its threads joined) when dropped.
pub struct Load {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts `concurrency` clients against the server on 127.0.0.1:`port`, after asking it
    /// which model it serves.
    pub fn start(port: u16, concurrency: usize, seed: u64) -> Result<Load> {
        let models = http::get(port, "/v1/models", Duration::from_secs(30))
            .with_context(|| format!("no OpenAI-compatible server answers on 127.0.0.1:{port}"))?;
        let v: Value = serde_json::from_str(&models.body).unwrap_or(Value::Null);
        let Some(model) = v["data"][0]["id"].as_str().map(str::to_string) else {
            bail!(
                "127.0.0.1:{port}/v1/models lists no model (HTTP {}): is it an OpenAI-compatible engine?",
                models.status
            );
        };
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicU64::new(0));
        let threads = (0..concurrency)
            .map(|i| {
                let (stop, failed, model) = (stop.clone(), failed.clone(), model.clone());
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(i as u64));
                std::thread::Builder::new()
                    .name(format!("stallscope-load-{i}"))
                    .spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            if !complete(port, &model, &mut rng) {
                                failed.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_secs(1));
                            }
                        }
                    })
                    .context("cannot start a load thread")
            })
            .collect::<Result<_>>()?;
        Ok(Load {
            stop,
            failed,
            threads,
        })
    }

    /// Requests that failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One completion request; whether it succeeded.
fn complete(port: u16, model: &str, rng: &mut impl Rng) -> bool {
    let words = rng.random_range(PROMPT_WORDS);
    let prompt: Vec<&str> = (0..words)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect();
    let body = json!({
        "model": model,
        "prompt": prompt.join(" "),
        "max_tokens": rng.random_range(OUTPUT_TOKENS),
        "temperature": 0.0,
        "ignore_eos": true,
    });
    http::post_json(port, "/v1/completions", &body.to_string(), REQUEST_TIMEOUT)
        .is_ok_and(|r| r.status == 200)
}
