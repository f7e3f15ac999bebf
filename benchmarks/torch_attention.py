#!/usr/bin/python3
"""PyTorch side of bench_attention: the same self-attention shapes, timed in the same run.

Usage: /usr/bin/python3 benchmarks/torch_attention.py --threads T [--reps 9] [--shapes 32x64,...]
Run it through scripts/bench_attention.sh, which exports the environment that lets Debian's torch
run at its best on this machine (../shared/bench/peers/peer_env.sh, mode tuned512).

Timed for d_model 512, 8 heads (dk 64), float32, (B, L) in 32x64, 16x128, 8x256, 4x512, 1x1024:
  math_fwd       softmax(Q K^T / sqrt(dk)) V over (B, H, L, dk) tensors, no grad
                 (what attn's attention_forward computes)
  math_fwd_bwd   the same with Q, K, V requiring grad, then (out * G).sum().backward()
  math_fwd_bwd_causal  math_fwd_bwd under a causal mask: the logits above the diagonal set to
                 -inf (masked_fill) before the softmax, as a decoder's self-attention
  mha_fwd        nn.MultiheadAttention(512, 8, batch_first=True, dropout=0), train mode,
                 need_weights=False, self-attention q = k = v = x
  mha_fwd_bwd    the same, then (out * G).sum().backward(): grads of x and every weight

FLOP model (multiply-add = 2 FLOP; softmax, scaling, bias not counted), as bench_attention.cpp:
  attention matmuls A = 4*B*H*L^2*dk; projections P = 8*B*L*d^2 (in_proj 3 x, out_proj 1 x);
  math forward = A, MHA forward = P + A, any forward+backward = 3 x its forward; causal: A with
  the L (L + 1) / 2 visible query-key pairs per head instead of L^2 (as bench_attention's causal
  rows; PyTorch computes all L^2 and masks).
Reported per row: median and minimum milliseconds over --reps calls after 3 warm-up calls,
GFLOP/s and tokens/s (B*L per call) from the median.
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

D_MODEL, HEADS = 512, 8
DK = D_MODEL // HEADS
DEFAULT_SHAPES = "32x64,16x128,8x256,4x512,1x1024"


def measure(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def math_attention(q, k, v, blocked=None):
    """softmax(Q K^T / sqrt(dk)) V; `blocked` [L, L] bool: logits set to -inf where true."""
    logits = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(DK)
    if blocked is not None:
        logits = logits.masked_fill(blocked, float("-inf"))
    return torch.matmul(F.softmax(logits, dim=-1), v)


def cases(batch, length):
    """(name, callable, FLOP per call) for one shape; tensors are built once, outside timing."""
    gen = torch.Generator().manual_seed(batch * 10007 + length)
    q, k, v = (torch.randn(batch, HEADS, length, DK, generator=gen) for _ in range(3))
    grad_math = torch.randn(batch, HEADS, length, DK, generator=gen)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    future = torch.ones(length, length, dtype=torch.bool).triu(1)  # keys after the query

    mha = torch.nn.MultiheadAttention(D_MODEL, HEADS, dropout=0.0, batch_first=True)
    mha.train()
    x = torch.randn(batch, length, D_MODEL, generator=gen).requires_grad_(True)
    grad_mha = torch.randn(batch, length, D_MODEL, generator=gen)

    def math_fwd():
        with torch.no_grad():
            return math_attention(q, k, v)

    def math_fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        (math_attention(qg, kg, vg) * grad_math).sum().backward()

    def math_fwd_bwd_causal():
        for t in (qg, kg, vg):
            t.grad = None
        (math_attention(qg, kg, vg, future) * grad_math).sum().backward()

    def mha_fwd():
        return mha(x, x, x, need_weights=False)[0]

    def mha_fwd_bwd():
        mha.zero_grad(set_to_none=True)
        x.grad = None
        (mha(x, x, x, need_weights=False)[0] * grad_mha).sum().backward()

    attn_flop = 4.0 * batch * HEADS * length * length * DK
    causal_flop = 4.0 * batch * HEADS * length * (length + 1) / 2 * DK
    proj_flop = 8.0 * batch * length * D_MODEL * D_MODEL
    return [("math_fwd", math_fwd, attn_flop),
            ("math_fwd_bwd", math_fwd_bwd, 3 * attn_flop),
            ("math_fwd_bwd_causal", math_fwd_bwd_causal, 3 * causal_flop),
            ("mha_fwd", mha_fwd, proj_flop + attn_flop),
            ("mha_fwd_bwd", mha_fwd_bwd, 3 * (proj_flop + attn_flop))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxL,BxL,...")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shown = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY",
             "OMP_WAIT_POLICY")
    print(f"# torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
          + ", ".join(f"{name}={os.environ.get(name, '-')}" for name in shown))
    print(f"{'op':<19} {'B':>3} {'L':>5} {'threads':>7} {'median ms':>10} {'min ms':>9} "
          f"{'GFLOP/s':>8} {'tokens/s':>10}")
    for shape in args.shapes.split(","):
        batch, length = (int(n) for n in shape.split("x"))
        for name, fn, flop in cases(batch, length):
            median, best = measure(fn, args.reps)
            print(f"{name:<19} {batch:>3} {length:>5} {args.threads:>7} {median * 1e3:>10.2f} "
                  f"{best * 1e3:>9.2f} {flop / median / 1e9:>8.1f} {batch * length / median:>10.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
