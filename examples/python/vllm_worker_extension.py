#!/usr/bin/env python3
"""An inference engine's GPUs patched in place by deltacast, the way a vLLM worker
extension hands them over (docs/engines.md walks through it step by step).

vLLM runs one worker process per GPU. With ``--worker-extension-cls
vllm_worker_extension.DeltacastWorkerExtension`` every worker gains the methods of
``DeltacastWorkerExtension``, which the driver calls on all workers at once with
``llm.collective_rpc("deltacast_parameters")``: each worker returns its GPU's
parameters as the engine names them (``model.named_parameters()``: fused
``qkv_proj``, ``gate_up_proj``, padded ``embed_tokens``), as CUDA IPC handles, so
one deltacast node in the driver maps every GPU's memory and patches it in place
(the addresses never change: CUDA graphs stay valid). The plans that say where each
canonical element lies on each GPU come from the checkpoint's config.json
(``deltacast.engine_layouts``), not from hand-written files.

Run as a script, it plays the whole path without vLLM or a GPU: a Qwen2-shaped
checkpoint (8 heads, 2 KV heads, QKV biases) served at tensor parallel 4 by four
"workers" whose modules follow vLLM's names and shapes (each KV head replicated on
two of them), loaded by a weight loader written from vLLM's (``vllm_shard``); a
trainer publishes ``--steps`` training steps, and every worker's parameters must
equal ``vllm_shard`` of the trainer's tensors after each. Exit status 0 when they do.
Uses Debian's python3-torch on the CPU; CPU tensors stand in for the IPC handles.

Usage: vllm_worker_extension.py [--steps N] [--tp 4] [--engine vllm|sglang]
"""
import argparse
import json
import os
import sys
import tempfile

import torch

import deltacast

TOKEN = "engine-example-token"
CONFIG = {  # a small Qwen2: QKV biases, 2 KV heads, untied LM head
    "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 128, "vocab_size": 200,
    "num_hidden_layers": 2, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
}


# --- In the engine: the worker extension (one instance per GPU worker) -----------

class DeltacastWorkerExtension:
    """Mixed into vLLM's GPU worker by --worker-extension-cls; ``self.model_runner``
    and ``self.rank`` are the worker's."""

    def deltacast_parameters(self):
        """This GPU's parameters, named as the engine names them, as handles another
        process can map: CUDA IPC for CUDA tensors (torch.multiprocessing), the
        tensors themselves otherwise. The driver orders the workers by rank."""
        from torch.multiprocessing.reductions import reduce_tensor
        shared = []
        for name, p in self.model_runner.model.named_parameters():
            t = p.detach()  # the same memory; deltacast patches it in place
            shared.append((name, reduce_tensor(t) if t.is_cuda else t))
        return self.rank, shared


# --- In the driver: one deltacast node over every GPU's parameters ----------------

def rebuild(handle):
    """A tensor from deltacast_parameters' handle (the worker's memory, mapped here)."""
    if isinstance(handle, tuple):
        rebuild_fn, args = handle
        return rebuild_fn(*args)
    return handle


def start_engine_node(cfg, node_id, checkpoint_config, engine, tp, per_worker, plan_dir,
                      canonical=None, dp=1, ep=1):
    """``per_worker``: what collective_rpc("deltacast_parameters") returned, one
    (rank, [(name, handle)]) per worker. Writes the plans and starts the node; raises
    deltacast.Error, naming the parameter, if a plan does not match a GPU's tensors."""
    plans = deltacast.engine_layouts(checkpoint_config, engine=engine, tp=tp, dp=dp, ep=ep,
                                     out=plan_dir, canonical=canonical)
    by_rank = dict(per_worker)
    gpus = [(plans[g], [(name, rebuild(h)) for name, h in by_rank[g]])
            for g in range(len(plans))]
    return deltacast.Node(cfg, node_id, gpus=gpus, token=TOKEN, apply_threads=1)


# --- The stand-ins for vLLM (the demo) ---------------------------------------------

