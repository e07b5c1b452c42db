#!/usr/bin/env python3
"""An independent check of a safetensors file (stdlib only), used by tests/test_checkpoint.cpp.

Checks the 8-byte little-endian header length, that the header is a UTF-8 JSON object, every
tensor's dtype, shape and data_offsets, that the byte span of each tensor matches dtype x shape,
and that the tensors, sorted by offset, cover the data section exactly (no gap, no overlap, no
trailing bytes). Prints "ok <n_tensors>" then one tensor name per line in file order; on a
problem prints "error: ..." and exits 1.

Usage: python3 tests/safetensors_check.py FILE
"""
import json
import struct
import sys

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}


def check(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"file is {len(blob)} bytes, shorter than the length prefix")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"header length {n} exceeds the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("__metadata__ is not a str -> str object")
    data_len = len(blob) - 8 - n
    entries = []
    for name, t in header.items():
        dtype, shape, offsets = t["dtype"], t["shape"], t["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{name}: unknown dtype {dtype}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{name}: bad shape {shape}")
        begin, end = offsets
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * DTYPE_BYTES[dtype]:
            raise ValueError(f"{name}: {end - begin} bytes for {dtype} {shape}")
        entries.append((begin, end, name))
    entries.sort()
    pos = 0
    for begin, end, name in entries:
        if begin != pos:
            raise ValueError(f"{name}: starts at {begin}, expected {pos}")
        pos = end
    if pos != data_len:
        raise ValueError(f"tensors cover {pos} bytes of a {data_len}-byte data section")
    return [name for _, _, name in entries]


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        names = check(sys.argv[1])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"error: {e}")
        return 1
    print(f"ok {len(names)}")
    for name in names:
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
