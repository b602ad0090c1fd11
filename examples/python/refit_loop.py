#!/usr/bin/env python3
"""A real refit loop: a small transformer trained with AdamW (FP32 master weights, as
RL trainers keep them) publishes its BF16 weights after every step through deltacast
to three rollout processes, which hold the model as torch tensors (patched in
place), generate a few tokens after each commit, and report a hash of each of their
tensors; every rollout is checked bit-exact with the trainer's state_dict after
every step.

With --producers 2 the trainer is two rank processes (data-parallel replicas, each
owning half of the parameters, as ZeRO shards them): each is a deltacast Producer
that encodes the changes of its own half, and this process is the Root that merges
their streams into one version; it never holds the model.

Usage: refit_loop.py [--steps N] [--producers 1|2]   (exit status 0 when every step
committed and every rollout matched). Uses Debian's python3-torch on the CPU.
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


def tensor_digests(tensors):
    """{name: sha256 of its bytes}: what a rollout holds, or a producer owns."""
    return {name: hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for name, t in tensors.items()}


class Trainer:
    """FP32 master weights and AdamW; `serving` is the BF16 copy that is published,
    refreshed in place after every step (its storage never moves). Deterministic:
    every rank process trains the same replica."""

    def __init__(self, lr):
        self.model = make_model(torch.float32)
        self.serving = {k: v.to(torch.bfloat16) for k, v in self.model.state_dict().items()}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.data = torch.randint(0, VOCAB, (16, CONTEXT + 1),
                                  generator=torch.Generator().manual_seed(1))

    def step(self, names=None):
        """One step; returns (loss, changed BF16 elements, elements) over `names`."""
        names = names if names is not None else list(self.serving)
        before = {k: self.serving[k].clone() for k in names}
        logits = self.model(self.data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(),
                                           self.data[:, 1:].reshape(-1))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                self.serving[k].copy_(v)  # round to BF16, in place
        changed = sum(int((before[k].view(torch.int16) != self.serving[k].view(torch.int16)).sum())
                      for k in names)
        return loss.item(), changed, sum(self.serving[k].numel() for k in names)


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
        reports.put((name, version, tensor_digests(model.state_dict()), len(changed),
                     prompt[0, 8:].tolist()))

    node = deltacast.Node(deltacast.config(config_dict), name, model.state_dict(), token=TOKEN,
                          on_commit=on_commit, apply_threads=1)
    stop.wait()
    node.stop()


def owned_names(rank, ranks):
    """Rank r owns every ranks-th parameter in name order: about 1/ranks of the bytes."""
    return sorted(make_model().state_dict())[rank::ranks]


def producer_rank(rank, ranks, config_dict, steps, lr, results):
    """A trainer rank: trains its replica, and serves each refit with its own half."""
    deltacast.set_log_level("warn")
    torch.set_num_threads(1)
    trainer = Trainer(lr)
    mine = owned_names(rank, ranks)
    with deltacast.Producer(deltacast.config(config_dict), f"rank-{rank}",
                            {k: trainer.serving[k] for k in mine}, model=trainer.serving,
                            token=TOKEN) as producer:
        for step in range(1, steps + 1):
            loss, changed, total = trainer.step(mine)
            report = producer.serve()
            results.put((rank, step, loss, changed, total, report.committed, report.sent_bytes,
                         tensor_digests({k: trainer.serving[k] for k in mine})))


def wait_rollouts(reports, version):
    seen = {}
    while len(seen) < len(ROLLOUTS):
        name, got, digests, n_changed, tokens = reports.get(timeout=60)
        if got == version:
            seen[name] = (digests, tokens)
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--producers", type=int, default=1,
                        help="1: one trainer process is the Source; N > 1: N rank processes "
                             "are Producers, each owning 1/N of the parameters")
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
    cfg = deltacast.config(config_dict)
    ok = True
    if args.producers <= 1:
        trainer = Trainer(args.lr)
        with deltacast.Source(cfg, trainer.serving, token=TOKEN) as source:
            for step in range(1, args.steps + 1):
                loss, changed, total = trainer.step()
                t0 = time.time()
                report = source.publish()
                seen = wait_rollouts(reports, report.target_version)
                expected = tensor_digests(trainer.serving)
                exact = all(d == expected for d, _ in seen.values())
                ok = ok and report.committed and exact
                print(f"step {step}: loss {loss:.3f}, {100 * changed / total:.2f}% of "
                      f"{total} BF16 elements changed, delta {report.delta_bytes} B for "
                      f"{report.checkpoint_bytes} B, "
                      f"{'committed' if report.committed else 'ABORTED'} in "
                      f"{time.time() - t0:.3f} s, rollouts {'bit-exact' if exact else 'DIFFER'}, "
                      f"r1 generated {seen['r1'][1]}", flush=True)
    else:
        results = ctx.Queue()
        with deltacast.Root(cfg, producers=args.producers, token=TOKEN) as root:
            ranks = [ctx.Process(target=producer_rank,
                                 args=(r, args.producers, config_dict, args.steps, args.lr,
                                       results)) for r in range(args.producers)]
            for p in ranks:
                p.start()
            for step in range(1, args.steps + 1):
                t0 = time.time()
                report = root.publish()
                elapsed = time.time() - t0
                done = [results.get(timeout=120) for _ in ranks]
                expected, changed, total, sent = {}, 0, 0, []
                for rank, got_step, loss, c, n, committed, sent_bytes, digests in sorted(done):
                    ok = ok and got_step == step and committed
                    expected.update(digests)
                    changed, total = changed + c, total + n
                    sent.append(sent_bytes)
                seen = wait_rollouts(reports, report.target_version)
                exact = all(d == expected for d, _ in seen.values())
                ok = ok and report.committed and exact
                print(f"step {step}: loss {loss:.3f}, {100 * changed / total:.2f}% of "
                      f"{total} BF16 elements changed, {len(ranks)} producers sent {sent} B, "
                      f"delta {report.delta_bytes} B, "
                      f"{'committed' if report.committed else 'ABORTED'} in {elapsed:.3f} s, "
                      f"rollouts {'bit-exact' if exact else 'DIFFER'}, "
                      f"r1 generated {seen['r1'][1]}", flush=True)
            for p in ranks:
                p.join(30)
                ok = ok and p.exitcode == 0
    stop.set()
    for w in workers:
        w.join(30)
    print("refit loop:", "every step committed and every rollout matched" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
