"""The model repositories one repository service reads: `--model-repository` given several times,
folders and buckets alike, as tritonserver takes them (core's `ModelRepositoryManager`).

Every repository is scanned; a model is one sub-folder of one of them. Without namespacing a
name is one model: a name found in two repositories is neither loaded nor loadable ("failed to
poll model 'X': not unique across all model repositories" in the log; the index shows it
UNAVAILABLE, "model appears in two or more repositories"), and the others serve. With
`--model-namespacing=true` each repository is a namespace: a model's identity is
`<repository>::<name>` (`shared.wire.records.model_key`), so the same name in two repositories
is two models, which a client addresses by the name alone where it is unique
(`inference/models.py`). The namespace of a repository is the folder or URL as given.

A bucket (`s3://`, `gs://`, `as://`) is read through a mirror on this host's disk (remote.py);
`sync` brings the mirrors up to date.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from services.repository.remote import RemoteRepository, is_remote
from services.repository.scan import list_models
from shared.wire.records import model_key

log = logging.getLogger("shoal.repository")

DUPLICATE = "model appears in two or more repositories"  # Triton's MODEL_READY_REASON_DUPLICATE


@dataclass(frozen=True)
class Located:
    """One model folder: its name, its namespace ('' without namespacing) and where it is."""

    name: str
    namespace: str
    path: Path

    @property
    def key(self) -> str:
        return model_key(self.namespace, self.name)


@dataclass(frozen=True)
class Source:
    """One `--model-repository`: as given (a folder or a bucket's URL), and where it is read."""

    given: str
    root: Path  # the folder, or the bucket's mirror
    remote: RemoteRepository | None = None


@dataclass(frozen=True)
class Scan:
    models: dict[str, Located]  # identity -> its folder
    duplicates: list[str]  # without namespacing: names in several repositories, which none serves


class Repositories:
    def __init__(self, sources: list[Source], namespacing: bool = False) -> None:
        self.sources = sources
        self.namespacing = namespacing
        self._duplicates: set[str] = set()  # logged once, until they are unique again

    @classmethod
    def open(cls, given: list[str], mirrors: Path, namespacing: bool = False) -> Repositories:
        """The repositories as the flags name them; a bucket gets its mirror (nothing fetched yet)."""
        sources = []
        for entry in given:
            if is_remote(entry):
                remote = RemoteRepository(entry, mirrors)
                sources.append(Source(entry, remote.mirror, remote))
            else:  # read where it is, named as given (a relative path: from this process's cwd)
                sources.append(Source(entry, Path(entry).absolute()))
        return cls(sources, namespacing)

    @property
    def roots(self) -> list[Path]:
        return [source.root for source in self.sources]

    @property
    def remote(self) -> bool:
        return any(source.remote is not None for source in self.sources)

    def describe(self) -> str:
        return ", ".join(source.given for source in self.sources)

    def _namespace(self, source: Source) -> str:
        return source.given if self.namespacing else ""

    def scan(self) -> Scan:
        """Every model folder of every repository (a repository that cannot be read has none)."""
        models: dict[str, Located] = {}
        duplicates: set[str] = set()
        for source in self.sources:
            try:
                names = list_models(source.root)
            except OSError:
                continue
            for name in names:
                found = Located(name, self._namespace(source), source.root / name)
                if found.key in models:
                    duplicates.add(found.key)  # only without namespacing: a namespace is one folder
                models.setdefault(found.key, found)
        for key in duplicates:
            del models[key]
        for name in sorted(duplicates - self._duplicates):
            log.error("failed to poll model '%s': not unique across all model repositories", name)
        self._duplicates = duplicates
        return Scan(models, sorted(duplicates))

    def named(self, name: str) -> list[Located]:
        """Where an explicit load of `name` finds it: each repository holding it with namespacing;
        without, the one that holds it, none when several do (Triton's "not unique")."""
        found = [
            Located(name, self._namespace(source), source.root / name)
            for source in self.sources
            if (source.root / name).is_dir()
        ]
        return [] if not self.namespacing and len(found) > 1 else found

    def missing(self, name: str) -> str:
        """Why an explicit load of `name` finds no folder (Triton's log line says it)."""
        if len([s for s in self.sources if (s.root / name).is_dir()]) > 1:
            return "not unique across all model repositories"
        return "model not found in any model repository."

    def split(self, key: str) -> tuple[str, str]:
        """A model's identity as (namespace, name): the inverse of `model_key` for these repositories."""
        if self.namespacing:
            for source in self.sources:
                if key.startswith(source.given + "::"):
                    return source.given, key[len(source.given) + 2 :]
        return "", key

    def locate(self, key: str) -> Located | None:
        """The folder of the model `key` names, if it has one (and, without namespacing, only one)."""
        namespace, name = self.split(key)
        if not namespace:
            found = self.named(name)
            return found[0] if len(found) == 1 and not found[0].namespace else None
        source = next(s for s in self.sources if s.given == namespace)
        path = source.root / name
        return Located(name, namespace, path) if path.is_dir() else None

    def sync(self, name: str | None = None) -> None:
        """Bring every bucket's mirror (or each one's part holding `name`) up to date. Blocking."""
        for source in self.sources:
            if source.remote is not None:
                source.remote.sync(name)
