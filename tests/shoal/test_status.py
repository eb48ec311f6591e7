"""`shoal status` names the cluster it shows and lets the user pick one (issue 16 item 3)."""

from __future__ import annotations

import re
import subprocess
import sys

from shared.process.natsserver import free_port
from tests.shoal.serving import one_model_repository, serve, status_env


def shoal_status(cache, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli", "status", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=status_env(cache),
    )


def nats_url_in(output: str) -> str:
    match = re.search(r"NATS (nats://\S+)", output)
    assert match, output
    return match.group(1)


def test_status_names_its_nats_and_picks_a_serve_by_http_port(tmp_path):
    cache = tmp_path / "cache"
    alpha_repo = one_model_repository(tmp_path / "a" / "models", "alpha")
    beta_repo = one_model_repository(tmp_path / "b" / "models", "beta")
    with serve(alpha_repo, cache) as alpha, serve(beta_repo, cache) as beta:
        alpha.wait_for("| alpha ")
        beta.wait_for("| beta ")

        shown = {}
        for running, model, other in ((alpha, "alpha", "beta"), (beta, "beta", "alpha")):
            out = shoal_status(cache, f"--http-port={running.http_port}")
            assert out.returncode == 0, out.stderr
            first = out.stdout.splitlines()[0]
            assert f"HTTP port {running.http_port}" in first and f"pid {running.process.pid}" in first
            assert f"{model}/1 READY" in out.stdout and other not in out.stdout
            shown[model] = nats_url_in(first)
        assert shown["alpha"] != shown["beta"]

        # by NATS URL: the same cluster
        out = shoal_status(cache, f"--nats-url={shown['beta']}")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == f"NATS {shown['beta']} (--nats-url)"
        assert "beta/1 READY" in out.stdout and "alpha" not in out.stdout

        # no choice: the latest serve, named, and the other one pointed at
        out = shoal_status(cache)
        first = out.stdout.splitlines()[0]
        latest, other = (beta, alpha) if f"HTTP port {beta.http_port}" in first.split(";")[0] else (alpha, beta)
        assert nats_url_in(first) == shown["beta" if latest is beta else "alpha"]
        assert f"other `shoal serve` here: HTTP port(s) {other.http_port} (pick with --http-port)" in first

        # JSON keeps stdout parseable; the NATS line goes to stderr
        out = shoal_status(cache, f"--http-port={alpha.http_port}", "--json")
        assert out.stdout.lstrip().startswith("[") and "NATS nats://" in out.stderr

        unused = free_port()
        out = shoal_status(cache, f"--http-port={unused}")
        assert out.returncode != 0
        assert f"no `shoal serve` with HTTP port {unused} runs here" in out.stderr
        assert str(alpha.http_port) in out.stderr and str(beta.http_port) in out.stderr

    # both stopped: their records are gone
    out = shoal_status(cache, f"--http-port={alpha.http_port}")
    assert out.returncode != 0 and "HTTP ports: none" in out.stderr
