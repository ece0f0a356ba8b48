"""Load generator for the vLLM OpenAI server that `cargo xtask vllm up` started (loopback only).

Sends /v1/completions requests with varied prompt lengths (text cut from the standard library's
sources to a token count drawn from [--min-prompt, --max-prompt] with the model's own tokenizer)
and output lengths (`max_tokens` from [--min-output, --max-output], `ignore_eos`, greedy), with
--concurrency requests in flight: either --requests of them, or as many as fit in --duration
seconds. Prints one JSON summary line last; exits 1 if any request failed.
"""

import argparse
import asyncio
import json
import pathlib
import random
import sys
import sysconfig
import time

import aiohttp
from tokenizers import Tokenizer

# Requests never carry a `seed`: vLLM 0.32.0 crashes on per-request seeds with chunked prefill.
REQUEST_TIMEOUT_S = 600
# vLLM's server (uvicorn) closes a keep-alive connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE
# (5 s by default). A request sent on one as the server closes it fails with
# ServerDisconnectedError or ECONNRESET unread: of 41 requests sent after 4.990-5.010 s idle,
# 5 failed. The client drops its idle connections well before the server does; the first
# one idles while the tokenizer cuts the prompts, which takes seconds beside a busy engine.
CLIENT_KEEPALIVE_S = 2.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-dir", type=pathlib.Path, required=True)
    count = p.add_mutually_exclusive_group(required=True)
    count.add_argument("--requests", type=int, help="send this many requests")
    count.add_argument("--duration", type=float, help="keep sending for this many seconds")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="seeds the prompt and length choices")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--min-output", type=int, default=16)
    p.add_argument("--max-output", type=int, default=256)
    args = p.parse_args()
    if args.concurrency < 1 or (args.requests is not None and args.requests < 1):
        p.error("--requests and --concurrency must be at least 1")
    return args


def corpus_ids(tokenizer, want):
    """At least `want` token ids of standard-library source text, in a fixed order."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    ids = []
    for path in sorted(stdlib.glob("*.py")):
        ids += tokenizer.encode(path.read_text(encoding="utf-8", errors="replace")).ids
        if len(ids) >= want:
            return ids
    sys.exit(f"load: only {len(ids)} tokens of text in {stdlib}")


class Load:
    """Shared state of the workers: the request plan and the tallies."""

    def __init__(self, args, model, tokenizer):
        self.args = args
        self.model = model
        self.tokenizer = tokenizer
        self.rng = random.Random(args.seed)
        self.ids = corpus_ids(tokenizer, 200_000)
        self.sent = 0
        self.deadline = None if args.duration is None else time.monotonic() + args.duration
        self.ok = 0
        self.failed = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.latencies = []
        self.errors = []

    def next_request(self):
        """The next request's body, or None when the plan is done."""
        if self.deadline is not None:
            if time.monotonic() >= self.deadline:
                return None
        elif self.sent >= self.args.requests:
            return None
        self.sent += 1
        a = self.args
        n = self.rng.randint(a.min_prompt, a.max_prompt)
        start = self.rng.randrange(len(self.ids) - n)
        # The server adds BOS; n - 1 text tokens keep the prompt near n tokens.
        prompt = self.tokenizer.decode(self.ids[start : start + n - 1])
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.rng.randint(a.min_output, a.max_output),
            "temperature": 0.0,
            "ignore_eos": True,
        }

    def fail(self, message):
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(message)

    async def worker(self, session, url):
        while (body := self.next_request()) is not None:
            t0 = time.monotonic()
            try:
                async with session.post(url, json=body) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        self.fail(f"HTTP {resp.status}: {text[:300]}")
                        continue
                    usage = json.loads(text)["usage"]
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
                self.fail(f"{type(e).__name__}: {e}")
                continue
            if usage["completion_tokens"] != body["max_tokens"]:
                self.fail(
                    f"{usage['completion_tokens']} tokens generated, {body['max_tokens']} asked"
                )
                continue
            self.ok += 1
            self.latencies.append(time.monotonic() - t0)
            self.prompt_tokens += usage["prompt_tokens"]
            self.output_tokens += usage["completion_tokens"]


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


async def main():
    args = parse_args()
    base = f"http://127.0.0.1:{args.port}"
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(keepalive_timeout=CLIENT_KEEPALIVE_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async with session.get(f"{base}/v1/models") as resp:
            resp.raise_for_status()
            model = (await resp.json())["data"][0]["id"]
        tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
        load = Load(args, model, tokenizer)
        t0 = time.monotonic()
        await asyncio.gather(
            *(load.worker(session, f"{base}/v1/completions") for _ in range(args.concurrency))
        )
        wall = time.monotonic() - t0
    for e in load.errors:
        print(f"load: request failed: {e}", file=sys.stderr)
    print(
        json.dumps(
            {
                "requests_ok": load.ok,
                "requests_failed": load.failed,
                "concurrency": args.concurrency,
                "prompt_tokens": load.prompt_tokens,
                "output_tokens": load.output_tokens,
                "wall_s": round(wall, 3),
                "output_tokens_per_s": round(load.output_tokens / wall, 1) if wall else None,
                "latency_p50_s": percentile(load.latencies, 0.5),
                "latency_p99_s": percentile(load.latencies, 0.99),
            }
        ),
        flush=True,
    )
    return 1 if load.failed or not load.ok else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
