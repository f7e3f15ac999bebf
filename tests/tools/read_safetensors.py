#!/usr/bin/env python3
"""Reads a safetensors file with only struct + json + torch (Debian's python has no safetensors
package) and prints every tensor, to show that attn's files load in PyTorch.

    python3 tests/tools/read_safetensors.py model.safetensors
    python3 tests/tools/read_safetensors.py --write out.safetensors   # a file for attn to read

Validates what the format requires: header length, '{'-first JSON, dtype sizes, contiguous
offsets covering the data buffer."""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
          "U8": torch.uint8, "BOOL": torch.bool}


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, f"header length {n} is not a multiple of 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors, spans = {}, []
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dtype) if e > b else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"])
        assert tensors[name].numel() * tensors[name].element_size() == e - b, name
        spans.append((b, e))
    end = 0
    for b, e in sorted(spans):
        assert b == end, f"gap or overlap at byte {b}"
        end = e
    assert end == len(data), "data buffer not covered"
    return tensors, meta


def write(path):
    """The layout the reference writer produces, for attn to read back."""
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
               "d": torch.tensor([1e-300, -2.5], dtype=torch.float64),
               "i": torch.tensor([-1, 7], dtype=torch.int64)}
    header, offset, blobs = {"__metadata__": {"from": "python"}}, 0, []
    for name, t in tensors.items():
        blob = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}[t.dtype],
                        "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


if __name__ == "__main__":
    if sys.argv[1] == "--write":
        write(sys.argv[2])
    else:
        tensors, meta = load(sys.argv[1])
        print("metadata:", meta)
        for name, t in tensors.items():
            print(name, t.dtype, list(t.shape), t.flatten()[:6].tolist())
