"""The Merkle tree of RFC 6962 / RFC 9162 §2.1 over a list of leaf hashes, with no models.

A tenant's sealed audit events, in sealing order, are the leaves: ``leaf_hash`` of an event's
link body (gateway.audit), interior nodes ``SHA-256(0x01 || left || right)``. A tree of ``n``
leaves splits at ``k``, the largest power of two below ``n``: the left subtree is full, the
right one holds the rest. This module computes the root, the inclusion proof (audit path) of
leaf ``m`` in a tree of size ``n``, the consistency proof between sizes ``m <= n``, and the
verifiers of both, as RFC 9162 §2.1.3.2 and §2.1.4.2 write them.

Everything takes the leaf hashes as a sequence and hashes subtrees on demand: O(n) per proof,
fine for tens of thousands of leaves per tenant. Past that, cache the hash of every full
power-of-two-aligned range once it is complete (it never changes in an append-only log) and
build proofs from O(log n) cached nodes.
"""

import hashlib
from collections.abc import Sequence

LEAF = b"\x00"
NODE = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """The hash of one leaf: SHA-256(0x00 || data)."""
    return hashlib.sha256(LEAF + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """The root of the tree over ``leaves`` (leaf hashes), in one pass with a stack of full
    subtrees; the empty tree's root is SHA-256 of nothing."""
    if not leaves:
        return EMPTY_ROOT
    stack: list[tuple[int, bytes]] = []
    for leaf in leaves:
        size, value = 1, leaf
        while stack and stack[-1][0] == size:
            below = stack.pop()
            size, value = size * 2, node_hash(below[1], value)
        stack.append((size, value))
    value = stack.pop()[1]
    while stack:
        value = node_hash(stack.pop()[1], value)
    return value


def inclusion_proof(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """The audit path of leaf ``m`` in the tree over ``leaves`` (RFC 9162 §2.1.3.1)."""
    n = len(leaves)
    if not 0 <= m < n:
        raise ValueError(f"leaf {m} is not in a tree of size {n}")
    path: list[bytes] = []
    low, high = 0, n
    while high - low > 1:
        k = _split(high - low)
        if m - low < k:
            path.append(root(leaves[low + k : high]))
            high = low + k
        else:
            path.append(root(leaves[low : low + k]))
            low += k
    path.reverse()
    return path


def consistency_proof(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """The proof that the tree of the first ``m`` leaves is a prefix of the tree over all of
    ``leaves`` (RFC 9162 §2.1.4.1); empty when ``m`` is 0 or the whole tree."""
    n = len(leaves)
    if not 0 <= m <= n:
        raise ValueError(f"size {m} is not within a tree of size {n}")
    if m in (0, n):
        return []
    path: list[bytes] = []
    low, high, complete = 0, n, True
    while m != high - low:
        k = _split(high - low)
        if m <= k:
            path.append(root(leaves[low + k : high]))
            high = low + k
        else:
            path.append(root(leaves[low : low + k]))
            m -= k
            low += k
            complete = False
    if not complete:
        path.append(root(leaves[low:high]))
    path.reverse()
    return path


def verify_inclusion(
    leaf: bytes, index: int, size: int, path: Sequence[bytes], expected_root: bytes
) -> bool:
    """True when ``path`` proves that ``leaf`` (a leaf hash) is leaf ``index`` of the tree of
    ``size`` leaves whose root is ``expected_root`` (RFC 9162 §2.1.3.2)."""
    if not 0 <= index < size:
        return False
    fn, sn, value = index, size - 1, leaf
    for sibling in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            value = node_hash(sibling, value)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            value = node_hash(value, sibling)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and value == expected_root


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, path: Sequence[bytes]
) -> bool:
    """True when ``path`` proves that the tree of ``first`` leaves with root ``first_root`` is
    a prefix of the tree of ``second`` leaves with root ``second_root`` (RFC 9162 §2.1.4.2;
    the empty tree is a prefix of every tree)."""
    if not 0 <= first <= second:
        return False
    if first == second:
        return not path and first_root == second_root
    if first == 0:
        return not path and first_root == EMPTY_ROOT
    if not path:
        return False
    nodes = list(path)
    if first & (first - 1) == 0:
        nodes.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = nodes[0]
    for node in nodes[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(node, fr), node_hash(node, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, node)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root
