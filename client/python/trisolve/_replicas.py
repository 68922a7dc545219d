"""Several trisolved replicas behind one Client, as the C++ library does it (client/replicas.cc).

A target of several addresses (``"h1:p1,h2:p2"``) or a DNS name (``"dns:///name:port"``) gets one
channel balanced by gRPC's ``round_robin`` over the replicas whose ``grpc.health.v1`` status is
SERVING, retrying UNAVAILABLE and CANCELLED on another replica for the calls that hold no state
on one. A persistent system's handle ends with ``@HOST:PORT`` (the server's
``--advertise-address``); its calls go to that replica alone, once the address is found among
the target's (a client never sends its token where a handle alone says).
"""
from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

# The same service config as client/replicas.cc's BalancedServiceConfig (tests compare them).
SERVICE_CONFIG: Dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": "trisolve.v1.Solver"},
    "retryThrottling": {"maxTokens": 100, "tokenRatio": 0.1},
    "methodConfig": [{
        "name": [{"service": "trisolve.v1.Solver", "method": m} for m in (
            "SolveTridiagonal", "SolveTree", "SolveBlockTridiagonal", "SolveDense",
            "SolveStream", "GetServerInfo", "CreateSystem", "ListSystems")],
        "retryPolicy": {
            "maxAttempts": 5,
            "initialBackoff": "0.02s",
            "maxBackoff": "0.5s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
        },
    }],
}
# A request stays buffered to be retried: room for unary requests and CreateSystem's arrays.
RETRY_BUFFER_BYTES = 64 << 20
# As the C++ library's defaults (Client::Options::keepalive_s, keepalive_timeout_s): while a call
# is open, a connection silent for 30 s is pinged and dropped after 10 s without an answer, so
# that a replica gone without closing its connections fails over instead of hanging.
KEEPALIVE_OPTIONS = [("grpc.keepalive_time_ms", 30000), ("grpc.keepalive_timeout_ms", 10000),
                     ("grpc.http2.max_pings_without_data", 0)]


@dataclass
class TargetSpec:
    balanced: bool = False
    dial: str = ""
    dns_host: str = ""
    dns_port: str = ""
    addresses: List[str] = field(default_factory=list)  # a list's, resolved: "IP:PORT"
    tls_name: str = ""


def split_host_port(s: str) -> Tuple[str, str]:
    s = s.strip()
    if s.startswith("["):
        close = s.find("]")
        if close < 0 or not s[close + 1:].startswith(":"):
            raise ValueError(f"target {s!r}: expected [IPv6]:PORT")
        host, port = s[1:close], s[close + 2:]
    else:
        host, sep, port = s.rpartition(":")
        if not sep:
            raise ValueError(f"target {s!r}: no port (expected HOST:PORT)")
        if ":" in host:
            raise ValueError(f"target {s!r}: an IPv6 address needs brackets")
    if not host or not port.isdigit():
        raise ValueError(f"target {s!r}: expected HOST:PORT")
    return host, port


def resolve(host: str, port: str) -> List[str]:
    """``HOST``, ``PORT`` as sorted ``"IP:PORT"`` strings (``"[IPv6]:PORT"``)."""
    out = set()
    for family, _, _, _, sa in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM):
        if family == socket.AF_INET:
            out.add(f"{sa[0]}:{port}")
        elif family == socket.AF_INET6:
            out.add(f"[{sa[0]}]:{port}")
    if not out:
        raise OSError(f"{host} has no address")
    return sorted(out)


def sockaddr_target(addresses: List[str]) -> str:
    """gRPC's ``ipv4:`` target for IPv4 alone, else ``ipv6:`` with IPv4 addresses mapped."""
    if not any(a.startswith("[") for a in addresses):
        return "ipv4:" + ",".join(addresses)
    v6 = []
    for a in addresses:
        if a.startswith("["):
            v6.append(a)
        else:
            ip, _, port = a.rpartition(":")
            v6.append(f"[::ffff:{ip}]:{port}")
    return "ipv6:" + ",".join(v6)


