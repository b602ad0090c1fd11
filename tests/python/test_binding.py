"""The Python binding in one process: a Source and two Nodes over torch tensors on
loopback, bit-exact after every publish, callbacks on commit, a Root with two
Producers, and misuse refused."""
import concurrent.futures
import json
import os
import tempfile
import threading
import unittest

import numpy as np
import torch

import deltacast

deltacast.set_log_level("warn")


def cluster(base_port: int, receivers=("w1", "w2"), **tree):
    nodes = [{"id": "trainer", "host": "127.0.0.1", "port": base_port, "role": "source"}]
    nodes += [{"id": r, "host": "127.0.0.1", "port": base_port + 3 * (i + 1)}
              for i, r in enumerate(receivers)]
    return deltacast.config({"cluster": {"name": "py"},
                             "tree": {"connect_timeout": "5s", **tree}, "node": nodes})


def port() -> int:
    return 26000 + (os.getpid() % 500) * 10


def model(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(512, 64, generator=g).to(torch.bfloat16),
        "layer.0.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(64, dtype=torch.float32),
    }


class BindingTest(unittest.TestCase):
    def test_publish_reaches_every_node_bit_exact(self):
        cfg = cluster(port())
        trainer = model(1)
        commits = {"w1": [], "w2": []}
        done = threading.Event()

        def on_commit(name):
            def record(version, changed):
                commits[name].append((version, changed))
                if all(len(c) == 3 for c in commits.values()):
                    done.set()
            return record

        workers = {n: {k: v.clone() for k, v in trainer.items()} for n in ("w1", "w2")}
        nodes = [deltacast.Node(cfg, n, workers[n], token="py-token", on_commit=on_commit(n),
                                apply_threads=1) for n in ("w1", "w2")]
        with deltacast.Source(cfg, trainer, token="py-token", encode_threads=1) as source:
            for step in range(3):
                with torch.no_grad():  # a training step: a few elements move
                    trainer["layer.0.weight"].view(torch.int16)[step::7] ^= 1
                report = source.publish()
                self.assertTrue(report.committed, report.abort_reason)
                self.assertEqual(report.nodes_decided, 2)
                self.assertEqual(len(report.nodes), 2)
                for n in report.nodes:  # where each node's time to PREPARED went
                    self.assertGreater(n.receive_seconds, 0)
                    self.assertLessEqual(n.receive_seconds, n.prepared_seconds)
                    self.assertGreater(n.write_seconds, 0)
                    self.assertGreater(n.apply_cpu_seconds, 0)
                    self.assertGreaterEqual(n.disk_wait_seconds, 0)
                for n in ("w1", "w2"):
                    for k in trainer:
                        self.assertTrue(torch.equal(workers[n][k].view(torch.uint8),
                                                    trainer[k].view(torch.uint8)), (n, k, step))
                self.assertEqual(nodes[0].version, report.target_version)
                self.assertEqual(nodes[0].stats().stripes, [])  # one tree: no stripes
            future = source.publish_async()  # nothing changed: an empty delta commits too
            self.assertTrue(future.result().committed)
        self.assertTrue(done.wait(10))
        self.assertEqual(commits["w1"][0][1], ["layer.0.weight"])
        for node in nodes:
            node.stop()

    def test_wrong_weights_are_named_at_join_and_verify_audits_a_node(self):
        """A Source knows its version from the tensors it starts with: a node whose
        weights differ is told which at join; verify() finds bits changed later."""
        cfg = cluster(port() + 1)
        trainer = model(5)
        good = {k: v.clone() for k, v in trainer.items()}
        bad = {k: v.clone() for k, v in trainer.items()}
        with torch.no_grad():
            bad["layer.0.weight"].view(torch.int16)[3, 3] ^= 4
        with deltacast.Source(cfg, trainer, token="py-token", encode_threads=1) as source:
            self.assertEqual(len(source.version), 32)
            n1 = deltacast.Node(cfg, "w1", good, token="py-token", apply_threads=1)
            n2 = deltacast.Node(cfg, "w2", bad, token="py-token", apply_threads=1)
            n1.wait_for_join(10)
            with self.assertRaisesRegex(deltacast.Error,
                                        "'layer.0.weight': bits differ in partition 0"):
                n2.wait_for_join(10)
            report = n1.verify()
            self.assertTrue(report.ok, report.summary)
            self.assertEqual(report.version, source.version)
            with torch.no_grad():
                good["norm.weight"][5] = 2.0
            report = n1.verify()
            self.assertFalse(report.ok)
            self.assertEqual([m.tensor for m in report.mismatches], ["norm.weight"])
            n1.stop()
            n2.stop()
        with self.assertRaisesRegex(deltacast.Error, "the source is stopped"):
            source.publish()

    def test_an_engine_on_two_gpus_receives_its_slices(self):
        """Node(gpus=...): each "GPU" holds its tensor-parallel slices under the
        engine's own names (host tensors here: the same path takes CUDA tensors)."""
        cfg = cluster(port() + 3, receivers=("engine",))
        g = torch.Generator().manual_seed(3)
        trainer = {
            "lm_head.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
            "model.layers.0.self_attn.o_proj.weight": torch.randn(8, 16, generator=g).to(
                torch.bfloat16),
            "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        }
        dims = "[model]\nhidden = 8\nheads = 2\nkv_heads = 2\nhead_dim = 4\nlayers = 1\n"
        rules = ('[[tensor]]\nlocal = "head"\nkind = "column"\ncanonical = ["lm_head.weight"]\n'
                 '[[tensor]]\nlocal = "proj"\nkind = "row"\n'
                 'canonical = ["model.layers.0.self_attn.o_proj.weight"]\n'
                 '[[tensor]]\nlocal = "norm"\nkind = "replicated"\n'
                 'canonical = ["model.norm.weight"]\n')

        def slices(tensors, rank):
            return {"head": tensors["lm_head.weight"][8 * rank:8 * (rank + 1)].clone(),
                    "proj": tensors["model.layers.0.self_attn.o_proj.weight"][
                        :, 8 * rank:8 * (rank + 1)].contiguous(),
                    "norm": tensors["model.norm.weight"].clone()}

        with tempfile.TemporaryDirectory() as d:
            table = [{"name": k, "dtype": "BF16", "shape": list(v.shape)}
                     for k, v in sorted(trainer.items())]
            with open(os.path.join(d, "canonical.json"), "w") as f:
                json.dump({"tensors": table}, f)
            gpus = []
            for rank in range(2):
                layout = os.path.join(d, f"rank{rank}.toml")
                with open(layout, "w") as f:
                    f.write('[layout]\ncanonical = "canonical.json"\n' + dims +
                            f"[mesh]\ntp = 2\n[rank]\ntp = {rank}\npp = 0\ndp = 0\nep = 0\n" + rules)
                gpus.append((layout, slices(trainer, rank)))
            with deltacast.Node(cfg, "engine", gpus=gpus, token="py-token",
                                apply_threads=1) as node:
                with deltacast.Source(cfg, trainer, token="py-token", encode_threads=1) as source:
                    with torch.no_grad():
                        for t in trainer.values():
                            t.view(torch.int16)[..., ::5] ^= 3
                    report = source.publish()
                    self.assertTrue(report.committed, report.abort_reason)
                    self.assertEqual(node.version, report.target_version)
                for rank, (_, engine) in enumerate(gpus):
                    for name, want in slices(trainer, rank).items():
                        self.assertTrue(torch.equal(engine[name].view(torch.int16),
                                                    want.view(torch.int16)), (rank, name))

    def test_a_striped_node_counts_each_stripe(self):
        """NodeStats.stripes: one entry per stripe, adding up to the totals; each
        stripe's link carried its chunks and its END once, joined once."""
        cfg = cluster(port() + 2, stripes=2, chunk_size="4KiB")
        g = torch.Generator().manual_seed(6)
        # Twelve tensors, a partition each: the delta takes a dozen chunks or more.
        trainer = {f"layers.{i}.weight": torch.randn(64, 128, generator=g).to(torch.bfloat16)
                   for i in range(12)}
        workers = {n: {k: v.clone() for k, v in trainer.items()} for n in ("w1", "w2")}
        nodes = [deltacast.Node(cfg, n, workers[n], token="t", apply_threads=1)
                 for n in ("w1", "w2")]
        with deltacast.Source(cfg, trainer, token="t", encode_threads=1) as source:
            with torch.no_grad():  # a training step that moves every tensor
                for t in trainer.values():
                    t += torch.randn(64, 128, generator=g).to(torch.bfloat16)
            report = source.publish()
            self.assertTrue(report.committed, report.abort_reason)
        self.assertGreater(report.chunks, 8)
        for node in nodes:
            stats = node.stats()
            self.assertEqual(len(stats.stripes), 2)
            self.assertEqual([s.parent_joins for s in stats.stripes], [1, 1])
            self.assertEqual(sum(s.parent_joins for s in stats.stripes), stats.parent_joins)
            self.assertEqual(sum(s.chunk_bytes_resent for s in stats.stripes),
                             stats.chunk_bytes_resent)
            self.assertEqual(stats.chunk_bytes_resent, 0)
            # Every data chunk on one stripe, and each stripe's own END.
            self.assertEqual(sum(s.chunks for s in stats.stripes), report.chunks - 1 + 2)
            self.assertTrue(all(s.chunks > 1 for s in stats.stripes), stats.stripes)
            node.stop()
        for n in workers:
            for k in trainer:
                self.assertTrue(torch.equal(workers[n][k].view(torch.uint8),
                                            trainer[k].view(torch.uint8)), (n, k))

    def test_misuse_is_refused_with_the_tensor_named(self):
        cfg = cluster(port() + 1)
        t = model(2)
        with self.assertRaisesRegex(deltacast.Error, "layer.0.weight.*not contiguous"):
            deltacast.Node(cfg, "w1", {"layer.0.weight": t["layer.0.weight"].t()}, token="x")
        with self.assertRaisesRegex(deltacast.Error, "'bad' .*has no __dlpack__"):
            deltacast.Node(cfg, "w1", {"bad": [1, 2, 3]}, token="x")
        with self.assertRaisesRegex(deltacast.Error, "w9"):
            deltacast.Node(cfg, "w9", t, token="x")
        try:
            deltacast.Node(cfg, "w1", t, token="x", apply_threads=1).stop()
        except deltacast.Error as e:
            self.fail(str(e))

    def test_numpy_arrays_and_a_freed_tensor_stay_safe(self):
        cfg = cluster(port() + 2, receivers=("w1",))
        trainer = {"a": np.arange(4096, dtype=np.float32)}
        held = {"a": trainer["a"].copy()}
        node = deltacast.Node(cfg, "w1", held, token="t", apply_threads=1)
        del held  # the Node keeps its own reference
        with deltacast.Source(cfg, trainer, token="t", encode_threads=1) as source:
            trainer["a"][::100] += 1
            report = source.publish()
            self.assertTrue(report.committed, report.abort_reason)
        self.assertEqual(node.version, report.target_version)
        node.stop()

    def test_two_producers_make_one_version_through_the_root(self):
        cfg = cluster(port() + 3, receivers=("w1",))
        trainer = model(4)
        held = {k: v.clone() for k, v in trainer.items()}
        names = sorted(trainer)
        halves = [{k: trainer[k] for k in names[0::2]}, {k: trainer[k] for k in names[1::2]}]
        with self.assertRaisesRegex(deltacast.Error, "'stray' is not in the model"):
            deltacast.Producer(cfg, "p0", {"stray": torch.zeros(4)}, model=trainer, token="t")
        node = deltacast.Node(cfg, "w1", held, token="t", apply_threads=1)
        with deltacast.Root(cfg, producers=2, token="t", producer_address="127.0.0.1:0") as root:
            producers = [deltacast.Producer(cfg, f"p{i}", halves[i], model=trainer, token="t",
                                            root=root.producer_address, encode_threads=1)
                         for i in range(2)]
            for step in range(2):
                for k, v in trainer.items():
                    v.view(torch.int16)[step::97] += 1  # flip some bits of every tensor
                pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
                served = [pool.submit(p.serve) for p in producers]
                report = root.publish()
                self.assertTrue(report.committed, report.abort_reason)
                self.assertTrue(all(f.result().committed for f in served))
                pool.shutdown()
                for k in trainer:
                    self.assertTrue(torch.equal(held[k].view(torch.uint8),
                                                trainer[k].view(torch.uint8)), (k, step))
            for p in producers:
                p.close()
        node.stop()

    def test_config_errors_name_the_problem(self):
        with self.assertRaisesRegex(deltacast.Error, "INVALID_ARGUMENT"):
            deltacast.config({"cluster": {"name": 3}})
        with self.assertRaises(deltacast.Error) as e:
            deltacast.config("/no/such/cluster.toml")
        self.assertIn(e.exception.code, ("NOT_FOUND", "IO_ERROR", "INVALID_ARGUMENT"))


if __name__ == "__main__":
    unittest.main()
