#!/usr/bin/python3
"""ctest attn_to_torch: an attn model opened in PyTorch computes what attn computes.

Trains a tiny model with attn-translate on a small generated corpus (a toy language pair: a fixed
lexicon and reversed word order), then for a few sentences compares attn_to_torch.py against
attn-logits: the same source ids, logits within 1e-5, the same greedy output; and checks that
attn-logits' greedy text is what `attn-translate translate --greedy` prints.

    test_attn_to_torch.py <attn-translate> <attn-logits> <scratch-dir>
"""

import os
import random
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SRC_WORDS = ["red", "blue", "green", "cat", "dog", "house", "big", "small", "runs", "sleeps",
             "the", "a", "old", "new"]
TGT_WORDS = ["rot", "blau", "gruen", "Katze", "Hund", "Haus", "gross", "klein", "laeuft",
             "schlaeft", "der", "ein", "alt", "neu"]


def corpus(n, seed):
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        words = [rng.randrange(len(SRC_WORDS)) for _ in range(rng.randint(2, 6))]
        src.append(" ".join(SRC_WORDS[w] for w in words))
        tgt.append(" ".join(TGT_WORDS[w] for w in reversed(words)))
    return src, tgt


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"FAILED ({result.returncode}): {' '.join(args)}\n{result.stdout}{result.stderr}")
    return result.stdout


def main():
    translate_bin, logits_bin, scratch = sys.argv[1:4]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    src, tgt = corpus(300, 1)
    write_lines(os.path.join(scratch, "train.en"), src)
    write_lines(os.path.join(scratch, "train.de"), tgt)
    model_dir = os.path.join(scratch, "model")
    run([translate_bin, "train", "--threads", "1", "--model-dir", model_dir,
         "--src", os.path.join(scratch, "train.en"), "--tgt", os.path.join(scratch, "train.de"),
         "--preset", "tiny", "--dropout", "0.1", "--vocab-size", "64", "--max-tokens", "256",
         "--max-len", "32", "--warmup", "30", "--steps", "120", "--valid-every", "0",
         "--checkpoint-every", "0", "--svg", "0", "--log-every", "40", "--show", "0"])

    sentences = corpus(3, 7)[0] + ["the big dog sleeps"]
    failures = 0
    for i, sentence in enumerate(sentences):
        attn_json = os.path.join(scratch, f"attn_{i}.json")
        with open(attn_json, "w", encoding="utf-8") as f:
            f.write(run([logits_bin, model_dir, sentence]))
        cli = run([translate_bin, "translate", "--threads", "1", "--model-dir", model_dir,
                   "--greedy"], input=sentence + "\n")
        torch_run = subprocess.run(
            [sys.executable, os.path.join(HERE, "attn_to_torch.py"), "--model-dir", model_dir,
             "--check", attn_json, sentence], capture_output=True, text=True)
        torch_text = torch_run.stdout.splitlines()[0] if torch_run.stdout else ""
        print(f"{sentence!r}: attn-translate {cli.strip()!r}, torch {torch_text!r}")
        print(torch_run.stdout + torch_run.stderr, end="")
        if torch_run.returncode != 0:
            failures += 1
        if cli.strip() != torch_text.strip():
            print(f"MISMATCH: attn-translate --greedy printed {cli.strip()!r}")
            failures += 1
    if failures:
        sys.exit(f"{failures} mismatch(es)")
    print(f"all {len(sentences)} sentences agree")


if __name__ == "__main__":
    main()
