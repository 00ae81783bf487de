"""Public identifiers: a short prefix plus a time-ordered, random, URL-safe body."""

import secrets
import time

# Crockford's base32: no I, L, O, U, so an id read aloud on a call is unambiguous.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _encode(number: int, length: int) -> str:
    chars = []
    for _ in range(length):
        number, rest = divmod(number, 32)
        chars.append(_ALPHABET[rest])
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """``<prefix>_`` + 26 characters: 48 bits of milliseconds then 80 random bits (ULID layout).

    Ids sort by creation time, so "newest first" can use the primary key index.
    """
    millis = time.time_ns() // 1_000_000
    return f"{prefix}_{_encode(millis, 10)}{_encode(secrets.randbits(80), 16)}"
