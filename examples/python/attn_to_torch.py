#!/usr/bin/python3
"""Open an attn model directory in PyTorch and translate with it.

An attn-translate model directory holds model.safetensors (or checkpoint_<step>.safetensors), whose
metadata carries the TransformerConfig ("config.<field>"), and spm.model, the sentencepiece
vocabulary. This script rebuilds the paper's model from torch modules -- nn.TransformerEncoder and
nn.TransformerDecoder, with norm=None for the paper's post-norm stacks (torch.nn.Transformer would
add a final LayerNorm the paper's model does not have) -- loads attn's weights by name, and
translates greedily:

    /usr/bin/python3 examples/python/attn_to_torch.py --model-dir runs/de-en "A sentence."

With --check FILE (the JSON that attn-logits prints for the same sentence) it also compares: the
source ids, the logits of the teacher-forced forward over attn's greedy output (to --tolerance,
1e-5 by default) and the greedy output itself, and exits with status 1 on any mismatch.

Needs Debian's python3-torch and python3-sentencepiece.
"""

import argparse
import json
import math
import os
import re
import struct
import sys

import sentencepiece
import torch
from torch import nn

PAD, BOS, EOS = 0, 2, 3  # attn-translate's special ids (examples/translate/bpe.hpp)
MAX_EXTRA_LENGTH = 50  # output length limit = source length + 50, as attn-translate

_DTYPES = {"F32": torch.float32, "F64": torch.float64}


def model_file(model_dir):
    """model.safetensors if present, else the newest checkpoint (as attn-translate picks)."""
    path = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(path):
        return path
    steps = []
    for name in os.listdir(model_dir):
        m = re.fullmatch(r"checkpoint_(\d+)\.safetensors", name)
        if m:
            steps.append((int(m.group(1)), name))
    if not steps:
        raise FileNotFoundError(f"{model_dir} holds neither model.safetensors nor a checkpoint")
    return os.path.join(model_dir, max(steps)[1])


def read_safetensors(path):
    """(tensors by name, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise ValueError(f"{path}: header length {header_len} exceeds the file")
    header = json.loads(data[8 : 8 + header_len])
    metadata = header.pop("__metadata__", {})
    body = data[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {entry['dtype']}, expected F32/F64")
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors, metadata


def read_config(metadata):
    """The TransformerConfig fields stored as config.<field>, as Python values."""
    cfg = {}
    for key, text in metadata.items():
        if not key.startswith("config."):
            continue
        field = key[len("config.") :]
        if text in ("0", "1") and field in (
            "share_embeddings", "tie_output", "norm_first", "learned_positions"):
            cfg[field] = text == "1"
        elif re.fullmatch(r"-?\d+", text):
            cfg[field] = int(text)
        else:
            cfg[field] = float(text)
    return cfg


def sinusoidal_table(length, d_model, dtype):
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) (section 3.5)."""
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), i2 / d_model)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype)


