"""Stop sequences over streamed text: the text before the first stop string, never the stop itself.

The stream stops at the stop string that ends first (as a model checking after each token
would), whatever the pieces the text arrives in. A stop string can arrive split over several responses, so the scanner holds back the end of
the text that could still begin one (at most the longest stop string less one character) and
releases it once it cannot, or when the stream ends.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that may be shown now; after a stop string, nothing more."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        # the stop that ends first, as a model checking after each token would see it
        found = [(i + len(s), i) for s, i in ((s, self.pending.find(s)) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            shown, self.pending = self.pending[: min(found)[1]], ""
            return shown
        keep = self._held_back()
        shown, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return shown

    def flush(self) -> str:
        """The end of the stream: what was held back is text after all."""
        shown, self.pending = ("" if self.stopped else self.pending), ""
        return shown

    def _held_back(self) -> int:
        """The length of the longest end of `pending` that is the start of a stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest
