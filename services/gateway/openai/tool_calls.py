"""Tool calls read out of a model's text as it comes (docs/openai.md, "Tool calling").

The model writes a call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(`shared/config/tool_prompt.py`; the grammar of a required call enforces exactly that). The
parser turns text into content and OpenAI's call deltas: a call's first delta has its index,
its id, its name and empty arguments, then the arguments' own JSON text follows in fragments
as it arrives. The whole answer runs the same parser over the whole text, so a stream's deltas
join into exactly the whole answer's calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from shared.config.tool_prompt import CALL_CLOSE, CALL_OPEN

# a call's start up to its arguments' value: name first, as the prompt shows and the grammar writes
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_OUTSIDE, _HEADING, _ARGUMENTS, _DONE = range(4)


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class CallDelta:
    """A piece of one call: the first carries its id and name."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def document(self) -> dict[str, Any]:
        """As a streamed chunk's `delta.tool_calls` entry."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


class ToolParser(Protocol):
    """What every format's parser does (tool_parsers.py): text in, content and call deltas out."""

    count: int  # calls started

    def feed(self, text: str) -> tuple[str, list[CallDelta]]: ...

    def flush(self) -> tuple[str, list[CallDelta]]: ...


def whole_calls(deltas: list[CallDelta]) -> list[dict[str, Any]]:
    """The deltas of an answer joined into its calls, as a message's `tool_calls`."""
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        if delta.id is not None:
            calls.append({"id": delta.id, "type": "function", "function": {"name": delta.name, "arguments": ""}})
        calls[delta.index]["function"]["arguments"] += delta.arguments
    return calls


def head_name(head: re.Match[str] | None) -> str | None:
    """The name a call's start holds, or None: no start, or a name that is not a JSON string (a
    bad escape, a raw control character), which makes the block not a call."""
    if head is None:
        return None
    try:
        return str(json.loads(f'"{head.group(1)}"'))
    except ValueError:
        return None


class Trailing:
    """The content after a call, as written; but white space (or a lone `separator`) that no text
    follows is not content: it waits for the text after it, and is dropped at the answer's end or
    when the next call starts. The same wherever the pieces split."""

    def __init__(self, separator: str = "") -> None:
        self.separator = separator
        self._after_call = False
        self._waiting = ""

    def called(self) -> None:
        self._after_call, self._waiting = True, ""

    def content(self, text: str, final: bool = False) -> str:
        if not self._after_call:
            return text
        text = self._waiting + text
        if not text.strip() or (final and text.strip() == self.separator):
            self._waiting = "" if final else text
            return ""
        self._after_call, self._waiting = False, ""
        return text


def _partial_suffix(text: str, tag: str) -> int:
    """How many of `text`'s last characters could start `tag` (held back until the next piece)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def _held_in_arguments(buffer: str) -> int:
    """How many of the arguments' last characters may belong to the call's end: the object's
    `}`, white space, and the start of `</tool_call>`."""
    end = len(buffer) - _partial_suffix(buffer, CALL_CLOSE)
    end = len(buffer[:end].rstrip())
    if end and buffer[end - 1] == "}":
        end = len(buffer[: end - 1].rstrip())
    return len(buffer) - end


class SteppingParser:
    """What every format's parser shares: text is buffered, and `_step` takes what it can of the
    buffer into content and call deltas until it needs more text."""

    _buffer: str

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._buffer += text
        content: list[str] = []
        deltas: list[CallDelta] = []
        while self._step(content, deltas):
            pass
        return "".join(content), deltas

    def _step(self, content: list[str], deltas: list[CallDelta]) -> bool:
        raise NotImplementedError


class CallParser(SteppingParser):
    """Feed text, get (content, call deltas); `flush` at the end. With `parallel` false, text after
    the first call is dropped (OpenAI's `parallel_tool_calls: false`: one call at most)."""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.count = 0  # calls started
        self._state = _OUTSIDE
        self._buffer = ""
        self._trailing = Trailing()

    def flush(self) -> tuple[str, list[CallDelta]]:
        """What is held back: an unfinished tag as content, an unfinished call's last arguments
        (an answer cut by `max_tokens`)."""
        rest, state = self._buffer, self._state
        self._buffer, self._state = "", _DONE
        if state == _OUTSIDE:
            return self._trailing.content(rest, final=True), []
        if state == _HEADING:
            return CALL_OPEN + rest, []
        if state == _ARGUMENTS and rest:
            return "", [CallDelta(self.count - 1, rest)]
        return "", []

    def _step(self, content: list[str], deltas: list[CallDelta]) -> bool:
        """One move of the state machine; False when it needs more text."""
        if self._state == _OUTSIDE:
            return self._outside(content)
        if self._state == _HEADING:
            return self._heading(content, deltas)
        if self._state == _ARGUMENTS:
            return self._arguments(deltas)
        self._buffer = ""  # _DONE
        return False

    def _outside(self, content: list[str]) -> bool:
        at = self._buffer.find(CALL_OPEN)
        if at < 0:
            keep = _partial_suffix(self._buffer, CALL_OPEN)
            content.append(self._trailing.content(self._buffer[: len(self._buffer) - keep]))
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        content.append(self._trailing.content(self._buffer[:at]))
        self._buffer, self._state = self._buffer[at + len(CALL_OPEN) :], _HEADING
        return True

    def _heading(self, content: list[str], deltas: list[CallDelta]) -> bool:
        head = _HEAD.match(self._buffer)
        name = head_name(head)
        if head is not None and name is not None and head.end() < len(self._buffer):  # the white space is whole
            deltas.append(CallDelta(self.count, "", call_id(), name))
            self.count += 1
            self._buffer, self._state = self._buffer[head.end() :], _ARGUMENTS
            return True
        end = self._buffer.find(CALL_CLOSE)
        if end < 0:
            return False
        block, self._buffer = self._buffer[:end], self._buffer[end + len(CALL_CLOSE) :]
        call = whole_call(block)
        if call is None:  # not a call after all: the model's text, as it wrote it
            content.append(self._trailing.content(CALL_OPEN + block + CALL_CLOSE))
            self._state = _OUTSIDE
            return True
        deltas.append(CallDelta(self.count, call[1], call_id(), call[0]))
        self.count += 1
        self._state = _OUTSIDE if self.parallel else _DONE
        self._trailing.called()
        return True

    def _arguments(self, deltas: list[CallDelta]) -> bool:
        end = self._buffer.find(CALL_CLOSE)
        if end < 0:
            ready = len(self._buffer) - _held_in_arguments(self._buffer)
            fragment, self._buffer = self._buffer[:ready], self._buffer[ready:]
        else:
            fragment = self._buffer[:end]
            fragment = fragment[: len(fragment) - _held_in_arguments(fragment)]
            self._buffer = self._buffer[end + len(CALL_CLOSE) :]
            self._state = _OUTSIDE if self.parallel else _DONE
            self._trailing.called()
        if fragment:
            deltas.append(CallDelta(self.count - 1, fragment))
        return end >= 0


def whole_call(block: str, keys: tuple[str, ...] = ("arguments",)) -> tuple[str, str] | None:
    """A call read whole (written in another order, arguments first, say): its name and its
    arguments' JSON, the first of `keys` it has; None when `block` is not a call."""
    try:
        call = json.loads(block)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    key = next((key for key in keys if key in call), None)
    return None if key is None else (call["name"], json.dumps(call[key], ensure_ascii=False))
