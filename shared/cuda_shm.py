"""Client CUDA shared memory through CUDA IPC handles, with CuPy (the `gpu` extra).

Import-guarded: on a host without CuPy or a GPU every entry point raises ShoalError
with the reason, and nothing else in Shoal imports CuPy.
"""

from __future__ import annotations

import threading

from shared.errors import ShoalError

HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
_opened: dict[tuple[bytes, int], int] = {}  # (handle, device) -> device pointer
_lock = threading.Lock()


def _cupy():
    try:
        import cupy
    except ImportError:
        raise ShoalError(
            "GPUs not supported (install `pip install 'shoal[gpu]'` on a CUDA host)", "INVALID_ARG"
        ) from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ShoalError("GPUs not supported (no CUDA device is visible)", "INVALID_ARG")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise ShoalError(f"GPUs not supported ({exc})", "INVALID_ARG") from None
    return cupy


def open_handle(handle: bytes, device_id: int) -> int:
    """The device pointer of an IPC handle, opened once per process."""
    cupy = _cupy()
    with _lock:
        pointer = _opened.get((handle, device_id))
        if pointer is None:
            with cupy.cuda.Device(device_id):
                pointer = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            _opened[(handle, device_id)] = pointer
        return pointer


def read(handle: bytes, device_id: int, offset: int, nbytes: int) -> bytes:
    cupy = _cupy()
    pointer = open_handle(handle, device_id)
    out = bytearray(nbytes)
    with cupy.cuda.Device(device_id):
        cupy.cuda.runtime.memcpy(_host_pointer(out), pointer + offset, nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
    return bytes(out)


def write(handle: bytes, device_id: int, offset: int, data: memoryview | bytes) -> None:
    cupy = _cupy()
    pointer = open_handle(handle, device_id)
    source = bytes(data)
    with cupy.cuda.Device(device_id):
        cupy.cuda.runtime.memcpy(
            pointer + offset, _host_pointer(source), len(source), cupy.cuda.runtime.memcpyHostToDevice
        )


def _host_pointer(buffer: bytes | bytearray) -> int:
    import ctypes

    if isinstance(buffer, bytearray):
        return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    return ctypes.cast(ctypes.c_char_p(buffer), ctypes.c_void_p).value
