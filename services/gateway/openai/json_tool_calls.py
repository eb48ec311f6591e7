"""Tool calls written as bare JSON objects: Llama 3.1's and Mistral's forms, as Triton's OpenAI
front end's `llama3` and `mistral` parsers read them (docs/openai.md, "Tool calling").

- `llama3`: the answer starts with a call, `{"name": ..., "parameters": {...}}` (or
  `"arguments"`), optionally after `<|python_tag|>`; several calls are separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, after any content; an answer
  that starts with the array itself (`[{...}]`) is read too.

The design is the `<tool_call>` parser's (tool_calls.py): a call whose name comes first is
committed once its name and the start of its arguments are seen (the first delta: index, id,
name), then its arguments' JSON text goes out as it arrives; where its value ends is found by
counting brackets outside strings, as there is no closing tag. A call written in another order
is read whole once its object closes. Text that turns out not to be a call is content, as
written; text after the calls is content too, with its own spacing (white space or a lone `;`
that nothing follows is dropped).
"""

from __future__ import annotations

import re
import secrets
import string

from services.gateway.openai.tool_calls import CallDelta, SteppingParser, Trailing, call_id, head_name, whole_call

_START, _ARRAY, _OPEN, _HEADING, _ARGUMENTS, _TAIL, _AFTER, _CONTENT, _DONE = range(9)
_ALPHANUMERIC = string.ascii_letters + string.digits


def _head(keys: str) -> re.Pattern[str]:
    """A call's start up to its arguments' object, the name first."""
    return re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:' + keys + r')"\s*:\s*(?=\{)')


class _Brackets:
    """Where a JSON value ends, fed in pieces: its brackets counted outside strings."""

    def __init__(self, depth: int = 0) -> None:
        self.depth, self.string, self.escape = depth, False, False

    def end(self, text: str) -> int | None:
        """The offset just after the bracket that closes the value, or None: not in `text`."""
        for at, char in enumerate(text):
            if self.string:
                if self.escape:
                    self.escape = False
                elif char == "\\":
                    self.escape = True
                elif char == '"':
                    self.string = False
            elif char == '"':
                self.string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return at + 1
        return None


