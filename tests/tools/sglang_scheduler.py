"""SGLang's own scheduler, run on a CPU without a model: tests/sglang_scheduler.rs watches it.

Real SGLang (the wheel `cargo xtask test` installs): ServerArgs, `run_scheduler_process` (which
sets the process title `sglang::scheduler_DP0`), `Scheduler.__init__`, its ZMQ input path, the
radix cache and CPU memory pools, and both event loops with `ingest_requests`,
`get_next_batch_to_run`, `run_batch` and `process_batch_result` on real `ScheduleBatch`es of
real `Req`s. Stand-in: the model worker only (`StandInWorker`, patched in for
`sglang.srt.managers.tp_worker.TpModelWorker`): its forward sleeps `--forward-ms` and returns
one fixed token per request; it writes each forward's batch to `--truth`, the record the test
holds stallscope's iterations against. This process plays the tokenizer and detokenizer ends
of the scheduler's sockets.

Protocol on stdout: `scheduler PID` once the scheduler is up; until the file `--go` exists
it sends one short request every 0.3 s (an idle scheduler sleeps in a ZMQ poll, where a
debugger's attach cannot run); then, after a quiet second, `quiet`. Once the file `--start`
exists, it sends the `--requests` requests (staggered, so that prefills and decodes mix) and
says `done` once all have finished; it shuts the scheduler down (SGLang's ShutdownReq) once
the file `--stop` exists.
"""

import argparse
import multiprocessing
import os
import sys
import time

import torch


class StandInModelRunner:
    """What the scheduler reads off `tp_worker.model_runner`: SGLang's real CPU pools (one
    layer, one head of 8: no model reads them), a CPU stream, and the attention backend's two
    flags the scheduler reads (their base-class defaults)."""

    def __init__(self, model_config, max_total_tokens, max_running):
        from types import SimpleNamespace

        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
            NgramEmbeddingManager,
        )

        self.model_config = model_config
        self.device = "cpu"
        self.max_running_requests = max_running
        self.logical_max_total_num_tokens = max_total_tokens
        self.effective_logical_max_total_num_tokens = max_total_tokens
        self.forward_stream = torch.cpu.Stream()
        self.req_to_token_pool = ReqToTokenPool(
            size=max_running,
            max_context_len=model_config.context_len + 4,
            device="cpu",
            enable_memory_saver=False,
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            size=max_total_tokens,
            page_size=1,
            dtype=torch.float32,
            head_num=1,
            head_dim=8,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
            size=max_total_tokens,
            dtype=torch.float32,
            device="cpu",
            kvcache=self.token_to_kv_pool,
            need_sort=False,
        )
        self.memory_pool_config = object()
        self.mtp_draft_device_pools = ()
        self.mtp_draft_mamba_pools = ()
        self.canary_manager = None
        self.attn_backend = SimpleNamespace(
            needs_cpu_seq_lens=True, folds_encoder_swa_replay=False
        )
        self.prefill_aware_swa = False
        self.ngram_embedding_manager = NgramEmbeddingManager.from_model(
            model=torch.nn.Module(),
            model_config=model_config,
            req_to_token_pool=self.req_to_token_pool,
            max_running_requests=max_running,
            device="cpu",
        )
        self.hisparse_coordinator = None

    def prewarm_sampling(self):
        pass

    def __getattr__(self, name):
        # Anything a newer scheduler needs fails loudly instead of being guessed.
        raise AttributeError(f"StandInModelRunner has no {name!r}")


class StandInWorker:
    """In place of TpModelWorker: no model; a forward sleeps and returns one token each."""

    FORWARD_S = 0.0
    TRUTH = None
    NEXT_TOKEN = 1000
    is_hybrid_swa = False
    sliding_window_size = None
    model_runner_list = ()
    weight_load_time = 0.0
    graph_time_usage = {}
    graph_memory_usage = {}
    preloaded_weights_bytes = 0

    def __init__(self, server_args, gpu_id, nccl_port, **_):
        from sglang.srt.configs.model_config import ModelConfig

        self.model_config = ModelConfig.from_server_args(server_args)
        self.device = "cpu"
        self.random_seed = 0
        self.max_total = server_args.max_total_tokens
        self.max_running = server_args.max_running_requests
        self.model_runner = StandInModelRunner(
            self.model_config, self.max_total, self.max_running
        )

    def alloc_memory_pool(self, *_, **__):
        pass

    def init_attention_backends(self):
        pass

    def init_cuda_graphs(self):
        pass

    def get_memory_pool(self):
        r = self.model_runner
        return r.req_to_token_pool, r.token_to_kv_pool_allocator

    def get_pad_input_ids_func(self):
        return None

    def get_worker_info(self):
        from sglang.srt.runtime_context import get_schedule

        r = self.model_runner
        max_req_len = min(self.model_config.context_len - 1, self.max_total - 1)
        return (
            self.max_total,
            get_schedule().max_prefill_tokens,
            self.max_running,
            get_schedule().max_queued_requests,
            max_req_len,
            max_req_len - 5,
            self.random_seed,
            self.device,
            r.forward_stream,
            r.req_to_token_pool.size,
            r.req_to_token_pool.max_context_len,
            r.token_to_kv_pool.size,
        )

    def forward_batch_generation(self, batch, **_):
        from sglang.srt.managers.utils import GenerationBatchResult

        time.sleep(self.FORWARD_S)
        # The real worker's ForwardBatch fills in a decode batch's seq_lens_sum.
        if batch.seq_lens_sum is None and batch.seq_lens_cpu is not None:
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        with open(self.TRUTH, "a") as f:
            f.write(f"{int(batch.forward_mode)} {len(batch.reqs)} {batch.seq_lens_sum}\n")
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=torch.full(
                (len(batch.reqs),), self.NEXT_TOKEN, dtype=torch.int64
            ),
            can_run_cuda_graph=False,
        )

    def __getattr__(self, name):
        raise AttributeError(f"StandInWorker has no {name!r}")


