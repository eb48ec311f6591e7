"""Client CUDA shared memory through CUDA IPC handles, with CuPy (the `gpu` extra).

Import-guarded: on a host without CuPy or a GPU every entry point raises ShoalError
with the reason, and nothing else in Shoal imports CuPy.
"""

from __future__ import annotations

import threading
from types import ModuleType

from shared.errors import internal, invalid

HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
_opened: dict[tuple[bytes, int], int] = {}  # (handle, device) -> device pointer
_lock = threading.Lock()


def _cupy() -> ModuleType:
    try:
        import cupy
    except ImportError:
        raise invalid("GPUs not supported (install `pip install 'shoal[gpu]'` on a CUDA host)") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise invalid("GPUs not supported (no CUDA device is visible)")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise invalid(f"GPUs not supported ({exc})") from None
    module: ModuleType = cupy
    return module


def open_handle(handle: bytes, device_id: int) -> int:
    """The device pointer of an IPC handle, opened once per process."""
    cupy = _cupy()
    with _lock:
        pointer = _opened.get((handle, device_id))
        if pointer is None:
            try:
                with cupy.cuda.Device(device_id):
                    pointer = int(cupy.cuda.runtime.ipcOpenMemHandle(handle))
            except cupy.cuda.runtime.CUDARuntimeError as exc:
                # Triton's text and status (INTERNAL) for a handle CUDA will not open; CuPy's
                # message is "<cudaError name>: <cudaGetErrorString>", Triton shows the latter
                raise internal(f"failed to open CUDA IPC handle: {str(exc).partition(': ')[2] or exc}") from None
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
    address = ctypes.cast(ctypes.c_char_p(buffer), ctypes.c_void_p).value
    assert address is not None  # a bytes object always has an address
    return address
