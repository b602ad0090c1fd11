"""The Python binding with torch CUDA tensors through DLPack: an engine's two
tensor-parallel "GPUs" (two sets of slices on CUDA device 0) receive published steps
in place, and weights written on a side stream just before the node starts are read
only after that stream's work (the binding asks for them with __dlpack__(stream=1)).
Skipped without torch or a CUDA device; scripts/gpu-check runs it on a GPU machine."""
import json
import os
import tempfile
import unittest

import torch

import deltacast

deltacast.set_log_level("warn")

HAVE_CUDA = torch.cuda.is_available()


def cluster(base_port: int):
    nodes = [{"id": "trainer", "host": "127.0.0.1", "port": base_port, "role": "source"},
             {"id": "engine", "host": "127.0.0.1", "port": base_port + 3}]
    return deltacast.config({"cluster": {"name": "py-cuda"}, "tree": {"connect_timeout": "5s"},
                             "node": nodes})


def port() -> int:
    return 28000 + (os.getpid() % 400) * 10


DIMS = "[model]\nhidden = 64\nheads = 4\nkv_heads = 4\nhead_dim = 16\nlayers = 1\n"
RULES = ('[[tensor]]\nlocal = "head"\nkind = "column"\ncanonical = ["lm_head.weight"]\n'
         '[[tensor]]\nlocal = "proj"\nkind = "row"\n'
         'canonical = ["model.layers.0.self_attn.o_proj.weight"]\n'
         '[[tensor]]\nlocal = "norm"\nkind = "replicated"\ncanonical = ["model.norm.weight"]\n')


def trainer_tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {
        "lm_head.weight": torch.randn(4096, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(64, 64, generator=g).to(
            torch.bfloat16),
        "model.norm.weight": torch.randn(64, generator=g).to(torch.bfloat16),
    }


def slices(tensors, rank, device):
    return {"head": tensors["lm_head.weight"][2048 * rank:2048 * (rank + 1)].to(device),
            "proj": tensors["model.layers.0.self_attn.o_proj.weight"][
                :, 32 * rank:32 * (rank + 1)].contiguous().to(device),
            "norm": tensors["model.norm.weight"].to(device)}


def layouts(d, trainer):
    table = [{"name": k, "dtype": "BF16", "shape": list(v.shape)}
             for k, v in sorted(trainer.items())]
    with open(os.path.join(d, "canonical.json"), "w") as f:
        json.dump({"tensors": table}, f)
    out = []
    for rank in range(2):
        path = os.path.join(d, f"rank{rank}.toml")
        with open(path, "w") as f:
            f.write('[layout]\ncanonical = "canonical.json"\n' + DIMS +
                    f"[mesh]\ntp = 2\n[rank]\ntp = {rank}\npp = 0\ndp = 0\nep = 0\n" + RULES)
        out.append(path)
    return out


@unittest.skipUnless(HAVE_CUDA, "torch sees no CUDA device")
class CudaBindingTest(unittest.TestCase):
    def run_engine(self, base_port, fill_on_side_stream):
        cfg = cluster(base_port)
        trainer = trainer_tensors(3)
        with tempfile.TemporaryDirectory() as d:
            paths = layouts(d, trainer)
            if fill_on_side_stream:
                # The engine loads its weights on a side stream and hands them over
                # at once: garbage first, then (queued behind long work) the values.
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    engine = [{k: torch.empty_like(v) for k, v in slices(trainer, r, "cuda").items()}
                              for r in range(2)]
                    torch.cuda.synchronize()
                    busy = torch.randn(4096, 4096, device="cuda")
                    for _ in range(20):
                        busy = busy @ busy
                        busy /= busy.norm()
                    for r in range(2):
                        for k, v in slices(trainer, r, "cpu").items():
                            engine[r][k].copy_(v, non_blocking=True)
                    gpus = [(paths[r], engine[r]) for r in range(2)]
                    node = deltacast.Node(cfg, "engine", gpus=gpus, token="py-token",
                                          apply_threads=1)
            else:
                engine = [slices(trainer, r, "cuda") for r in range(2)]
                gpus = [(paths[r], engine[r]) for r in range(2)]
                node = deltacast.Node(cfg, "engine", gpus=gpus, token="py-token",
                                      apply_threads=1)
            # The version the node hashed at start: the weights as the engine loaded
            # them (a hash that raced the side stream would give another version).
            started_at = node.stats().version
            with node:
                with deltacast.Source(cfg, trainer, token="py-token", encode_threads=1) as source:
                    for step in range(2):
                        with torch.no_grad():
                            for t in trainer.values():
                                t.view(torch.int16)[..., step::7] ^= 1
                        report = source.publish()
                        self.assertTrue(report.committed, report.abort_reason)
                        if step == 0:
                            self.assertEqual(started_at, report.base_version)
                        self.assertEqual(node.stats().version, report.target_version)
                        torch.cuda.synchronize()
                        for rank in range(2):
                            for name, want in slices(trainer, rank, "cpu").items():
                                got = engine[rank][name].cpu()
                                self.assertTrue(torch.equal(got.view(torch.int16),
                                                            want.view(torch.int16)),
                                                (step, rank, name))

    def test_an_engine_on_cuda_receives_its_slices_in_place(self):
        self.run_engine(port(), fill_on_side_stream=False)

    def test_weights_written_on_a_side_stream_are_read_after_it(self):
        self.run_engine(port() + 5, fill_on_side_stream=True)


if __name__ == "__main__":
    unittest.main()
