"""The python backend's own `--backend-config` settings, checked as Triton's python backend checks
them. Shoal accepts them and they change nothing: its python models have no stub process, no
shared-memory pool and no stub timeout (docs/models.md, "Python models")."""

from __future__ import annotations

from shared.errors import invalid

MIB = 1024 * 1024
# setting -> (smallest value, Triton's words when it is smaller)
_BOUNDS = {
    "shm-growth-byte-size": (1, "shm-growth-byte-size can't be smaller than or equal to zero."),
    "shm-default-byte-size": (MIB, "shm-default-byte-size can't be smaller than 4 MiBs"),
    "thread-pool-size": (1, "thread-pool-size can't be less than 1."),
    "stub-timeout-seconds": (1, "stub-timeout-seconds can't be smaller than or equal to zero."),
    "shm_message_queue_size": (0, ""),
}


def check(settings: dict[str, str]) -> None:
    """A bad value fails the load of the backend's models, as it fails Triton's python backend."""
    for key, (smallest, words) in _BOUNDS.items():
        if key not in settings:
            continue
        try:
            value = int(settings[key])
        except ValueError:
            raise invalid(f"--backend-config {key}: '{settings[key]}' is not a number") from None
        if value < smallest:
            raise invalid(words)
