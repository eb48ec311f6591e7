"""Separate hosts on one machine, for the multi-host tests and benchmark (docs/reliability.md).

Each host is a Linux network namespace with its own address, its own loopback and its own
`/dev/shm` (a directory of the test's, bound over `/dev/shm` in a mount namespace of the host's
processes): a shared-memory handle made on one host means nothing on another, as on real
machines. The hosts hang off one bridge, which lives in a namespace of its own ("the switch"),
so nothing is added to the machine's own network: a link taken down there is a host cut off,
a `tbf` qdisc on it a slow link. Every host runs a nats-server node of one cluster (routes
between the hosts) and the services it is given; the services connect to their own host's node.

Ports inside a host are fixed (4222, 6222, 8222, 8000...): the namespace is the test's alone,
so nothing else can hold them. The test process itself stays in the machine's namespace; what
must reach a host (an HTTP client, a monitoring probe) runs on a thread that entered the host's
network namespace (`Host.call`, `Host.thread`).

Everything is torn down by the test that made it: processes first, then the namespaces (which
take their links with them). Namespaces left by a test process that was SIGKILLed carry its pid
in their name and are removed by the next run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shared.process import credentials, lifeline
from shared.process.natsserver import NatsServer
from shared.process.settings import (
    BusSettings,
    GatewaySettings,
    RepositorySettings,
    SchedulerSettings,
    WorkerSettings,
    to_argv,
)
from shared.process.settings_env import BaseSettings
from shared.wire.permissions import ADMIN
from shoal import private_runtime

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
PREFIX = "shoal-"  # namespace names: shoal-<pid of the test process>-<run>-<role>
SUBNET = "10.77.0"  # private addresses, only ever inside the namespaces made here
NATS_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
PING_INTERVAL_S = 2.0  # a route across a partition is given up after two missed pings (as in the compose file)
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def namespaces_refused() -> str | None:
    """Why this machine cannot make network namespaces (None: it can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install -y iproute2)"
    if shutil.which("unshare") is None:
        return "util-linux's `unshare` is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe-{uuid.uuid4().hex[:6]}"
    try:
        ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = exc.stderr.decode().strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        return f"`ip netns add` is refused here (root and CAP_SYS_ADMIN needed): {detail}"
    ip("netns", "del", probe)
    return None


def enter(namespace: str) -> None:
    """Move the calling thread (only it) into a network namespace: its new sockets live there."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)


def sweep_stale() -> None:
    """Namespaces of a test process that no longer exists (it was SIGKILLed before its clean-up)."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if name.startswith(PREFIX) and len(parts) > 2 and parts[1].isdigit() and not Path(f"/proc/{parts[1]}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@dataclass
