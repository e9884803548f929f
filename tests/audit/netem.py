"""A userspace netem: relays IP packets between two TUN devices, one in this network namespace and
one in another, delaying each by a fixed time and dropping a share of them at random.

The kernel of the test machines has no netem qdisc (`tc qdisc add ... netem` fails with "Specified
qdisc kind is unknown") and no tc actions, so a member's impaired link is a pair of TUN devices
with this process between them. Run as ``python -m tests.audit.netem --netns NS --inner DEV
--outer DEV``; every line on stdin sets the impairment, ``DELAY_MS LOSS`` (``200 0.05``); ``0 0``
lifts it. The process prints ``ready`` once both devices are open.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import os
import random
import select
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536


def open_tun(name: str) -> int:
    """Attach to the existing (persistent) TUN device `name` of this thread's namespace."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    ns = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(ns, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(ns)


class Impairment:
    def __init__(self, seed: int) -> None:
        self.delay_s = 0.0
        self.loss = 0.0
        self.rng = random.Random(seed)

    def set(self, line: str) -> None:
        delay_ms, loss = line.split()
        self.delay_s, self.loss = float(delay_ms) / 1000, float(loss)

    def dropped(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss


def relay(outer: int, inner: int, impairment: Impairment) -> None:
    peer = {outer: inner, inner: outer}
    queue: list[tuple[float, int, int, bytes]] = []  # due, sequence, destination fd, packet
    seq = 0
    control = sys.stdin.fileno()
    watched = [outer, inner, control]
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        readable, _, _ = select.select(watched, [], [], timeout)
        for fd in readable:
            if fd == control:
                line = sys.stdin.readline()
                if not line:
                    return  # the harness is gone: so is the link
                if line.strip():
                    impairment.set(line)
                continue
            while True:
                try:
                    packet = os.read(fd, MAX_PACKET)
                except BlockingIOError:
                    break
                if impairment.dropped():
                    continue
                seq += 1
                due = time.monotonic() + impairment.delay_s
                heapq.heappush(queue, (due, seq, peer[fd], packet))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dest, packet = heapq.heappop(queue)
            # A full device queue drops the packet, as a full link would.
            with contextlib.suppress(BlockingIOError):
                os.write(dest, packet)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--netns", required=True, help="the namespace of the inner device")
    ap.add_argument("--inner", required=True, help="TUN device in --netns")
    ap.add_argument("--outer", required=True, help="TUN device in this namespace")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    outer = open_tun(args.outer)
    enter_netns(args.netns)
    inner = open_tun(args.inner)
    print("ready", flush=True)
    relay(outer, inner, Impairment(args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
