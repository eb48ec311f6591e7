"""Continuous batching: many sequences decode together in one llama.cpp context.

One thread owns the context and runs steps. A step is one `llama_decode` of a batch holding the
next token of every sequence that is generating, plus as much of the newcomers' prompts as fits
in `n_batch` tokens; then each sequence whose logits came back samples its next token with its
own sampler. Between steps:

- **joining**: the oldest waiting request is admitted while there is a free sequence and its
  reservation fits the context: prompt + the most it may generate, in KV cells, so that a
  sequence admitted always has room to finish (no eviction, no recomputation);
- **a shared prompt start is decoded once**: the cells of the latest prompts stay in sequences
  of their own (`prompt_cache.py`: up to `prefix_cache_entries` prompts, `prefix_cache_tokens`
  cells in all), and a newcomer whose prompt starts the same way (a chat template's system prompt,
  a conversation's previous turn) shares those cells instead of decoding them, when both run on
  the same LoRA adapter (an adapter changes the cells' keys and values);
- **LoRA adapters**: a job may name one of the model's adapters. llama.cpp applies adapters to
  a whole context, so a step is one decode per adapter in use, each after switching to it: every
  sequence still advances every step, and sequences on the same adapter still batch together;
- **leaving**: a sequence that ends (an end-of-generation token, `max_tokens`, its reservation)
  or whose client went away (`Sink.cancelled`, which includes its deadline) is answered and its
  cells and sampler are freed at once, so the next request can join at the next step.

`submit` returns once the request has joined (or was answered): a model instance's `execute`
calls it, so requests that do not fit yet wait in the scheduler's queue, under its policies and
in its statistics, not in here. A request that fits joins at once (its sequence and cells are
reserved in `submit`, its prompt goes into the next step), so requests that arrive together
start together. docs/openai.md says how it performs.

The engine tells a `Meter` what it does (the model's metrics: llm_metrics.py): the prompt tokens
each request brings, each generated token with the time since its sequence's previous one, and
after each step the KV cells in use.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from shoal.llm.llama_c_api import Entry, LazyGrammar, LlamaError, Penalties, Sampler, Shaping
from shoal.llm.prompt_cache import PromptCache
from shoal.llm.text import Detokenizer
from shoal.llm.token_logprobs import Distribution, Logprob, token_entry

log = logging.getLogger("shoal.llm")


class Decoder(Protocol):
    """What the engine needs of a model and its context (`runtime.LlamaModel`)."""

    n_ctx: int

    def decode(self, entries: list[Entry], adapter: int | None = None) -> None: ...

    def sampler(self, temperature: float, top_p: float, seed: int, shaping: Shaping | None = None) -> Sampler: ...

    def sample(self, sampler: Sampler, index: int) -> int: ...

    def logits(self, index: int) -> np.ndarray: ...

    def forget(self, seq: int) -> None: ...

    def share(self, source: int, target: int, length: int) -> None: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def is_end(self, token: int) -> bool: ...


class Sink(Protocol):
    """Where one request's output goes; called on the engine's thread."""

    def text(self, text: str, completion_tokens: int, logprobs: Sequence[Logprob] = ()) -> None:
        """More text (one token's, or more when a character spans tokens), and the log
        probabilities of the tokens it came from when the job asked for them."""

    def end(self, text: str, reason: str, completion_tokens: int, logprobs: Sequence[Logprob] = ()) -> None:
        """The last text and why it ended: `stop`, `length` or `cancelled`."""

    def prompt(self, logprobs: Sequence[Logprob]) -> None:
        """The prompt's tokens' log probabilities (a job with `prompt_logprobs`), before any text:
        the first token's is None (nothing precedes it)."""

    def fail(self, message: str) -> None:
        """The request failed: nothing more comes."""

    def cancelled(self) -> bool:
        """The client went away or its deadline passed."""


class Meter(Protocol):
    """What the engine reports as it runs: from its own thread, or a caller's (`prompt`, when a
    request joins at once)."""

    def prompt(self, tokens: int) -> None: ...

    def token(self, gap_s: float | None) -> None:
        """A token generated; `gap_s`: the time since its sequence's previous one (None: its first)."""

    def cells(self, used: int, total: int) -> None:
        """KV cells in use (reserved by the running sequences, and the prompt cache's) of `total`."""


class _NoMeter:
    def prompt(self, tokens: int) -> None:
        pass

    def token(self, gap_s: float | None) -> None:
        pass

    def cells(self, used: int, total: int) -> None:
        pass


@dataclass(frozen=True)
class Limits:
    """The engine's bounds: concurrent sequences, and the context's KV cells (shared by all
    sequences) of which one sequence (prompt and completion) may hold at most `max_sequence_tokens`."""

    max_sequences: int = 8
    n_batch: int = 512
    max_sequence_tokens: int = 2048
    prefix_cache_tokens: int = 512  # cells kept for the latest prompts' starts (0: no prompt cache)
    prefix_cache_entries: int = 1  # prompts kept (the least recently used gives way)


@dataclass
class Job:
    """One generation request."""

    prompt: list[int]
    sink: Sink
    max_tokens: int | None = None
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int | None = None  # None: a random one
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    grammar: str | LazyGrammar = ""  # GBNF the output must follow (response_format, tools), "" for none
    logprobs: int | None = None  # each token's log probability and this many most likely (None: not asked)
    adapter: int | None = None  # the model's LoRA adapter that computes it (None: the base model alone)
    prompt_logprobs: bool = False  # the prompt's tokens' log probabilities too (OpenAI's echo), `logprobs` top ones
    joined: threading.Event = field(default_factory=threading.Event, repr=False)


def _shaping(job: Job, budget: int) -> Shaping | None:
    """What changes the logits before the draw, if anything: the penalties count every token the
    sequence may generate."""
    penalties = None
    if job.frequency_penalty or job.presence_penalty:
        penalties = Penalties(job.frequency_penalty, job.presence_penalty, max(budget, 1))
    if penalties is None and not job.logit_bias and not job.grammar:
        return None
    return Shaping(penalties, dict(job.logit_bias), job.grammar)


@dataclass
class _Sequence:
    job: Job
    seq: int
    sampler: Sampler
    budget: int  # the most tokens it may generate
    fed: int = 0  # prompt tokens decoded so far
    produced: int = 0
    next_token: int = -1  # the token to decode at the next step, once the prompt is in
    detokenizer: Detokenizer = field(default_factory=Detokenizer)
    logprobs: list[Logprob] = field(default_factory=list)  # tokens whose text has not gone out yet
    prompt_logprobs: list[Logprob] = field(default_factory=list)  # the prompt's, while it goes in
    last_token_s: float = 0.0  # when it generated its latest token (monotonic); 0: none yet

    @property
    def cells(self) -> int:
        return len(self.job.prompt) + self.budget

    @property
    def generating(self) -> bool:
        return self.fed == len(self.job.prompt)


# one adapter's share of a step: its entries, the sequences that sample (and their entry's index),
# the prompt chunks scored (sequence, first entry's index, first position, length)
_Part = tuple[list[Entry], list[tuple[_Sequence, int]], list[tuple[_Sequence, int, int, int]]]


class Engine:
    def __init__(self, model: Decoder, limits: Limits, meter: Meter | None = None) -> None:
        self.model, self.limits = model, limits
        self.meter: Meter = meter or _NoMeter()
        self.capacity = model.n_ctx - limits.prefix_cache_tokens  # what sequences may reserve
        # the sequence ids after the running sequences' keep the latest prompts' cells (the engine's thread's alone)
        self._cache = PromptCache(model, limits.max_sequences, limits.prefix_cache_entries, limits.prefix_cache_tokens)
        self._waiting: deque[Job] = deque()
        self._joining: list[_Sequence] = []  # admitted, not yet in a step (the engine's thread moves them)
        self._running: list[_Sequence] = []  # the engine's thread's alone
        self._free_seqs = list(range(limits.max_sequences - 1, -1, -1))
        self._reserved = 0
        self._stopping = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    # --- callers' side ---

    def check(self, job: Job) -> None:
        """Refuse at once what can never run: ValueError saying why."""
        prompt, limit = len(job.prompt), min(self.limits.max_sequence_tokens, self.capacity)
        if prompt == 0:
            raise ValueError("the prompt is empty")
        if prompt >= limit:
            raise ValueError(
                f"the prompt has {prompt} tokens; a sequence holds at most {limit} (prompt and completion)"
            )

    def submit(self, job: Job) -> None:
        """Queue `job` and return once it has joined the running sequences, or was answered
        (cancelled while it waited, or the engine stopped). Raises ValueError for a job that can
        never run."""
        self.check(job)
        with self._wake:
            if self._stopping:
                raise RuntimeError("the model is unloading")
            self._waiting.append(job)
            self._admit()  # it may fit now: then it joins without waiting for a step
            self._wake.notify()
        job.joined.wait()

    def load(self) -> dict[str, int]:
        """Sequences running and waiting, KV cells reserved and in all (for statistics and tests)."""
        with self._wake:
            running, waiting = len(self._running) + len(self._joining), len(self._waiting)
            return {"running": running, "waiting": waiting, "reserved": self._reserved, "capacity": self.capacity}

    def close(self) -> None:
        """Stop: every request still here fails with a clear error."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # --- the engine's thread ---

    def _loop(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._running and not self._joining and not self._waiting and not self._stopping:
                        self._wake.wait()
                    if self._stopping:
                        break
                    self._drop_cancelled_waiting()
                    self._admit()
                    joining, self._joining = self._joining, []
                self._running.extend(joining)
                for sequence in joining:
                    if sequence.job.prompt_logprobs:  # every position's logits: none from the cache
                        continue
                    if sequence.budget == 0:  # max_tokens 0: nothing to generate
                        self._finish(sequence, "length")
                    else:
                        self._reuse_prefix(sequence)
                self._step()
                self.meter.cells(self._reserved + self._cache.used, self.model.n_ctx)
        except Exception:  # a bug: answer everyone rather than leave them hanging
            log.exception("the LLM engine stopped")
        finally:
            self._fail_all("the model is unloading" if self._stopping else "the LLM engine stopped on an error")

    def _admit(self) -> None:
        """Move waiting requests that fit now, oldest first, to `_joining` (under `_wake`)."""
        while self._waiting and self._free_seqs:
            job = self._waiting[0]
            budget = min(self.limits.max_sequence_tokens, self.capacity) - len(job.prompt)
            if job.max_tokens is not None:
                budget = min(budget, max(job.max_tokens, 0))
            if self._reserved + len(job.prompt) + budget > self.capacity:
                return  # the oldest waits for room: no overtaking
            self._waiting.popleft()
            seed = job.seed if job.seed is not None else random.randrange(2**32)
            try:
                sampler = self.model.sampler(job.temperature, job.top_p, seed, _shaping(job, budget))
            except LlamaError as exc:  # a grammar llama.cpp refuses: this request fails, not the engine
                job.joined.set()
                self._answer(job.sink.fail, str(exc))
                continue
            sequence = _Sequence(job, self._free_seqs.pop(), sampler, budget)
            self.meter.prompt(len(job.prompt))  # on joining: a request cancelled while waiting brings none
            self._reserved += sequence.cells
            self._joining.append(sequence)
            job.joined.set()

    def _reuse_prefix(self, sequence: _Sequence) -> None:
        """Start a newcomer with the cells of the longest cached start its prompt shares (computed
        on its own adapter)."""
        sequence.fed = self._cache.lend(sequence.job.prompt, sequence.seq, sequence.job.adapter)

    def _cache_prompt(self, sequence: _Sequence) -> None:
        """Keep this prompt's cells (its sequence has just decoded them all) for the next ones."""
        self._cache.keep(sequence.job.prompt, sequence.seq, sequence.job.adapter)

    def _drop_cancelled_waiting(self) -> None:
        for job in [job for job in self._waiting if job.sink.cancelled()]:
            self._waiting.remove(job)
            self._answer(job.sink.end, "", "cancelled", 0)
            job.joined.set()

    def _step(self) -> None:
        for sequence in [s for s in self._running if s.job.sink.cancelled()]:
            self._finish(sequence, "cancelled")
        # one decode per LoRA adapter in use: llama.cpp applies an adapter to a whole decode
        parts: dict[int | None, _Part] = {}
        for sequence in self._running:
            if sequence.generating:
                entries, wanted, _ = parts.setdefault(sequence.job.adapter, ([], [], []))
                position = len(sequence.job.prompt) + sequence.produced - 1
                wanted.append((sequence, len(entries)))
                entries.append(Entry(sequence.next_token, position, sequence.seq, True))
        room = self.limits.n_batch - sum(len(part[0]) for part in parts.values())
        for sequence in self._running:
            if room <= 0:
                break
            if not sequence.generating:
                entries, wanted, scored = parts.setdefault(sequence.job.adapter, ([], [], []))
                prompt, start, every = sequence.job.prompt, sequence.fed, sequence.job.prompt_logprobs
                chunk = prompt[start : start + room]
                if every:  # each position's logits score the prompt's next token
                    scored.append((sequence, len(entries), start, len(chunk)))
                entries.extend(
                    Entry(token, start + i, sequence.seq, every or start + i == len(prompt) - 1)
                    for i, token in enumerate(chunk)
                )
                sequence.fed += len(chunk)
                room -= len(chunk)
                if sequence.generating:
                    wanted.append((sequence, len(entries) - 1))
        for adapter, part in parts.items():
            self._decode(part, adapter)

    def _decode(self, part: _Part, adapter: int | None) -> None:
        """Decode the step's entries of the sequences on one adapter, score the prompts that asked
        for their log probabilities, and sample the next tokens."""
        entries, wanted, scored = part
        try:
            self.model.decode(entries, adapter)
        except LlamaError as exc:
            for sequence in {id(s): s for s in self._batch_members(entries)}.values():
                self._release(sequence)
                self._answer(sequence.job.sink.fail, str(exc))
            return
        for sequence, first, start, count in scored:
            self._score_prompt(sequence, first, start, count)
        for sequence, index in wanted:
            if sequence.produced == 0:  # its prompt is all in
                self._cache_prompt(sequence)
                if sequence.job.prompt_logprobs:
                    self._answer(sequence.job.sink.prompt, sequence.prompt_logprobs)
                    if sequence.budget == 0:  # max_tokens 0: the prompt scored, nothing to generate
                        self._finish(sequence, "length")
                        continue
            # read before the draw, and raw: the sampler's chain shapes its own copy
            scores = None if sequence.job.logprobs is None else Distribution(self.model.logits(index))
            self._advance(sequence, self.model.sample(sequence.sampler, index), scores)

    def _score_prompt(self, sequence: _Sequence, first: int, start: int, count: int) -> None:
        """Prompt tokens `start + 1 ... start + count`'s log probabilities: the token at p from the
        logits at p - 1 (the last position's predict the first generated token); the first has none."""
        prompt, top = sequence.job.prompt, sequence.job.logprobs or 0
        if start == 0:
            sequence.prompt_logprobs.append(Logprob(self.model.piece(prompt[0]), None, []))
        for i in range(min(count, len(prompt) - 1 - start)):
            scores = Distribution(self.model.logits(first + i))
            sequence.prompt_logprobs.append(token_entry(self.model.piece, prompt[start + i + 1], scores, top))

    def _batch_members(self, entries: list[Entry]) -> list[_Sequence]:
        seqs = {entry.seq for entry in entries}
        return [s for s in self._running if s.seq in seqs]

    def _advance(self, sequence: _Sequence, token: int, scores: Distribution | None = None) -> None:
        if self.model.is_end(token):  # not part of the answer: nor of its log probabilities
            self._finish(sequence, "stop")
            return
        sequence.produced += 1
        now = time.monotonic()
        self.meter.token(now - sequence.last_token_s if sequence.last_token_s else None)
        sequence.last_token_s = now
        piece = self.model.piece(token)
        if scores is not None:
            sequence.logprobs.append(token_entry(self.model.piece, token, scores, sequence.job.logprobs or 0))
        text = sequence.detokenizer.feed(piece)
        if sequence.produced >= sequence.budget:
            self._finish(sequence, "length", text)
            return
        sequence.next_token = token
        # a token that ends inside a character waits, with its log probability, for the next
        if text and not self._answer(sequence.job.sink.text, text, sequence.produced, _taken(sequence)):
            self._release(sequence)

    def _finish(self, sequence: _Sequence, reason: str, text: str = "") -> None:
        if sequence not in self._running:
            return
        self._release(sequence)
        ending = text + sequence.detokenizer.flush()
        self._answer(sequence.job.sink.end, ending, reason, sequence.produced, _taken(sequence))

    def _release(self, sequence: _Sequence) -> None:
        self._running.remove(sequence)
        self.model.forget(sequence.seq)
        sequence.sampler.close()
        with self._wake:
            self._free_seqs.append(sequence.seq)
            self._reserved -= sequence.cells

    @staticmethod
    def _answer(call: Callable[..., None], *args: object) -> bool:
        """Hand output to a sink; a sink that raises (its client gone) loses its sequence, not the engine."""
        try:
            call(*args)
            return True
        except Exception:
            log.exception("could not deliver a generated answer")
            return False

    def _fail_all(self, message: str) -> None:
        with self._wake:
            self._running.extend(self._joining)
            self._joining = []
        for sequence in list(self._running):
            self._release(sequence)
            self._answer(sequence.job.sink.fail, message)
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
            self._stopping = True
        for job in waiting:
            self._answer(job.sink.fail, message)
            job.joined.set()


def _taken(sequence: _Sequence) -> list[Logprob]:
    """The log probabilities waiting to go out with the sequence's next text."""
    taken, sequence.logprobs = sequence.logprobs, []
    return taken
