"""Prometheus text exposition: families, samples and histograms."""

from __future__ import annotations


def label_text(labels: dict[str, str]) -> str:
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def family_lines(name: str, doc: str, kind: str, samples: list[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{label_text(labels)} {value:g}" for labels, value in samples]
    return lines


def histogram_lines(name: str, doc: str, rows: list[tuple[dict[str, str], list[float], list[int], float]]) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for labels, bounds, counts, total in rows:
        cumulative = 0
        for bound, count in zip(bounds, counts):
            cumulative += count
            lines.append(f"{name}_bucket{label_text({**labels, 'le': f'{bound:g}'})} {cumulative}")
        cumulative += counts[-1] if len(counts) > len(bounds) else 0
        lines.append(f"{name}_bucket{label_text({**labels, 'le': '+Inf'})} {cumulative}")
        lines.append(f"{name}_sum{label_text(labels)} {total:g}")
        lines.append(f"{name}_count{label_text(labels)} {cumulative}")
    return lines
