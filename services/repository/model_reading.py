"""What a load reads, before anything is published: the model's directory (a repository's, or the
client's files written to an override directory of their own), its config scanned and completed,
an ensemble's graph connected and checked, and its outputs' labels. File I/O: the manager runs
`read` on a thread. It also keeps the override directories while a generation may use them."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from pathlib import Path

from services.repository import ensembles, namespaces, overrides
from services.repository.autocomplete import AutoComplete
from services.repository.labels import LabelError, read_labels
from services.repository.repositories import Located, Repositories
from services.repository.scan import ScannedModel, check_model_name, scan_model
from shared.config import backend_config, model_config
from shared.config.ensemble_graph import check_structure, is_ensemble
from shared.errors import ShoalError, internal, invalid
from shared.process.settings import RepositorySettings
from shared.wire.records import ModelRecord

log = logging.getLogger("shoal.repository")

Labels = dict[str, list[str]]


class ModelReader:
    def __init__(self, settings: RepositorySettings, repositories: Repositories) -> None:
        self.settings = settings
        self.repositories = repositories
        self.override_dirs: dict[str, Path] = {}  # model -> the override directory of its latest load
        self._stale_dirs: dict[str, list[Path]] = {}  # override directories still serving an old generation

    @property
    def auto_complete(self) -> AutoComplete:
        return AutoComplete(
            enabled=not (self.settings.disable_auto_complete_config or self.settings.strict_model_config),
            backend_directory=self.settings.backend_directory,
            backend_config=backend_config.parse(self.settings.backend_config),
            config_name=self.settings.model_config_name,
        )

    def read(
        self, name: str, config: str, files: dict[str, str], records: Mapping[str, ModelRecord]
    ) -> tuple[ScannedModel, Labels]:
        """The model scanned, and its outputs' classification labels. `config`: the client's
        config override (JSON); `files`: its file overrides (base64); `records`: the models known."""
        scanned = self._scan(name, config, files, records)
        if scanned.config is None:
            return scanned, {}
        try:
            return scanned, read_labels(scanned.path, name, model_config.to_json(scanned.config))
        except LabelError as exc:
            return ScannedModel(scanned.name, scanned.path, None, scanned.versions, str(exc)), {}

    def _scan(self, name: str, config: str, files: dict[str, str], records: Mapping[str, ModelRecord]) -> ScannedModel:
        check_model_name(self.repositories.split(name)[1])
        located = None if files else self.repositories.locate(name)  # the folder `name` loads from
        decoded = _decoded(files)
        if not files and located is None:
            model = self.repositories.split(name)[1]
            log.error("failed to poll model '%s': %s", model, self.repositories.missing(model))
            raise internal(f"failed to load '{model}', failed to poll from model repository")
        try:
            override = model_config.parse_json(config) if config else None
            model_dir = located.path if located is not None else overrides.write_override_dir(name, decoded)
        except ShoalError as exc:
            raise overrides.poll_failed(name, exc.message) from None
        scanned = self._ensemble_checked(name, scan_model(model_dir, self.auto_complete, override), located, records)
        self._keep_override(name, model_dir, bool(files), scanned.config is not None)
        return scanned

    def _ensemble_checked(
        self, name: str, scanned: ScannedModel, located: Located | None, records: Mapping[str, ModelRecord]
    ) -> ScannedModel:
        """An ensemble's steps connected to their models (with namespacing) and its graph checked:
        a bad graph is a load failure, like a bad config; member checks come with readiness."""
        if scanned.config is None or not is_ensemble(model_config.to_json(scanned.config)):
            return scanned
        graph = model_config.to_json(scanned.config)
        if self.repositories.namespacing:  # its steps' models, found as Triton finds them
            holders = namespaces.known(self.repositories.scan(), records.values())
            steps = graph["ensemble_scheduling"]["step"]
            namespaces.connect(steps, located.namespace if located else "", holders)
            for step, connected in zip(scanned.config.ensemble_scheduling.step, steps):
                step.model_namespace = connected.get("model_namespace", "")
        error = check_structure(graph) or ensembles.cycle(name, dict(records), graph)
        return ScannedModel(scanned.name, scanned.path, None, scanned.versions, error) if error else scanned

    def _keep_override(self, name: str, model_dir: Path, files: bool, loads: bool) -> None:
        if files and not loads:
            overrides.remove_override_dir(model_dir)  # the one serving (if any) stays
        elif files or name in self.override_dirs:
            # the previous override directory may still serve until the new generation is ready
            previous = self.override_dirs.pop(name, None)
            if previous is not None:
                self._stale_dirs.setdefault(name, []).append(previous)
            if files:
                self.override_dirs[name] = model_dir

    def drop_stale_dirs(self, name: str) -> None:
        """The new generation serves (or the model is gone): the older override directories go."""
        for stale in self._stale_dirs.pop(name, []):
            overrides.remove_override_dir(stale)

    def unloaded(self, name: str) -> None:
        if name in self.override_dirs:
            overrides.remove_override_dir(self.override_dirs.pop(name))
        self.drop_stale_dirs(name)

    def remove_override_dirs(self) -> None:
        """At stop: every override directory of this run. Its records go too (the next repository
        deletes a previous run's), so no worker loads from them again."""
        for name in list(self._stale_dirs):
            self.drop_stale_dirs(name)
        while self.override_dirs:
            overrides.remove_override_dir(self.override_dirs.popitem()[1])


def _decoded(files: dict[str, str]) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for relative, text in files.items():
        try:
            decoded[relative] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"file override '{relative}' is not valid base64") from None
    return decoded
