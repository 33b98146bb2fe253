"""Host names and host lists as inventories write them: a SLURM hostlist expanded (`expand_hostlist`), one host
however it is spelt (`same_host`, `loopback`), what is no host name (`host_problem`), a proxy_jump's parts."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket

import hostlist


def expand_hostlist(pattern: str) -> list[str]:
    """A SLURM hostlist (`h20-[01-04]`, `sitea-[1-2],siteb-[01,03-04]`, `r[1-2]n[1-2]`) as host names, in order,
    zero padding kept (python-hostlist, the syntax `scontrol show hostnames` reads). ValueError naming the list
    and what is wrong with it."""
    if not pattern or any(c.isspace() for c in pattern):
        raise ValueError(f"bad hostlist {pattern!r}: {'empty' if not pattern else 'contains whitespace'}")
    try:
        return [str(h) for h in hostlist.expand_hostlist(pattern)]
    except hostlist.BadHostlist as e:
        raise ValueError(f"bad hostlist {pattern!r}: {e}; e.g. 'node-[01-16]' or 'a-[1-2],b-7'") from e


_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")  # a host name, IPv4 or IPv6 address (no shell syntax)


def same_host(host: str) -> str:
    """What two spellings of one host share: DNS names ignore case (`H20-01` is `h20-01`) and one trailing dot (the
    root: `h20-01.` is `h20-01`), an IPv6 address has one compressed form (`2001:DB8:0::5` is `2001:db8::5`), an IPv4
    address its dotted quad (`127.1` is `127.0.0.1`, as inet_aton, and so ssh and getaddrinfo, read it)."""
    name = host.lower().removesuffix(".")
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fx.]+", name):  # (inet_aton takes what follows a space as well: no space here)
        with contextlib.suppress(OSError):
            return socket.inet_ntoa(socket.inet_aton(name))
    return name


def host_problem(host: str) -> str | None:
    """Why `host` is not a host name or address (it reaches ssh command lines, sbatch and the agents' addresses),
    None when it is. A ':' belongs to an IPv6 address only: `login:2222` is a port, which fabric refused at connect
    with a ValueError (the scheduler's port says it)."""
    if _HOST_NAME.fullmatch(host) and ":" not in host:
        return None
    try:
        ipaddress.IPv6Address(host)
        return None
    except ValueError:
        pass
    return (
        f"{host!r} is not a host name or address (letters, digits, '-', '_', '.', or an IP address); a user or a "
        "port goes in the scheduler's user / port (a SLURM submit host's ssh_user / ssh_port)"
    )


def jump_host_parts(spec: str) -> tuple[str, str, str | None]:
    """A `proxy_jump: [user@]host[:port]` as ssh -J reads it: (user, '' for none; host; port as written, None for
    none). An IPv6 address with a port goes in brackets (`[fd00::1]:2222`); bare, it has none (`fd00::1`).
    ValueError for a '[' with no ']' or anything but ':port' after it."""
    user, _, rest = spec.rpartition("@")
    if rest.startswith("["):
        host, closed, after = rest[1:].partition("]")
        if not closed or (after and not after.startswith(":")):
            raise ValueError(f"{rest!r}: write an IPv6 address with a port as [address]:port, e.g. [fd00::1]:2222")
        return user, host, after[1:] if after else None
    if rest.count(":") == 1:  # host:port (not a bare IPv6 address)
        host, _, port = rest.partition(":")
        return user, host, port
    return user, rest, None


def loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback however written (`same_host`): localhost, 127.0.0.0/8 (`127.1` too),
    ::1, an IPv4-mapped IPv6 one (::ffff:127.0.0.1)."""
    key = same_host(host)
    if key == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(key)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
