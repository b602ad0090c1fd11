#!/usr/bin/env python3
"""An inference engine that keeps serving while refits stream in (docs/serving.md).

A trainer (this process: a small transformer, FP32 master weights and AdamW, its BF16
copy published through a deltacast Source) takes three steps. An engine process holds
the BF16 model as torch tensors and answers requests on one thread, nonstop; its
deltacast Node runs staged (``apply_mode="staged"``): each refit's chunks are verified,
spooled and checked against the target while the engine serves, and the weights are
written only at COMMIT, between the engine's ``pause`` and ``resume`` hooks, which
close and open its request gate.

After each commit the engine's outputs on a fixed batch must equal the trainer's
model's outputs bit for bit, and its weights must hash to the trainer's; no request
may have run while the weights were being written; the engine must have paused
exactly once per refit. Prints, per refit, how long the publish took, how long the
engine was paused (and what the source's report says), how long it held the verified
delta before COMMIT, and how many requests it answered during the refit.

Usage: serve_while_streaming.py [--steps N]   (exit status 0 when every check held).
Uses Debian's python3-torch on the CPU.
"""
import argparse
import multiprocessing as mp
import os
import sys
import threading
import time

import torch

import deltacast
from refit_loop import CONTEXT, VOCAB, Trainer, make_model, tensor_digests

TOKEN = "serve-token"


def cluster(base_port):
    return {"cluster": {"name": "serve-while-streaming"},
            "tree": {"connect_timeout": "20s", "commit_timeout": "60s"},
            "node": [{"id": "trainer", "host": "127.0.0.1", "port": base_port, "role": "source"},
                     {"id": "engine", "host": "127.0.0.1", "port": base_port + 3}]}


def fixed_batch():
    return torch.randint(0, VOCAB, (4, CONTEXT), generator=torch.Generator().manual_seed(2))


def engine(config_dict, commands, replies):
    """The engine: serves on one thread; the node writes only between its hooks."""
    deltacast.set_log_level("error")
    torch.set_num_threads(1)
    model = make_model().eval()
    batch = fixed_batch()
    gate = threading.Lock()  # held by the request in flight, or by a pause
    open_ = threading.Event()  # cleared while a pause is wanted or held: no request starts
    open_.set()
    requests = []  # (start, end) of every request answered
    pauses = []  # [start, end] of every pause
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            open_.wait()
            with gate:
                start = time.monotonic()
                with torch.no_grad():
                    model(batch)
                requests.append((start, time.monotonic()))

    def pause():  # the node's hook thread: returns once no request reads the weights
        open_.clear()
        gate.acquire()  # the request in flight finishes first
        pauses.append([time.monotonic(), None])

    def resume():
        pauses[-1][1] = time.monotonic()
        gate.release()
        open_.set()

    server = threading.Thread(target=serve)
    server.start()
    node = deltacast.Node(deltacast.config(config_dict), "engine", model.state_dict(),
                          token=TOKEN, apply_threads=1, apply_mode="staged", pause=pause,
                          resume=resume)
    node.wait_for_join(20)
    replies.put("ready")
    mark = 0.0
    while True:
        command, arg = commands.get()
        if command == "stop":
            break
        if command == "mark":  # a refit is about to start
            mark = time.monotonic()
            replies.put("marked")
            continue
        # "report": once `arg` is active and the engine resumed.
        while node.version != arg or (pauses and pauses[-1][1] is None):
            time.sleep(0.001)
        with gate, torch.no_grad():
            outputs = model(batch)
        mine = [p for p in pauses if p[0] >= mark]
        overlapping = [r for r in requests for p in pauses if r[0] < p[1] and r[1] > p[0]]
        first_pause = mine[0][0] if mine else float("inf")
        stats = node.stats()
        replies.put({"outputs": outputs, "digests": tensor_digests(model.state_dict()),
                     "pauses": len(mine), "paused": sum(p[1] - p[0] for p in mine),
                     "node_pause": stats.last_pause_seconds,
                     "hold": stats.last_prepared_hold_seconds,
                     "served_before_pause": sum(1 for r in requests if mark <= r[0] < first_pause),
                     "overlapping": len(overlapping)})
    stop.set()
    server.join()
    node.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args()
    deltacast.set_log_level("warn")
    torch.set_num_threads(1)
    config_dict = cluster(23000 + (os.getpid() % 800) * 10)
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=engine, args=(config_dict, commands, replies))
    trainer = Trainer(args.lr)
    reference = make_model().eval()  # the trainer's BF16 model, for the outputs
    ok, served = True, 0
    with deltacast.Source(deltacast.config(config_dict), trainer.serving, token=TOKEN) as source:
        worker.start()
        if replies.get(timeout=120) != "ready":
            return 1
        for step in range(1, args.steps + 1):
            loss, changed, total = trainer.step()
            commands.put(("mark", None))
            replies.get(timeout=60)
            t0 = time.monotonic()
            report = source.publish()
            elapsed = time.monotonic() - t0
            commands.put(("report", report.target_version))
            got = replies.get(timeout=120)
            reference.load_state_dict(trainer.serving)
            with torch.no_grad():
                want = reference(fixed_batch())
            exact_outputs = torch.equal(got["outputs"], want)
            exact_weights = got["digests"] == tensor_digests(trainer.serving)
            reported = report.nodes[0].pause_seconds if report.nodes else 0.0
            step_ok = (report.committed and exact_outputs and exact_weights and
                       got["pauses"] == 1 and got["overlapping"] == 0)
            ok = ok and step_ok
            served += got["served_before_pause"]
            print(f"step {step}: loss {loss:.3f}, {100 * changed / total:.2f}% of {total} BF16 "
                  f"elements changed, {'committed' if report.committed else 'ABORTED'} in "
                  f"{elapsed:.3f} s; engine paused {got['paused'] * 1e3:.2f} ms "
                  f"({got['pauses']} pause; node {got['node_pause'] * 1e3:.2f} ms, source's "
                  f"report {reported * 1e3:.2f} ms), held the verified delta "
                  f"{got['hold'] * 1e3:.2f} ms, answered {got['served_before_pause']} requests "
                  f"during the refit, {got['overlapping']} during a pause; outputs "
                  f"{'equal' if exact_outputs else 'DIFFER'}, weights "
                  f"{'bit-exact' if exact_weights else 'DIFFER'}", flush=True)
        commands.put(("stop", None))
        worker.join(60)
    ok = ok and worker.exitcode == 0 and served > 0
    print("serve while streaming:",
          "every refit committed, the engine served throughout and paused only to write"
          if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
