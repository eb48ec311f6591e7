"""Classification labels: each output's `label_filename`, read when the model loads.

As Triton's core (`Model::Init`, `LabelProvider::AddLabels`): the file is relative to the model
directory and must stay inside it, each line (getline: '\\n' ends a line, a last line without
one counts) is the label of the class with that index, and a file that cannot be read fails the
load. The labels travel in the model's record (`ModelRecord.labels`): a gateway on another host
cannot read the repository's files. Ensembles' outputs take their producers' labels at the
gateway (`inference/models.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_LABEL_BYTES = 256 * 1024  # per model: the record is one bus message (1 MiB by default)


class LabelError(Exception):
    """The load fails with this text."""


def read_labels(model_dir: Path, model: str, config: dict[str, Any]) -> dict[str, list[str]]:
    labels: dict[str, list[str]] = {}
    total = 0
    base = model_dir.resolve()
    for output in config.get("output", []):
        filename = output.get("label_filename", "")
        if not filename:
            continue
        path = (model_dir / filename).resolve()
        if path != base and base not in path.parents:
            raise LabelError(
                f"label file path '{model_dir / filename}' for output '{output['name']}' in model '{model}' "
                "is outside model directory"
            )
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise LabelError(f"failed to read text file '{model_dir / filename}': {exc.strerror}") from None
        total += len(text)
        if total > MAX_LABEL_BYTES:
            raise LabelError(f"label files of model '{model}' exceed {MAX_LABEL_BYTES} bytes")
        lines = text.split("\n")
        labels[output["name"]] = lines[:-1] if lines and lines[-1] == "" else lines
    return labels
