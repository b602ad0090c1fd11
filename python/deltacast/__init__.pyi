"""Type stubs for deltacast (the public API of include/deltacast/, in Python)."""
import concurrent.futures
import os
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

Tensors = Union[Mapping[str, Any], Sequence[Tuple[str, Any]]]
PathLike = Union[str, os.PathLike]

class Error(RuntimeError):
    """Any failure: the message is the Status ("INVALID_ARGUMENT: ..."); ``code`` its name."""
    code: str

class Config:
    @staticmethod
    def load(path: PathLike) -> "Config": ...
    @staticmethod
    def parse(toml: str, name: str = "config") -> "Config": ...
    @property
    def source(self) -> str: ...
    @property
    def receivers(self) -> List[str]: ...
    def token_from_environment(self) -> str: ...
    def describe_plan(self) -> str: ...

def config(source: Union[PathLike, Mapping[str, Any]]) -> Config: ...
def engine_layouts(config_json: PathLike, *, engine: str, tp: int, out: PathLike, dp: int = 1,
                   ep: int = 1, canonical: Optional[PathLike] = None) -> List[str]: ...
def set_log_level(level: str) -> None:
    """"debug", "info", "warn", "error" or "off"."""

class NodeReport:
    node: str
    delta_bytes: int
    prepared_seconds: float
    partitions_applied: int
    receive_seconds: float
    check_seconds: float
    write_seconds: float
    apply_cpu_seconds: float
    cpu_wait_seconds: float
    disk_wait_seconds: float
    pause_seconds: float
    prepared_hold_seconds: float

class PublishReport:
    committed: bool
    abort_reason: str
    refit_id: int
    base_version: str
    target_version: str
    delta_bytes: int
    checkpoint_bytes: int
    chunks: int
    seconds: float
    call_to_first_chunk_seconds: float
    nodes_decided: int
    nodes: List[NodeReport]

class StripeStats:
    # One stripe's parent link (docs/protocol.md, "Stripes"): CHUNK messages that
    # came on it (data and END, replays included), the bytes of those this node had
    # already, and the times it joined that stripe's parent.
    chunks: int
    chunk_bytes_resent: int
    parent_joins: int

class NodeStats:
    refits_committed: int
    refits_aborted: int
    chunk_bytes_received: int
    chunk_bytes_resent: int
    parent_joins: int
    partitions_repaired: int
    partitions_caught_up: int
    deltas_caught_up: int
    last_pause_seconds: float
    last_prepared_hold_seconds: float
    pause_seconds_total: float
    version: str
    # Indexed by stripe; empty when the tree is not striped. Summed over the
    # stripes, chunk_bytes_resent and parent_joins are the totals above.
    stripes: List[StripeStats]

class TensorMismatch:
    tensor: str
    what: str

class VerifyReport:
    version: str
    tensors: int
    partitions: int
    mismatches: List[TensorMismatch]
    summary: str
    @property
    def ok(self) -> bool: ...

class Source:
    def __init__(self, cfg: Config, tensors: Tensors, *, token: Optional[str] = None,
                 state_dir: PathLike = "", keep_deltas: int = 4, context_mode: bool = False,
                 encode_threads: int = 0) -> None: ...
    def publish(self) -> PublishReport: ...
    def publish_async(self) -> "concurrent.futures.Future[PublishReport]": ...
    def publish_checkpoints(self, base: PathLike, new: PathLike) -> PublishReport: ...
    @property
    def address(self) -> str: ...
    @property
    def version(self) -> str: ...
    def stop(self) -> None: ...
    def __enter__(self) -> "Source": ...
    def __exit__(self, *exc: object) -> None: ...

class ProduceReport:
    committed: bool
    reason: str
    refit_id: int
    partitions: int
    changed_elements: int
    sent_bytes: int
    encode_seconds: float
    seconds: float

class Producer:
    def __init__(self, cfg: Config, producer_id: str, tensors: Tensors, *, model: Tensors,
                 token: Optional[str] = None, root: str = "", context_mode: bool = False,
                 encode_threads: int = 0) -> None: ...
    def serve(self) -> ProduceReport: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Producer": ...
    def __exit__(self, *exc: object) -> None: ...

class Root:
    def __init__(self, cfg: Config, *, producers: int, token: Optional[str] = None,
                 producer_address: str = "", state_dir: PathLike = "",
                 keep_deltas: int = 4) -> None: ...
    def publish(self) -> PublishReport: ...
    @property
    def producer_address(self) -> str: ...
    @property
    def address(self) -> str: ...
    def stop(self) -> None: ...
    def __enter__(self) -> "Root": ...
    def __exit__(self, *exc: object) -> None: ...

class Node:
    def __init__(self, cfg: Config, node_id: str,
                 tensors: Union[Tensors, PathLike, None] = None, *,
                 gpus: Optional[Sequence[Tuple[PathLike, Union[Tensors, Iterable[Tuple[str, Any]]]]]] = None,
                 token: Optional[str] = None,
                 on_commit: Optional[Callable[[str, List[str]], None]] = None,
                 apply_threads: int = 0,
                 apply_mode: Optional[str] = None,
                 pause: Optional[Callable[[], None]] = None,
                 resume: Optional[Callable[[], None]] = None,
                 hook_timeout: float = 10.0) -> None: ...
    def stats(self) -> NodeStats: ...
    def wait_for_join(self, timeout: float = 10.0) -> None: ...
    def verify(self) -> VerifyReport: ...
    @property
    def version(self) -> str: ...
    @property
    def address(self) -> str: ...
    def stop(self) -> None: ...
    def __enter__(self) -> "Node": ...
    def __exit__(self, *exc: object) -> None: ...
