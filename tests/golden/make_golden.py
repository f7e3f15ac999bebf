#!/usr/bin/env python3
"""Golden outputs and gradients of PyTorch's Transformer pieces for tests/test_encoder_decoder.cpp
and tests/test_multi_head_attention.cpp.

Run with a Python that has torch (1.13 was used):   /usr/bin/python3 tests/golden/make_golden.py
It rewrites tests/golden/*.txt. CI has no torch: the C++ tests read the stored files.

Each case is built in float64 with dropout 0, every parameter (LayerNorm included) redrawn from
N(0, 0.5^2) so no parameter sits at a symmetric initial value, random inputs, key padding masks and
(for decoders) the causal tgt_mask. The loss is sum(out * R) for a stored random R; the file holds
the state_dict by name, the inputs, R, the output, and the gradients of the inputs and of every
parameter ("grad.<name>").

File format, one tensor after another:
    <name> <rank> <d0> ... <d_{rank-1}>
    <numel values, %.17g, space separated>
Key padding masks are stored as lengths (real tokens first): PyTorch's key_padding_mask uses
True = ignore, the C++ side builds KeyPaddingMask::from_lengths, so the conversion happens here.
"""
import os

import torch
import torch.nn as nn

torch.manual_seed(20260521)
torch.set_default_dtype(torch.float64)
OUT_DIR = os.path.dirname(os.path.abspath(__file__))

D, H, F = 8, 2, 12


def padding_mask(lengths, L):
    """PyTorch's key_padding_mask: True where the key is padding (ignored)."""
    return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]


def causal_mask(L):
    return torch.triu(torch.full((L, L), float("-inf")), diagonal=1)


def randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn_like(p))


def write(path, tensors):
    with open(path, "w") as f:
        for name, t in tensors:
            t = torch.as_tensor(t).detach().to(torch.float64).contiguous()
            f.write(f"{name} {t.dim()} {' '.join(str(d) for d in t.shape)}\n")
            f.write(" ".join("%.17g" % v for v in t.flatten().tolist()) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def run_case(file, module, inputs, lengths, forward, holder=None):
    """inputs: (name, tensor) pairs that get gradients; lengths: (name, list) pairs; holder: where
    forward leaves the [B, H, T, S] attention weights to store, if any."""
    randomize(module)
    module.train()  # dropout is 0, and train mode keeps PyTorch off its inference fast path
    xs = [x.clone().requires_grad_(True) for _, x in inputs]
    out = forward(*xs)
    r = torch.randn_like(out)
    (out * r).sum().backward()
    tensors = [(k, v) for k, v in module.state_dict().items()]
    tensors += [(n, x) for (n, _), x in zip(inputs, xs)]
    tensors += [(n, torch.tensor(l, dtype=torch.float64)) for n, l in lengths]
    tensors += [("R", r), ("out", out)]
    if holder is not None:
        tensors += [("weights", holder["w"])]
    tensors += [("grad." + n, x.grad) for (n, _), x in zip(inputs, xs)]
    tensors += [("grad." + k, p.grad) for k, p in module.named_parameters()]
    write(os.path.join(OUT_DIR, file), tensors)


def mha_cases():
    B, T, S = 2, 4, 5
    # Self-attention, causal with key padding; the weights are stored per head.
    mha = nn.MultiheadAttention(D, H, batch_first=True)
    lengths = [4, 2]
    holder = {}

    def self_fwd(x):
        out, w = mha(x, x, x, key_padding_mask=padding_mask(lengths, T), attn_mask=causal_mask(T),
                     need_weights=True, average_attn_weights=False)
        holder["w"] = w
        return out

    run_case("mha_self.txt", mha, [("x", torch.randn(B, T, D))],
                          [("lengths", lengths)], self_fwd, holder)

    # Cross-attention: queries from x, keys and values from memory, memory padding.
    mha = nn.MultiheadAttention(D, H, batch_first=True)
    mem_lengths = [5, 3]

    def cross_fwd(x, memory):
        out, w = mha(x, memory, memory, key_padding_mask=padding_mask(mem_lengths, S),
                     need_weights=True, average_attn_weights=False)
        holder["w"] = w
        return out

    run_case("mha_cross.txt", mha,
                          [("x", torch.randn(B, T, D)), ("memory", torch.randn(B, S, D))],
                          [("memory_lengths", mem_lengths)], cross_fwd, holder)


def layer_cases():
    B, T, S = 2, 4, 5
    src_lengths, tgt_lengths = [5, 3], [4, 2]

    # The module is built (drawing its initial weights) before the inputs are drawn, in the order
    # the stored files were made with.
    def encoder_case(file, enc):
        run_case(file, enc, [("x", torch.randn(B, S, D))], [("src_lengths", src_lengths)],
                 lambda x: enc(x, src_key_padding_mask=padding_mask(src_lengths, S)))

    def decoder_case(file, dec):
        run_case(file, dec, [("y", torch.randn(B, T, D)), ("memory", torch.randn(B, S, D))],
                 [("tgt_lengths", tgt_lengths), ("memory_lengths", src_lengths)],
                 lambda y, m: dec(y, m, tgt_mask=causal_mask(T),
                                  tgt_key_padding_mask=padding_mask(tgt_lengths, T),
                                  memory_key_padding_mask=padding_mask(src_lengths, S)))

    for norm_first in (False, True):
        tag = "pre" if norm_first else "post"
        layer = dict(d_model=D, nhead=H, dim_feedforward=F, dropout=0.0, batch_first=True,
                     norm_first=norm_first)
        encoder_case(f"encoder_layer_{tag}.txt", nn.TransformerEncoderLayer(**layer))
        decoder_case(f"decoder_layer_{tag}.txt", nn.TransformerDecoderLayer(**layer))
        # Stacks of two layers without a final norm (our Encoder/Decoder with final_norm = false).
        encoder_case(f"encoder_{tag}.txt",
                     nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), num_layers=2,
                                           norm=None, enable_nested_tensor=False))
        decoder_case(f"decoder_{tag}.txt",
                     nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer), num_layers=2,
                                           norm=None))


if __name__ == "__main__":
    mha_cases()
    layer_cases()
