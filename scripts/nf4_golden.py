#!/usr/bin/env python3
"""The NF4 golden of tests/test_nf4.cpp: bitsandbytes' 4-bit NormalFloat quantisation written out
from its definition in numpy, checked against bitsandbytes itself when it is importable, and the
result saved as tests/golden/nf4/golden.json (committed: `make test` never runs this).

The definition (bitsandbytes.functional.quantize_4bit / dequantize_4bit, quant_type="nf4",
blocksize=64, and with compress_statistics the nested quantize_blockwise of the absmaxes):
  * the weight is flattened row-major and cut into blocks of 64 (the last may be shorter);
  * absmax = max |x| of each block; x is scaled by (1 / absmax) in f32 and clamped to [-1, 1];
  * the code is the NF4 table's index of the nearest value: torch.bucketize against the
    midpoints of neighbouring table values (a value on a midpoint takes the lower index);
  * two codes per byte, the first in the high nibble (an odd count pads the code of 0.0, 7);
  * nested (double quant): offset = mean of the absmaxes, and absmax - offset is quantised
    blockwise in blocks of 256 with the signed 8-bit dynamic map (create_dynamic_map), again the
    nearest value by midpoints, with an f32 absmax of its own per 256;
  * dequantised: code[q] * absmax in f32, the nested absmax being dyn[qa] * absmax2 + offset.
The input is integers over 4096 (exact in f32) so that the C++ test builds the same weights
without reading them.

Run: /work/venv-hf/bin/python scripts/nf4_golden.py [--bnb-path DIR] > tests/golden/nf4/golden.json
"""
import argparse
import json
import sys

import numpy as np

# bitsandbytes' NF4 table (create_normal_map(offset=0.9677083, use_extra_value=True), the values
# bitsandbytes hardcodes in functional.get_4bit_type and its CUDA kernels), as f32.
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)


def torch_linspace_f32(start, end, steps):
    """torch.linspace in float32 on the CPU: start + step * i (one rounding: the kernel's fused
    multiply-add) for the first half, end - step * (steps - 1 - i) for the second."""
    s, e = np.float32(start), np.float32(end)
    step = np.float32((e - s) / np.float32(steps - 1))
    half = steps // 2
    return np.array([np.float32(np.float64(s) + np.float64(step) * i) if i < half else
                     np.float32(np.float64(e) - np.float64(step) * (steps - 1 - i))
                     for i in range(steps)], dtype=np.float32)


