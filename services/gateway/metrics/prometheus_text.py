"""Prometheus text exposition: families, samples and histograms."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def _escape(text: str, quote: bool = True) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def label_text(labels: Mapping[str, str]) -> str:
    model = labels.get("model")
    if model is not None and "::" in str(model):
        labels = _namespaced(labels)
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _namespaced(labels: Mapping[str, str]) -> dict[str, str]:
    """With --model-namespacing a model's identity is `<repository>::<name>` (records.model_key):
    Triton labels it `model="<name>",namespace="<repository>"` (its labels are sorted)."""
    out: dict[str, str] = {}
    for key, value in labels.items():
        if key == "model":
            namespace, _, name = str(value).rpartition("::")
            out["model"], out["namespace"] = name, namespace
        else:
            out[key] = value
    return out


def _value(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # exact: byte counts pass a million, where `g` would round them
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:g}"


def family_lines(name: str, doc: str, kind: str, samples: Sequence[tuple[Mapping[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {_escape(doc, quote=False)}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{label_text(labels)} {_value(value)}" for labels, value in samples]
    return lines


def double_text(value: float) -> str:
    """A double as prometheus-cpp writes it (Triton's exposition): 16 significant digits, the
    shortest form (2.5, 0, -1, 1000000), so a sum of whole milliseconds reads as an integer."""
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def histogram_lines(
    name: str, doc: str, rows: Sequence[tuple[Mapping[str, str], Sequence[float], Sequence[int], float]]
) -> list[str]:
    """Each row as prometheus-cpp serialises a histogram: `_count`, `_sum`, then the cumulative
    `_bucket`s, `le` last among the labels and `+Inf` closing them."""
    lines = [f"# HELP {name} {_escape(doc, quote=False)}", f"# TYPE {name} histogram"]
    for labels, bounds, counts, total in rows:
        count = sum(counts[: len(bounds) + 1])
        lines.append(f"{name}_count{label_text(labels)} {count}")
        lines.append(f"{name}_sum{label_text(labels)} {double_text(total)}")
        cumulative = 0
        for bound, bucket in zip(bounds, counts):
            cumulative += bucket
            lines.append(f"{name}_bucket{label_text({**labels, 'le': double_text(bound)})} {cumulative}")
        lines.append(f"{name}_bucket{label_text({**labels, 'le': '+Inf'})} {count}")
    return lines
