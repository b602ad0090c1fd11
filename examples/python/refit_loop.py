#!/usr/bin/env python3
"""A real refit loop: a small transformer trained with AdamW (FP32 master weights, as
RL trainers keep them) publishes its BF16 weights after every step through deltacast
to three rollout processes, which hold
the model as torch tensors (patched in place), generate a few tokens after each
commit, and report a hash of their weights; the trainer checks every rollout is
bit-exact with its own state_dict after every step.

Usage: refit_loop.py [--steps N]   (exit status 0 when every step committed and
every rollout matched). Uses Debian's python3-torch on the CPU.
"""
import argparse
import hashlib
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.nn as nn

import deltacast

VOCAB, DIM, LAYERS, HEADS, CONTEXT = 256, 128, 2, 4, 32
ROLLOUTS = ("r1", "r2", "r3")
TOKEN = "refit-loop-token"


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, DIM))
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        n = tokens.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1).to(self.pos.dtype)
        x = self.embed(tokens) + self.pos[:n]
        return self.head(self.layers(x, mask=mask))


def make_model(dtype=torch.bfloat16):
    torch.manual_seed(0)  # every process starts from the same weights: the fleet's version
    return TinyLM().to(dtype)


def weights_hash(model):
    return weights_hash_of(model.state_dict())


def weights_hash_of(tensors):
    h = hashlib.sha256()
    for name, t in sorted(tensors.items()):
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cluster(base_port):
    nodes = [{"id": "trainer", "host": "127.0.0.1", "port": base_port, "role": "source"}]
    nodes += [{"id": r, "host": "127.0.0.1", "port": base_port + 3 * (i + 1)}
              for i, r in enumerate(ROLLOUTS)]
    return {"cluster": {"name": "refit-loop"},
            "tree": {"connect_timeout": "20s", "commit_timeout": "60s"}, "node": nodes}


def rollout(name, config_dict, reports, stop):
    """A rollout worker: its model's tensors are the node's store."""
    deltacast.set_log_level("error")
    torch.set_num_threads(1)
    model = make_model().eval()

    def on_commit(version, changed):
        with torch.no_grad():
            prompt = torch.arange(8).unsqueeze(0) % VOCAB
            for _ in range(4):  # greedy: a few tokens with the new weights
                nxt = model(prompt[:, -CONTEXT:])[:, -1].argmax(-1, keepdim=True)
                prompt = torch.cat([prompt, nxt], dim=1)
        reports.put((name, version, weights_hash(model), len(changed), prompt[0, 8:].tolist()))

    node = deltacast.Node(deltacast.config(config_dict), name, model.state_dict(), token=TOKEN,
                          on_commit=on_commit, apply_threads=1)
    stop.wait()
    node.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-6,
                        help="AdamW learning rate (RL fine-tuning scale: ~3%% of BF16 weights change a step)")
    args = parser.parse_args()
    deltacast.set_log_level("warn")
    torch.set_num_threads(1)
    config_dict = cluster(21000 + (os.getpid() % 800) * 10)
    ctx = mp.get_context("spawn")
    reports, stop = ctx.Queue(), ctx.Event()
    workers = [ctx.Process(target=rollout, args=(r, config_dict, reports, stop)) for r in ROLLOUTS]
    for w in workers:
        w.start()

    # The trainer's FP32 master weights; the BF16 copy is what serves and what is
    # published, refreshed in place after every step (its storage never moves).
    model = make_model(torch.float32)
    serving = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = torch.randint(0, VOCAB, (16, CONTEXT + 1), generator=torch.Generator().manual_seed(1))
    ok = True
    with deltacast.Source(deltacast.config(config_dict), serving, token=TOKEN) as source:
        for step in range(1, args.steps + 1):
            before = {k: v.clone() for k, v in serving.items()}
            logits = model(data[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(),
                                               data[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    serving[k].copy_(v)  # round to BF16, in place
            changed = sum(int((before[k].view(torch.int16) != v.view(torch.int16)).sum())
                          for k, v in serving.items())
            total = sum(v.numel() for v in serving.values())
            t0 = time.time()
            report = source.publish()
            expected = weights_hash_of(serving)
            seen = {}
            while len(seen) < len(ROLLOUTS):
                name, version, digest, n_changed, tokens = reports.get(timeout=60)
                if version == report.target_version:
                    seen[name] = (digest, tokens)
            exact = all(d == expected for d, _ in seen.values())
            ok = ok and report.committed and exact
            print(f"step {step}: loss {loss.item():.3f}, {100 * changed / total:.2f}% of "
                  f"{total} BF16 elements changed, delta {report.delta_bytes} B for "
                  f"{report.checkpoint_bytes} B, {'committed' if report.committed else 'ABORTED'}"
                  f" in {time.time() - t0:.3f} s, rollouts {'bit-exact' if exact else 'DIFFER'}, "
                  f"r1 generated {seen['r1'][1]}", flush=True)
    stop.set()
    for w in workers:
        w.join(30)
    print("refit loop:", "every step committed and every rollout matched" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
