#!/usr/bin/python3
"""attn against PyTorch, alternately in one run, and the ratio table for the README.

Usage (through scripts/bench_compare.sh, which builds the bench binaries and installs the peer):
  /usr/bin/python3 benchmarks/bench_compare.py --build BUILD_DIR [--only train,decode,mha,gemm]
      [--rounds 3] [--reps 5] [--threads 2,1] [--min-time 0.2] [--out FILE.md] [--raw DIR]

Each round runs every selected job on both sides in turn, attn first in rounds 1, 3, 5, ... and
PyTorch first in rounds 2, 4, ... (A B, B A, A B, ...), after an FMA-peak probe (bench_fma_peak)
whose figure every attn process of that round is given (ATTN_FMA_PEAK), so that each GFLOP/s is
also a % of the peak measured minutes apart. Jobs:
  train   training step, small and base (bench_train_step vs peers/torch_transformer.py train),
          32 x 64 tokens, each thread count; also the peak resident memory of each process
  decode  base greedy decoding of 30 tokens, batch 1 (each thread count) and batch 32 (the
          highest thread count) (bench_train_step vs peers/torch_transformer.py decode)
  mha     multi-head attention block forward+backward, d 512, 8 heads, B x L 32x64 and 4x512
          (bench_attention mha_fwd_bwd vs nn.MultiheadAttention, benchmarks/torch_attention.py),
          and the attention alone at the same shapes (bench_attention fast_fwd_bwd, Q, K and V
          the column blocks of one packed projection, vs PyTorch's math attention math_fwd_bwd),
          also under a causal mask (fast_fwd_bwd_causal vs math_fwd_bwd_causal)
  gemm    2048x512x512, 2048x512x2048, 2048x2048x512, 2048x512x8000 as A B, A^T B and A B^T
          (bench_gemm vs torch.mm on OpenBLAS, benchmarks/torch_gemm.py)
Both sides warm up before timing and time --reps repetitions (train: one step each, after 2
warm-up steps; decode: one decode each, after warm-up; mha and gemm: --min-time seconds each).
Per round and side: median and best of the repetitions. Table: median over rounds of the
per-round medians, best of the bests, and the speed-up attn/PyTorch (throughput) as the median
of the per-round ratios with their range. Each PyTorch process runs in the peer's tuned512
environment (../shared/bench/peers/peer_env.sh) on a CPU with AVX-512, else in its tuned one
less the SkylakeX kernels (peer_mode); attn's with OMP_NUM_THREADS unset.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cases import (GROUPS, PEERS, PY, ROOT, decode_jobs, gemm_jobs,  # noqa: E402
                         mha_jobs, train_jobs)


# ---- running one side ----------------------------------------------------------------------

def run(argv, env, log, timeout):
    """Runs argv with output to `log`; returns (output, peak RSS of the process in MiB)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout, proc.kill)  # os.wait4 has no timeout of its own
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # wait4: the rusage of this child alone
        finally:
            timer.cancel()
        code = os.waitstatus_to_exitcode(status)
    with open(log) as f:
        text = f.read()
    if code != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited with {code} (log {log}):\n"
                           + "\n".join(text.splitlines()[-8:]))
    return text, usage.ru_maxrss / 1024.0


def attn_env(peak):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENBLAS_", "MALLOC_", "OMP_", "ATEN_"))}
    if peak:
        env["ATTN_FMA_PEAK"] = f"{peak[1]:.3f},{peak[2]:.3f}"
    return env


def run_attn(args, binary, bench_filter, reps, log, peak):
    """One bench binary on `bench_filter`; returns (Google Benchmark's JSON, peak RSS MiB)."""
    out_json = log + ".json"
    argv = [os.path.join(args.build, "benchmarks", binary), f"--benchmark_filter={bench_filter}",
            f"--benchmark_repetitions={reps}", f"--benchmark_min_time={args.min_time}",
            f"--benchmark_out={out_json}", "--benchmark_out_format=json"]
    _, rss = run(argv, attn_env(peak), log, args.timeout)
    with open(out_json) as f:
        return json.load(f), rss


def attn_runs(data, prefix):
    """The per-repetition entries of the benchmark whose run_name starts with `prefix`."""
    runs = [b for b in data["benchmarks"]
            if b.get("run_type") == "iteration" and b["run_name"].startswith(prefix)]
    if not runs:
        raise RuntimeError(f"bench output has no benchmark {prefix}*")
    for b in runs:
        if b.get("error_occurred"):
            raise RuntimeError(f"{b['name']}: {b.get('error_message')}")
    return runs


def to_ms(b):
    return b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]


def record_attn(case, data, peak):
    runs = attn_runs(data, case.attn_prefix)
    times = [to_ms(b) for b in runs]
    gflops = [b["GFLOP/s"] for b in runs if "GFLOP/s" in b]
    per_call = [b["tokens/call"] for b in runs if "tokens/call" in b]
    case.attn.append(dict(median_ms=statistics.median(times), best_ms=min(times),
                          gflops=statistics.median(gflops) if gflops else None,
                          work=statistics.median(per_call) if per_call else case.tokens,
                          peak=peak[case.threads] if case.threads in peak else None))


def peer_mode():
    """The peer's environment for this CPU: tuned512 where it has AVX-512; else the same without
    its AVX-512 settings (peer_env.sh's tuned forces OpenBLAS's SkylakeX kernels, which an AVX2
    CPU cannot run: OpenBLAS then picks its own, Haswell's on a Zen 3)."""
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    return "tuned512" if "avx512f" in flags else "tuned-avx2"


def peer_env_command(threads):
    mode = peer_mode()
    if mode == "tuned512":
        return f"peer_env tuned512 {threads}"
    return f"peer_env tuned {threads} && unset OPENBLAS_CORETYPE"


def run_peer(args, peer_argv, threads, log):
    script = (f"source {shlex.quote(os.path.join(PEERS, 'peer_env.sh'))} && "
              f"{peer_env_command(threads)} && exec {PY} " + shlex.join(peer_argv))
    return run(["bash", "-c", script], dict(os.environ), log, args.timeout)


def probe_peak(args, log, reps):
    """GFLOP/s of bench_fma_peak's calibrated probe on 1 and 2 threads: {1: p1, 2: p2}.

    The probe of its main() (best of 5 runs of about 0.1 s each, fma_peak.hpp) rather than its
    repeated benchmark loop: on this VM the loop's short runs measured 134 / 261 GFLOP/s while the
    calibrated probe and attn's own GEMM both ran above 390 on 2 threads."""
    data, _ = run_attn(args, "bench_fma_peak", "^fma_peak/threads:", reps, log, None)
    context = data.get("context", {})
    return {1: float(context["fma_peak_GFLOP/s_1_thread"]),
            2: float(context["fma_peak_GFLOP/s_2_threads"])}


def attn_runs_first(r):
    """Whether attn runs before PyTorch in round r (from 0): run_round's order, which round_order
    reports."""
    return r % 2 == 0


def run_round(args, r, jobs, raw, peaks):
    """Round r (from 0, as the raw logs r0_..., r1_... are numbered): the FMA probe, then each job
    on both sides, attn first when r is even and PyTorch first when it is odd (attn_runs_first),
    so that an effect of position or of drift does not always favour the same side. With a fixed
    order, position cannot be told apart from what is measured: in session 38 a scratch build
    that always ran second measured 1.10x over 40 pairs, and when the order rotated its gain
    shrank (docs/benchmark-history.md, Zen 3). A case keeps a round only if both sides measured
    it."""
    say = lambda msg: print(f"[round {r + 1}/{args.rounds}] {msg}", file=sys.stderr, flush=True)
    peak = probe_peak(args, os.path.join(raw, f"r{r}_fma_peak.log"), max(3, args.reps))
    peaks.append(peak)
    say(f"FMA peak {peak[1]:.0f} / {peak[2]:.0f} GFLOP/s on 1 / 2 threads")
    for job in jobs:
        stem = os.path.join(raw, f"r{r}_{job.name.replace(' ', '_')}")

        def attn_side():
            data, rss = run_attn(args, job.attn_binary, job.attn_filter, args.reps,
                                 stem + "_attn.log", peak)
            for case in job.cases:
                record_attn(case, data, peak)
                case.rss["attn"].append(rss)

        def peer_side():
            text, rss = run_peer(args, job.peer_argv, job.cases[0].threads, stem + "_peer.log")
            job.parse_peer(job.cases, text)
            for case in job.cases:
                case.rss["peer"].append(rss)

        try:
            for side in (attn_side, peer_side) if attn_runs_first(r) else (peer_side, attn_side):
                side()
            say(f"{job.name}: done")
        except (RuntimeError, KeyError, OSError, ValueError) as e:
            say(f"{job.name}: FAILED: {e}")
            for case in job.cases:  # keep the rounds of both sides paired
                for mine, theirs in (case.attn, case.peer), (case.rss["attn"], case.rss["peer"]):
                    kept = min(len(mine), len(theirs))
                    del mine[kept:], theirs[kept:]


# ---- the report ----------------------------------------------------------------------------

def summary(case, side):
    """(median, best) over rounds in the case's unit, and per-round throughputs (1 / ms, or
    tok/s) for the ratio."""
    rounds = getattr(case, side)
    if case.unit == "tok/s":
        rates = [r["work"] / r["median_ms"] * 1e3 for r in rounds]
        best = max(r["work"] / r["best_ms"] * 1e3 for r in rounds)
        return statistics.median(rates), best, rates
    med = statistics.median(r["median_ms"] for r in rounds)
    return med, min(r["best_ms"] for r in rounds), [1.0 / r["median_ms"] for r in rounds]


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "tok/s" or v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def case_row(case):
    if not case.attn:
        return f"| {case.label} | {case.threads} | failed | failed | - | - | - | - |"
    a_med, a_best, a_rates = summary(case, "attn")
    p_med, p_best, p_rates = summary(case, "peer")
    ratios = sorted(a / p for a, p in zip(a_rates, p_rates))
    ratio = f"{statistics.median(ratios):.2f}"
    if len(ratios) > 1:
        ratio += f" ({ratios[0]:.2f}-{ratios[-1]:.2f})"
    a_gflops = median_of(r["gflops"] for r in case.attn)
    pct = median_of(100 * r["gflops"] / r["peak"] if r["gflops"] and r["peak"] else None
                    for r in case.attn)
    p_gflops = median_of(r.get("gflops") for r in case.peer)
    return (f"| {case.label} | {case.threads} | {fmt(a_med, case.unit)} ({fmt(a_best, case.unit)}) "
            f"| {fmt(p_med, case.unit)} ({fmt(p_best, case.unit)}) | {ratio} "
            f"| {fmt(a_gflops, '')} | {'-' if pct is None else f'{pct:.0f}%'} | {fmt(p_gflops, '')} |")


def round_order(rounds):
    """Which side ran first in which rounds, counted from 1 ("attn first in rounds 1, 3 and 5,
    PyTorch first in rounds 2 and 4"): with an odd count, attn ran first once more."""
    def listed(numbers):
        words = [str(n) for n in numbers]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    first = [r + 1 for r in range(rounds) if attn_runs_first(r)]
    second = [r + 1 for r in range(rounds) if not attn_runs_first(r)]
    text = f"attn first in round{'s' * (len(first) > 1)} {listed(first)}"
    if second:
        text += f", PyTorch first in round{'s' * (len(second) > 1)} {listed(second)}"
    return text


