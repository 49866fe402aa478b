"""Helpers shared by the benchmark scripts (run as `python3 bench/x.py`, so this is importable)."""
import socket


def one_line(exc, limit=600):
    """Condenses an exception chain (compiler output included) into one short line."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
        errs = [l for l in lines if "error" in l.lower()]
        parts.append(f"{type(exc).__name__}: " + " / ".join((errs or lines or [""])[:3]))
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)[:limit]


def free_port():
    """A TCP port on the loopback that nothing holds now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
