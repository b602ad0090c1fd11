#!/usr/bin/env python3
"""Reference implementation of the deltacast partition hash (docs/wire-format.md,
"Partition hash"), written from the spec alone and independent of the C++ code. It
prints the golden vectors that tests/common/partition_hash_test.cc checks.

Usage: scripts/partition_hash_ref.py            # golden vectors
       scripts/partition_hash_ref.py FILE        # hash of FILE as one partition
"""
import hashlib
import sys

POLY = (1 << 128) | 0x87  # x^128 + x^7 + x^2 + x + 1
ALPHA = int.from_bytes(hashlib.sha256(b"deltacast partition hash v2 alpha").digest()[:16], "little")
LENGTH_TAG = int.from_bytes(b"dcph-len", "little")


def mul(a, b):
    r = 0
    while b:
        if b & 1:
            r ^= a
        b >>= 1
        a <<= 1
        if a >> 128:
            a ^= POLY
    return r


def partition_hash(data: bytes) -> bytes:
    n = len(data)
    h = (LENGTH_TAG << 64) | n
    power = ALPHA  # alpha^(b+1) for block b
    for b in range(0, n, 16):
        block = int.from_bytes(data[b:b + 16].ljust(16, b"\0"), "little")
        h ^= mul(block, power)
        power = mul(power, ALPHA)
    return h.to_bytes(16, "little")


def golden_inputs():
    yield "empty", b""
    yield "abc", b"abc"
    yield "iota16", bytes(range(16))
    yield "iota17", bytes(range(17))
    yield "zeros100", bytes(100)
    yield "pattern1000", bytes((i * 131 + 7) & 255 for i in range(1000))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(partition_hash(open(sys.argv[1], "rb").read()).hex())
    else:
        print("alpha", ALPHA.to_bytes(16, "little").hex(), hex(ALPHA))
        for name, data in golden_inputs():
            print(name, partition_hash(data).hex())
