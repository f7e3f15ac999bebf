#!/usr/bin/python3
"""Tests of bench_compare.py's parsing and table arithmetic, on made-up outputs (no torch, no
timing): a ratio turned the wrong way round would mislead more than no benchmark at all."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_compare as bc  # noqa: E402

TRAIN_OUT = ("# torch 1.13.0a0 torch_threads=2 {}\n"
             "train config=base params=60.5M batch=32 src=64 tgt=64 threads=2 step_ms median=4000 "
             "min=3800 tgt_tok/s median=512 best=539 GFLOP/step=600 GFLOP/s median=150.0 loss 9->8\n")
GEMM_OUT = ("# torch 1.13.0a0, torch threads 2\n"
            "op           M     K     N threads  median ms    min ms  GFLOP/s\n"
            + "".join(f"gemm_{f:<3} {m:>5} {k:>5} {n:>5}       2      10.000     9.000    100.0\n"
                      for m, k, n in bc.GEMM_SHAPES for f in bc.GEMM_FORMS))

MHA_OUT = ("# torch 1.13.0a0, torch threads 2, shapes ...\n"
           "op              B     L threads  median ms    min ms  GFLOP/s\n"
           + "".join(f"{op:<13} {b:>3} {l:>5}       2 {ms:>10.2f} {ms - 1:>9.2f}    100.0\n"
                     for b, l in bc.MHA_SHAPES
                     for op, ms in (("math_fwd", 1.0), ("math_fwd_bwd", 3.0), ("mha_fwd", 20.0),
                                    ("mha_fwd_bwd", 60.0))))


def attn_json(prefix, times_ms, **counters):
    return {"benchmarks": [dict(run_type="iteration", run_name=prefix + "real_time",
                                name=prefix + "real_time", real_time=t, time_unit="ms", **counters)
                           for t in times_ms]}


class ParseAndRatio(unittest.TestCase):
    def test_train_rate_ratio_is_attn_over_peer_throughput(self):
        case = bc.train_jobs([2], 5)[1].cases[0]  # base, 2 threads
        self.assertEqual(case.attn_prefix, "train_step/base/threads:2/")
        bc.parse_peer_train([case], TRAIN_OUT)
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
        cases = bc.gemm_jobs([2], 5, 0.1)[0].cases
        bc.parse_peer_gemm(cases, GEMM_OUT)
        case = cases[0]
        bc.record_attn(case, attn_json(case.attn_prefix, [5.0, 4.0, 6.0], **{"GFLOP/s": 1.0}),
                       {1: 1.0, 2: 2.0})
        self.assertIn("| 2.00 |", bc.case_row(case))  # 10 ms against 5 ms

    def test_mha_rows_go_to_the_block_and_to_the_attention_alone(self):
        job = bc.mha_jobs([2], 5)[0]
        self.assertEqual(job.attn_filter,
                         "^(mha_fwd_bwd|fast_fwd_bwd)/(B:32/L:64|B:4/L:512)/threads:2/")
        bc.parse_peer_mha(job.cases, MHA_OUT)
        peer = {c.attn_prefix: c.peer[0]["median_ms"] for c in job.cases}
        self.assertEqual(peer, {"mha_fwd_bwd/B:32/L:64/threads:2/": 60.0,
                                "mha_fwd_bwd/B:4/L:512/threads:2/": 60.0,
                                "fast_fwd_bwd/B:32/L:64/threads:2/": 3.0,
                                "fast_fwd_bwd/B:4/L:512/threads:2/": 3.0})
        with self.assertRaisesRegex(RuntimeError, "math_fwd_bwd 4 512"):
            bc.parse_peer_mha(job.cases, MHA_OUT.replace("math_fwd_bwd    4", "other"))

    def test_range_over_rounds(self):
        cases = bc.gemm_jobs([2], 5, 0.1)[0].cases
        for attn_ms in (5.0, 4.0, 10.0):
            bc.parse_peer_gemm(cases, GEMM_OUT)
            bc.record_attn(cases[0], attn_json(cases[0].attn_prefix, [attn_ms]), {})
        self.assertIn("| 2.00 (1.00-2.50) |", bc.case_row(cases[0]))

    def test_decode_counts_the_tokens_attn_produced(self):
        case = bc.decode_jobs([2], 5)[0].cases[0]  # batch 1
        bc.parse_peer_decode([case], "decode ... total_ms median=600 min=500 tok/s median=50\n")
        bc.record_attn(case, attn_json(case.attn_prefix, [100.0], **{"tokens/call": 15.0}), {})
        self.assertIn("| 3.00 |", bc.case_row(case))  # 150 tok/s against 50

    def test_missing_peer_output_and_failed_benchmark_are_errors(self):
        case = bc.train_jobs([2], 5)[0].cases[0]
        with self.assertRaisesRegex(RuntimeError, "step_ms"):
            bc.parse_peer_train([case], "Traceback ...")
        failed = attn_json(case.attn_prefix, [1.0], error_occurred=True, error_message="boom")
        with self.assertRaisesRegex(RuntimeError, "boom"):
            bc.record_attn(case, failed, {})
        with self.assertRaisesRegex(RuntimeError, "no benchmark"):
            bc.record_attn(case, attn_json("other/", [1.0]), {})


if __name__ == "__main__":
    unittest.main()