def scheduler_process(server_args, port_args, pipe, forward_s, truth):
    import sglang.srt.managers.tp_worker as tp_worker
    from sglang.srt.managers.scheduler import run_scheduler_process

    torch.set_num_threads(1)
    StandInWorker.FORWARD_S, StandInWorker.TRUTH = forward_s, truth
    # Scheduler.init_tp_model_worker imports the name when it runs.
    tp_worker.TpModelWorker = StandInWorker
    run_scheduler_process(
        server_args, port_args, gpu_id=0, tp_rank=0, pp_rank=0, dp_rank=0, pipe_writer=pipe
    )


class Peer:
    """The tokenizer's and the detokenizer's ends of the scheduler's sockets."""

    def __init__(self, port_args, vocab):
        import zmq

        self.ctx = zmq.Context(1)
        self.to_scheduler = self.ctx.socket(zmq.PUSH)
        self.to_scheduler.bind(port_args.scheduler_input_ipc_name)
        self.outputs = [self.ctx.socket(zmq.PULL) for _ in range(2)]
        self.outputs[0].bind(port_args.detokenizer_ipc_name)
        self.outputs[1].bind(port_args.tokenizer_ipc_name)
        self.vocab = vocab
        self.sent = 0
        self.finished = set()

    def request(self, prompt_len, max_new_tokens):
        from array import array

        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
        sp.normalize(None)
        sp.verify(self.vocab)
        i = self.sent
        self.sent += 1
        ids = array("q", [(7 * i + k) % 500 + 10 for k in range(prompt_len)])
        self.send(
            TokenizedGenerateReqInput(
                rid=f"req-{i}",
                input_text=None,
                input_ids=ids,
                input_embeds=None,
                mm_inputs=None,
                token_type_ids=None,
                sampling_params=sp,
                return_logprob=False,
                logprob_start_len=-1,
                top_logprobs_num=0,
                token_ids_logprob=None,
                stream=False,
            )
        )

    def send(self, obj):
        from sglang.srt.managers.io_struct import sock_send

        if hasattr(obj, "wrap_pickle_fields"):
            obj.wrap_pickle_fields()
        sock_send(self.to_scheduler, obj)

    def drain(self):
        import zmq
        from sglang.srt.managers.io_struct import sock_recv

        for sock in self.outputs:
            while True:
                try:
                    out = sock_recv(sock, zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                rids = getattr(out, "rids", None) or []
                reasons = getattr(out, "finished_reasons", None) or [None] * len(rids)
                self.finished.update(r for r, why in zip(rids, reasons) if why is not None)

    def wait_all(self, limit_s):
        end = time.time() + limit_s
        while len(self.finished) < self.sent:
            if time.time() > end:
                sys.exit(f"{self.sent - len(self.finished)} requests unfinished after {limit_s} s")
            self.drain()
            time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--overlap", action="store_true", help="event_loop_overlap")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--forward-ms", type=float, default=5.0)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--go", required=True)
    ap.add_argument("--start", required=True)
    ap.add_argument("--stop", required=True)
    args = ap.parse_args()
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.io_struct import ShutdownReq
    from sglang.srt.server_args import PortArgs, ServerArgs

    server_args = ServerArgs(
        model_path=args.model,
        device="cpu",
        disable_cuda_graph=True,
        skip_server_warmup=True,
        disable_overlap_schedule=not args.overlap,
        max_total_tokens=4096,
        max_running_requests=16,
        attention_backend="torch_native",
        # Idle iterations wait in SGLang's IdleSleeper instead of spinning.
        sleep_on_idle=True,
    )
    port_args = PortArgs.init_new(server_args)
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=scheduler_process,
        args=(server_args, port_args, writer, args.forward_ms / 1e3, args.truth),
    )
    peer = Peer(port_args, ModelConfig.from_server_args(server_args).vocab_size)
    try:
        child.start()
        reader.recv()
        print(f"scheduler {child.pid}", flush=True)
        while not os.path.exists(args.go):
            peer.request(4, 2)
            peer.wait_all(30)
            time.sleep(0.3)
        time.sleep(1.0)
        print("quiet", flush=True)
        while not os.path.exists(args.start):
            time.sleep(0.05)
        for i in range(args.requests):
            peer.request(8 + 3 * i, args.max_new_tokens)
            time.sleep(args.forward_ms * 2.5 / 1e3)
        peer.wait_all(120)
        print("done", flush=True)
        while not os.path.exists(args.stop):
            time.sleep(0.1)
        # With sleep_on_idle the loop sees the exit flag after its next wake-up: a second
        # message wakes it.
        for _ in range(2):
            peer.send(ShutdownReq())
            time.sleep(0.2)
        child.join(30)
        sys.exit(child.exitcode)
    finally:
        if child.is_alive():
            child.kill()
        for v in vars(port_args).values():
            if isinstance(v, str) and v.startswith("ipc://"):
                try:
                    os.unlink(v[len("ipc://") :])
                except OSError:
                    pass


if __name__ == "__main__":
    main()
