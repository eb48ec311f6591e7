"""Ctrl-C while `shoal serve` is still starting stops it at once, without a false error: the user
stopped it, nothing timed out (found in the README's first hour, issue 28)."""

from __future__ import annotations

import re
import signal

from tests.shoal.serving import one_model_repository, serve


def test_ctrl_c_while_starting_stops_without_a_timeout_error(tmp_path):
    repository = one_model_repository(tmp_path / "models", "early")
    # the ready wait would last 600 s: an exit far sooner is the interrupt's doing
    with serve(repository, tmp_path / "cache", "--ready-timeout-secs=600") as running:
        running.wait_for("embedded nats-server at")  # started, models not yet loaded
        running.stop(signal.SIGINT)
        code = running.process.wait(120)
    out = running.output()
    assert "Started HTTPService" not in out, "the interrupt came too late to test the start"
    assert code == 128 + signal.SIGINT, out  # what a shell reports for a start cut short by Ctrl-C
    assert "not loaded after" not in out
    problems = [line for line in out.splitlines() if re.search(r" (W|E|WARNING|ERROR) |Traceback", line)]
    assert not problems, "\n".join(problems)
