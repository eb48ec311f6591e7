"""Request header blocks decoded with `hpack`, the repeated ones from a cache.

A gRPC client sends nearly the same headers on every call, and after the first call gRPC core's
encoder sends them as references to its dynamic table: the same bytes, call after call. Decoding
them again costs more than the rest of a call's HTTP/2 work in Python (hpack decodes field by
field, with a debug log per field), so a block whose decoding left the dynamic table as it was
is kept with its result; any block that changes the table empties the cache, since the same
references could then name other fields.
"""

from __future__ import annotations

from collections.abc import Sequence

import hpack

Headers = list[tuple[bytes, bytes]]

CACHED_BLOCKS = 64  # distinct repeated blocks: one per method and client kind, in practice


class HeaderDecoder:
    def __init__(self, max_header_list_size: int = 1 << 20) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = max_header_list_size
        self._cache: dict[bytes, Headers] = {}

    def decode(self, block: bytes) -> Headers:
        """The block's (name, value) pairs; raises hpack.HPACKError if it cannot be decoded."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        # objects, not tuples: compiled (shoal/compiled_modules.py), a typed tuple is unboxed and boxed anew on each read
        entries: Sequence[object] = self._decoder.header_table.dynamic_entries
        size, newest = len(entries), entries[0] if entries else None
        headers: Headers = [(bytes(name), bytes(value)) for name, value in self._decoder.decode(block, raw=True)]
        # an addition puts a new tuple first (identity, not equality: the same field may be added again)
        if len(entries) != size or (entries[0] if entries else None) is not newest:
            self._cache.clear()  # the table changed: cached references may now name other fields
        elif len(self._cache) < CACHED_BLOCKS:
            self._cache[block] = headers
        return headers
