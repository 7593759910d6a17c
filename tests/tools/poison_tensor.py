#!/usr/bin/env python3
"""Sets the first element of a tensor in a safetensors file to NaN, in place (for tests of non-finite handling).

usage: poison_tensor.py FILE TENSOR
"""
import json
import struct
import sys

NAN = {"BF16": b"\xc0\x7f", "F16": b"\x00\x7e", "F32": b"\x00\x00\xc0\x7f"}

path, name = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
    t = header[name]
    f.seek(8 + n + t["data_offsets"][0])
    f.write(NAN[t["dtype"]])
