"""Public identifiers: a short prefix plus a time-ordered, random, URL-safe body."""

import secrets
import threading
import time

# Crockford's base32: no I, L, O, U, so an id read aloud on a call is unambiguous.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_lock = threading.Lock()
_last = (0, 0)


def _encode(number: int, length: int) -> str:
    chars = []
    for _ in range(length):
        number, rest = divmod(number, 32)
        chars.append(_ALPHABET[rest])
    return "".join(reversed(chars))


def _next() -> tuple[int, int]:
    """(milliseconds, random): random bits, but strictly increasing within this process
    when two ids share a millisecond (monotonic ULID), so "newest first" is exact."""
    global _last
    millis = time.time_ns() // 1_000_000
    with _lock:
        last_millis, last_random = _last
        if millis <= last_millis:
            millis = last_millis
            random = last_random + 1 + secrets.randbits(16)
            if random >= 1 << _RANDOM_BITS:
                millis, random = millis + 1, secrets.randbits(_RANDOM_BITS - 1)
        else:
            random = secrets.randbits(_RANDOM_BITS - 1)
        _last = (millis, random)
    return millis, random


def new_id(prefix: str) -> str:
    """``<prefix>_`` + 26 characters: 48 bits of milliseconds then 80 bits (ULID layout).

    Ids sort by creation time, so "newest first" can use the primary key index.
    """
    millis, random = _next()
    return f"{prefix}_{_encode(millis, 10)}{_encode(random, 16)}"