def parse_target(target: str) -> TargetSpec:
    spec = TargetSpec(dial=target)
    if target.startswith("dns:"):
        rest = target[4:]
        if rest.startswith("//"):
            slash = rest.find("/", 2)
            if slash < 0:
                raise ValueError(f"target {target!r}: expected dns:///NAME:PORT")
            rest = rest[slash + 1:]
        spec.dns_host, spec.dns_port = split_host_port(rest)
        spec.tls_name = spec.dns_host
        spec.balanced = True
        return spec
    if "," not in target:
        return spec
    entries = target
    if entries.startswith(("ipv4:", "ipv6:")):
        entries = entries[5:]
    for entry in filter(None, (e.strip() for e in entries.split(","))):
        host, port = split_host_port(entry)
        spec.tls_name = spec.tls_name or host
        for a in resolve(host, port):
            if a not in spec.addresses:
                spec.addresses.append(a)
    if not spec.addresses:
        raise ValueError(f"target {target!r} names no address")
    spec.balanced = True
    spec.dial = sockaddr_target(spec.addresses)
    return spec


def replica_of(handle: str) -> str:
    """``"sys-...@HOST:PORT"`` gives ``"HOST:PORT"``; a handle without one gives ``""``."""
    return handle.partition("@")[2]


class Replicas:
    """Each handle's replica's ``(channel, stub)``, made on first use by ``make(target, False)``."""

    def __init__(self, spec: TargetSpec, make_channel: Callable[[str, bool], Any]) -> None:
        self.spec = spec
        self._make_channel = make_channel
        self._lock = threading.Lock()
        self._channels: Dict[str, Any] = {}

    def current(self) -> List[str]:
        if self.spec.dns_host:
            return resolve(self.spec.dns_host, self.spec.dns_port)
        return list(self.spec.addresses)

    def channel_for(self, key: str, resolved: str) -> Any:
        with self._lock:
            ch = self._channels.get(key)
            if ch is None:
                ch = self._channels[key] = self._make_channel(sockaddr_target([resolved]), False)
            return ch

    def for_handle(self, handle: str) -> Optional[Any]:
        """The handle's replica's ``(channel, stub)``; None: the balanced channel's (not balanced,
        or no replica named). Raises LookupError when the replica is not one of the target's,
        ConnectionError when the target's name cannot be resolved now."""
        replica = replica_of(handle)
        if not self.spec.balanced or not replica:
            return None
        with self._lock:
            if replica in self._channels:
                return self._channels[replica]
        why = ""
        try:
            now = self.current()
        except socket.gaierror as e:
            if e.errno not in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                # The target's name cannot be resolved now: the handle may well be good.
                raise ConnectionError(f"system {handle}: cannot check its replica {replica}: "
                                      f"{e}") from None
            now, why = [], f"; {e}"
        try:
            for a in resolve(*split_host_port(replica)):
                if a in now:
                    return self.channel_for(replica, a)
        except (OSError, ValueError) as e:
            why += f"; {e}"
        where = (f"{self.spec.dns_host}'s addresses" if self.spec.dns_host
                 else ", ".join(self.spec.addresses))
        raise LookupError(f"system {handle}: its replica {replica} is not one of {where} (the "
                          f"replica went away and its systems with it, or the handle is another "
                          f"service's){why}")

    def all(self) -> List[Tuple[str, Any]]:
        try:
            now = self.current()
        except socket.gaierror as e:
            if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []  # no replica, no system
            raise
        return [(a, self.channel_for(a, a)) for a in now]

    def close(self) -> None:
        with self._lock:
            for ch, _ in self._channels.values():
                ch.close()
            self._channels.clear()


def service_config_json() -> str:
    return json.dumps(SERVICE_CONFIG)
