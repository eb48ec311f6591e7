"""llama.cpp's C API (llama.h) through llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`).

Continuous batching needs the C API itself, not llama-cpp-python's `Llama` class (one sequence
at a time): a batch of tokens from several sequences, a KV cache shared by sequences, a sampler
per sequence. One `LlamaModel` is one model and one context; its methods are called from one
thread at a time (the engine's), as llama.cpp requires.

A portable build of llama-cpp-python (docs/openai.md: `GGML_BACKEND_DL` with
`GGML_CPU_ALL_VARIANTS`) has no CPU code in libllama: its CPU backend is one of several
libraries, one per instruction set, and `cpu.py` picks the one this process loads, before
`llama_backend_init`, through `Library.start(variant)`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

log = logging.getLogger("shoal.llm")

_GGML_LOG_LEVEL_WARN = 3  # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5


class LlamaError(Exception):
    """llama.cpp refused: a library or file it cannot load, a batch it cannot decode."""


@dataclass(frozen=True)
class ContextSettings:
    """One context's bounds. `n_ctx` KV cells are shared by all sequences (a unified cache); the
    context has `cache_entries` sequence ids more than `max_sequences`, for the engine's prompt cache."""

    n_ctx: int = 8192
    max_sequences: int = 8
    n_batch: int = 512  # the most tokens one decode takes (prompt chunks and decode steps together)
    n_threads: int = 1  # for a batch of one token (one sequence generating)
    n_threads_batch: int = 1  # for a batch of several (sequences together, prompts)
    flash_attention: bool = False
    cache_entries: int = 1  # prompts the engine's prompt cache keeps (`prompt_cache.py`)


@dataclass(frozen=True)
class Entry:
    """One token of a batch: which sequence, where, and whether its logits are wanted."""

    token: int
    pos: int
    seq: int
    logits: bool


def library_folder() -> Path:
    """Where llama-cpp-python keeps libllama and the ggml libraries (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise LlamaError("llama-cpp-python is not installed: pip install '.[llm]' (docs/openai.md)")
    return Path(spec.submodule_search_locations[0]) / "lib"


def _loaded_ggml() -> ctypes.CDLL:
    """The libggml that libllama loaded. A wheel holds `libggml.so` and `libggml.so.0` as two
    files (a zip has no links): opening the first by its path would load a second copy with a
    registry of its own, so it is opened by the name libllama needs, which finds the one loaded."""
    sonames = sorted((path.name for path in library_folder().glob("libggml.so.*")), key=len)
    return ctypes.CDLL(sonames[0] if sonames else str(library_folder() / "libggml.so"))


class Library:
    """The loaded library, once per process. It keeps llama.cpp's recent warnings and errors for
    the messages of failures (llama.cpp logs them rather than returning them)."""

    _instance: Library | None = None
    _lock = threading.Lock()

    def __init__(self, variant: Path | None) -> None:
        from llama_cpp import llama_cpp as api  # loads libllama (and, through it, libggml)

        self.api: Any = api
        self.variant = variant
        self.messages: deque[str] = deque(maxlen=16)
        self._callback = api.llama_log_callback(self._on_log)  # kept: C holds a pointer to it
        api.llama_log_set(self._callback, ctypes.c_void_p(0))
        if variant is not None:
            ggml = _loaded_ggml()
            ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
            ggml.ggml_backend_load.restype = ctypes.c_void_p
            if not ggml.ggml_backend_load(str(variant).encode()):
                raise LlamaError(f"ggml cannot load the CPU backend {variant}: {self.recent() or 'no reason given'}")
        api.llama_backend_init()

    @classmethod
    def start(cls, variant: Path | None = None) -> Library:
        """Load the library (with this CPU backend, for a portable build); the first call decides."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = Library(variant)
            elif cls._instance.variant != variant:
                raise LlamaError(f"llama.cpp already runs with {cls._instance.variant} in this process, not {variant}")
            return cls._instance

    def _on_log(self, level: int, text: bytes | None, _: Any) -> None:
        if level >= _GGML_LOG_LEVEL_WARN and level != 5 and text:
            line = text.decode("utf-8", "replace").strip()
            if line:
                self.messages.append(line)
                log.debug("llama.cpp: %s", line)

    def recent(self) -> str:
        """llama.cpp's latest warnings and errors, for an error message."""
        return "; ".join(self.messages)

    def system_info(self) -> str:
        return bytes(self.api.llama_print_system_info()).decode("utf-8", "replace").strip()


class Penalties(NamedTuple):
    """OpenAI's `frequency_penalty` and `presence_penalty` (each in -2..2; 0: none) over the last
    `last_n` tokens the sequence generated: a token's logit loses frequency x its count so far, and
    presence once it has appeared (llama.cpp's penalties sampler does exactly this)."""

    frequency: float
    presence: float
    last_n: int


@dataclass(frozen=True)
class LazyGrammar:
    """A grammar that joins the sampler once the output ends with one of its openings (at a token's
    end), first in the chain: (opening, GBNF of all that follows it), longest opening first.

    llama.cpp's own lazy grammar (`llama_sampler_init_grammar_lazy_patterns`) is not used: it
    matches its trigger pattern against all the text so far after every token (in this build, 2.8
    ms a token after 100 tokens of free text, 300 ms after 500), and a token that completes the
    trigger and carries text the grammar refuses (SmolLM2's `>.` after `<tool_call`) throws
    through its C API, which aborts the process (docs/openai.md, "Tool calling")."""

    openings: tuple[tuple[str, str], ...]
    tools: str = ""  # the functions' names, for the log


class Shaping(NamedTuple):
    """What a sequence's sampler does to the logits before its draw."""

    penalties: Penalties | None
    logit_bias: dict[int, float]  # token id (in the vocabulary) -> added to its logit
    grammar: str | LazyGrammar = ""  # GBNF (root rule `root`) every token must keep the output within