class PaperTransformer(nn.Module):
    """Figure 1 from torch modules, with attn's parameter names (see the module docstring)."""

    def __init__(self, cfg):
        super().__init__()
        d, eps, norm_first = cfg["d_model"], cfg["layer_norm_eps"], cfg["norm_first"]
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg["src_vocab"], d)
        self.tgt_embed = (self.src_embed if cfg["share_embeddings"]
                          else nn.Embedding(cfg["tgt_vocab"], d))
        if cfg["learned_positions"]:
            self.src_pos = nn.Embedding(cfg["max_positions"], d)
            self.tgt_pos = nn.Embedding(cfg["max_positions"], d)
        layer_args = dict(d_model=d, nhead=cfg["heads"], dim_feedforward=cfg["d_ff"],
                          dropout=cfg["dropout"], layer_norm_eps=eps, batch_first=True,
                          norm_first=norm_first)
        # Post-norm stacks end with their last layer's norm3; only pre-norm needs a final norm.
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer_args), cfg["encoder_layers"],
            norm=nn.LayerNorm(d, eps=eps) if norm_first else None, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer_args), cfg["decoder_layers"],
            norm=nn.LayerNorm(d, eps=eps) if norm_first else None)
        self.generator = nn.Linear(d, cfg["tgt_vocab"], bias=False)
        if cfg["share_embeddings"] or cfg["tie_output"]:
            self.generator.weight = self.tgt_embed.weight

    def load_attn_weights(self, tensors):
        """Copies every parameter from attn's tensors by name; a tied parameter is stored once by
        attn (under its first name) and reached here through the tie."""
        seen = set()
        for name, param in self.named_parameters():  # each shared parameter once, first name
            if name not in tensors:
                raise KeyError(f"the attn model has no tensor {name}")
            if tuple(tensors[name].shape) != tuple(param.shape):
                raise ValueError(f"{name}: attn shape {tuple(tensors[name].shape)}, "
                                 f"torch shape {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(tensors[name])
            seen.add(name)
        unused = [n for n in tensors if n not in seen and not n.startswith(("adam.", "extra."))]
        if unused:
            raise KeyError(f"attn tensors without a torch counterpart: {unused}")

    def _embed(self, ids, embed, pos):
        d = self.cfg["d_model"]
        x = embed(ids) * math.sqrt(d)
        length = ids.shape[1]
        if self.cfg["learned_positions"]:
            return x + pos.weight[:length]
        return x + sinusoidal_table(length, d, x.dtype)

    def forward(self, src, tgt_in):
        """src [B, S], tgt_in [B, T] (BOS + output) -> logits [B, T, V]."""
        src_padding = src == self.cfg["pad_id"]
        memory = self.encoder(self._embed(src, self.src_embed, getattr(self, "src_pos", None)),
                              src_key_padding_mask=src_padding)
        t = tgt_in.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf"), dtype=memory.dtype), diagonal=1)
        h = self.decoder(self._embed(tgt_in, self.tgt_embed, getattr(self, "tgt_pos", None)),
                         memory, tgt_mask=causal, tgt_key_padding_mask=tgt_in == self.cfg["pad_id"],
                         memory_key_padding_mask=src_padding)
        return self.generator(h)


def load(model_dir, dtype=torch.float64):
    """(model in eval mode, sentencepiece processor) of an attn model directory."""
    tensors, metadata = read_safetensors(model_file(model_dir))
    model = PaperTransformer(read_config(metadata))
    model.load_attn_weights(tensors)
    model.to(dtype).eval()
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir, "spm.model"))
    return model, sp


@torch.no_grad()
def greedy(model, src_ids):
    """The most probable next token at every step (full forward each step), without BOS/EOS.

    Never the padding token, as attn's greedy_decode (decode/options.hpp, may_output)."""
    if not src_ids:
        return []
    src = torch.tensor([src_ids])
    out = []
    while len(out) < len(src_ids) + MAX_EXTRA_LENGTH:
        logits = model(src, torch.tensor([[BOS] + out]))[0, -1].clone()
        if PAD != EOS:
            logits[PAD] = -math.inf
        best = int(torch.argmax(logits))
        if best == EOS:
            break
        out.append(best)
    return out


def check(model, src_ids, out, attn_file, tolerance):
    """Compares with attn-logits' JSON; returns the list of mismatches (empty when all agree)."""
    with open(attn_file, encoding="utf-8") as f:
        ref = json.load(f)
    problems = []
    if ref["src_ids"] != src_ids:
        problems.append(f"source ids: attn {ref['src_ids']}, torch {src_ids}")
    with torch.no_grad():
        logits = model(torch.tensor([src_ids]), torch.tensor([[BOS] + ref["greedy_ids"]]))[0]
    attn_logits = torch.tensor(ref["logits"], dtype=logits.dtype)
    if attn_logits.shape != logits.shape:
        problems.append(f"logits shape: attn {tuple(attn_logits.shape)}, "
                        f"torch {tuple(logits.shape)}")
    else:
        diff = float((attn_logits - logits).abs().max())
        print(f"max |logit difference| over {logits.numel()} logits: {diff:.3g}")
        if not diff <= tolerance:
            problems.append(f"logits differ by {diff:.3g} > {tolerance:g}")
    if ref["greedy_ids"] != out:
        problems.append(f"greedy output: attn {ref['greedy_ids']}, torch {out}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="attn-translate model directory")
    parser.add_argument("--check", metavar="FILE",
                        help="attn-logits JSON for the same sentence: compare and fail on mismatch")
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest accepted |logit difference| (default 1e-5)")
    parser.add_argument("--float32", action="store_true",
                        help="run torch in float32 (default float64, the tighter reference)")
    parser.add_argument("sentence", help="the sentence to translate")
    args = parser.parse_args()

    torch.set_num_threads(1)
    model, sp = load(args.model_dir, torch.float32 if args.float32 else torch.float64)
    src_ids = sp.encode(args.sentence)
    out = greedy(model, src_ids)
    print(sp.decode(out))
    if args.check:
        problems = check(model, src_ids, out, args.check, args.tolerance)
        for p in problems:
            print("MISMATCH:", p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
