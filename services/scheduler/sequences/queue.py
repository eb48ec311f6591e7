"""What a sequence-batched model's queue holds besides its requests: its config and its book."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.scheduler.sequences.book import SequenceBook
from shared.sequence_config import SequenceConfig


@dataclass
class SequenceQueue:
    config: SequenceConfig
    book: SequenceBook
    reaper: asyncio.TimerHandle | None = None  # the next idle check