class Sampler:
    """One sequence's sampling chain: greedy at temperature 0, else top-p, temperature and a
    seeded draw."""

    def __init__(
        self, api: Any, temperature: float, top_p: float, seed: int, shaping: Shaping | None, vocab: Any
    ) -> None:
        self._api = api
        self.chain = api.llama_sampler_chain_init(api.llama_sampler_chain_default_params())
        self._lazy: LazyGrammar | None = None  # a lazy grammar, until its opening comes
        self._vocab: Any = None
        self._tail = b""  # the output's last bytes, while a lazy grammar waits
        if shaping is not None:  # first: they change the logits the rest choose from
            try:
                self._shape(shaping, vocab)
            except LlamaError:
                self.close()
                raise
        if temperature <= 0:
            api.llama_sampler_chain_add(self.chain, api.llama_sampler_init_greedy())
        else:
            if top_p < 1:
                api.llama_sampler_chain_add(self.chain, api.llama_sampler_init_top_p(top_p, 1))
            api.llama_sampler_chain_add(self.chain, api.llama_sampler_init_temp(temperature))
            api.llama_sampler_chain_add(self.chain, api.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def _shape(self, shaping: Shaping, vocab: Any) -> None:
        api = self._api
        n_vocab = int(api.llama_vocab_n_tokens(vocab))
        if isinstance(shaping.grammar, LazyGrammar):  # compiled when its opening comes (`seen`), if ever
            self._lazy, self._vocab = shaping.grammar, vocab
        elif shaping.grammar:  # first: no other sampler may bring back a token the grammar rules out
            api.llama_sampler_chain_add(self.chain, self._grammar(vocab, shaping.grammar))
        if shaping.logit_bias:  # token ids checked against the vocabulary by the caller
            biases = (api.llama_logit_bias * len(shaping.logit_bias))(*shaping.logit_bias.items())
            api.llama_sampler_chain_add(self.chain, api.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
        if shaping.penalties is not None:  # repeat penalty 1.0: off (OpenAI has none)
            penalties = shaping.penalties
            penalty = api.llama_sampler_init_penalties(
                n_vocab, penalties.last_n, 1.0, penalties.frequency, penalties.presence
            )
            api.llama_sampler_chain_add(self.chain, penalty)

    def _grammar(self, vocab: Any, text: str) -> Any:
        grammar = self._api.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not grammar:
            raise LlamaError("llama.cpp refused the grammar")
        return grammar

    @property
    def waiting(self) -> bool:
        """A lazy grammar waits for its opening: the sampler wants each token's text (`seen`)."""
        return self._lazy is not None

    def seen(self, piece: bytes) -> None:
        """The latest token's text: at an opening, its grammar (compiled now: one grammar, only
        for an answer that calls) goes first in the chain, the other samplers after it as they
        are (the penalties' counts and the draw's state kept). A grammar llama.cpp refuses leaves
        the call unguided, with a warning, as a schema the converter cannot take does."""
        assert self._lazy is not None
        self._tail = (self._tail + piece)[-32:]
        text = next((text for opening, text in self._lazy.openings if self._tail.endswith(opening.encode())), None)
        if text is None:
            return
        lazy, self._lazy = self._lazy, None
        try:
            grammar = self._grammar(self._vocab, text)
        except LlamaError:
            log.warning(
                "tool_choice auto: llama.cpp refused the grammar of the tools %s, calls run unguided", lazy.tools
            )
            return
        api = self._api
        others = [api.llama_sampler_chain_remove(self.chain, 0) for _ in range(api.llama_sampler_chain_n(self.chain))]
        for sampler in [grammar, *others]:
            api.llama_sampler_chain_add(self.chain, sampler)

    def close(self) -> None:
        self._lazy = None
        if self.chain is not None:
            self._api.llama_sampler_free(self.chain)
            self.chain = None
            self.chain = None


class LlamaModel:
    """A GGUF model and one context of `settings.max_sequences` sequences."""

    def __init__(self, path: Path, settings: ContextSettings, library: Library) -> None:
        self.library, self.settings = library, settings
        self.api = api = library.api
        params = api.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = api.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise LlamaError(f"llama.cpp cannot load {path}: {library.recent() or 'no reason given'}")
        context = api.llama_context_default_params()
        context.n_ctx = settings.n_ctx
        context.n_batch = context.n_ubatch = settings.n_batch
        context.n_seq_max = settings.max_sequences + settings.cache_entries  # and those that keep prompts' cells
        context.n_threads, context.n_threads_batch = settings.n_threads, settings.n_threads_batch
        context.kv_unified = True  # any sequence may use any cell: the engine bounds the total
        context.no_perf = True
        # llama-cpp-python's default, and its server's: the same numerics as the library used alone
        context.flash_attn_type = 1 if settings.flash_attention else 0
        self.context = api.llama_init_from_model(self.model, context)
        if not self.context:
            api.llama_model_free(self.model)
            raise LlamaError(f"llama.cpp cannot make a context for {path}: {library.recent() or 'no reason given'}")
        self.n_ctx = int(api.llama_n_ctx(self.context))
        self.vocab = api.llama_model_get_vocab(self.model)
        self.memory = api.llama_get_memory(self.context)
        self._batch = api.llama_batch_init(settings.n_batch, 0, 1)
        self._piece = ctypes.create_string_buffer(256)
        self._n_vocab = int(api.llama_vocab_n_tokens(self.vocab))
        self._adapters: list[Any] = []  # LoRA adapters on this model, by the index `load_adapter` gave
        self._adapter: int | None = None  # the one the context applies now (None: the base model)

    # --- text ---

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<|im_start|>`) are parsed as such."""
        data = text.encode()
        room = len(data) + 8
        while True:
            tokens = (self.api.llama_token * room)()
            count = self.api.llama_tokenize(self.vocab, data, len(data), tokens, room, add_special, True)
            if count >= 0:
                return tokens[:count]
            room = -count

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (part of a UTF-8 character, possibly)."""
        count = self.api.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, special)
        if count < 0:
            self._piece = ctypes.create_string_buffer(-count)
            count = self.api.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, special)
        return self._piece.raw[:count]

    def is_end(self, token: int) -> bool:
        """An end-of-generation token (`<|im_end|>`, `<|endoftext|>`, ...)."""
        return bool(self.api.llama_vocab_is_eog(self.vocab, token))

    def chat_template(self) -> str | None:
        text = self.api.llama_model_chat_template(self.model, None)
        return None if not text else bytes(text).decode("utf-8", "replace")

    def special_text(self, which: str) -> str:
        """`bos` or `eos` as text, for chat templates that write them."""
        api = self.api
        token = api.llama_vocab_bos(self.vocab) if which == "bos" else api.llama_vocab_eos(self.vocab)
        return "" if token < 0 else self.piece(token, special=True).decode("utf-8", "replace")

    # --- decoding ---

    def load_adapter(self, path: Path) -> int:
        """Load a LoRA adapter (GGUF) for this model; its index names it to `decode`. The base
        weights are not copied: llama.cpp adds the adapter's low-rank product while decoding."""
        adapter = self.api.llama_adapter_lora_init(self.model, str(path).encode())
        if not adapter:
            raise LlamaError(f"llama.cpp cannot load the LoRA adapter {path}: {self.library.recent() or 'no reason'}")
        self._adapters.append(adapter)
        return len(self._adapters) - 1

    def _use_adapter(self, adapter: int | None) -> None:
        """Make the context apply `adapter` (None: none) to every token of the next decodes."""
        if adapter == self._adapter:
            return
        api = self.api
        if adapter is None:  # no adapters: the base model (llama.h has no separate clear call)
            status = api.llama_set_adapters_lora(self.context, None, 0, None)
        else:
            adapters = (api.llama_adapter_lora_p_ctypes * 1)(self._adapters[adapter])
            status = api.llama_set_adapters_lora(self.context, adapters, 1, (ctypes.c_float * 1)(1.0))
        if status != 0:
            raise LlamaError(f"llama.cpp cannot switch to LoRA adapter {adapter}: {self.library.recent()}")
        self._adapter = adapter

    def decode(self, entries: Sequence[Entry], adapter: int | None = None) -> None:
        """Run one batch (at most `settings.n_batch` entries) through the base model with LoRA
        adapter `adapter` (an index from `load_adapter`; None: none); the logits of the entries
        that asked for them are then what `sample` reads, by the entry's index in `entries`."""
        self._use_adapter(adapter)
        batch = self._batch
        token, pos, n_seq_id, seq_id, logits = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        for i, entry in enumerate(entries):
            token[i] = entry.token
            pos[i] = entry.pos
            n_seq_id[i] = 1
            seq_id[i][0] = entry.seq
            logits[i] = entry.logits
        batch.n_tokens = len(entries)
        status = self.api.llama_decode(self.context, batch)
        if status != 0:
            meaning = {1: "no room in the KV cache", 2: "aborted"}.get(status, "an error")
            raise LlamaError(f"llama_decode returned {status} ({meaning}): {self.library.recent()}")

    @property
    def n_vocab(self) -> int:
        return int(self.api.llama_vocab_n_tokens(self.vocab))

    def sampler(self, temperature: float, top_p: float, seed: int, shaping: Shaping | None = None) -> Sampler:
        return Sampler(self.api, temperature, top_p, seed, shaping, self.vocab)

    def sample(self, sampler: Sampler, index: int) -> int:
        token = int(self.api.llama_sampler_sample(sampler.chain, self.context, index))
        if sampler.waiting:
            sampler.seen(self.piece(token))
        return token

    def logits(self, index: int) -> np.ndarray:
        """The logits of the entry at `index` of the last `decode` (a view of llama.cpp's own
        buffer, valid until the next decode: copy what must outlive it)."""
        pointer = self.api.llama_get_logits_ith(self.context, index)
        if not pointer:
            raise LlamaError(f"llama.cpp has no logits for batch entry {index}: {self.library.recent()}")
        return np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))

    def forget(self, seq: int) -> None:
        """Free a sequence's KV cells."""
        self.api.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def share(self, source: int, target: int, length: int) -> None:
        """Give `target` the KV cells of `source`'s first `length` positions (shared, not copied:
        a cell belongs to every sequence that has it)."""
        self.api.llama_memory_seq_cp(self.memory, source, target, 0, length)

    def close(self) -> None:
        if self.context:
            self.api.llama_batch_free(self._batch)
            self.api.llama_free(self.context)
            self.api.llama_model_free(self.model)  # and its adapters with it (llama.h)
            self.context = None
