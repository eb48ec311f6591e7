"""A clean start logs each line once; a clean Ctrl-C is quiet (issue 16 item 5)."""

from __future__ import annotations

import re
import signal
from collections import Counter

from tests.shoal.serving import one_model_repository, serve


def test_ctrl_c_is_quiet_and_started_lines_come_once(tmp_path):
    repository = one_model_repository(tmp_path / "models", "quiet")
    with serve(repository, tmp_path / "cache") as running:
        running.wait_for("Started Metrics Service")
        running.stop(signal.SIGINT)
        assert running.process.wait(60) == 0
    out = running.output()
    assert "| quiet " in out
    problems = [line for line in out.splitlines() if re.search(r" (W|E|WARNING|ERROR) |Traceback", line)]
    assert not problems, "\n".join(problems)
    started = Counter(line[line.index("Started ") :] for line in out.splitlines() if "Started " in line)
    assert started and all(n == 1 for n in started.values()), started
    assert any("Started HTTPService at 127.0.0.1:" in line for line in started)
