#!/usr/bin/python3
"""What bench_compare.py compares: the shapes, one Case per row of its table, one Job per pair of
processes (attn's bench binary and the PyTorch peer's script) with the cases it measures, and the
parsers of the peers' outputs. bench_compare.py runs the jobs and writes the report."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "..", "shared", "bench", "peers")
PY = "/usr/bin/python3"  # Debian's python3, the one with torch
GROUPS = ("train", "decode", "mha", "gemm")
MHA_SHAPES = ((32, 64), (4, 512))
GEMM_SHAPES = ((2048, 512, 512), (2048, 512, 2048), (2048, 2048, 512), (2048, 512, 8000))
GEMM_FORMS = ("ab", "atb", "abt")
OUT_LEN = 30  # decoding: tokens per source row


class Case:
    """One row of the table, in `unit`: "tok/s" (a rate: tokens = work per call) or "ms"."""

    def __init__(self, group, label, threads, attn_prefix, unit, tokens=None):
        self.group, self.label, self.threads = group, label, threads
        self.attn_prefix, self.unit, self.tokens = attn_prefix, unit, tokens
        self.attn, self.peer = [], []  # per round: dict(median_ms, best_ms, gflops, work, ...)
        self.rss = {"attn": [], "peer": []}


class Job:
    """One attn process and one PyTorch process, yielding the measurements of some cases."""

    def __init__(self, name, attn_binary, attn_filter, peer_argv, cases, parse_peer):
        self.name, self.attn_binary, self.attn_filter = name, attn_binary, attn_filter
        self.peer_argv, self.cases, self.parse_peer = peer_argv, cases, parse_peer


def train_jobs(threads, reps):
    jobs = []
    for t in threads:
        for cfg in ("small", "base"):
            case = Case("train", f"{cfg} training step (target tok/s)", t,
                        f"train_step/{cfg}/threads:{t}/", "tok/s", tokens=32 * 64)
            argv = [os.path.join(PEERS, "torch_transformer.py"), "train", "--config", cfg,
                    "--threads", str(t), "--steps", str(reps)]
            jobs.append(Job(f"train {cfg} t{t}", "bench_train_step", f"^train_step/{cfg}/threads:{t}/",
                            argv, [case], parse_peer_train))
    return jobs


def decode_jobs(threads, reps):
    jobs = []
    for batch, ts in ((1, threads), (32, threads[:1])):
        for t in ts:
            case = Case("decode", f"base greedy decoding, batch {batch} (tok/s)", t,
                        f"greedy_decode/base/batch:{batch}/threads:{t}/", "tok/s",
                        tokens=batch * OUT_LEN)
            argv = [os.path.join(PEERS, "torch_transformer.py"), "decode", "--config", "base",
                    "--batch", str(batch), "--threads", str(t), "--reps", str(reps)]
            jobs.append(Job(f"decode b{batch} t{t}", "bench_train_step",
                            f"^greedy_decode/base/batch:{batch}/threads:{t}/", argv, [case],
                            parse_peer_decode))
    return jobs


# bench_attention's name of a benchmark -> torch_attention.py's, and the table's label.
MHA_OPS = (("mha_fwd_bwd", "mha_fwd_bwd", "MHA block fwd+bwd"),
           ("fast_fwd_bwd", "math_fwd_bwd", "attention alone fwd+bwd"),
           ("fast_fwd_bwd_causal", "math_fwd_bwd_causal", "causal attention alone fwd+bwd"))


def mha_jobs(threads, reps):
    jobs = []
    for t in threads:
        cases = [Case("mha", f"{label}, {b}x{l} (ms)", t, f"{op}/B:{b}/L:{l}/threads:{t}/", "ms")
                 for op, _, label in MHA_OPS for b, l in MHA_SHAPES]
        shapes = ",".join(f"{b}x{l}" for b, l in MHA_SHAPES)
        argv = [os.path.join(ROOT, "benchmarks", "torch_attention.py"), "--threads", str(t),
                "--reps", str(reps), "--shapes", shapes]
        ops = "|".join(op for op, _, _ in MHA_OPS)
        sizes = "|".join(f"B:{b}/L:{l}" for b, l in MHA_SHAPES)
        jobs.append(Job(f"mha t{t}", "bench_attention", f"^({ops})/({sizes})/threads:{t}/", argv,
                        cases, parse_peer_mha))
    return jobs


def gemm_jobs(threads, reps, min_time):
    jobs = []
    for t in threads:
        cases = [Case("gemm", f"GEMM {f} {m}x{k}x{n} (ms)", t,
                      f"gemm/{f}/M:{m}/K:{k}/N:{n}/threads:{t}/", "ms")
                 for m, k, n in GEMM_SHAPES for f in GEMM_FORMS]
        argv = [os.path.join(ROOT, "benchmarks", "torch_gemm.py"), "--threads", str(t),
                "--reps", str(reps), "--min-time", str(min_time),
                "--shapes", ",".join(f"{m}x{k}x{n}" for m, k, n in GEMM_SHAPES),
                "--forms", ",".join(GEMM_FORMS)]
        jobs.append(Job(f"gemm t{t}", "bench_gemm", f"^gemm/[a-z]+/M:[0-9]+/K:[0-9]+/N:[0-9]+/threads:{t}/",
                        argv, cases, parse_peer_gemm))
    return jobs


# ---- parsing the peers' output -------------------------------------------------------------

def parse_peer_train(case_list, text):
    m = re.search(r"step_ms median=(\d+) min=(\d+).*GFLOP/s median=([\d.]+)", text)
    if not m:
        raise RuntimeError("no 'step_ms median=... min=...' line from torch_transformer.py train")
    med, best, gflops = float(m.group(1)), float(m.group(2)), float(m.group(3))
    case_list[0].peer.append(dict(median_ms=med, best_ms=best, gflops=gflops,
                                  work=case_list[0].tokens))


def parse_peer_decode(case_list, text):
    m = re.search(r"total_ms median=(\d+) min=(\d+)", text)
    if not m:
        raise RuntimeError("no 'total_ms median=... min=...' line from torch_transformer.py decode")
    case_list[0].peer.append(dict(median_ms=float(m.group(1)), best_ms=float(m.group(2)),
                                  gflops=None, work=case_list[0].tokens))


def parse_rows(text, op_prefix, key_fields):
    """Rows of torch_attention.py / torch_gemm.py: op, key_fields sizes, threads, median ms,
    min ms, GFLOP/s, ...; keyed by (op, sizes...)."""
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if f and f[0].startswith(op_prefix) and len(f) >= key_fields + 5:
            median, best, gflops = f[key_fields + 2:key_fields + 5]
            rows[tuple(f[:key_fields + 1])] = dict(median_ms=float(median), best_ms=float(best),
                                                   gflops=float(gflops))
    return rows


def parse_peer_mha(case_list, text):
    peer_op = {op: peer for op, peer, _ in MHA_OPS}
    rows = {}
    for peer in peer_op.values():
        rows.update(parse_rows(text, peer, 2))
    for case in case_list:
        op, b, l = re.match(r"(\w+)/B:(\d+)/L:(\d+)/", case.attn_prefix).groups()
        key = (peer_op[op], b, l)
        if key not in rows:
            raise RuntimeError(f"no {' '.join(key)} row in torch_attention.py's output")
        case.peer.append(rows[key])


def parse_peer_gemm(case_list, text):
    rows = parse_rows(text, "gemm_", 3)
    for case in case_list:
        f, m, k, n = re.match(r"gemm/(\w+)/M:(\d+)/K:(\d+)/N:(\d+)/", case.attn_prefix).groups()
        case.peer.append(rows[(f"gemm_{f}", m, k, n)])
