"""A warm decode loop on a real GPU, for `cargo xtask gpu-check` (no downloads).

argv[1] picks the loop:
- `llama` (default): a random-init Llama from transformers (8 x 1024), batch 8, one token per
  step with a KV cache that restarts every 256 tokens (that step is a 16-token prefill). Eager
  PyTorch: ~330 kernel launches a step, so the step is bound by the CPU's launches.
- `gemv`: decode-shaped and bound by the GPU: per step 24 bf16 [64 x 8192] x [8192 x 8192]
  products (weights streamed from memory, as a decode step does), after copying the step's
  input ids from pinned host memory.
 Each step is one call of `step(batch, n)` (n: tokens in the KV
cache), which ends by copying the sampled tokens to the host, as an engine does to detokenize.
Prints "ready <kind>", then per step "sync <t0> <t1>" (CLOCK_MONOTONIC ns around
torch.cuda.synchronize()) and "step <t0> <t1>" (the whole step), and every half second
"tps <ns> <tokens per second>".
"""
import os
import sys
import time

import torch

torch.manual_seed(0)
# cpu only to try the check's own harness on a machine without a GPU.
dev = os.environ.get("STALLSCOPE_GPU_CHECK_DEVICE", "cuda")
BATCH = 8
PROMPT = 16
KIND = sys.argv[1] if len(sys.argv) > 1 else "llama"
try:
    if KIND != "llama":
        raise ImportError(KIND)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(cfg).to(dev, torch.bfloat16).eval()
    kind = "llama"
except ImportError:
    model = None
    kind = "gemv"
    BATCH = 64
    # (A CPU try of the harness gets small weights.)
    HIDDEN = 8192 if dev == "cuda" else 512
    weights = [torch.randn(HIDDEN, HIDDEN, device=dev, dtype=torch.bfloat16) for _ in range(24)]
    host_ids = torch.zeros(BATCH, dtype=torch.int64).pin_memory() if dev == "cuda" else torch.zeros(BATCH, dtype=torch.int64)

state = {"past": None, "tok": None, "x": torch.randn(BATCH, HIDDEN if model is None else 1024, device=dev, dtype=torch.bfloat16)}
out_lines = []


def step(batch, n):
    t_start = time.monotonic_ns()
    if model is not None:
        if n == 0:
            state["past"] = None
            state["tok"] = torch.randint(0, 32000, (batch, PROMPT), device=dev)
        out = model(input_ids=state["tok"], past_key_values=state["past"], use_cache=True)
        state["past"], state["tok"] = out.past_key_values, out.logits[:, -1:].argmax(-1)
    else:
        ids = host_ids.to(dev, non_blocking=True)
        x = state["x"] + ids[:, None].to(torch.bfloat16)
        for w in weights:
            x = torch.tanh(x @ w)
        state["x"] = x
        state["tok"] = x[:, :1].argmax(-1)
    t0 = time.monotonic_ns()
    if dev == "cuda":
        torch.cuda.synchronize()
    t1 = time.monotonic_ns()
    state["tok"].cpu()
    t_end = time.monotonic_ns()
    out_lines.append(f"sync {t0} {t1}\nstep {t_start} {t_end}\n")


def run():
    print(f"ready {kind}", flush=True)
    n, tokens, mark = 0, 0, time.monotonic_ns()
    # Not a decorator on step: the sentinel times step itself.
    torch.inference_mode().__enter__()
    while True:
        step(BATCH, n)
        n = 0 if n >= 256 else n + 1
        tokens += BATCH
        now = time.monotonic_ns()
        if now - mark >= 500_000_000:
            out_lines.append(f"tps {now} {tokens * 1e9 / (now - mark):.1f}\n")
            sys.stdout.write("".join(out_lines))
            sys.stdout.flush()
            out_lines.clear()
            tokens, mark = 0, now


run()
