"""What the agent's proxy admits: the [internet] hosts as rules, a request's
`host:port` read, and whether an address is public (pure).

A target whose address is loopback, private, link-local or otherwise not
global is refused unless the list names it exactly (a name or an address):
the way in and the host's own services stay out of reach. An IPv6 address
carrying an IPv4 one (NAT64, 6to4, mapped...) is judged by that IPv4 address.
"""

from __future__ import annotations

import ipaddress


class Rules:
    """The [internet] hosts: exact names, `*.example.com`, optional `:port`; `*` any public host."""

    def __init__(self, hosts: list[str]):
        self.hosts = hosts
        self.any = "*" in hosts
        self.entries = []
        for entry in hosts:
            if entry == "*":
                continue
            name, port = entry, None
            if entry.rsplit(":", 1)[-1].isdigit() and entry.count(":") == 1:
                name, port_text = entry.rsplit(":", 1)
                port = int(port_text)
            self.entries.append((name.lower().rstrip("."), port))

    def admits(self, host: str, port: int) -> tuple[bool, bool]:
        """(admitted, named exactly): a named target may be private or loopback."""
        host = host.lower().rstrip(".")
        for name, allowed_port in self.entries:
            ports_ok = port == allowed_port if allowed_port is not None else port in (80, 443)
            if not ports_ok:
                continue
            if name == host:
                return True, True
            if name.startswith("*.") and host.endswith(name[1:]) and host != name[2:]:
                return True, False
        if self.any and port in (80, 443):
            return True, False
        return False, False

    def describe(self) -> str:
        return ", ".join(self.hosts) if self.hosts else "none"


def split_authority(text: str, default_port: str | None) -> tuple[str, str]:
    """`host:port`, `[v6]:port` or a bare host → (host, port text; "" when missing)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else (default_port or "")
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, default_port or ""


# IPv6 forms whose last 32 bits are an IPv4 address a gateway may reach:
# IPv4-compatible, IPv4-mapped, SIIT's IPv4-translated, NAT64's well-known prefix.
_LAST_32_BITS_IPV4 = tuple(ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96"))
# Never public: site-local (deprecated), and NAT64's local-use prefix, whose
# IPv4 lies where the network's own prefix length puts it (RFC 6052).
_NOT_PUBLIC_V6 = tuple(ipaddress.ip_network(n) for n in ("fec0::/10", "64:ff9b:1::/48"))


def public(address: str) -> bool:
    """A global unicast address; an IPv6 one that embeds an IPv4 address is judged by that."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _NOT_PUBLIC_V6):
            return False
        if any(ip in network for network in _LAST_32_BITS_IPV4):
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif ip.sixtofour:
            ip = ip.sixtofour
    return ip.is_global and not ip.is_multicast
