"""A warm decode loop on a real GPU, for `cargo xtask gpu-check` (no downloads).

A random-init Llama from transformers when it is installed (a small fallback of bf16 matmuls
otherwise), batch 8, one token per step with a KV cache that restarts every 256 tokens.
Prints "ready <kind>", then per step "sync <t0> <t1>" (CLOCK_MONOTONIC ns around
torch.cuda.synchronize()) and every half second "tps <ns> <tokens per second>".
"""
import sys
import time

import torch

torch.manual_seed(0)
dev = "cuda"
BATCH = 8
try:
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
    kind = "matmul"
    weights = [torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16) for _ in range(16)]


@torch.inference_mode()
def run():
    past, tok, n = None, torch.randint(0, 32000, (BATCH, 16), device=dev), 0
    x = torch.randn(BATCH, 1024, device=dev, dtype=torch.bfloat16)
    tokens, mark = 0, time.monotonic_ns()
    print(f"ready {kind}", flush=True)
    while True:
        if model is not None:
            if n >= 256:
                past, tok, n = None, torch.randint(0, 32000, (BATCH, 16), device=dev), 0
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            n += 1
        else:
            for w in weights:
                x = torch.tanh(x @ w)
        t0 = time.monotonic_ns()
        torch.cuda.synchronize()
        t1 = time.monotonic_ns()
        print(f"sync {t0} {t1}")
        tokens += BATCH
        if t1 - mark >= 500_000_000:
            print(f"tps {t1} {tokens * 1e9 / (t1 - mark):.1f}", flush=True)
            tokens, mark = 0, t1


run()
