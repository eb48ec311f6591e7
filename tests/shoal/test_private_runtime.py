"""`shoal serve`'s private runtime directory: 0700, each child handed its own kind's identity."""

from __future__ import annotations

import stat

from shared.process.settings import GatewaySettings, RepositorySettings, WorkerSettings
from shoal import private_runtime


def test_each_service_gets_its_kinds_identity_and_the_directory():
    runtime = private_runtime.make(embedded=True)
    try:
        assert stat.S_IMODE(runtime.directory.stat().st_mode) == 0o700
        assert runtime.identities is not None
        gateway = private_runtime.assign("gateway", GatewaySettings(), runtime)
        assert gateway.nats_credentials == runtime.identities.file("gateway")
        assert gateway.runtime_dir == str(runtime.directory)
        worker = private_runtime.assign("worker", WorkerSettings(), runtime)
        # its python models' processes run as `instance`, not as the worker
        assert worker.nats_credentials.endswith("worker.nk") and worker.instance_credentials.endswith("instance.nk")
        own = private_runtime.assign("repository", RepositorySettings(nats_credentials="/mine.nk"), runtime)
        assert own.nats_credentials == "/mine.nk"  # a service that names its own keeps it
        assert runtime.operator.endswith("operator.nk")
    finally:
        private_runtime.remove(runtime)
    assert not runtime.directory.exists()


def test_an_external_nats_without_credentials_gets_only_the_directory():
    runtime = private_runtime.make(embedded=False)
    try:
        assert runtime.identities is None and runtime.operator == ""
        assert private_runtime.assign("worker", WorkerSettings(), runtime).nats_credentials == ""
    finally:
        private_runtime.remove(runtime)


def test_an_external_nats_with_a_credentials_directory_hands_out_its_identities(tmp_path):
    from shared.process import credentials

    made = credentials.make(tmp_path / "ids")  # `shoal credentials --out DIR`
    runtime = private_runtime.make(embedded=False, credentials_dir=str(tmp_path / "ids"))
    try:
        assert runtime.identities == made
        assert private_runtime.assign("scheduler", WorkerSettings(), runtime).nats_credentials == made.file("scheduler")
    finally:
        private_runtime.remove(runtime)
