#!/usr/bin/env python3
"""The C++ FP8 block quantizer against the independent numpy reference
(scripts/fp8_reference.py), byte for byte, on random BF16 tensors and on weights of
a small torch AdamW run; and against torch's own float8_e4m3fn cast of the same
formula where this torch has one (torch >= 2.1; Debian's 1.13 does not).

    test_fp8_reference.py PATH/TO/deltacast_fp8_quantize_tool [PATH/TO/deltacast]

With the deltacast binary, also checks `deltacast synth --fp8`: every tensor of each
step's FP8 twin against the reference's quantization of the BF16 step (or the BF16
bytes for kept tensors), the index and config.json's quantization_config.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import fp8_reference as ref  # noqa: E402

TOOL = sys.argv[1]
DELTACAST = sys.argv[2] if len(sys.argv) > 2 else None
SCHEMES = ["fp8_e4m3_block128", "fp8_e4m3_block128_ue8m0", "fp8_e4m3_block128_amax448"]
TMP = tempfile.mkdtemp(prefix="fp8ref-")
checked = {"tensors": 0, "bytes": 0}


def run_tool(bits, scheme, path="cpu"):
    rows, cols = bits.shape
    src, out, scale = (os.path.join(TMP, n) for n in ("in.bf16", "out.fp8", "out.scale"))
    bits.astype("<u2").tofile(src)
    r = subprocess.run([TOOL, scheme, str(rows), str(cols), src, out, scale, path],
                       capture_output=True, text=True)
    if r.returncode == 77:
        return None
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return (np.fromfile(out, dtype=np.uint8).reshape(rows, cols),
            np.fromfile(scale, dtype="<f4"))


def compare(bits, label, paths=("cpu", "avx2", "baseline")):
    for scheme in SCHEMES:
        want_q, want_s = ref.quantize(bits, scheme)
        for path in paths:
            got = run_tool(bits, scheme, path)
            if got is None:
                continue
            got_q, got_s = got
            if not np.array_equal(got_s.view(np.uint32), want_s.reshape(-1).view(np.uint32)):
                bad = np.nonzero(got_s.view(np.uint32) != want_s.reshape(-1).view(np.uint32))[0]
                raise AssertionError(f"{label} {scheme} {path}: scales differ at {bad[:5]}")
            if not np.array_equal(got_q, want_q):
                r, c = np.argwhere(got_q != want_q)[0]
                x = ref.bf16_to_float32(bits[r, c])
                raise AssertionError(
                    f"{label} {scheme} {path}: [{r}, {c}] x={x!r} (0x{int(bits[r, c]):04x}): "
                    f"C++ 0x{got_q[r, c]:02x}, reference 0x{want_q[r, c]:02x}")
            checked["tensors"] += 1
            checked["bytes"] += got_q.size


def bf16_bits(x32):
    """float32 -> BF16 bits, round to nearest even (numpy, on the bits)."""
    u = np.asarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_reference_self_check():
    # A few codes worked out from the format, so the reference itself is pinned down.
    v = np.array([0.0, -0.0, 1.0, 448.0, 464.0, 465.0, 480.0, 2.0 ** -10, 3 * 2.0 ** -10,
                  1.0625, 1.1875], dtype=np.float32)
    want = [0x00, 0x80, 0x38, 0x7E, 0x7E, 0x7F, 0x7F, 0x00, 0x02, 0x38, 0x3A]
    assert list(ref.e4m3_from_float32(v)) == want, list(map(hex, ref.e4m3_from_float32(v)))


def test_random_tensors():
    rng = np.random.default_rng(20261202)
    shapes = [(1, 1), (3, 5), (128, 128), (130, 200), (257, 389), (384, 1024)]
    for rows, cols in shapes:
        normal = bf16_bits(rng.normal(0, 0.02, (rows, cols)).astype(np.float32))
        compare(normal, f"normal {rows}x{cols}")
        # Any finite BF16: every exponent, subnormals, signed zeros.
        wide = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint32).astype(np.uint16)
        wide[(wide & 0x7F80) == 0x7F80] &= 0xBFFF  # Inf/NaN exponents -> finite
        compare(wide, f"wide {rows}x{cols}")
        # Mostly zero, with whole zero blocks, -0.0, and subnormal-only blocks.
        sparse = np.where(rng.random((rows, cols)) < 0.01, normal, 0).astype(np.uint16)
        sparse[::3, ::7] |= 0x8000
        if rows > 128 and cols > 128:
            sparse[128:, 128:] = rng.integers(0, 0x80, (rows - 128, cols - 128)).astype(np.uint16)
        compare(sparse, f"sparse {rows}x{cols}")


def test_tie_heavy_values():
    # Blocks whose amax is 1.0 get the UE8M0 scale 2^-8 (1/448 rounded up), so the
    # multiplier is 256 and x * 256 is exact: x = midpoint / 256 puts every element
    # on an E4M3 midpoint (or on a code), where only round-to-nearest-even decides.
    rng = np.random.default_rng(7)
    mids = (ref._VALUES[:-1] + ref._VALUES[1:]) / 2
    pool = np.concatenate([mids, ref._VALUES, -mids])
    pool = pool[np.abs(pool) <= 256].astype(np.float32) / np.float32(256)
    x = rng.choice(pool, size=(256, 256)).astype(np.float32)
    x[0, 0], x[0, 200], x[200, 0], x[200, 200] = 1.0, 1.0, -1.0, 1.0
    bits = bf16_bits(x)
    assert np.array_equal(ref.bf16_to_float32(bits), x), "midpoints must be exact in BF16"
    scaled = x.astype(np.float64) * 256
    ties = np.isin(np.abs(scaled), mids).sum()
    assert ties > 10000, ties
    compare(bits, "ties")


def test_adamw_weights():
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(520, 384), torch.nn.Linear(384, 300))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    data = torch.randn(64, 520)
    for step in range(3):
        loss = model(data).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for name, p in model.named_parameters():
            if p.dim() != 2:
                continue
            bits = p.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            compare(bits, f"adamw step {step} {name}")


def test_non_finite_refused():
    bits = bf16_bits(np.full((130, 140), 0.5, dtype=np.float32))
    for value, word in ((0x7FC0, "NaN"), (0xFF80, "-Inf")):
        b = bits.copy()
        b[129, 3] = value
        try:
            run_tool(b, SCHEMES[0])
        except RuntimeError as e:
            assert "[129, 3]" in str(e) and word in str(e), str(e)
        else:
            raise AssertionError("a non-finite input was quantized")
        try:
            ref.quantize(b)
        except ValueError:
            pass
        else:
            raise AssertionError("the reference quantized a non-finite input")


def test_cuda_matches():
    rng = np.random.default_rng(3)
    bits = bf16_bits(rng.normal(0, 0.02, (300, 700)).astype(np.float32))
    if run_tool(bits, SCHEMES[0], "cuda") is None:
        print("cuda: no device, skipped")
        return
    compare(bits, "cuda", paths=("cuda",))


def test_torch_float8_cast():
    import torch
    if not hasattr(torch, "float8_e4m3fn"):
        print(f"torch {torch.__version__} has no float8_e4m3fn: torch comparison skipped")
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rng = np.random.default_rng(11)
    for device in devices:
        for rows, cols in [(130, 200), (384, 1024)]:
            bits = bf16_bits(rng.normal(0, 0.02, (rows, cols)).astype(np.float32))
            x = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).to(device)
            for scheme, kw in zip(SCHEMES, [{}, {"use_ue8m0": True}, {"amax448": True}]):
                tq, ts = ref.torch_quantize(x, **kw)
                want_q, want_s = ref.quantize(bits, scheme)
                assert np.array_equal(tq, want_q), f"torch {device} {scheme}: bytes differ"
                assert np.array_equal(ts.view(np.uint32), want_s.view(np.uint32)), scheme
                got_q, got_s = run_tool(bits, scheme)
                assert np.array_equal(got_q, tq), f"C++ vs torch {device} {scheme}"
    print(f"torch {torch.__version__} float8_e4m3fn on {devices}: identical")


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[b:e])
    return out


def read_checkpoint(d):
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    tensors = {}
    for f in sorted(set(index["weight_map"].values())):
        for name, t in read_safetensors(os.path.join(d, f)).items():
            assert index["weight_map"][name] == f, name
            tensors[name] = t
    assert set(tensors) == set(index["weight_map"]), "index and files disagree"
    assert index["metadata"]["total_size"] == sum(len(t[2]) for t in tensors.values())
    return tensors


def test_synth_fp8_twin():
    if DELTACAST is None:
        print("no deltacast binary given: synth --fp8 not checked")
        return
    out = os.path.join(TMP, "synth")
    for scheme in SCHEMES:
        subprocess.run([DELTACAST, "synth", "--out", out, "--params", "3M", "--steps", "1",
                        "--fp8", "--fp8-scheme", scheme], check=True, capture_output=True)
        for step in ("step0", "step1"):
            bf16 = read_checkpoint(os.path.join(out, step))
            fp8 = read_checkpoint(os.path.join(out, step + "-fp8"))
            config = json.load(open(os.path.join(out, step + "-fp8", "config.json")))
            q = config["quantization_config"]
            assert q["quant_method"] == "fp8" and q["fmt"] == "e4m3", q
            assert q["weight_block_size"] == [128, 128], q
            assert q.get("scale_fmt") == ("ue8m0" if scheme.endswith("ue8m0") else None), q
            assert config["hidden_size"] > 0  # the source's config is kept
            quantized = 0
            for name, (dtype, shape, raw) in bf16.items():
                served = fp8.pop(name)
                if served[0] == "BF16":
                    assert served[1:] == (shape, raw), name
                    continue
                assert served[0] == "F8_E4M3" and served[1] == shape, name
                sdtype, sshape, sraw = fp8.pop(name + "_scale_inv")
                bits = np.frombuffer(raw, dtype="<u2").reshape(shape)
                want_q, want_s = ref.quantize(bits, scheme)
                assert sdtype == "F32" and sshape == list(want_s.shape), name
                assert served[2] == want_q.tobytes(), f"{scheme} {step} {name}: FP8 bytes differ"
                assert sraw == want_s.astype("<f4").tobytes(), f"{scheme} {step} {name}: scales"
                quantized += 1
            assert not fp8, f"extra tensors in the twin: {list(fp8)[:3]}"
            assert quantized > 0
            checked["tensors"] += quantized
        print(f"synth --fp8 {scheme}: twins match the reference")


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print(f"{name}: ok")
    print(f"{checked['tensors']} tensors, {checked['bytes']} FP8 bytes identical")
