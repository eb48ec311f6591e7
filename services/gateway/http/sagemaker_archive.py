"""SageMaker's multi-model load (`POST /models {"model_name", "url"}`, sagemaker.py) as the HTTP
API's loads: tritonserver registers the directory at `url` as a model repository and loads one
model of it under the name asked for; Shoal reads the directory on the gateway's host and loads
each model with its files as load overrides (`config` and `file:<path>`), so the repository service
and the workers need not see the gateway's disk.

As in tritonserver's `src/sagemaker_server.cc`: a `url` whose directory holds `config.pbtxt` is the
model itself (its parent is the `modelUrl` listed); otherwise `url` is a repository, and its model
is the ensemble among its subdirectories (`platform: "ensemble"`) or else its only one; the other
subdirectories are loaded under their own names first (an ensemble's steps).
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from shared.config import model_config

FORBIDDEN = ("/dev/", "/proc/", "/sys/")  # tritonserver refuses a url under these (400, no body)
MODELS_ROOT = "/opt/ml/models"  # where SageMaker puts the models it loads: all tritonserver reads
_NAME = "[0-9A-Za-z._]+"  # a path component tritonserver's model_path_regex_ takes
_ENSEMBLE = re.compile(r"platform:(\s)*\"ensemble\"")


class RepositoryNotFound(Exception):
    """No directory at `url`: tritonserver's register answer (400)."""


class Refused(Exception):
    """A model directory the gateway will not send: a file that leads out of it, or more bytes than
    a request may carry (400)."""


@dataclass
class Plan:
    repository: str  # the `modelUrl` SageMaker's list shows (tritonserver's registered repository)
    loads: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (model, load parameters), the target last


def absolute(url: str) -> str:
    """The url as tritonserver normalises it (`std::filesystem::absolute(lexically_normal())`)."""
    return os.path.abspath(url)


def forbidden(url: str) -> bool:
    return absolute(url).startswith(FORBIDDEN)


def invalid(url: str, root: str = MODELS_ROOT) -> str | None:
    """tritonserver's refusal of a url outside `<root>/<hash>/model[/<subdir>]` (its fixed root is
    SageMaker's /opt/ml/models), else None: a client names a directory of the gateway's host, and
    only SageMaker's own may be read (before, any directory: `/` read the whole disk)."""
    pattern = re.escape(root.rstrip("/")) + f"/{_NAME}/model(?:/{_NAME})?"
    if re.fullmatch(pattern, absolute(url)) is not None:
        return None
    return f"Invalid \"url\" '{url}': expected a path of the form {root.rstrip('/')}/<hash>/model[/<subdir>]"


def plan(url: str, target: str, limit: int = 1 << 62) -> Plan:
    """What to load for `url` under the name `target` (at most `limit` bytes of files); raises
    RepositoryNotFound or Refused."""
    path = Path(absolute(url))
    if (path / "config.pbtxt").is_file():
        return Plan(str(path.parent), [(target, parameters(path, target, limit))])
    if not path.is_dir():
        raise RepositoryNotFound(f"failed to register '{path}', repository not found")
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    if not subdirs:
        raise RepositoryNotFound(f"failed to register '{path}', repository not found")
    main = next((p for p in subdirs if _is_ensemble(p)), subdirs[-1])
    loads = [(p.name, parameters(p, p.name, limit)) for p in subdirs if p != main]
    loads.append((target, parameters(main, target, limit)))
    if sum(len(value) for _, params in loads for value in params.values()) > limit:
        raise Refused(f"the model files at '{path}' are larger than the {limit} bytes a request may carry")
    return Plan(str(path), loads)


def _is_ensemble(model_dir: Path) -> bool:
    config = model_dir / "config.pbtxt"
    return config.is_file() and _ENSEMBLE.search(config.read_text(errors="replace")) is not None


def parameters(model_dir: Path, name: str, limit: int = 1 << 62) -> dict[str, str]:
    """The load request's parameters for a model directory: its config (named `name`) and its files."""
    return {"config": json.dumps(config_json(model_dir, name)), **files(model_dir, limit)}


def config_json(model_dir: Path, name: str) -> dict[str, object]:
    """The directory's config.pbtxt as the load API's JSON (only the fields it sets), renamed."""
    from google.protobuf import json_format  # protobuf, on first use (as model_config)

    path = model_dir / "config.pbtxt"
    config = model_config.parse_text(model_config.read_text(path), path) if path.is_file() else None
    data = json_format.MessageToDict(config, preserving_proto_field_name=True) if config is not None else {}
    return {**data, "name": name}


def files(model_dir: Path, limit: int = 1 << 62) -> dict[str, str]:
    """Every file but the config, as `file:<relative path>` with its content in base64. The load
    API carries files only: an empty directory (an ensemble's version) goes as an empty `.keep`.
    A link that leads out of the directory is refused, and so are more than `limit` bytes."""
    found, size, inside = {}, 0, model_dir.resolve()
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir).as_posix()
        if not path.resolve().is_relative_to(inside):
            raise Refused(f"'{relative}' in '{model_dir}' leads out of the model's directory")
        if path.is_file() and relative != "config.pbtxt":
            size += path.stat().st_size
            if size > limit:
                raise Refused(f"the model files at '{model_dir}' are larger than the {limit} bytes a request may carry")
            found[f"file:{relative}"] = base64.b64encode(path.read_bytes()).decode()
        elif path.is_dir() and not any(path.iterdir()):
            found[f"file:{relative}/.keep"] = ""
    return found
