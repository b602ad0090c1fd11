"""deltacast: move LLM weight updates from a trainer to many rollout workers, bit for bit.

The trainer keeps a :class:`Source` over its tensors and calls :meth:`Source.publish`
after each step (or, with many trainer ranks, each rank keeps a :class:`Producer`
over the tensors it owns and one process runs the :class:`Root`); every rollout worker runs a :class:`Node` over its model's tensors,
which are patched in place when a version commits everywhere. Tensors cross by
DLPack (torch tensors, numpy arrays): their bytes are used where they are, never
copied into Python objects.
"""
from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

from ._deltacast import (  # noqa: F401
    Config,
    Error,
    NodeReport,
    NodeStats,
    ProduceReport,
    PublishReport,
    StripeStats,
    TensorMismatch,
    VerifyReport,
    _Node,
    _Producer,
    _Root,
    _Source,
    _engine_layouts,
    set_log_level,
)
from ._toml import dumps as _toml_dumps

__all__ = ["Config", "Error", "Node", "NodeReport", "NodeStats", "ProduceReport", "Producer",
           "PublishReport", "Root", "Source", "StripeStats", "TensorMismatch", "VerifyReport",
           "config", "engine_layouts", "set_log_level"]

Tensors = Union[Mapping[str, Any], Sequence[Tuple[str, Any]]]


def config(source: Union[str, os.PathLike, Mapping[str, Any]]) -> Config:
    """A cluster config, from a TOML file's path or from a dict with the file's shape.

    Every table and key, its type, default and when to change it: docs/config.md
    (``deltacast config --explain --config FILE`` prints a file's effective values).
    The dict holds a dict per table and a list of dicts per array of tables, values
    written as in TOML (sizes, durations and bandwidths as strings)::

        deltacast.config({
            "cluster": {"name": "lab"},
            "tree": {"commit_policy": "available", "connect_timeout": "20s"},
            "node": [{"id": "trainer", "host": "10.0.0.10", "port": 7600, "role": "source"},
                     {"id": "w1", "host": "10.0.0.11", "port": 7600}],
        })

    Raises :class:`Error` naming the key and value of the first problem (an unknown
    key, a wrong type, a value out of range)."""
    if isinstance(source, Mapping):
        return Config.parse(_toml_dumps(source), "<dict>")
    return Config.load(os.fspath(source))


def engine_layouts(config_json: Union[str, os.PathLike], *, engine: str, tp: int, out: Union[
        str, os.PathLike], dp: int = 1, ep: int = 1,
        canonical: Union[str, os.PathLike, None] = None) -> list:
    """Each GPU's load plan for a vLLM or SGLang engine serving the checkpoint whose
    ``config.json`` is given: writes ``out/gpu-<g>.toml`` and returns their paths in
    the engine's rank order (GPU g: data-parallel rank g // tp, tensor-parallel rank
    g % tp), one per ``Node(gpus=...)`` entry. ``canonical`` is the checkpoint
    directory (or a canonical.json); by default config.json's directory. ``ep``:
    vLLM 1 or tp * dp (--enable-expert-parallel); SGLang a divisor of tp (--ep).
    Raises :class:`Error` naming what does not divide."""
    return [str(p) for p in _engine_layouts(os.fspath(config_json), engine, tp, dp, ep,
                                            os.fspath(out),
                                            os.fspath(canonical) if canonical else "")]


def _named(parameters: Any) -> list:
    """(name, tensor) pairs from a state_dict, pairs, or ``module.named_parameters()``;
    parameters that require grad are detached (the same memory, patched in place)."""
    items = parameters.items() if hasattr(parameters, "items") else parameters
    out = []
    for name, t in items:
        if getattr(t, "requires_grad", False):
            t = t.detach()
        out.append((name, t))
    return out


def _token(cfg: Config, token: Optional[str]) -> str:
    return token if token is not None else cfg.token_from_environment()


