"""An ensemble's step graph: Triton's load-time checks, pruning, and which steps can run.

Pure functions over the normalized config JSON (what the repository publishes), so the
repository (validation at load) and the scheduler (execution) read the graph the same
way. Error texts are Triton's (`ValidateEnsembleSchedulingConfig`, `ValidateTensorMapping`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.wire.records import model_key


@dataclass(frozen=True)
class Step:
    index: int
    model: str  # the step model's identity (`model_key`: with namespacing, the repository resolved at load)
    version: int  # -1: the latest READY version
    input_map: dict[str, str]  # step model input -> ensemble tensor
    output_map: dict[str, str]  # step model output -> ensemble tensor
    name: str = ""  # its name as the config writes it ('': `model`)

    @property
    def shown(self) -> str:
        """The step model's name in texts."""
        return self.name or self.model


@dataclass(frozen=True)
class EnsembleGraph:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]

    @property
    def members(self) -> list[str]:
        """Composing model names, in step order, each once."""
        return list(dict.fromkeys(s.model for s in self.steps))

    def needed_steps(self, requested: list[str]) -> list[Step]:
        """The steps that (transitively) feed a requested output; the rest are pruned."""
        producer = {tensor: step for step in self.steps for tensor in step.output_map.values()}
        wanted = deque(requested or self.outputs)
        needed: dict[int, Step] = {}
        while wanted:
            step = producer.get(wanted.popleft())
            if step is None or step.index in needed:
                continue
            needed[step.index] = step
            wanted.extend(step.input_map.values())
        return [needed[i] for i in sorted(needed)]

    def consumers(self, steps: list[Step]) -> dict[str, int]:
        """How many of `steps` read each ensemble tensor."""
        counts: dict[str, int] = {}
        for step in steps:
            for tensor in step.input_map.values():
                counts[tensor] = counts.get(tensor, 0) + 1
        return counts


def is_ensemble(config: dict[str, Any]) -> bool:
    return config.get("platform") == "ensemble"


def is_decoupled(name: str, configs: Mapping[str, dict[str, Any]], _seen: frozenset[str] = frozenset()) -> bool:
    """Whether `name` answers as a decoupled model: its own transaction policy says so, or it is
    an ensemble with a decoupled step (nested ensembles included: their responses stream too).
    `configs`: every known model's config JSON (a missing member counts as not decoupled)."""
    config = configs.get(name) or {}
    if config.get("model_transaction_policy", {}).get("decoupled"):
        return True
    if not is_ensemble(config) or name in _seen:  # a cycle is refused at load; never loop on one
        return False
    seen = _seen | {name}
    return any(is_decoupled(member, configs, seen) for member in graph_from_config(config).members)


def max_inflight(config: dict[str, Any]) -> int:
    """`ensemble_scheduling.max_inflight_requests`: step requests in flight per step (0: no bound)."""
    return int(config.get("ensemble_scheduling", {}).get("max_inflight_requests", 0) or 0)


def graph_from_config(config: dict[str, Any]) -> EnsembleGraph:
    steps = tuple(
        Step(
            index=i,
            model=model_key(s.get("model_namespace", ""), s.get("model_name", "")),
            name=s.get("model_name", ""),
            version=int(s.get("model_version", -1)),
            input_map=dict(s.get("input_map", {})),
            output_map=dict(s.get("output_map", {})),
        )
        for i, s in enumerate(config.get("ensemble_scheduling", {}).get("step", []))
    )
    return EnsembleGraph(
        name=config.get("name", ""),
        inputs=tuple(io["name"] for io in config.get("input", [])),
        outputs=tuple(io["name"] for io in config.get("output", [])),
        steps=steps,
    )


def check_structure(config: dict[str, Any]) -> str:
    """Triton's checks that need no other model; '' when the graph is sound."""
    name = config.get("name", "")
    if config.get("instance_group"):
        return f"instance group should not be specified for ensemble '{name}'"
    if config.get("model_warmup"):
        return f"model_warmup can not be specified for ensemble '{name}'"
    graph = graph_from_config(config)
    if not graph.steps:
        return f"must specify 'step' for ensemble '{name}'"
    produced: set[str] = set()
    # tensor -> the tensors it is computed from (a step's outputs depend on all of its inputs)
    sources: dict[str, list[str]] = {}
    consumed: set[str] = set()
    for step in graph.steps:
        where = f"ensemble '{name}' step {step.index}"
        if not step.model:
            return f"must specify 'model_name' in step {step.index} of ensemble '{name}'"
        if not step.input_map:
            return f"must specify 'input_map' in step {step.index} of ensemble '{name}'"
        if not step.output_map:
            return f"must specify 'output_map' in step {step.index} of ensemble '{name}'"
        for tensor in step.output_map.values():
            if tensor in produced:
                return f"ensemble tensor '{tensor}' can appear in an output map only once for {where}"
            produced.add(tensor)
            sources.setdefault(tensor, []).extend(step.input_map.values())
        consumed.update(step.input_map.values())
    known = produced | consumed
    ready = set()
    for tensor in graph.inputs:
        if tensor not in known:
            return f"ensemble input '{tensor}' for ensemble {name}' is not used"
        ready.add(tensor)
    # a tensor becomes ready when every tensor it is computed from is: what never becomes
    # ready is unreachable from the inputs (a missing producer, or a cycle)
    changed = True
    while changed:
        changed = False
        for tensor, deps in sources.items():
            if tensor not in ready and all(d in ready for d in deps):
                ready.add(tensor)
                changed = True
    for tensor in graph.outputs:
        if tensor not in known:
            return f"ensemble output '{tensor}' for ensemble {name}' is not used"
        if tensor not in ready:
            message = f"output '{tensor}' for ensemble '{name}' is not written"
            source = _first_unready_source(tensor, sources, ready)
            if source != tensor:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            return message
    readers = {t for s in graph.steps for t in s.input_map.values()}
    for tensor in sorted(known - set(graph.outputs)):
        if tensor not in ready or tensor not in readers:
            return f"ensemble tensor '{tensor}' is unused in ensemble '{name}'"
    return ""