class Host:
    index: int  # 1-based: the address is SUBNET.index
    namespace: str
    link: str  # this host's port on the switch (in the switch's namespace)
    switch: str
    shm_dir: Path
    nats: NatsServer | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # directories this host does not see (an empty tmpfs over each): the model repository on the
    # worker hosts, which share no disk with the repository's host (--model-files=store)
    hidden: list[Path] = field(default_factory=list)
    _pool: ThreadPoolExecutor | None = None

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index}"

    @property
    def name(self) -> str:
        return f"host{self.index}"

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run on this host: its network, its own /dev/shm and hostname."""
        hide = "".join(f"mount -t tmpfs shoal-hidden {shlex.quote(str(path))} && " for path in self.hidden)
        script = f'mount --bind "$1" /dev/shm && hostname "$2" && {hide}shift 2 && exec "$@"'
        return [
            "ip", "netns", "exec", self.namespace, "unshare", "--mount", "--uts",
            "sh", "-c", script, "sh", str(self.shm_dir), self.name, *argv,
        ]  # fmt: skip

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A process on this host that dies with the test process (shared/process/lifeline.py)."""
        with open(log, "ab") as out:
            process = lifeline.popen(
                self.command(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a thread inside this host's network (a client, a probe)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(4, initializer=enter, initargs=(self.namespace,))
        return self._pool.submit(fn, *args).result()

    def thread(self, fn: Callable[..., None], *args: Any) -> threading.Thread:
        """A started thread running `fn(*args)` inside this host's network."""

        def run() -> None:
            enter(self.namespace)
            fn(*args)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    # -- the network ------------------------------------------------------------------
    def cut(self) -> None:
        """The host's link goes down: nothing reaches it, nothing leaves it (no reset either)."""
        ip("-n", self.switch, "link", "set", self.link, "down")

    def heal(self) -> None:
        ip("-n", self.switch, "link", "set", self.link, "up")

    def limit(self, rate: str) -> None:
        """Both directions of the host's link shaped to `rate` (tbf, e.g. "40mbit")."""
        for namespace, device in ((self.namespace, "eth0"), (self.switch, self.link)):
            subprocess.run(
                ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root",
                 "tbf", "rate", rate, "burst", "64kb", "latency", "400ms"],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip

    def unlimit(self) -> None:
        for namespace, device in ((self.namespace, "eth0"), (self.switch, self.link)):
            subprocess.run(
                ["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", device, "root"],
                capture_output=True,
                timeout=30,
            )

    def stop(self, timeout: float = 10.0) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.nats is not None:
            self.nats.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class Hosts:
    """`count` hosts on one switch, each with a nats-server node of one cluster."""

    def __init__(self, count: int, workdir: Path | None = None) -> None:
        self.run = uuid.uuid4().hex[:6]
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="shoal-hosts-"))
        self.switch = f"{PREFIX}{os.getpid()}-{self.run}-sw"
        self.hosts = [
            Host(i, f"{PREFIX}{os.getpid()}-{self.run}-h{i}", f"port{i}", self.switch, self.workdir / f"host{i}-shm")
            for i in range(1, count + 1)
        ]
        # authenticated as a deployment is (docs/security.md): each service with its kind's identity,
        # the test's own clients (no credentials) as `admin`
        self.runtime = private_runtime.Runtime(self.workdir, credentials.make(self.workdir / "identities"))

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index - 1]

    def nats_url(self, host: Host) -> str:
        """A service connects to its own host's node (the others are learnt from it)."""
        assert host.nats is not None
        return host.nats.url

    def start(self) -> Hosts:
        sweep_stale()
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for host in self.hosts:
            host.shm_dir.mkdir(parents=True, exist_ok=True)
            ip("netns", "add", host.namespace)
            ip("-n", host.namespace, "link", "set", "lo", "up")
            ip(
                "link",
                "add",
                "eth0",
                "netns",
                host.namespace,
                "type",
                "veth",
                "peer",
                "name",
                host.link,
                "netns",
                self.switch,
            )
            ip("-n", self.switch, "link", "set", host.link, "master", "br0", "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
        routes = [f"{h.address}:{ROUTE_PORT}" for h in self.hosts]
        for host in self.hosts:
            host.nats = NatsServer(
                NATS_PORT,
                MONITOR_PORT,
                store_dir=str(self.workdir / f"host{host.index}-nats"),
                name=f"nats-{host.index}",
                route_port=ROUTE_PORT if len(self.hosts) > 1 else 0,
                host=host.address,
                route_urls=routes,
                prefix=host.command([]),
                ping_interval_s=PING_INTERVAL_S,
                authorization=self.runtime.identities.authorization(anonymous=ADMIN) if self.runtime.identities else "",
            )
            Path(host.nats.store_dir).mkdir(parents=True, exist_ok=True)
            host.call(host.nats.start)
        for host in self.hosts:  # clustered JetStream has elected a meta leader
            host.call(host.nats.wait_healthy, 60)
        return self

    def service(self, host: Host, service: str, settings: BaseSettings, env: dict[str, str] | None = None) -> None:
        """`shoal <service>` on `host`, its log in the work directory."""
        log = self.workdir / f"host{host.index}-{service}.log"
        if isinstance(settings, BusSettings):
            settings = private_runtime.assign(service, settings, self.runtime)
        host.start(
            [sys.executable, "-m", "shoal.cli", service, *to_argv(settings)],
            log,
            {"SHOAL_RUN_ID": self.run, **(env or {})},
        )

    def serve(
        self,
        models: Path,
        repository: dict[str, Any] | None = None,
        gateway: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        worker: dict[str, Any] | None = None,
    ) -> None:
        """Shoal as the compose file places it: the repository, scheduler and gateway (no co-hosted
        scheduler) on host 1, one worker on each other host (named after it); each service on its
        host's NATS node. The worker hosts do not see `models` (nor each other's model cache): the
        files they load come through NATS."""
        first = self[1]
        for host in self.hosts[1:]:
            host.hidden.append(models)
        url = self.nats_url(first)
        self.service(
            first, "repository", RepositorySettings(nats_url=url, model_repository=str(models), **(repository or {}))
        )
        self.service(
            first, "scheduler", SchedulerSettings(nats_url=url, scheduler_id="scheduler-1", **(scheduler or {}))
        )
        self.service(
            first,
            "gateway",
            GatewaySettings(
                nats_url=url,
                http_address=first.address,
                http_port=HTTP_PORT,
                grpc_address=first.address,
                grpc_port=GRPC_PORT,
                metrics_port=METRICS_PORT,
                **{"cohost_scheduler": False, **(gateway or {})},  # the compose file's default
            ),
        )
        for host in self.hosts[1:]:
            cache = str(self.workdir / f"{host.name}-model-files")
            settings = {"model_cache_dir": cache, **(worker or {})}
            self.service(host, "worker", WorkerSettings(nats_url=self.nats_url(host), worker_id=host.name, **settings))

    @property
    def url(self) -> str:
        """The gateway's HTTP endpoint (reachable from inside the hosts: `Host.call`)."""
        return f"{self[1].address}:{HTTP_PORT}"

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.workdir.glob("*.log"))
        )

    def stop(self) -> None:
        for host in reversed(self.hosts):  # the gateway's host last: it sees the others leave
            host.stop()
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True, timeout=30)
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def running_hosts(count: int, workdir: Path | None = None) -> Iterator[Hosts]:
    hosts = Hosts(count, workdir)
    try:
        yield hosts.start()
    finally:
        hosts.stop()