def dynamic_map():
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), in f32."""
    data = []
    for i in range(7):
        items = 2 ** i + 1
        b = torch_linspace_f32(0.1, 1, items)
        means = (b[:-1] + b[1:]) / np.float32(2)
        scale = np.float32(10.0 ** (-6 + i))
        data += list(scale * means)
        data += list(-scale * means)
    data += [np.float32(0), np.float32(1)]
    data.sort()
    return np.array(data, dtype=np.float32)


def nearest(scaled, table):
    bounds = ((table[:-1] + table[1:]) / np.float32(2)).astype(np.float32)
    return np.searchsorted(bounds, scaled, side="left").astype(np.uint8)


def blockwise(x, block, table):
    """(codes, absmax) of bitsandbytes' blockwise quantisation of the f32 vector x."""
    n = x.size
    nb = -(-n // block)
    absmax = np.empty(nb, dtype=np.float32)
    scaled = np.empty(n, dtype=np.float32)
    for b in range(nb):
        part = x[b * block:(b + 1) * block]
        am = np.float32(np.abs(part).max())
        absmax[b] = am
        inv = np.float32(1) / np.float32(max(am, np.float32(1e-38)))
        scaled[b * block:(b + 1) * block] = np.clip(part * inv, np.float32(-1), np.float32(1))
    return nearest(scaled, table), absmax


def quantize(x, double_quant):
    q, absmax = blockwise(x, 64, NF4)
    if len(q) % 2:  # bitsandbytes pads the scaled values with a 0: the code of 0.0
        q = np.concatenate([q, nearest(np.zeros(1, np.float32), NF4)])
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    state = {"packed": packed, "absmax": absmax}
    if double_quant:
        # torch's mean of an f32 vector; for the golden the value bitsandbytes computed is kept.
        offset = np.float32(np.mean(absmax.astype(np.float64)))
        qa, absmax2 = blockwise((absmax - offset).astype(np.float32), 256, dynamic_map())
        state.update(qabsmax=qa, absmax2=absmax2, offset=offset)
    return state


def dequantize(state, n, double_quant):
    packed = state["packed"]
    q = np.empty(packed.size * 2, dtype=np.uint8)
    q[0::2] = packed >> 4
    q[1::2] = packed & 15
    absmax = state["absmax"]
    if double_quant:
        dyn = dynamic_map()
        qa = state["qabsmax"]
        absmax = np.array([dyn[qa[b]] * state["absmax2"][b // 256] + state["offset"]
                           for b in range(qa.size)], dtype=np.float32)
    return np.array([NF4[q[i]] * absmax[i // 64] for i in range(n)], dtype=np.float32)


def weights(rows, cols, seed):
    """The test's input: integers k / 4096 (|k| <= 12000) times a per-block factor of 1..13 / 8,
    from a 64-bit LCG, every value exact in f32; block 2 of every tensor is zero (an absmax of 0)."""
    n = rows * cols
    state = seed
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        k = int(state >> 33) % 24001 - 12000
        factor = ((i // 64) % 13 + 1) / 8
        out[i] = np.float32(k / 4096 * factor)
    out[128:192] = 0
    return out


def hexbytes(a):
    return a.astype(a.dtype).tobytes().hex()


CASES = [  # (name, rows, cols, seed, double_quant, whole dequantised output)
    ("small", 4, 96, 1, True, True),
    ("small_f32absmax", 4, 96, 1, False, True),
    ("odd", 1, 77, 2, True, True),
    ("nested2", 300, 64, 3, True, False),
    ("nested2_f32absmax", 300, 64, 3, False, False),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bnb-path", default="", help="a folder holding the bitsandbytes package")
    args = ap.parse_args()
    bnb = None
    if args.bnb_path:
        sys.path.insert(0, args.bnb_path)
    try:
        import torch
        import bitsandbytes.functional as F
        bnb = (torch, F)
    except Exception as e:  # noqa: BLE001
        print(f"bitsandbytes not importable ({e}): the golden is numpy's alone", file=sys.stderr)

    out = {"source": "scripts/nf4_golden.py", "nf4": [float(v) for v in NF4],
           "dynamic_map_f32_hex": hexbytes(dynamic_map()), "cases": []}
    for name, rows, cols, seed, dq, whole in CASES:
        x = weights(rows, cols, seed)
        mine = quantize(x, dq)
        n = x.size
        if bnb:
            torch, F = bnb
            assert np.array_equal(F.create_dynamic_map().numpy(), dynamic_map()), "dynamic map"
            assert np.array_equal(F.get_4bit_type("nf4", device="cpu").numpy(), NF4), "nf4 table"
            t = torch.from_numpy(x.reshape(rows, cols))
            qt, st = F.quantize_4bit(t, blocksize=64, quant_type="nf4", compress_statistics=dq)
            theirs = {"packed": qt.numpy().reshape(-1)}
            if dq:
                theirs.update(qabsmax=st.absmax.numpy(), absmax2=st.state2.absmax.numpy(),
                              offset=np.float32(st.offset.item()))
            else:
                theirs["absmax"] = st.absmax.numpy()
            for key, value in theirs.items():
                a, b = np.asarray(value), np.asarray(mine[key])
                print(f"{name}: {key}: {int((a == b).sum())} of {a.size} equal to bitsandbytes'",
                      file=sys.stderr)
            deq_theirs = F.dequantize_4bit(qt, st).numpy().reshape(-1)
            deq_mine = dequantize(mine, n, dq)
            deq_state = dequantize({**mine, **theirs}, n, dq)
            print(f"{name}: dequantised: max |ours - bitsandbytes'| {np.abs(deq_theirs - deq_mine).max()}"
                  f", bitsandbytes' state dequantised here vs by bitsandbytes "
                  f"{np.abs(deq_theirs - deq_state).max()}", file=sys.stderr)
            out["checked_against"] = "bitsandbytes " + __import__("bitsandbytes").__version__
        deq = dequantize(mine, n, dq)
        case = {"name": name, "rows": rows, "cols": cols, "seed": seed, "double_quant": dq,
                "packed_hex": hexbytes(mine["packed"])}
        if dq:
            case.update(qabsmax_hex=hexbytes(mine["qabsmax"]),
                        absmax2_f32_hex=hexbytes(mine["absmax2"]),
                        offset_f32_hex=hexbytes(np.array([mine["offset"]], np.float32)))
        else:
            case["absmax_f32_hex"] = hexbytes(mine["absmax"])
        idx = range(n) if whole else range(0, n, 37)
        case["dequantized"] = [[i, deq[i].view(np.uint32).item()] for i in idx]
        out["cases"].append(case)
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"))
    print()


if __name__ == "__main__":
    main()