class JsonCallParser(SteppingParser):
    """Feed text, get (content, call deltas); `flush` at the end (as `CallParser`). Subclasses say
    where the calls start (`_start`), what separates them and what ends them."""

    separator = ""
    closing = ""  # after the last call (Mistral's `]`), "" when nothing closes them
    keys = "arguments"  # the key of a call's arguments (a regex alternative)

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.count = 0  # calls started
        self._state = _START
        self._buffer = ""
        self._held = ""  # consumed since the last call: content after all if no call follows
        self._brackets = _Brackets()
        self._scanned = 0  # how much of the buffer `_brackets` has seen (while heading)
        self._trailing = Trailing(self.separator)
        self._head = _head(self.keys)

    def new_id(self) -> str:
        return call_id()

    def flush(self) -> tuple[str, list[CallDelta]]:
        """What is held back: text that did not become a call is content; an unfinished call's
        arguments went out as they came (an answer cut by `max_tokens`)."""
        rest, state = self._held + self._buffer, self._state
        self._held, self._buffer, self._state = "", "", _DONE
        if state in (_START, _ARRAY, _OPEN, _HEADING, _CONTENT):
            return self._trailing.content(rest, final=True), []
        return "", []

    def _step(self, content: list[str], deltas: list[CallDelta]) -> bool:
        """One move of the state machine; False when it needs more text."""
        if self._state == _START:
            return self._start(content)
        if self._state in (_ARRAY, _OPEN):
            return self._opening(content)
        if self._state == _HEADING:
            return self._heading(content, deltas)
        if self._state == _ARGUMENTS:
            return self._arguments(deltas)
        if self._state == _TAIL:
            return self._tail()
        if self._state == _AFTER:
            return self._after()
        if self._state == _CONTENT:
            content.append(self._trailing.content(self._buffer))
        self._buffer = ""  # _CONTENT, _DONE
        return False

    def _start(self, content: list[str]) -> bool:
        raise NotImplementedError

    def _take(self, size: int) -> None:
        """The buffer's first `size` characters, consumed but held (content if no call follows)."""
        self._held, self._buffer = self._held + self._buffer[:size], self._buffer[size:]

    def _not_a_call(self, content: list[str]) -> bool:
        """What was held, and all after it, is content."""
        content.append(self._trailing.content(self._held + self._buffer))
        self._held, self._buffer, self._state = "", "", _CONTENT
        return False

    def _opening(self, content: list[str]) -> bool:
        """Before the array (`_ARRAY`) or a call (`_OPEN`): white space, then `[` or `{`."""
        text = self._buffer.lstrip()
        if not text:
            return False
        wanted = "[" if self._state == _ARRAY else "{"
        if text[0] != wanted:
            return self._not_a_call(content)
        if self._state == _ARRAY:
            self._take(len(self._buffer) - len(text) + 1)
            self._state = _OPEN
        else:
            self._take(len(self._buffer) - len(text))
            self._state, self._brackets, self._scanned = _HEADING, _Brackets(), 0
        return True

    def _heading(self, content: list[str], deltas: list[CallDelta]) -> bool:
        head = self._head.match(self._buffer)
        name = head_name(head)
        if head is not None and name is not None:  # else read whole: not a call, as its name is not JSON
            deltas.append(CallDelta(self.count, "", self.new_id(), name))
            self.count += 1
            self._held, self._buffer = "", self._buffer[head.end() :]
            self._state, self._brackets = _ARGUMENTS, _Brackets()
            return True
        end = self._brackets.end(self._buffer[self._scanned :])
        if end is None:
            self._scanned = len(self._buffer)
            return False
        end += self._scanned
        call = whole_call(self._buffer[:end], tuple(self.keys.split("|")))
        if call is None:  # not a call after all: the model's text, as it wrote it
            return self._not_a_call(content)
        deltas.append(CallDelta(self.count, call[1], self.new_id(), call[0]))
        self.count += 1
        self._held, self._buffer = "", self._buffer[end:]
        self._called()
        return True

    def _arguments(self, deltas: list[CallDelta]) -> bool:
        end = self._brackets.end(self._buffer)
        fragment = self._buffer if end is None else self._buffer[:end]
        self._buffer = "" if end is None else self._buffer[end:]
        if fragment:
            deltas.append(CallDelta(self.count - 1, fragment))
        if end is not None:
            self._state, self._brackets = _TAIL, _Brackets(1)
        return end is not None

    def _tail(self) -> bool:
        """The rest of the call's object after its arguments, to its closing brace."""
        end = self._brackets.end(self._buffer)
        self._buffer = "" if end is None else self._buffer[end:]
        if end is not None:
            self._called()
        return end is not None

    def _called(self) -> None:
        self._state = _AFTER if self.parallel else _DONE
        self._trailing.called()

    def _after(self) -> bool:
        """After a call: a separator and the next one, the end of the calls, or content."""
        text = self._buffer.lstrip()
        if not text:
            return False
        if text.startswith(self.separator):
            self._buffer = text
            self._take(len(self.separator))
            self._state = _OPEN
        elif self.closing and text.startswith(self.closing):
            self._buffer, self._state = text[len(self.closing) :], _CONTENT
        else:  # content, with its own spacing
            self._state = _CONTENT
        return True


class Llama3Parser(JsonCallParser):
    """Llama 3.1's JSON calls: the answer starts with one (after `<|python_tag|>` or not)."""

    TAG = "<|python_tag|>"
    separator = ";"
    keys = "parameters|arguments"

    def _start(self, content: list[str]) -> bool:
        text = self._buffer.lstrip()
        if not text or (self.TAG.startswith(text) and text != self.TAG):
            return False  # not yet known
        if text.startswith(self.TAG):
            self._take(len(self._buffer) - len(text) + len(self.TAG))
            self._state = _OPEN
        else:
            self._state = _OPEN if text[0] == "{" else _CONTENT
        return True


class MistralParser(JsonCallParser):
    """Mistral's `[TOOL_CALLS]` and a JSON array of calls; Mistral's ids: 9 letters or digits (its
    chat template refuses any other when the conversation comes back)."""

    TOKEN = "[TOOL_CALLS]"
    separator = ","
    closing = "]"

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self._fresh = True  # nothing of the answer is content yet: a bare `[` may open the calls

    def new_id(self) -> str:
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))

    def _start(self, content: list[str]) -> bool:
        at = self._buffer.find(self.TOKEN)
        if at >= 0:
            content.append(self._buffer[:at])
            self._buffer = self._buffer[at:]
            self._take(len(self.TOKEN))
            self._state = _ARRAY
            return True
        text = self._buffer.lstrip()
        if self._fresh and (not text or self.TOKEN.startswith(text)):
            return False  # not yet known
        if self._fresh and text[0] == "[":
            self._state = _ARRAY
            return True
        self._fresh = False
        keep = next((n for n in range(len(self.TOKEN) - 1, 0, -1) if self._buffer.endswith(self.TOKEN[:n])), 0)
        content.append(self._buffer[: len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return False
