"""Node(gpus=...) over an engine's named parameters with generated plans
(examples/python/vllm_worker_extension.py): a plan that does not match the engine's
tensors is refused, naming the parameter and what was expected, before any byte is
written; a KV replication factor that does not divide is refused by the generator."""
import json
import os
import sys
import tempfile
import unittest

import torch

import deltacast

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import vllm_worker_extension as ext  # noqa: E402

deltacast.set_log_level("warn")
TP = 4


def port() -> int:
    # Below the ephemeral range (32768+), apart from the other tests' ranges.
    return 16000 + (os.getpid() % 150) * 10


class EngineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.trainer = ext.checkpoint(ext.CONFIG)
        ext.write_checkpoint_files(self.dir.name, ext.CONFIG, self.trainer)
        self.shards = [ext.vllm_shard(self.trainer, ext.CONFIG, TP, r) for r in range(TP)]

    def tearDown(self):
        self.dir.cleanup()

    def start(self, shards):
        workers = [ext.FakeWorker(r, ext.module_with(s)) for r, s in enumerate(shards)]
        per_worker = [w.deltacast_parameters() for w in workers]
        node = ext.start_engine_node(ext.cluster(port()), "engine",
                                     os.path.join(self.dir.name, "config.json"), "vllm", TP,
                                     per_worker, os.path.join(self.dir.name, "plans"),
                                     canonical=os.path.join(self.dir.name, "canonical.json"))
        return node, workers

    def test_named_parameters_and_generated_plans_start_a_node(self):
        node, workers = self.start(self.shards)
        node.stop()
        names = [n for n, _ in workers[0].model_runner.model.named_parameters()]
        self.assertIn("model.layers.0.self_attn.qkv_proj.bias", names)

    def test_a_shape_that_does_not_match_is_refused_with_nothing_written(self):
        shards = [dict(s) for s in self.shards]
        name = "model.layers.1.self_attn.qkv_proj.weight"
        shards[2][name] = shards[2][name][:-8].clone()  # one head's rows short
        before = [{k: v.clone() for k, v in s.items()} for s in shards]
        with self.assertRaisesRegex(deltacast.Error,
                                    name + ".*has shape \\[24, 64\\].*implies \\[32, 64\\]"):
            self.start(shards)
        for s, b in zip(shards, before):
            for k in s:
                self.assertTrue(torch.equal(s[k].view(torch.uint8), b[k].view(torch.uint8)), k)

    def test_a_missing_parameter_is_named_with_its_shape(self):
        shards = [dict(s) for s in self.shards]
        del shards[1]["model.layers.1.mlp.down_proj.weight"]
        with self.assertRaisesRegex(
                deltacast.Error, "parameter 'model.layers.1.mlp.down_proj.weight' is missing: the "
                                 "plan .*gpu-1.toml:[0-9]+\\) expects it with shape \\[64, 32\\]"):
            self.start(shards)

    def test_a_kv_replication_factor_that_does_not_divide_is_refused(self):
        config = dict(ext.CONFIG, num_attention_heads=12, num_key_value_heads=3)
        path = os.path.join(self.dir.name, "config3.json")
        with open(path, "w") as f:
            json.dump(config, f)
        with self.assertRaisesRegex(deltacast.Error,
                                    "num_key_value_heads = 3 < tp = 4.*replicated.*not whole"):
            deltacast.engine_layouts(path, engine="vllm", tp=TP, out=self.dir.name,
                                     canonical=os.path.join(self.dir.name, "canonical.json"))


if __name__ == "__main__":
    unittest.main()
