"""A decode loop on a stand-in GPU, for the GPU plane tests.

argv[1] is the stand-in libcupti (a copy named libcupti.so.13); it is mapped at start, the way
`import torch` maps the wheel's CUPTI. Each step launches two kernels and a copy on stream 7
and synchronizes (which really waits for the simulated stream), printing for each launch its
correlation id and the CLOCK_MONOTONIC ns just before and after the call, then what CUPTI
holds (`state N`). With argv[2] == "held", another tool holds the CUPTI subscriber slot and
does not share it; with "shared", another tool holds it and shares it.
"""
import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
lib.stallscope_standin_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32]
lib.stallscope_standin_launch.restype = ctypes.c_uint32
lib.stallscope_standin_memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32]
lib.stallscope_standin_memcpy.restype = ctypes.c_uint32
lib.stallscope_standin_synchronize.argtypes = [ctypes.c_uint32]
lib.stallscope_standin_state.restype = ctypes.c_uint64
lib.stallscope_standin_hold.argtypes = [ctypes.c_int, ctypes.c_char_p]
HOLDS = {"held": (1, b"torch.profiler (Kineto)"), "shared": (2, b"Nsight Systems")}
if len(sys.argv) > 2:
    lib.stallscope_standin_hold(*HOLDS[sys.argv[2]])

KERNELS = ((b"ampere_bf16_gemm_128x128", 300_000), (b"flash_attn_decode", 120_000))


def step():
    for name, ns in KERNELS:
        t0 = time.monotonic_ns()
        corr = lib.stallscope_standin_launch(name, ns, 7)
        t1 = time.monotonic_ns()
        print(f"launch {corr} {t0} {t1}")
    lib.stallscope_standin_memcpy(1 << 20, 40_000, 7)
    lib.stallscope_standin_synchronize(7)
    print(f"state {lib.stallscope_standin_state()}", flush=True)
    time.sleep(0.002)


print("ready", flush=True)
while True:
    step()
