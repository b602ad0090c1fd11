#!/usr/bin/env python3
"""An independent reference of deltacast's FP8 block quantizer (docs/fp8.md), in numpy.

Written from the formula of DeepGEMM's per_block_cast_to_fp8 (deep_gemm/utils/math.py)
and torch's float8_e4m3fn cast, not from the C++ code: the E4M3 rounding here picks
the nearest of the 127 positive E4M3 values from a table (ties to the even code), the
C++ one works on the float's bits. Scales and multipliers are numpy float32
arithmetic, which is IEEE single precision like torch's on CPU and CUDA.

    quantize(bf16_bits, scheme) -> (e4m3 codes as uint8 [rows, cols], scales float32)

Schemes (quant/fp8_scheme.cc):
  fp8_e4m3_block128          sf = amax / 448, x * (1 / sf)
  fp8_e4m3_block128_ue8m0    sf = 2^ceil(log2(amax / 448)) on the bits, x * (1 / sf)
  fp8_e4m3_block128_amax448  sf = amax / 448, x * (448 / amax) as torch evaluates
                             it: reciprocal(amax) * 448, two roundings
amax is clamped to at least float32(1e-4). Inf and NaN inputs raise ValueError.
"""
import numpy as np

F32 = np.float32
BLOCK = 128


def _e4m3_values():
    """The value of each E4M3FN code 0..126 (127 is NaN), from the format's definition."""
    codes = np.arange(127)
    exp, man = codes >> 3, codes & 7
    normal = (1.0 + man / 8.0) * np.exp2(exp - 7.0)
    subnormal = man * 2.0 ** -9
    return np.where(exp == 0, subnormal, normal)


_VALUES = _e4m3_values()  # float64, increasing


def e4m3_from_float32(v):
    """float32 array -> E4M3FN codes (uint8), round to nearest, ties to even code.

    Past 448 there is no next value: torch's cast rounds into the NaN code (0x7F)
    for |v| > 464 (464 itself is a tie and goes to 448); Inf and NaN give NaN.
    """
    v = np.asarray(v, dtype=F32)
    sign = np.signbit(v).astype(np.uint8) << 7
    a = np.abs(v.astype(np.float64))
    # The midpoint between code 126 (448) and a virtual 480 is 464.
    table = np.append(_VALUES, 480.0)
    hi = np.searchsorted(table, a, side="left")  # first value >= a
    hi = np.clip(hi, 0, 127)
    lo = np.clip(hi - 1, 0, 127)
    d_lo = a - table[lo]
    d_hi = table[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(a == table[hi], hi, code)
    code = np.where(np.isnan(a) | (a >= 480.0), 127, code)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def bf16_to_float32(bits):
    wide = (np.array(bits, dtype=np.uint32, ndmin=1) << 16).view(F32)
    return wide if np.ndim(bits) else wide[0]


def _ceil_to_ue8m0(s):
    """DeepGEMM's ceil_to_ue8m0: biased exponent + (mantissa != 0), clamped to [1, 254]."""
    bits = np.abs(s).astype(F32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).astype(np.uint32)
    return (np.clip(exp, 1, 254).astype(np.uint32) << 23).view(F32)


def quantize(bf16_bits, scheme="fp8_e4m3_block128"):
    x = bf16_to_float32(np.asarray(bf16_bits, dtype=np.uint16))
    if x.ndim != 2:
        raise ValueError("a 2-D tensor is needed")
    if not np.all(np.isfinite(x)):
        raise ValueError("Inf or NaN input")
    rows, cols = x.shape
    br, bc = BLOCK, BLOCK
    pr, pc = -(-rows // br) * br, -(-cols // bc) * bc
    padded = np.zeros((pr, pc), dtype=F32)
    padded[:rows, :cols] = x
    blocks = padded.reshape(pr // br, br, pc // bc, bc)
    amax = np.abs(blocks).max(axis=(1, 3)).astype(F32)
    amax = np.maximum(amax, F32(1e-4))
    sf = (amax / F32(448.0)).astype(F32)
    if scheme == "fp8_e4m3_block128":
        mult = (F32(1.0) / sf).astype(F32)
    elif scheme == "fp8_e4m3_block128_ue8m0":
        sf = _ceil_to_ue8m0(sf)
        mult = (F32(1.0) / sf).astype(F32)
    elif scheme == "fp8_e4m3_block128_amax448":
        mult = ((F32(1.0) / amax).astype(F32) * F32(448.0)).astype(F32)
    else:
        raise ValueError("unknown scheme " + scheme)
    scaled = (blocks * mult[:, None, :, None]).astype(F32)
    codes = e4m3_from_float32(scaled).reshape(pr, pc)[:rows, :cols]
    return np.ascontiguousarray(codes), sf.astype(F32)


def torch_quantize(x, use_ue8m0=False, amax448=False):
    """The same with torch's own ops and float8_e4m3fn cast (torch >= 2.1), following
    DeepGEMM's per_block_cast_to_fp8 line by line; None where torch has no float8."""
    import torch
    if not hasattr(torch, "float8_e4m3fn"):
        return None
    m, n = x.shape
    padded = torch.zeros((-(-m // BLOCK) * BLOCK, -(-n // BLOCK) * BLOCK), dtype=x.dtype,
                         device=x.device)
    padded[:m, :n] = x
    view = padded.view(-1, BLOCK, padded.size(1) // BLOCK, BLOCK)
    amax = view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    if amax448:
        scaled = (view * (448.0 / amax)).to(torch.float8_e4m3fn)
        sf = amax / 448.0
    else:
        sf = amax / 448.0
        if use_ue8m0:
            bits = sf.abs().float().view(torch.int)
            exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
            sf = (exp.clamp(1, 254) << 23).view(torch.float)
        scaled = (view * (1.0 / sf)).to(torch.float8_e4m3fn)
    q = scaled.view_as(padded)[:m, :n].contiguous()
    return q.view(torch.uint8).cpu().numpy(), sf.view(view.size(0), view.size(2)).cpu().numpy()
