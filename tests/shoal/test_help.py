"""Every option of `shoal serve` and of each service has one line of help with its default (issue 16 item 4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from shared.process.settings import GatewaySettings, RepositorySettings, SchedulerSettings, WorkerSettings
from shoal.cli import parse_serve

COMMANDS = ["serve", "gateway", "scheduler", "worker", "repository", "status"]


def help_of(command: str) -> str:
    # wide enough that no help text wraps: one line per option
    env = {**os.environ, "COLUMNS": "400"}
    out = subprocess.run(
        [sys.executable, "-m", "shoal.cli", command, "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def options(text: str) -> dict[str, list[str]]:
    """Option -> its help lines (an option line starts with two spaces and a dash; its help follows)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.split("options:", 1)[1].splitlines():
        match = re.match(r"  (-{1,2}[\w-]+)", line)
        if match:
            current = match.group(1)
            rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            found[current] = [rest[1]] if len(rest) > 1 else []
        elif current and line.startswith("    ") and line.strip():
            found[current].append(line.strip())
    return found


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_one_line_of_help_with_its_default(command):
    found = options(help_of(command))
    assert len(found) > 2
    for option, lines in found.items():
        if option in ("-h", "--help"):
            continue
        assert len(lines) == 1, f"shoal {command} {option}: {lines}"
        match = re.fullmatch(r"(\S.*?)\s*\(default: (.+)\)", lines[0])
        assert match, f"shoal {command} {option} has no text or no default: {lines[0]!r}"


def test_serve_defaults_are_the_settings_models_defaults():
    args = parse_serve([])
    gateway, repository, worker, scheduler = (
        GatewaySettings(),
        RepositorySettings(),
        WorkerSettings(),
        SchedulerSettings(),
    )
    assert args.http_port == gateway.http_port and args.metrics_port == gateway.metrics_port
    assert args.http_address == gateway.http_address and args.http_max_input_size == gateway.http_max_input_size
    assert args.exit_timeout_secs == gateway.exit_timeout_s and args.request_timeout_secs == gateway.request_timeout_s
    assert args.strict_readiness is gateway.strict_readiness and args.allow_client_shm is gateway.allow_client_shm
    assert args.model_control_mode == repository.model_control_mode
    assert args.repository_poll_secs == repository.repository_poll_secs
    assert args.rate_limit == scheduler.rate_limit and args.python_isolation == worker.python_isolation


def test_serve_takes_python_isolation_for_its_workers():
    from shoal.supervisor import build_cluster

    args = parse_serve(["--python-isolation=none", "--workers=2"])
    cluster = build_cluster(args, "nats://127.0.0.1:1", __import__("pathlib").Path("/nonexistent"))
    assert [w.python_isolation for w in cluster.workers] == ["none", "none"]
    with pytest.raises(SystemExit):
        parse_serve(["--python-isolation=thread"])