def _first_unready_source(tensor: str, sources: dict[str, list[str]], ready: set[str]) -> str:
    """Walk back through not-ready tensors to the one that is not connected (cycles end the walk)."""
    seen: set[str] = set()
    last = tensor
    deps = sources.get(tensor, [])
    while deps:
        nxt = next((d for d in deps if d not in ready and d not in seen), None)
        if nxt is None:
            break
        seen.add(nxt)
        last = nxt
        deps = sources.get(nxt, [])
    return last


def _full(dims: list[int], batching: bool) -> list[int]:
    return ([-1] if batching else []) + list(dims)


def _dims_compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == -1 or y == -1 or x == y for x, y in zip(a, b))


def _fmt(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


@dataclass
class _Node:
    model: str
    datatype: str  # config name (TYPE_FP32)
    dims: list[int]
    full: list[int]


def _node(model: str, io: dict[str, Any], batching: bool, use_reshape: bool = False) -> _Node:
    dims = [int(d) for d in io.get("dims", [])]
    if use_reshape and "reshape" in io:
        dims = [int(d) for d in io["reshape"].get("shape", [])]
    return _Node(model, io.get("data_type", "TYPE_INVALID"), dims, _full(dims, batching))


def _merge(tensors: dict[str, _Node], tensor: str, node: _Node, ensemble: str) -> str:
    """The first sighting of an ensemble tensor defines it; later ones must agree with it."""
    if tensor not in tensors:
        tensors[tensor] = node
        return ""
    return _consistent(tensors[tensor], node, f"in ensemble {ensemble}, ensemble tensor {tensor}: ")


def _consistent(a: _Node, b: _Node, prefix: str) -> str:
    if a.datatype != b.datatype:
        return (
            f"{prefix}inconsistent data type: {a.datatype} is inferred from model {a.model} "
            f"while {b.datatype} is inferred from model {b.model}"
        )
    if not _dims_compatible(a.dims, b.dims) and not _dims_compatible(a.full, b.full):
        return (
            f"{prefix}inconsistent shape: {_fmt(a.full)} is inferred from model {a.model} "
            f"while {_fmt(b.full)} is inferred from model {b.model}"
        )
    return ""


def check_members(config: dict[str, Any], members: dict[str, dict[str, Any]]) -> str:
    """Triton's checks against the composing models' configs (`members`: name -> config JSON)."""
    name = config.get("name", "")
    batching = int(config.get("max_batch_size", 0)) > 0
    tensors: dict[str, _Node] = {}
    for io in config.get("input", []) + config.get("output", []):
        tensors[io["name"]] = _node(name, io, batching, use_reshape=True)
    for step in graph_from_config(config).steps:
        member = members[step.model]
        mbs = int(member.get("max_batch_size", 0))
        if mbs != 0 and mbs < int(config.get("max_batch_size", 0)):
            return (
                f"ensemble {name} allows maximum batch size {config.get('max_batch_size', 0)}, but it contains "
                f"model {step.shown} which only allows maximum batch size to be {mbs}"
            )
        m_batching = mbs > 0
        inputs = {io["name"]: io for io in member.get("input", [])}
        outputs = {io["name"]: io for io in member.get("output", [])}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                return (
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                    f"{model_input} in model {step.shown}"
                )
        for model_input, io in inputs.items():
            mapped = step.input_map.get(model_input)
            if mapped is None:
                if io.get("optional"):
                    continue
                return f"in ensemble {name}, input {model_input} in model {step.shown} is not mapped to any ensemble tensors"
            error = _merge(tensors, mapped, _node(step.shown, io, m_batching), name)
            if error:
                return error
        for model_output, tensor in step.output_map.items():
            if model_output not in outputs:
                return (
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                    f"{model_output} in model {step.shown}"
                )
            error = _merge(tensors, tensor, _node(step.shown, outputs[model_output], m_batching), name)
            if error:
                return error
    return ""
