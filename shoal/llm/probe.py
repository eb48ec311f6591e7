"""Run llama.cpp in a child process before serving with it, and pick the CPU backend it runs with.

A llama.cpp library built for another CPU dies with SIGILL at its first matrix product, and takes
its process with it: in a model instance that would be a worker restarted and killed again at
each request. So the instance first loads the library and the model and generates a few tokens
(several sequences in one batch, and one at a time: both kinds of kernel) in a child process. A
child that dies, exits or hangs fails the model's load with what happened to it.

A portable build (docs/openai.md) ships one CPU backend per instruction set
(`libggml-cpu-haswell.so`, `-skylakex`, `-zen4`, `-sapphirerapids`, ...). llama.cpp picks the one
whose `ggml_backend_score` is highest from the CPUID flags, which can promise what a VM does not
allow (AMX). Here the candidates are tried best first, each in a child, and the first that
generates is the one the instance loads: an instruction the CPU refuses costs a child, never
the server.

    python -m shoal.llm.probe --gguf MODEL.gguf [--variant libggml-cpu-X.so]   # one trial
    python -m shoal.llm.probe --score libggml-cpu-X.so ...                      # their scores
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal.llm.llama_c_api import LlamaError

VARIANTS = "libggml-cpu-*.so"

log = logging.getLogger("shoal.llm")


class ProbeFailed(LlamaError):
    """llama.cpp could not load or generate on this machine, in a child process."""


@dataclass(frozen=True)
class Choice:
    """What the probe found: the CPU backend to load (None: a build with its CPU code inside)
    and llama.cpp's own summary of what it runs with."""

    variant: Path | None
    system_info: str


def variants(folders: Sequence[Path]) -> list[Path]:
    """The CPU backends of a portable build in these folders (none for a build that has its CPU
    code inside libggml)."""
    return sorted(path for folder in folders if folder.is_dir() for path in folder.glob(VARIANTS))


def _died(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    why = {
        "SIGILL": ": an instruction this CPU (or the VM it runs in) does not allow; the library was built for another CPU",
        "SIGSEGV": ": a memory fault inside the library",
        "SIGKILL": ": killed (out of memory?)",
    }.get(name, "")
    return f"died with {name}{why}"


def _child(arguments: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "shoal.llm.probe", *arguments]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"llama.cpp did not load and generate within {timeout:.0f} s in a child process") from None


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def trial(gguf: Path, variant: Path | None, timeout: float = 180.0) -> Choice:
    """Load and generate in a child; its report, or ProbeFailed saying how it ended."""
    arguments = ["--gguf", str(gguf)] + (["--variant", str(variant)] if variant else [])
    done = _child(arguments, timeout)
    if done.returncode != 0:
        detail = _tail(done.stderr)
        raise ProbeFailed(f"llama.cpp {_died(done.returncode)}" + (f" ({detail})" if detail else ""))
    report = json.loads(_tail(done.stdout))
    return Choice(variant, report["system_info"])


def scores(candidates: Sequence[Path], timeout: float = 60.0) -> dict[Path, int]:
    """Each backend's own score for this CPU (0: it cannot run here), read in a child: a backend
    whose loading dies scores 0, and the child starts again after it."""
    result: dict[Path, int] = {}
    left = list(candidates)
    while left:
        done = _child(["--score", *map(str, left)], timeout)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for line in lines:
            result[Path(line["variant"])] = int(line["score"])
        left = left[len(lines) :]
        if left and done.returncode == 0:
            raise ProbeFailed(f"the score child ended before scoring {left[0].name}")
        if left:  # the child died loading left[0]: it cannot run here
            result[left.pop(0)] = 0
    return result


def choose(gguf: Path, folders: Sequence[Path], timeout: float = 180.0) -> Choice:
    """The CPU backend this process should run llama.cpp with, tried in a child first; ProbeFailed
    (saying what happened to each) when none generates."""
    candidates = variants(folders)
    if not candidates:  # a build with its CPU code inside: one trial, as it is
        try:
            return trial(gguf, None, timeout)
        except ProbeFailed as exc:
            raise ProbeFailed(
                f"{exc}. This llama-cpp-python has its CPU code built in, for one CPU (pip builds it with "
                "-march=native): install the portable build, which picks its CPU backend here (docs/openai.md)"
            ) from None
    ranked = sorted(((score, path) for path, score in scores(candidates).items() if score > 0), reverse=True)
    if not ranked:
        names = ", ".join(path.name for path in candidates)
        raise ProbeFailed(f"none of llama.cpp's CPU backends runs on this CPU ({names})")
    failures = []
    for _, path in ranked:
        try:
            return trial(gguf, path, timeout)
        except ProbeFailed as exc:
            failures.append(f"{path.name}: {exc}")
            log.warning("llama.cpp's CPU backend %s failed its trial (%s); trying the next", path.name, exc)
    raise ProbeFailed("no CPU backend of llama.cpp generates on this machine: " + "; ".join(failures))


# --- the child's side ---


def _score(paths: list[str]) -> None:
    import ctypes

    from shoal.llm.llama_c_api import LlamaError, library_folder

    try:  # the backends need ggml's base library, which they find loaded (they carry no path to it)
        ctypes.CDLL(str(library_folder() / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    except (LlamaError, OSError):
        pass  # no llama-cpp-python here: a backend that needs it fails to load, and scores 0
    for path in paths:
        report: dict[str, object] = {"variant": path, "score": 0}
        try:
            library = ctypes.CDLL(path)
            report["score"] = int(library.ggml_backend_score()) if hasattr(library, "ggml_backend_score") else 0
        except OSError as exc:
            report["error"] = str(exc)
        print(json.dumps(report), flush=True)


def _generate(gguf: Path, variant: Path | None) -> None:
    from shoal.llm.llama_c_api import ContextSettings, Entry, Library, LlamaModel

    library = Library.start(variant)
    model = LlamaModel(gguf, ContextSettings(n_ctx=512, max_sequences=2, n_batch=64), library)
    prompt = model.tokenize("The capital of France is")
    # both sequences' prompts in one batch (matrix-matrix kernels), then one token at a time
    model.decode([Entry(t, i, seq, i == len(prompt) - 1) for seq in (0, 1) for i, t in enumerate(prompt)])
    sampler = model.sampler(0.0, 1.0, 0)
    index, position = 2 * len(prompt) - 1, len(prompt)
    for _ in range(3):
        token = model.sample(sampler, index)
        model.decode([Entry(token, position, 1, True)])
        index, position = 0, position + 1
    sampler.close()
    model.close()
    print(json.dumps({"system_info": library.system_info()}), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shoal.llm.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--variant", type=Path)
    parser.add_argument("--score", nargs="+", metavar="LIBRARY")
    args = parser.parse_args(argv)
    if args.score:
        _score(args.score)
    elif args.gguf:
        try:
            _generate(args.gguf, args.variant)
        except LlamaError as exc:
            sys.exit(f"LlamaError: {exc}")
    else:
        parser.error("--gguf or --score")


if __name__ == "__main__":
    main()