def report(args, cases, peaks, load):
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"attn against PyTorch {args.torch_version} ({peer_mode()}), interleaved: {date}, "
             f"commit {commit}, {cpu}, {os.cpu_count()} cores, load average {load[0]:.1f} "
             f"at the start and {load[1]:.1f} at the end.",
             "",
             f"Command: `{args.command}` ({args.rounds} round{'s' * (args.rounds > 1)} of attn "
             f"and PyTorch in turn, {round_order(args.rounds)}, "
             f"{args.reps} repetition{'s' * (args.reps > 1)} per side and round, after warm-up).",
             ""]
    if peaks:
        p1 = statistics.median(p[1] for p in peaks)
        p2 = statistics.median(p[2] for p in peaks)
        lines += [f"FMA peak (bench_fma_peak's calibrated probe, median of the rounds): {p1:.0f} GFLOP/s on "
                  f"1 thread, {p2:.0f} on 2.", ""]
    if args.reps < 5 or args.rounds < 3:
        lines += ["**Fewer than 5 repetitions or 3 rounds: a smoke run, not figures to publish.**",
                  ""]
    lines += ["Medians over rounds of each round's median, best repetition in parentheses; "
              "attn / PyTorch is the throughput ratio, median of the rounds (range).", "",
              "| benchmark | threads | attn median (best) | PyTorch median (best) "
              "| attn / PyTorch | attn GFLOP/s | attn % of peak | PyTorch GFLOP/s |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [case_row(c) for c in cases]
    if any(100 * r["gflops"] > 105 * r["peak"] for c in cases for r in c.attn
           if r["gflops"] and r["peak"]):
        lines += ["", "**Above 100% of peak: the probe ran slower than the benchmark, so the machine "
                  "was not quiet (another process, or the clock changed); rerun.**"]
    trained = [c for c in cases if c.group == "train" and c.rss["attn"] and c.rss["peer"]]
    if trained:
        lines += ["", "Peak resident memory of the whole process (ru_maxrss, MiB; max over rounds):",
                  "", "| benchmark | threads | attn | PyTorch | attn / PyTorch |", "|---|---|---|---|---|"]
        for c in trained:
            a, p = max(c.rss["attn"]), max(c.rss["peer"])
            lines.append(f"| {c.label.split(' (')[0]} | {c.threads} | {a:,.0f} | {p:,.0f} | {a / p:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="build directory with benchmarks/bench_*")
    parser.add_argument("--only", default=",".join(GROUPS), help="subset of " + ",".join(GROUPS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5, help="repetitions per side and round")
    parser.add_argument("--threads", default="2,1", help="thread counts, e.g. 2 or 2,1")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds per repetition of the mha and gemm kernels")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per process")
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--raw", help="directory for the logs and JSON of every process")
    parser.add_argument("--command", default=shlex.join(sys.argv), help="command shown in the table")
    args = parser.parse_args()
    only = args.only.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    bad = [g for g in only if g not in GROUPS] + [t for t in threads if t not in (1, 2)]
    if bad or args.rounds < 1 or args.reps < 1:
        parser.error(f"expected --only from {GROUPS}, --threads from 1,2, rounds and reps >= 1; "
                     f"got {bad or (args.rounds, args.reps)}")
    jobs = []
    if "train" in only:
        jobs += train_jobs(threads, args.reps)
    if "decode" in only:
        jobs += decode_jobs(threads, args.reps)
    if "mha" in only:
        jobs += mha_jobs(threads, args.reps)
    if "gemm" in only:
        jobs += gemm_jobs(threads, args.reps, args.min_time)
    raw = args.raw or tempfile.mkdtemp(prefix="attn_bench_compare_")
    os.makedirs(raw, exist_ok=True)
    load_start = os.getloadavg()[0]
    peaks = []
    for r in range(args.rounds):
        run_round(args, r, jobs, raw, peaks)
    version = set()
    for name in os.listdir(raw):
        if name.endswith("_peer.log"):
            m = re.search(r"# torch (\S+?),? ", open(os.path.join(raw, name)).read())
            if m:
                version.add(m.group(1))
    args.torch_version = "/".join(sorted(version)) or "?"
    text = report(args, [c for j in jobs for c in j.cases], peaks, (load_start, os.getloadavg()[0]))
    print(text)
    print(f"(logs and JSON of every process: {raw})", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if all(c.attn for j in jobs for c in j.cases) else 1


if __name__ == "__main__":
    sys.exit(main())
