"""`config.pbtxt` files a repository may hold, made up by hypothesis (services/repository/scan.py,
shared/config/model_config.py; docs/security.md, "Front doors"): fields of every kind with values
in and out of range, valid configs cut and spliced, nesting deeper than any parser recurses, bytes
that are not UTF-8. A model either loads into a spec every service can build, or is UNAVAILABLE
with Triton's kind of reason, never an unhandled exception's; nothing takes long."""

from __future__ import annotations

import re
import time
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.repository.autocomplete import AutoComplete
from services.repository.scan import scan_model
from shared.config import model_config

NAME = "fuzzed"
VALID = f"""name: "{NAME}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
version_policy {{ latest {{ num_versions: 1 }} }}
parameters {{ key: "k" value {{ string_value: "v" }} }}
""".encode()
# load_error's form for an exception that is not Shoal's own: a case the loader did not expect
UNHANDLED = re.compile(r"^[A-Z]\w*(Error|Exception|Exit|Interrupt)\b")

numbers = st.sampled_from(["0", "-1", "1", "2147483648", "9223372036854775807", "9223372036854775808", "1e9", "0x10"])
words = st.sampled_from(["TYPE_FP32", "TYPE_STRING", "TYPE_INVALID", "KIND_GPU", "KIND_MODEL", "true", "nan", "x"])
strings = st.binary(max_size=12).map(lambda b: b'"' + b.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"')
fields = st.sampled_from(
    [
        "name",
        "backend",
        "platform",
        "max_batch_size",
        "dims",
        "data_type",
        "count",
        "kind",
        "gpus",
        "preferred_batch_size",
        "max_queue_delay_microseconds",
        "priority_levels",
        "default_priority_level",
        "num_versions",
        "versions",
        "decoupled",
        "string_value",
        "no_such_field",
    ]
)
messages = st.sampled_from(
    ["input", "output", "instance_group", "dynamic_batching", "sequence_batching", "version_policy", "parameters"]
)


@st.composite
def entries(draw: st.DrawFn, depth: int = 0) -> bytes:
    if depth < 3 and draw(st.integers(0, 3)) == 0:
        inner = b" ".join(draw(st.lists(entries(depth + 1), max_size=4)))
        return draw(messages).encode() + draw(st.sampled_from([b" { ", b" [ { ", b" "])) + inner + b" }"
    value = draw(numbers.map(str.encode) | words.map(str.encode) | strings | st.just(b"[ 1, -1, 0 ]"))
    return draw(fields).encode() + b": " + value


@st.composite
def config_texts(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return b"\n".join(draw(st.lists(entries(), max_size=12)))
    if kind == 1:
        return VALID + b"\n".join(draw(st.lists(entries(), max_size=4)))
    if kind == 2:
        at = draw(st.integers(0, len(VALID)))
        return VALID[:at] + draw(st.binary(max_size=12)) + VALID[at + draw(st.integers(0, 8)) :]
    if kind == 3:
        depth = draw(st.integers(50, 5000))
        return b'parameters { key: "k" value { ' * depth + b"}" * draw(st.integers(0, 2 * depth))
    return draw(st.binary(max_size=300))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=config_texts())
@example(text=b"instance_group { kind: 2147483648 }")  # protobuf's ValueError, not a ParseError (found by this test)
def test_a_made_up_config_loads_or_is_refused_with_a_reason(tmp_path: Path, text: bytes) -> None:
    model = tmp_path / NAME
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.onnx").write_bytes(b"not read: no auto-complete")
    (model / "config.pbtxt").write_bytes(text)
    started = time.monotonic()
    scanned = scan_model(model, AutoComplete(enabled=False))
    assert time.monotonic() - started < 5, "one config took seconds to read"
    if scanned.config is None:
        assert scanned.error and not UNHANDLED.match(scanned.error), scanned.error
        return
    doc = model_config.to_json(scanned.config)
    spec = model_config.spec_from_json(doc)  # what the gateway, scheduler and worker each build
    assert spec.name == NAME
