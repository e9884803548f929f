"""A small network of Linux namespaces for fault tests: cut a member or a broker off, or slow and
lossy links, with iproute2 (`ip`) only.

`Lan` makes a bridge in this (the root) namespace with an address of its own, `Lan.address`,
where a broker in this namespace listens. `Lan.host` adds a network namespace joined to the
bridge by a veth pair: a member or a broker runs inside it (``ip netns exec``, see `Host.run`).
`Lan.cut` sets the veth's root end down, which drops every packet both ways without a word to
either side, as a pulled cable does (the namespace's end stays up, so its sockets see no error,
only silence); `Lan.heal` sets it up again.

`Lan.impaired_host` joins its namespace through a pair of TUN devices and a relay process
(tests/audit/netem.py) instead: `Lan.impair` makes the relay delay and drop packets, because the
test machines' kernel has no netem qdisc (``tc qdisc add dev X root netem delay 200ms loss 5%``
fails there with "Error: Specified qdisc kind is unknown."). Such a host reaches this namespace
(and a broker listening on `Lan.address`), not the hosts on the bridge.

Everything needs root (CAP_NET_ADMIN); `unavailable()` says why it cannot work here, for a
test's skip reason. Every name carries a random tag, so runs in several worktrees do not meet;
`close()` removes it all.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.audit.cluster import REPO


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be made on this machine (a test's skip reason), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if shutil.which("ip") is None:
        return (
            "iproute2 is not installed (`ip` is not on PATH): `make chaos` installs it when run "
            "as root, or apt-get install iproute2"
        )
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN): run make chaos as root"
    probe = f"weir-probe-{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
        ip("link", "add", probe[:15], "type", "bridge")
        ip("link", "del", probe[:15])
    except NetworkError as exc:
        return f"cannot create network namespaces or bridges here: {exc}"
    return None


@dataclass(frozen=True)
class Host:
    """A network namespace on the LAN: `address` is its IPv4 address, `link` the root end of its
    link (a veth on the bridge, or the relay's TUN device)."""

    name: str
    netns: str
    address: str
    link: str

    def run(self, *command: str) -> list[str]:
        """`command` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *command]


_CONNECT = """
import socket, sys, time
started = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError:
    print(-1)
else:
    print(time.monotonic() - started)
"""


def connect_seconds(host: Host, address: str, port: int, timeout: float) -> float | None:
    """How long a TCP connection from inside `host` to `address`:`port` takes to open (the
    network's round trip), or None if it cannot open within `timeout`: proof that a fault is
    in place."""
    command = host.run(sys.executable, "-c", _CONNECT, address, str(port), str(timeout))
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    seconds = float(out)
    return None if seconds < 0 else seconds


def _used_subnets() -> set[str]:
    out = ip("-4", "-o", "route", "show", "table", "all")
    return {word for word in out.split() if "/" in word}


class Lan:
    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"wb{self.tag}"
        used = _used_subnets()
        for _ in range(100):
            net = f"10.{random.randint(200, 254)}.{random.randint(0, 255)}.0/24"
            if net not in used:
                break
        else:
            raise NetworkError(f"no free 10.x.y.0/24 subnet here (routes: {sorted(used)})")
        self.network = ipaddress.IPv4Network(net)
        self.address = str(self.network[1])
        self.hosts: list[Host] = []
        self._relays: dict[str, subprocess.Popen[str]] = {}
        self._tuns: list[str] = []
        ip("link", "add", self.bridge, "type", "bridge")
        try:
            ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def _namespace(self, name: str) -> tuple[str, str]:
        netns = f"weir-{self.tag}-{name}"
        address = str(self.network[10 + len(self.hosts)])
        ip("netns", "add", netns)
        ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
        return netns, address

    def host(self, name: str) -> Host:
        """A namespace on the bridge, with its own address."""
        netns, address = self._namespace(name)
        outer, inner = f"w{self.tag}{len(self.hosts)}", f"w{self.tag}{len(self.hosts)}p"
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", netns)
        ip("link", "set", outer, "master", self.bridge)
        ip("link", "set", outer, "up")
        ip("netns", "exec", netns, "ip", "addr", "add", f"{address}/24", "dev", inner)
        ip("netns", "exec", netns, "ip", "link", "set", inner, "up")
        host = Host(name, netns, address, outer)
        self.hosts.append(host)
        return host

    def impaired_host(self, name: str, workdir: Path) -> Host:
        """A namespace joined to this one through the netem relay (no impairment until
        `impair`); its log goes to `workdir`/netem-NAME.log."""
        netns, address = self._namespace(name)
        outer, inner = f"w{self.tag}{len(self.hosts)}t", "tun0"
        ip("tuntap", "add", "dev", outer, "mode", "tun")
        self._tuns.append(outer)
        ip("link", "set", outer, "up")
        ip("route", "add", f"{address}/32", "dev", outer)
        inside = ["netns", "exec", netns, "ip"]
        ip(*inside, "tuntap", "add", "dev", inner, "mode", "tun")
        ip(*inside, "addr", "add", f"{address}/32", "dev", inner)
        ip(*inside, "link", "set", inner, "up")
        ip(*inside, "route", "add", "default", "dev", inner)
        log: IO[str] = (workdir / f"netem-{name}.log").open("a")
        seed = str(random.randrange(1 << 30))
        command = [sys.executable, "-m", "tests.audit.netem", "--netns", netns, "--seed", seed]
        relay = subprocess.Popen(
            [*command, "--inner", inner, "--outer", outer],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert relay.stdout is not None
        if relay.stdout.readline().strip() != "ready":
            relay.kill()
            raise NetworkError(f"the netem relay of {name} did not start: see {log.name}")
        self._relays[name] = relay
        host = Host(name, netns, address, outer)
        self.hosts.append(host)
        return host

    def cut(self, host: Host) -> None:
        ip("link", "set", host.link, "down")

    def heal(self, host: Host) -> None:
        ip("link", "set", host.link, "up")

    def impair(self, host: Host, delay_ms: float, loss: float) -> None:
        """Every packet to and from `host` waits `delay_ms` and is lost with probability
        `loss`; 0, 0 lifts it."""
        stdin = self._relays[host.name].stdin
        assert stdin is not None
        stdin.write(f"{delay_ms:g} {loss:g}\n")
        stdin.flush()

    def close(self) -> None:
        """Remove every namespace (their ends of the links go with them), relay, TUN device and
        the bridge; what is already gone is fine."""
        for relay in self._relays.values():
            relay.kill()
            relay.wait(10)
        self._relays.clear()
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
        self.hosts.clear()
        for dev in [*self._tuns, self.bridge]:
            subprocess.run(["ip", "link", "del", dev], capture_output=True, check=False)
        self._tuns.clear()