class Source:
    """The trainer's end: the root of the relay tree, over named tensors.

    ``tensors`` (a state_dict, or (name, tensor) pairs) must hold the version every
    node holds when the Source starts; deltacast keeps a copy of the last committed
    version, so :meth:`publish` sends what changed since. Host tensors only, each
    contiguous; keep them alive and in place while the Source runs.
    """

    def __init__(self, cfg: Config, tensors: Tensors, *, token: Optional[str] = None,
                 state_dir: Union[str, os.PathLike] = "", keep_deltas: int = 4,
                 context_mode: bool = False, encode_threads: int = 0) -> None:
        self._source = _Source(cfg, tensors, _token(cfg, token), os.fspath(state_dir),
                               keep_deltas, context_mode, encode_threads)
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def publish(self) -> PublishReport:
        """Publishes the tensors' current bytes as the next version; blocks until it
        committed or aborted everywhere (the GIL is released meanwhile). Do not change
        the tensors until it returns.

        Raises :class:`Error` when the refit never began (nothing was sent, every node
        keeps its version): a stopped Source, receivers that did not join (each named,
        with why: refused at the door and the reason, or never connected), tensors
        that are not the model's. Otherwise returns the report of the refit that ran:
        ``committed`` says whether the version is active everywhere, ``abort_reason``
        why not (a node whose weights differ names the tensors)."""
        return self._source.publish()

    def publish_async(self) -> "concurrent.futures.Future[PublishReport]":
        """:meth:`publish` on a background thread; the future holds the report."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        return self._pool.submit(self._source.publish)

    def publish_checkpoints(self, base: Union[str, os.PathLike],
                            new: Union[str, os.PathLike],
                            serving: Optional[Union[str, os.PathLike]] = None) -> PublishReport:
        """Publishes checkpoint directory ``new`` to nodes holding ``base``.

        With ``serving`` (a serving description, docs/fp8.md), ``base`` and ``new``
        are BF16 and the nodes hold their FP8 serving twins: both are quantized here
        and the delta between the twins is published; the report's
        ``bf16_base_version`` / ``bf16_target_version`` name the BF16 versions."""
        return self._source.publish_checkpoints(os.fspath(base), os.fspath(new),
                                                os.fspath(serving) if serving else "")

    @property
    def address(self) -> str:
        return self._source.address

    @property
    def version(self) -> str:
        """The version the cluster holds (hex): the tensors the Source started with,
        then each committed publish. Each node that joins checks its weights
        against it (:meth:`Node.wait_for_join`)."""
        return self._source.version

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._source.stop()

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Producer:
    """One trainer rank's end when many ranks make each version: it owns ``tensors``
    (a part of the model: its shard of the parameters, named as in the model) and
    encodes their changes itself, with no other rank's bytes.

    ``model`` lists every tensor of the model (a state_dict or (name, tensor) pairs;
    only names, dtypes and shapes are read). Like :class:`Source`, it keeps a copy of
    its tensors as the fleet holds them, so :meth:`serve` sends what changed since
    the last commit. Connects to the :class:`Root` at ``root`` ("host:port"; default:
    the config's source host, its port + 1000).
    """

    def __init__(self, cfg: Config, producer_id: str, tensors: Tensors, *, model: Tensors,
                 token: Optional[str] = None, root: str = "", context_mode: bool = False,
                 encode_threads: int = 0) -> None:
        self._producer = _Producer(cfg, producer_id, tensors, model, _token(cfg, token), root,
                                   context_mode, encode_threads)

    def serve(self) -> ProduceReport:
        """Serves the root's next refit with the tensors' current bytes; blocks until
        the version committed or aborted (the GIL is released meanwhile). Do not change
        the tensors until it returns."""
        return self._producer.serve()

    def close(self) -> None:
        self._producer.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Root:
    """The source of the relay tree when ``producers`` Producers make each version:
    :meth:`publish` waits for them, merges their streams into one delta and commits
    it everywhere. It never holds the model's tensors."""

    def __init__(self, cfg: Config, *, producers: int, token: Optional[str] = None,
                 producer_address: str = "", state_dir: Union[str, os.PathLike] = "",
                 keep_deltas: int = 4) -> None:
        self._root = _Root(cfg, producers, _token(cfg, token), producer_address,
                           os.fspath(state_dir), keep_deltas)

    def publish(self) -> PublishReport:
        """One version from the producers' tensors. Raises :class:`Error` if it could
        not start (a producer missing, shares that do not cover the model); a producer
        lost mid-refit aborts it (``committed`` False, the reason names it)."""
        return self._root.publish()

    @property
    def producer_address(self) -> str:
        return self._root.producer_address

    @property
    def address(self) -> str:
        return self._root.address

    def stop(self) -> None:
        self._root.stop()

    def __enter__(self) -> "Root":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Node:
    """A receiver (rollout worker) over named tensors patched in place, or over a
    safetensors checkpoint directory (pass its path).

    ``on_commit(version, changed_tensor_names)`` is called on deltacast's dispatcher
    thread after each version commits here (the tensors already hold it), so a worker
    can reset caches. Host tensors only, each contiguous; the Node holds a reference
    to each, so they stay alive while it runs.

    An inference engine whose GPUs hold tensor-parallel slices passes ``gpus``
    instead: one ``(layout, parameters)`` pair per GPU, ``parameters`` being that
    GPU's own tensors as the engine names them (``model.named_parameters()`` of the
    engine's module on that GPU, a state_dict or pairs; CUDA tensors, by DLPack,
    patched in place; their addresses never change) and ``layout`` the layout file
    that places them in canonical terms: :func:`engine_layouts` writes them for vLLM
    and SGLang (docs/engines.md), or write one by hand (docs/layout.md). A plan that
    does not match the parameters (a shape, a missing parameter) is refused, naming
    the parameter, before anything is written. A version commits here only when
    every GPU's part of it verifies.

    An engine that keeps serving from the weights while a refit streams passes
    ``apply_mode="staged"`` (or sets ``apply = "staged"`` for the node in the
    config) and its hooks: ``pause()`` must return once the engine no longer reads
    the weights (raise, or take longer than ``hook_timeout`` seconds, and nothing is
    written: the node fails that commit and writes it before the next refit);
    ``resume()`` is called once they are whole again, at the new version. Staged,
    chunks are verified and checked against the target while the engine serves, and
    only the write at COMMIT happens between the hooks (docs/serving.md). Both run
    on a thread of the node's own, one at a time, holding the GIL.
    ``apply_mode="on-arrival"`` writes chunk by chunk; the hooks then bracket the
    whole refit from its first write.

    With a checkpoint directory, ``checkpoint="snapshot"`` (or ``checkpoint =
    "snapshot"`` for the node in the config) keeps it as a base snapshot plus the
    committed deltas and patches the weights in memory: a commit writes the delta,
    not the model (docs/config.md). ``deltacast materialize`` writes the committed
    version out as a checkpoint directory.
    """

    def __init__(self, cfg: Config, node_id: str,
                 tensors: Union[Tensors, str, os.PathLike, None] = None, *,
                 gpus: Optional[Sequence[Tuple[Union[str, os.PathLike], Tensors]]] = None,
                 token: Optional[str] = None,
                 on_commit: Optional[Callable[[str, list], None]] = None,
                 apply_threads: int = 0,
                 apply_mode: Optional[str] = None,
                 pause: Optional[Callable[[], None]] = None,
                 resume: Optional[Callable[[], None]] = None,
                 hook_timeout: float = 10.0,
                 checkpoint: Optional[str] = None) -> None:
        if (tensors is None) == (gpus is None):
            raise ValueError("Node: give tensors (or a checkpoint directory), or gpus")
        if isinstance(tensors, os.PathLike):
            tensors = os.fspath(tensors)
        if gpus is not None:
            gpus = [(os.fspath(layout), _named(parameters)) for layout, parameters in gpus]
        self._node = _Node(cfg, node_id, _token(cfg, token), tensors, on_commit, apply_threads,
                           gpus, apply_mode or "", pause, resume, hook_timeout,
                           checkpoint or "")

    def stats(self) -> NodeStats:
        return self._node.stats()

    def wait_for_join(self, timeout: float = 10.0) -> None:
        """Waits until the node joined its parent and compared its weights with the
        version the parent holds (at most ``timeout`` seconds). Raises :class:`Error`
        naming the problem: weights that are another version (each tensor that
        differs: name, dtype, shape, or the partitions whose bits differ), a refusal
        at the door (a wrong cluster token, another node's certificate), or no
        parent within the timeout. Weights of an earlier version of this cluster
        still catch up at the next refit."""
        self._node.wait_for_join(timeout)

    def verify(self) -> "VerifyReport":
        """Hashes the weights now (host, checkpoint or GPU memory) and compares them
        with the active version: ``report.ok``, ``report.mismatches`` (tensor, what).
        Blocks for a full read; between refits."""
        return self._node.verify()

    @property
    def version(self) -> str:
        return self._node.stats().version

    @property
    def address(self) -> str:
        return self._node.address

    def stop(self) -> None:
        self._node.stop()

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
