#!/usr/bin/python3
"""Tests of bench_compare.py's parsing and table arithmetic, on made-up outputs (no torch, no
timing): a ratio turned the wrong way round would mislead more than no benchmark at all."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cases as bcases  # noqa: E402
import bench_compare as bc  # noqa: E402

TRAIN_OUT = ("# torch 1.13.0a0 torch_threads=2 {}\n"
             "train config=base params=60.5M batch=32 src=64 tgt=64 threads=2 step_ms median=4000 "
             "min=3800 tgt_tok/s median=512 best=539 GFLOP/step=600 GFLOP/s median=150.0 loss 9->8\n")
GEMM_OUT = ("# torch 1.13.0a0, torch threads 2\n"
            "op           M     K     N threads  median ms    min ms  GFLOP/s\n"
            + "".join(f"gemm_{f:<3} {m:>5} {k:>5} {n:>5}       2      10.000     9.000    100.0\n"
                      for m, k, n in bcases.GEMM_SHAPES for f in bcases.GEMM_FORMS))

MHA_OUT = ("# torch 1.13.0a0, torch threads 2, shapes ...\n"
           "op              B     L threads  median ms    min ms  GFLOP/s\n"
           + "".join(f"{op:<19} {b:>3} {l:>5}       2 {ms:>10.2f} {ms - 1:>9.2f}    100.0\n"
                     for b, l in bcases.MHA_SHAPES
                     for op, ms in (("math_fwd", 1.0), ("math_fwd_bwd", 3.0),
                                    ("math_fwd_bwd_causal", 2.0), ("mha_fwd", 20.0),
                                    ("mha_fwd_bwd", 60.0))))


def attn_json(prefix, times_ms, **counters):
    return {"benchmarks": [dict(run_type="iteration", run_name=prefix + "real_time",
                                name=prefix + "real_time", real_time=t, time_unit="ms", **counters)
                           for t in times_ms]}


class ParseAndRatio(unittest.TestCase):
    def test_train_rate_ratio_is_attn_over_peer_throughput(self):
        case = bcases.train_jobs([2], 5)[1].cases[0]  # base, 2 threads
        self.assertEqual(case.attn_prefix, "train_step/base/threads:2/")
        bcases.parse_peer_train([case], TRAIN_OUT)
        self.assertEqual(case.peer[0]["median_ms"], 4000)
        bc.record_attn(case, attn_json(case.attn_prefix, [2100, 2000, 1900], **{"GFLOP/s": 300.0}),
                       {1: 200.0, 2: 400.0})
        a_med, a_best, a_rates = bc.summary(case, "attn")
        self.assertAlmostEqual(a_med, 2048 / 2.0)   # median step 2000 ms
        self.assertAlmostEqual(a_best, 2048 / 1.9)  # best = fastest step, as a rate
        row = bc.case_row(case)
        self.assertIn("| 2.00 |", row)  # twice PyTorch's 512 tok/s
        self.assertIn("| 75% |", row)   # 300 of 400 GFLOP/s

    def test_ms_ratio_is_peer_time_over_attn_time(self):
        cases = bcases.gemm_jobs([2], 5, 0.1)[0].cases
        bcases.parse_peer_gemm(cases, GEMM_OUT)
        case = cases[0]
        bc.record_attn(case, attn_json(case.attn_prefix, [5.0, 4.0, 6.0], **{"GFLOP/s": 1.0}),
                       {1: 1.0, 2: 2.0})
        self.assertIn("| 2.00 |", bc.case_row(case))  # 10 ms against 5 ms

    def test_mha_rows_go_to_the_block_and_to_the_attention_alone(self):
        job = bcases.mha_jobs([2], 5)[0]
        self.assertEqual(job.attn_filter,
                         "^(mha_fwd_bwd|fast_fwd_bwd|fast_fwd_bwd_causal)/(B:32/L:64|B:4/L:512)"
                         "/threads:2/")
        bcases.parse_peer_mha(job.cases, MHA_OUT)
        peer = {c.attn_prefix: c.peer[0]["median_ms"] for c in job.cases}
        self.assertEqual(peer, {"mha_fwd_bwd/B:32/L:64/threads:2/": 60.0,
                                "mha_fwd_bwd/B:4/L:512/threads:2/": 60.0,
                                "fast_fwd_bwd/B:32/L:64/threads:2/": 3.0,
                                "fast_fwd_bwd/B:4/L:512/threads:2/": 3.0,
                                "fast_fwd_bwd_causal/B:32/L:64/threads:2/": 2.0,
                                "fast_fwd_bwd_causal/B:4/L:512/threads:2/": 2.0})
        # The causal row is its own: a prefix match must not take it for math_fwd_bwd's.
        with self.assertRaisesRegex(RuntimeError, "math_fwd_bwd 4 512"):
            bcases.parse_peer_mha(job.cases, MHA_OUT.replace("math_fwd_bwd          4", "other"))
        with self.assertRaisesRegex(RuntimeError, "math_fwd_bwd_causal 4 512"):
            bcases.parse_peer_mha(job.cases, MHA_OUT.replace("math_fwd_bwd_causal   4", "other"))

    def test_range_over_rounds(self):
        cases = bcases.gemm_jobs([2], 5, 0.1)[0].cases
        for attn_ms in (5.0, 4.0, 10.0):
            bcases.parse_peer_gemm(cases, GEMM_OUT)
            bc.record_attn(cases[0], attn_json(cases[0].attn_prefix, [attn_ms]), {})
        self.assertIn("| 2.00 (1.00-2.50) |", bc.case_row(cases[0]))

    def test_decode_counts_the_tokens_attn_produced(self):
        case = bcases.decode_jobs([2], 5)[0].cases[0]  # batch 1
        bcases.parse_peer_decode([case], "decode ... total_ms median=600 min=500 tok/s median=50\n")
        bc.record_attn(case, attn_json(case.attn_prefix, [100.0], **{"tokens/call": 15.0}), {})
        self.assertIn("| 3.00 |", bc.case_row(case))  # 150 tok/s against 50

    def test_missing_peer_output_and_failed_benchmark_are_errors(self):
        case = bcases.train_jobs([2], 5)[0].cases[0]
        with self.assertRaisesRegex(RuntimeError, "step_ms"):
            bcases.parse_peer_train([case], "Traceback ...")
        failed = attn_json(case.attn_prefix, [1.0], error_occurred=True, error_message="boom")
        with self.assertRaisesRegex(RuntimeError, "boom"):
            bc.record_attn(case, failed, {})
        with self.assertRaisesRegex(RuntimeError, "no benchmark"):
            bc.record_attn(case, attn_json("other/", [1.0]), {})


class RoundOrder(unittest.TestCase):
    """run_round swaps which side runs first every round, and a side that fails leaves both sides
    with the same number of rounds."""

    def setUp(self):
        self.saved = bc.probe_peak, bc.run_attn, bc.run_peer
        self.calls, self.failing, self.round = [], None, 0
        bc.probe_peak = lambda args, log, reps: {1: 1.0, 2: 2.0}
        bc.run_attn = self.fake_attn
        bc.run_peer = self.fake_peer
        self.args = type("Args", (), {"rounds": 4, "reps": 5})()
        self.job = bcases.gemm_jobs([2], 5, 0.1)[0]

    def tearDown(self):
        bc.probe_peak, bc.run_attn, bc.run_peer = self.saved

    def fake_attn(self, args, binary, bench_filter, reps, log, peak):
        self.calls.append("attn")
        if self.failing == "attn":
            raise RuntimeError("attn failed")
        ms = 5.0 + self.round
        data = {"benchmarks": [b for case in self.job.cases
                               for b in attn_json(case.attn_prefix, [ms])["benchmarks"]]}
        return data, 100

    def fake_peer(self, args, peer_argv, threads, log):
        self.calls.append("peer")
        if self.failing == "peer":
            raise RuntimeError("peer failed")
        return GEMM_OUT.replace("10.000", f"{10.0 + self.round:.3f}"), 200

    def play_round(self, r):
        self.round = r
        bc.run_round(self.args, r, [self.job], "/nonexistent", [])

    def test_the_side_that_runs_first_alternates(self):
        for r in range(4):
            self.play_round(r)
        self.assertEqual(self.calls, ["attn", "peer", "peer", "attn"] * 2)
        case = self.job.cases[0]
        self.assertEqual([x["median_ms"] for x in case.attn], [5.0, 6.0, 7.0, 8.0])
        self.assertEqual([x["median_ms"] for x in case.peer], [10.0, 11.0, 12.0, 13.0])
        self.assertIn("| 1.77 (1.62-2.00) |", bc.case_row(case))  # 10/5, 11/6, 12/7, 13/8
        self.assertEqual(bc.round_order(5),
                         "attn first in rounds 1, 3 and 5, PyTorch first in rounds 2 and 4")
        self.assertEqual(bc.round_order(1), "attn first in round 1")

    def test_a_failed_side_drops_the_round_of_both(self):
        # Round 1 runs PyTorch first and then fails on attn; round 2 runs attn first and then
        # fails on PyTorch: both sides keep rounds 0 and 3 only, the later ones dropped.
        for r, fail in ((0, None), (1, "attn"), (2, "peer"), (3, None)):
            self.failing = fail
            self.play_round(r)
        for case in self.job.cases:
            self.assertEqual([x["median_ms"] for x in case.attn], [5.0, 8.0])
            self.assertEqual([x["median_ms"] for x in case.peer], [10.0, 13.0])
            self.assertEqual((case.rss["attn"], case.rss["peer"]), ([100, 100], [200, 200]))


if __name__ == "__main__":
    unittest.main()