def vllm_shard(hf, config, tp, rank):
    """GPU ``rank``'s parameters, as vLLM's weight loaders fill them from the
    checkpoint: VocabParallelEmbedding / ParallelLMHead pad the vocabulary to a
    multiple of 64 and split it; QKVParallelLinear holds [its q heads; its KV heads'
    k; their v], a KV head on tp / kv_heads ranks when there are fewer KV heads than
    ranks; MergedColumnParallelLinear [gate; up] of the rank; RowParallelLinear the
    rank's input columns; norms whole."""
    hd, nh, ng = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    vocab = config["vocab_size"]
    per = -(-vocab // 64) * 64 // tp
    qh = nh // tp
    kvn, kv0 = (ng // tp, rank * (ng // tp)) if ng >= tp else (1, rank // (tp // ng))

    def vocab_rows(t):
        w = torch.zeros(per, t.shape[1], dtype=t.dtype)
        lo, hi = rank * per, min(vocab, (rank + 1) * per)
        if hi > lo:
            w[:hi - lo] = t[lo:hi]
        return w

    def rows(t, first, n):
        return t[first:first + n]

    out = {"model.embed_tokens.weight": vocab_rows(hf["model.embed_tokens.weight"])}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for part in ("weight", "bias"):
            a = p + "self_attn."
            out[a + "qkv_proj." + part] = torch.cat([
                rows(hf[a + "q_proj." + part], rank * qh * hd, qh * hd),
                rows(hf[a + "k_proj." + part], kv0 * hd, kvn * hd),
                rows(hf[a + "v_proj." + part], kv0 * hd, kvn * hd)])
        o = hf[p + "self_attn.o_proj.weight"]
        w = o.shape[1] // tp
        out[p + "self_attn.o_proj.weight"] = o[:, rank * w:(rank + 1) * w].contiguous()
        i = config["intermediate_size"] // tp
        out[p + "mlp.gate_up_proj.weight"] = torch.cat([
            rows(hf[p + "mlp.gate_proj.weight"], rank * i, i),
            rows(hf[p + "mlp.up_proj.weight"], rank * i, i)])
        down = hf[p + "mlp.down_proj.weight"]
        out[p + "mlp.down_proj.weight"] = down[:, rank * i:(rank + 1) * i].contiguous()
        for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + norm] = hf[p + norm].clone()
    out["model.norm.weight"] = hf["model.norm.weight"].clone()
    out["lm_head.weight"] = vocab_rows(hf["lm_head.weight"])
    return out


def module_with(named):
    """A torch module whose named_parameters() are ``named`` (dotted names become
    submodules, as in vLLM's Qwen2ForCausalLM)."""
    root = torch.nn.Module()
    for name, t in named.items():
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        m.register_parameter(leaf, torch.nn.Parameter(t.clone(), requires_grad=False))
    return root


class FakeWorker(DeltacastWorkerExtension):
    """What the extension sees in vLLM: a rank and a model runner holding the model."""

    def __init__(self, rank, model):
        self.rank = rank
        self.model_runner = type("ModelRunner", (), {"model": model})()


def checkpoint(config, seed=0):
    """A Hugging Face state dict for ``config`` (BF16; norms in F32)."""
    g = torch.Generator().manual_seed(seed)
    h, hd = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    ffn, vocab = config["intermediate_size"], config["vocab_size"]
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
              "lm_head.weight": (vocab, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.q_proj.bias": (q,),
                       p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,),
                       p + "self_attn.o_proj.weight": (h, q), p + "mlp.gate_proj.weight": (ffn, h),
                       p + "mlp.up_proj.weight": (ffn, h), p + "mlp.down_proj.weight": (h, ffn),
                       p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    return {n: torch.randn(*s, generator=g).to(torch.float32 if "norm" in n else torch.bfloat16)
            for n, s in sorted(shapes.items())}


def write_checkpoint_files(directory, config, hf):
    """config.json and the tensor table (what a checkpoint's safetensors headers say)."""
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    names = {torch.bfloat16: "BF16", torch.float32: "F32"}
    with open(os.path.join(directory, "canonical.json"), "w") as f:
        json.dump({"tensors": [{"name": n, "dtype": names[t.dtype], "shape": list(t.shape)}
                               for n, t in hf.items()]}, f)


def cluster(base_port):
    return deltacast.config({
        "cluster": {"name": "engine"}, "tree": {"connect_timeout": "5s"},
        "node": [{"id": "trainer", "host": "127.0.0.1", "port": base_port, "role": "source"},
                 {"id": "engine", "host": "127.0.0.1", "port": base_port + 3}]})


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--port", type=int, default=18000 + (os.getpid() % 150) * 10)
    args = parser.parse_args()
    deltacast.set_log_level("warn")
    trainer = checkpoint(CONFIG)
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint_files(d, CONFIG, trainer)
        # The engine: one worker per GPU, its module loaded from the checkpoint.
        workers = [FakeWorker(r, module_with(vllm_shard(trainer, CONFIG, args.tp, r)))
                   for r in range(args.tp)]
        # The driver: collective_rpc("deltacast_parameters") on every worker.
        per_worker = [w.deltacast_parameters() for w in workers]
        cfg = cluster(args.port)
        with start_engine_node(cfg, "engine", os.path.join(d, "config.json"), args.engine,
                               args.tp, per_worker, os.path.join(d, "plans"),
                               canonical=os.path.join(d, "canonical.json")) as node, \
                deltacast.Source(cfg, trainer, token=TOKEN, encode_threads=1) as source:
            g = torch.Generator().manual_seed(1)
            for step in range(1, args.steps + 1):
                with torch.no_grad():  # a training step: ~3 % of the elements move
                    for t in trainer.values():
                        bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(
                            torch.int32)
                        flat = bits.view(-1)
                        picked = torch.randint(0, flat.numel(), (max(1, flat.numel() // 33),),
                                               generator=g)
                        flat[picked] ^= 1
                report = source.publish()
                if not report.committed:
                    sys.exit(f"step {step}: not committed: {report.abort_reason}")
                if node.version != report.target_version:
                    sys.exit(f"step {step}: the engine holds {node.version}")
                for w in workers:
                    want = vllm_shard(trainer, CONFIG, args.tp, w.rank)
                    for name, p in w.model_runner.model.named_parameters():
                        if name in ("model.embed_tokens.weight", "lm_head.weight"):
                            n = min(CONFIG["vocab_size"] - w.rank * p.shape[0], p.shape[0])
                            ok = same_bits(p.detach()[:max(n, 0)], want[name][:max(n, 0)])
                        else:
                            ok = same_bits(p.detach(), want[name])
                        if not ok:
                            sys.exit(f"step {step}: GPU {w.rank} {name} differs")
                print(f"step {step}: {report.delta_bytes} B; {args.tp} GPUs bit-exact "
                      f"({len(per_worker[0][1])} parameters each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
