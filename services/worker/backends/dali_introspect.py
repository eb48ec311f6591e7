"""What a DALI pipeline declares, for the repository's auto-complete (dali_autocomplete.py), run
as `python -m services.worker.backends.dali_introspect <version dir> <model file name>`: JSON on
stdout with its external inputs and outputs (name, Triton data type, number of dimensions) and
its batch size; exit status 3 where DALI is not installed.

The pipeline is found as the backend finds it (the serialized file, else an `@autoserialize`
definition) and instantiated without a GPU, as Triton's DALI backend instantiates it for
auto-complete on a host without one (`CPU_ONLY_DEVICE_ID`).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

# DALI's `daliDataType_t` (include/dali/core/dali_data_type.h) as a config's data type
# (dali_backend's `to_triton_config`; anything else, DALI_NO_TYPE included: TYPE_INVALID)
TYPES = {
    0: "TYPE_UINT8",
    1: "TYPE_UINT16",
    2: "TYPE_UINT32",
    3: "TYPE_UINT64",
    4: "TYPE_INT8",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_FP16",
    9: "TYPE_FP32",
    10: "TYPE_FP64",
    11: "TYPE_BOOL",
}
CPU_ONLY_DEVICE_ID = -99999  # DALI's c_api.h: a pipeline without a GPU


def _library(dali: Any) -> ctypes.CDLL:
    """DALI's C API (libdali.so, next to the Python package), the calls Triton's backend makes."""
    lib = ctypes.CDLL(str(Path(dali.__file__).parent / "libdali.so"))
    handle = ctypes.POINTER(ctypes.c_void_p)
    for name, result in (
        ("daliGetNumExternalInput", ctypes.c_int),
        ("daliGetExternalInputName", ctypes.c_char_p),
        ("daliGetExternalInputType", ctypes.c_int),
        ("daliGetExternalInputNdim", ctypes.c_int),
        ("daliGetNumOutput", ctypes.c_uint),
        ("daliGetOutputName", ctypes.c_char_p),
        ("daliGetDeclaredOutputDtype", ctypes.c_int),
        ("daliGetDeclaredOutputNdim", ctypes.c_ssize_t),
        ("daliGetMaxBatchSize", ctypes.c_int),
    ):
        getattr(lib, name).restype = result
    lib.daliGetExternalInputName.argtypes = [handle, ctypes.c_int]
    lib.daliGetExternalInputType.argtypes = [handle, ctypes.c_char_p]
    lib.daliGetExternalInputNdim.argtypes = [handle, ctypes.c_char_p]
    lib.daliGetOutputName.argtypes = [handle, ctypes.c_int]
    lib.daliGetDeclaredOutputDtype.argtypes = [handle, ctypes.c_int]
    lib.daliGetDeclaredOutputNdim.argtypes = [handle, ctypes.c_int]
    return lib


def describe(dali: Any, pipeline: bytes) -> dict[str, Any]:
    """The pipeline's declared inputs, outputs and batch size, read through DALI's C API as Triton's
    backend reads them (`DaliPipeline::GetInputType`, `GetDeclaredOutputShape`, ...): the Python
    API keeps no input or output names for a deserialized pipeline."""
    lib = _library(dali)
    lib.daliInitialize()
    handle = ctypes.c_void_p()
    # max_batch_size -1: the pipeline's own; 1 thread; no GPU; simple execution, queue depth 1
    lib.daliCreatePipeline2(
        ctypes.byref(handle), pipeline, len(pipeline), -1, 1, CPU_ONLY_DEVICE_ID, 0, 0, 0, 1, 1, 1, 0
    )
    ref = ctypes.byref(handle)
    try:
        inputs = []
        for index in range(lib.daliGetNumExternalInput(ref)):
            name = lib.daliGetExternalInputName(ref, index)
            ndim = lib.daliGetExternalInputNdim(ref, name)
            dtype = TYPES.get(lib.daliGetExternalInputType(ref, name), "TYPE_INVALID")
            inputs.append({"name": name.decode(), "data_type": dtype, "ndim": ndim if ndim >= 0 else None})
        outputs = []
        for index in range(lib.daliGetNumOutput(ref)):
            ndim = lib.daliGetDeclaredOutputNdim(ref, index)
            dtype = TYPES.get(lib.daliGetDeclaredOutputDtype(ref, index), "TYPE_INVALID")
            name = lib.daliGetOutputName(ref, index).decode()
            outputs.append({"name": name, "data_type": dtype, "ndim": ndim if ndim >= 0 else None})
        return {"inputs": inputs, "outputs": outputs, "max_batch_size": lib.daliGetMaxBatchSize(ref)}
    finally:
        lib.daliDeletePipeline(ref)


def serialized(dali: Any, version_dir: Path, filename: str) -> bytes:
    """The version's pipeline as the backend finds it: the model file (serialized, or a `.py`
    definition), else `dali.py`, each `@autoserialize` definition serialized."""
    from services.worker.backends.dali_backend import autoserialize

    path = version_dir / filename
    if path.is_file():
        return autoserialize(dali, path) if path.suffix == ".py" else path.read_bytes()
    if (version_dir / "dali.py").is_file():
        return autoserialize(dali, version_dir / "dali.py")
    raise FileNotFoundError(f"unable to find '{path}' or '{version_dir / 'dali.py'}'")


def main(version_dir: Path, filename: str) -> int:
    try:
        import nvidia.dali as dali
    except ImportError:
        return 3
    print(json.dumps(describe(dali, serialized(dali, version_dir, filename))))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
