#!/usr/bin/python3
"""PyTorch side of bench_gemm: torch.mm on the same shapes and forms, timed in the same run.

Usage: /usr/bin/python3 benchmarks/torch_gemm.py --threads T [--reps 5] [--min-time 0.2]
                        [--shapes 2048x512x512,...] [--forms ab,atb,abt]
Run it through scripts/bench_compare.sh, which exports the peer's tuned512 environment
(../shared/bench/peers/peer_env.sh): Debian's torch calls OpenBLAS 0.3.21 for torch.mm, and
OPENBLAS_CORETYPE=SkylakeX selects its AVX-512 kernel; OPENBLAS_NUM_THREADS=T sizes its pool.

Shapes M x K x N, C [M, N] = A [M, K] B [K, N], float32, in three forms of the same FLOPs:
  ab   torch.mm(a, b, out=c)       a [M, K], b [K, N]
  atb  torch.mm(a.t(), b, out=c)   a stored [K, M]  (a transposed view: OpenBLAS's TransA)
  abt  torch.mm(a, b.t(), out=c)   b stored [N, K]
out= writes into a preallocated C, as attn's gemm does.
FLOP model: 2*M*K*N per product.
Timing: 3 warm-up calls, then --reps repetitions; a repetition times as many calls as fill
--min-time seconds and reports their mean; printed are the median and the minimum over the
repetitions (ms per call) and GFLOP/s from the median.
"""
import argparse
import os
import statistics
import time

import torch

DEFAULT_SHAPES = "2048x512x512,2048x512x2048,2048x2048x512,2048x512x8000"


def operands(form, m, k, n, gen):
    a = torch.randn(k, m, generator=gen) if form == "atb" else torch.randn(m, k, generator=gen)
    b = torch.randn(n, k, generator=gen) if form == "abt" else torch.randn(k, n, generator=gen)
    c = torch.empty(m, n)
    left = a.t() if form == "atb" else a
    right = b.t() if form == "abt" else b
    return lambda: torch.mm(left, right, out=c)


def measure(fn, reps, min_time):
    for _ in range(3):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time / 4 or calls < 1:
        fn()
        calls += 1
    per_rep = max(1, int(calls * 4))  # about min_time seconds per repetition
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(per_rep):
            fn()
        times.append((time.perf_counter() - start) / per_rep)
    return statistics.median(times), min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxKxN,MxKxN,...")
    parser.add_argument("--forms", default="ab,atb,abt")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    shown = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY")
    print(f"# torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
          + ", ".join(f"{name}={os.environ.get(name, '-')}" for name in shown))
    print(f"{'op':<8} {'M':>5} {'K':>5} {'N':>5} {'threads':>7} {'median ms':>10} {'min ms':>9} "
          f"{'GFLOP/s':>8}")
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        for form in args.forms.split(","):
            median, best = measure(operands(form, m, k, n, gen), args.reps, args.min_time)
            flop = 2.0 * m * k * n
            print(f"gemm_{form:<3} {m:>5} {k:>5} {n:>5} {args.threads:>7} {median * 1e3:>10.3f} "
                  f"{best * 1e3:>9.3f} {flop / median / 1e9:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
