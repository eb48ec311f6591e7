"""The compiled build: mypyc over the modules `shoal/compiled_modules.py` lists (docs/performance.md, "The compiled build").

Everything else about the package is in pyproject.toml. `pip install .` compiles when it can:
- a C compiler and Python's headers are present, and `SHOAL_PURE` is unset or 0;
- the install is not editable: `pip install -e .` never compiles, so the source tree holds no
  `.so` that would shadow an edited `.py` (a stale extension is the one way a compiled build goes
  wrong silently).
Otherwise, or if compiling fails, the same modules install as plain Python and a line says why.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# the module list and mypy's settings, without importing shoal
BUILD = runpy.run_path(str(HERE / "shoal" / "compiled_modules.py"))
COMPILED: tuple[str, ...] = BUILD["COMPILED"]


def why_pure() -> str | None:
    """Why this build cannot compile, or None when it can."""
    if os.environ.get("SHOAL_PURE", "0") not in ("", "0"):
        return "SHOAL_PURE is set"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    if not compiler or shutil.which(compiler[0]) is None:
        return f"no C compiler ({compiler[0] if compiler else 'CC unset'})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python.h (install the python3-dev package)"
    try:
        import mypyc  # noqa: F401  (build-system.requires brings it)
    except ImportError:
        return "mypyc is not installed"
    return None


def say(line: str) -> None:
    print(f"shoal: {line}", file=sys.stderr, flush=True)


class CompiledDistribution(Distribution):
    """A wheel that may hold extensions is tagged for this platform and Python."""

    def has_ext_modules(self) -> bool:
        return why_pure() is None


class BuildFresh(build_py):
    """The build folder starts empty: pip builds in the checkout's `build/`, and what an earlier
    build left there goes into the wheel too (an extension of a module no longer compiled would
    shadow its `.py`, a `SHOAL_PURE` build would hold the last compiled build's extensions, a
    removed module would still install)."""

    def run(self) -> None:
        if not self.editable_mode and Path(self.build_lib).is_dir():
            shutil.rmtree(self.build_lib)
        super().run()


class BuildCompiled(build_ext):
    """mypycify runs here, in `run`: setup.py also runs (and finalizes this command) to read
    metadata and for editable installs, which need no C at all."""

    with_extensions = False  # this instance was made by `run` below, with mypyc's extensions

    def run(self) -> None:
        if self.with_extensions:
            self._compile()
            return
        reason = "an editable install" if self.editable_mode else why_pure()
        if reason is not None:
            say(f"pure-Python build ({reason})")
            return
        from mypyc.build import mypycify

        os.chdir(HERE)  # mypyc names modules by their paths relative to here
        config = HERE / "build" / "mypyc.ini"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(BUILD["mypy_config"]())
        paths = ["--config-file", str(config), *COMPILED]
        try:
            self.distribution.ext_modules = mypycify(paths, opt_level="3", multi_file=True)
        except (Exception, SystemExit) as exc:  # noqa: BLE001  (mypyc refused: a type error, say)
            say(f"pure-Python build (mypyc failed: {exc})")
            return
        # a fresh command finalized with the extensions (setuptools prepares each one there)
        compiling = self.distribution.reinitialize_command("build_ext")
        assert isinstance(compiling, BuildCompiled)
        compiling.with_extensions = True
        compiling.parallel = self.parallel or os.cpu_count() or 1
        compiling.ensure_finalized()
        compiling.run()

    def _compile(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001  (any compiler failure: fall back, all or none)
            for built in self.get_outputs():
                Path(built).unlink(missing_ok=True)
            say(f"pure-Python build (compiling failed: {exc})")
            return
        say(f"compiled build: {len(COMPILED)} modules by mypyc")


setup(distclass=CompiledDistribution, cmdclass={"build_py": BuildFresh, "build_ext": BuildCompiled}, ext_modules=[])
