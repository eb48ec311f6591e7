"""Text in and out of a language model: chat templates and incremental detokenization."""

from __future__ import annotations

import codecs

from shared.config.chat_template import render_chat

__all__ = ["Detokenizer", "render_chat"]  # render_chat: the chat template inside a GGUF file, rendered


class Detokenizer:
    """Token bytes to text as they come: a character split over two tokens appears whole, with
    the second."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, piece: bytes) -> str:
        return str(self._decoder.decode(piece))

    def flush(self) -> str:
        return str(self._decoder.decode(b"", final=True))
