"""The records services keep in JetStream KV buckets (shared/wire/subjects.py names the
buckets and keys), as MessagePack: the repository's view of each model, the workers' reports on
their instances, and the clients' shared-memory regions."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec


class Lease(msgspec.Struct):
    """A model's lease (KV `shoal-leases`, key: the model): the scheduler replica that serves it
    (services/scheduler/replicas/leases.py)."""

    holder: str  # the replica's scheduler_id
    # the holding process's liveness subject (`subjects.scheduler_alive`): "" from an older version;
    # a replica that finds it without responders takes the lease at once (replicas/takeover.py)
    alive: str = ""


class ShmRegion(msgspec.Struct, omit_defaults=True):
    """A client-registered shared-memory region (KV `shoal-shm-regions`), seen by every service."""

    name: str
    kind: str  # "system" or "cuda"
    byte_size: int
    key: str = ""  # system: the shm key the client created
    offset: int = 0
    host: str = ""  # system: the host token of the gateway that registered it
    cuda_handle: bytes = b""
    device_id: int = 0


class ModelState(StrEnum):
    """A model version's state, Triton's names (its repository index and `ModelReady`): on the wire
    as the name itself, and equal to it as a string."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


UNLOADED = "unloaded"  # the reason of a version unloaded on purpose (not a failure)


class ModelVersionState(msgspec.Struct, omit_defaults=True, frozen=True):
    """A version's state as clients see it, and why when it is not READY (replaced, never edited)."""

    state: ModelState
    reason: str = ""


class ModelFile(msgspec.Struct, array_like=True):
    """One file of a model version as the repository published it into the object store
    (shared/bus/file_store.py): where it goes in the model's directory, and what it is."""

    path: str  # relative to the model's directory, "/"-separated
    size: int
    digest: str  # SHA-256, hex: the object's name in the store


def model_key(namespace: str, name: str) -> str:
    """A model's identity: its name, or with --model-namespacing `<namespace>::<name>` (Triton's
    `ModelIdentifier::str()`, the namespace being its repository). Everything past the gateway's
    look-up of a client's name (`inference/models.py`) knows a model by this key."""
    return f"{namespace}::{name}" if namespace else name


def shown_name(key: str) -> str:
    """The name clients know a model by, for the texts they read: Triton's errors about a request
    name its model (`InferenceRequest::ModelName`), never its namespace; only load and unload
    texts show the identity (`ModelIdentifier::str()`)."""
    return key.rpartition("::")[2]


class ModelRecord(msgspec.Struct, omit_defaults=True):
    """The repository's published view of one model (JetStream KV `shoal-models`).

    Workers host the `hosted` versions at `generation` with `config`. During a reload the
    instances of the previous generation keep serving (`serving_config` is what they run,
    what gateways validate against) until the new generation is ready.
    """

    name: str  # the model's identity (`model_key`): its KV key, its subject, its queues' and instances' key
    path: str = ""
    config: dict[str, Any] = {}  # normalized ModelConfig (Triton's JSON) of `generation`
    versions: dict[str, ModelVersionState] = {}  # version -> state as clients see it
    generation: int = 0  # bumps on every (re)load so workers reload
    hosted: list[int] = []  # versions workers should have instances of
    serving_config: dict[str, Any] = {}  # config of the generation now serving (empty: `config`)
    serving_path: str = ""  # and its directory
    # the files of `generation`'s directory in the object store (--model-files=store): workers fetch
    # these and load from their copy, never from `path` (a directory of the repository's host)
    files: list[ModelFile] = []
    serving_files: list[ModelFile] = []  # and those of the generation now serving
    reason: str = ""  # model-level failure (bad config), shown for every version
    labels: dict[str, list[str]] = {}  # output -> classification labels of `config` (label_filename)
    workers: list[str] = []  # the workers that host it (empty: every worker); on-demand placement sets it
    on_demand: bool = False  # --model-control-mode=on-demand: a request for it loads it when it is not
    namespace: str = ""  # --model-namespacing: the repository it came from ('' without namespacing)

    @property
    def model_name(self) -> str:
        """The name clients know it by (`name` less its namespace)."""
        return self.name[len(self.namespace) + 2 :] if self.namespace else self.name

    @property
    def active_config(self) -> dict[str, Any]:
        return self.serving_config or self.config

    def any_version(self, state: ModelState) -> bool:
        """Whether a version of it is in `state`."""
        return any(s.state == state for s in self.versions.values())


class InstanceRecord(msgspec.Struct, omit_defaults=True):
    """A worker's report on its instances of one model version (KV `shoal-instances`)."""

    worker: str
    model: str
    version: int
    generation: int  # the generation last loaded or tried
    state: ModelState  # of that generation: READY, LOADING or UNAVAILABLE
    reason: str = ""
    count: int = 0
    serving_generation: int = 0  # generation of the instances serving now (0 = none)
    warmup_ms: float = 0.0
    load_s: float = 0.0  # how long the load of the serving generation took (0: none serves)
    rss_bytes: int = 0  # memory its instances took at load: the worker's resident set after - before
    device_bytes: int = 0  # and GPU memory, where there is a GPU
    # the process of one instance (--python-isolation instance): the model's instance processes on one
    # worker report under one group, counted as one report of `group_size` instances (all loaded: loaded)
    group: str = ""
    group_size: int = 0
