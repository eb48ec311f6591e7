"""A GGUF requantized to another llama.cpp type when the model loads, kept in a cache.

A model's config may ask for a quantisation its file does not ship (`quantization`, e.g.
`IQ4_NL`): llama.cpp's own `llama_model_quantize` (with `allow_requantize`, since the source is
usually quantized already) writes the copy once, and later loads find it. Which type to pick for
the example LLM, by measurement: docs/openai.md ("Which quantisation").

The copy is named for what made it: the source's resolved path, size and modification time,
the type and llama-cpp-python's version, hashed, so a changed source or library makes a new
copy instead of reusing a stale one. It is written under a temporary name and renamed into
place, so two instances loading at once never read a half-written file (each may write its
own; the last rename wins with identical content). The cache folder is the user's own (0700):
a model file another user could replace would run as whatever it says.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from importlib import metadata
from pathlib import Path

from shoal.llm.llama_c_api import Library, LlamaError

# llama.cpp's type names a block of 32 weights can take (this model family's rows, 576 values,
# are not a multiple of 256, so the K-quants fall back to other types for most tensors)
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "F16", "BF16")


def cache_folder() -> Path:
    """`$SHOAL_GGUF_CACHE`, else `$XDG_CACHE_HOME/shoal/gguf` (`~/.cache/shoal/gguf`)."""
    configured = os.environ.get("SHOAL_GGUF_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal" / "gguf"


def copy_name(source: Path, kind: str, library_version: str) -> str:
    """The cached copy's file name: the source's stem, the type and a hash of what made it."""
    status = source.stat()
    made_of = f"{source.resolve()}\0{status.st_size}\0{status.st_mtime_ns}\0{kind}\0{library_version}"
    return f"{source.stem}.{kind}.{hashlib.sha256(made_of.encode()).hexdigest()[:16]}.gguf"


def requantized(source: Path, kind: str, library: Library, threads: int = 1, folder: Path | None = None) -> Path:
    """The path of `source` in llama.cpp type `kind`, making the copy if the cache lacks it."""
    kind = kind.strip().upper()
    if kind not in TYPES:
        raise ValueError(f"unknown quantization '{kind}': expected one of {', '.join(TYPES)}")
    folder = own_folder(folder or cache_folder())
    target = folder / copy_name(source, kind, metadata.version("llama_cpp_python"))
    if target.is_file():
        return target
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder)
    os.close(handle)
    try:
        _quantize(library, source, Path(temporary), kind, threads)
        os.replace(temporary, target)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return target


def own_folder(folder: Path) -> Path:
    """The cache folder, made 0700 if missing; refused if another user owns it or may write to it
    (they could put a file under a copy's name, which this would then load)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = folder.stat()
    except OSError as exc:
        raise LlamaError(f"cannot use {folder} for requantized GGUF files ({exc}): set SHOAL_GGUF_CACHE") from exc
    if status.st_uid != os.getuid() or status.st_mode & 0o022:
        raise LlamaError(f"{folder} is not this user's alone: requantized GGUF files are not kept there")
    return folder


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
