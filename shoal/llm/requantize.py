"""A GGUF requantized to another llama.cpp type when the model loads, kept in a cache.

A model's config may ask for a quantisation its file does not ship (`quantization`, e.g.
`Q8_0`): llama.cpp's own `llama_model_quantize` (with `allow_requantize`, since the source is
usually quantized already) writes the copy once, and later loads find it. Which type to pick for
the example LLM, by measurement: docs/openai.md ("Which quantisation").

The copy is named for what made it: the source's resolved path, size and modification time,
the type and llama-cpp-python's version, hashed, so a changed source or library makes a new
copy instead of reusing a stale one. One process makes it, under an exclusive lock of its own
(`flock`): the instances of a host that load the model together wait for it rather than each
writing a full-size copy (a 7B model's Q8_0 is 7 GB), and the maker writes under a temporary
name and renames, so nobody reads a half-written file; a maker killed half-way leaves a
temporary file the next maker removes. The cache is the user's own (0700,
shared/process/cache_dirs.py): a file another user could put there under a copy's name would be
loaded as the model.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import tempfile
from importlib import metadata
from pathlib import Path

from shared.process.cache_dirs import gguf_copies, private_dir
from shoal.llm.llama_c_api import Library, LlamaError

# llama.cpp's type names a block of 32 weights can take (this model family's rows, 576 values,
# are not a multiple of 256, so the K-quants fall back to other types for most tensors)
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "F16", "BF16")


class CacheUnavailable(LlamaError):
    """The cache folder cannot be used (read-only, another user's): no copy can be kept."""


def copy_name(source: Path, kind: str, library_version: str) -> str:
    """The cached copy's file name: the source's stem, the type and a hash of what made it."""
    status = source.stat()
    made_of = f"{source.resolve()}\0{status.st_size}\0{status.st_mtime_ns}\0{kind}\0{library_version}"
    return f"{source.stem}.{kind}.{hashlib.sha256(made_of.encode()).hexdigest()[:16]}.gguf"


def check_type(kind: str) -> str:
    """The llama.cpp type name, upper case; ValueError naming the known ones."""
    kind = kind.strip().upper()
    if kind not in TYPES:
        raise ValueError(f"unknown quantization '{kind}': expected one of {', '.join(TYPES)}")
    return kind


def requantized(source: Path, kind: str, library: Library, threads: int = 1, folder: Path | None = None) -> Path:
    """The path of `source` in llama.cpp type `kind`, making the copy if the cache lacks it."""
    kind = check_type(kind)
    folder = folder or gguf_copies()
    try:
        private_dir(folder)
        target = folder / copy_name(source, kind, metadata.version("llama_cpp_python"))
        with open(folder / f".{target.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not target.is_file():
                _make(library, source, target, kind, threads)
    except OSError as exc:
        raise CacheUnavailable(f"cannot keep requantized GGUF files in {folder} ({exc}): set SHOAL_GGUF_CACHE") from exc
    return target


def _make(library: Library, source: Path, target: Path, kind: str, threads: int) -> None:
    """Under the target's lock: remove a killed maker's leftovers, then write and rename."""
    for leftover in target.parent.glob(f".{target.name}.*.part"):
        leftover.unlink(missing_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(handle)
    try:
        _quantize(library, source, Path(temporary), kind, threads)
        os.replace(temporary, target)
    finally:
        Path(temporary).unlink(missing_ok=True)


def _quantize(library: Library, source: Path, target: Path, kind: str, threads: int) -> None:
    api = library.api
    params = api.llama_model_quantize_default_params()
    params.ftype = getattr(api, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.allow_requantize = True
    params.nthread = max(1, threads)
    if api.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise LlamaError(
            f"llama.cpp could not requantize {source.name} to {kind}: {library.recent() or 'no reason given'}"
        )
