"""The RFC 6962 / 9162 tree math of gateway.lib.merkle against a brute-force reference."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.lib import merkle


def _leaves(n: int) -> list[bytes]:
    return [merkle.leaf_hash(f"event {i}".encode()) for i in range(n)]


def _reference_root(leaves: list[bytes]) -> bytes:
    """MTH of RFC 9162 §2.1.1, written as the definition reads."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(
        b"\x01" + _reference_root(leaves[:k]) + _reference_root(leaves[k:])
    ).digest()


def _flip(path: list[bytes], at: int) -> list[bytes]:
    node = bytearray(path[at % len(path)])
    node[0] ^= 1
    return [*path[: at % len(path)], bytes(node), *path[at % len(path) + 1 :]]


def test_known_values():
    assert merkle.root([]) == hashlib.sha256(b"").digest()
    assert merkle.leaf_hash(b"") == hashlib.sha256(b"\x00").digest()
    one, two, three = _leaves(3)
    assert merkle.root([one, two, three]) == merkle.node_hash(merkle.node_hash(one, two), three)


@given(st.integers(min_value=0, max_value=300))
def test_root_matches_the_definition(n):
    leaves = _leaves(n)
    assert merkle.root(leaves) == _reference_root(leaves)


@given(st.data())
def test_inclusion_proofs_verify_and_only_for_their_leaf_and_size(data):
    n = data.draw(st.integers(min_value=1, max_value=200))
    m = data.draw(st.integers(min_value=0, max_value=n - 1))
    leaves = _leaves(n)
    top = _reference_root(leaves)
    path = merkle.inclusion_proof(m, leaves)
    assert merkle.verify_inclusion(leaves[m], m, n, path, top)
    other = data.draw(st.integers(min_value=0, max_value=n - 1))
    if other != m:
        assert not merkle.verify_inclusion(leaves[other], m, n, path, top)
        assert not merkle.verify_inclusion(leaves[m], other, n, path, top)
    bigger = n + data.draw(st.integers(min_value=1, max_value=50))
    assert not merkle.verify_inclusion(leaves[m], m, bigger, path, _reference_root(_leaves(bigger)))
    assert not merkle.verify_inclusion(merkle.leaf_hash(b"forged"), m, n, path, top)
    if path:
        at = data.draw(st.integers(min_value=0, max_value=len(path) - 1))
        assert not merkle.verify_inclusion(leaves[m], m, n, _flip(path, at), top)
        assert not merkle.verify_inclusion(leaves[m], m, n, path[:-1], top)
    assert not merkle.verify_inclusion(leaves[m], m, n, [*path, top], top)


@given(st.data())
def test_consistency_proofs_verify_and_only_for_their_sizes(data):
    n = data.draw(st.integers(min_value=0, max_value=200))
    m = data.draw(st.integers(min_value=0, max_value=n))
    leaves = _leaves(n)
    first, second = _reference_root(leaves[:m]), _reference_root(leaves)
    path = merkle.consistency_proof(m, leaves)
    assert merkle.verify_consistency(m, n, first, second, path)
    if 0 < m < n:
        other = data.draw(st.integers(min_value=1, max_value=n))
        if other != m:
            other_root = _reference_root(leaves[:other])
            assert not merkle.verify_consistency(other, n, other_root, second, path)
        at = data.draw(st.integers(min_value=0, max_value=len(path) - 1))
        assert not merkle.verify_consistency(m, n, first, second, _flip(path, at))
        assert not merkle.verify_consistency(m, n, first, second, path[:-1])
        assert not merkle.verify_consistency(m, n, first, second, [*path, second])
        # The same prefix with one leaf rewritten: a different first root, not consistent.
        rewritten = list(leaves)
        rewritten[m - 1] = merkle.leaf_hash(b"rewritten")
        assert not merkle.verify_consistency(m, n, _reference_root(rewritten[:m]), second, path)
        assert not merkle.verify_consistency(
            m, n, first, _reference_root(rewritten), merkle.consistency_proof(m, rewritten)
        )


def test_bad_arguments():
    leaves = _leaves(4)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="not in a tree of size 4"):
            merkle.inclusion_proof(bad, leaves)
    with pytest.raises(ValueError, match="not within a tree of size 4"):
        merkle.consistency_proof(5, leaves)
    assert not merkle.verify_inclusion(leaves[0], 0, 0, [], merkle.EMPTY_ROOT)
    assert not merkle.verify_consistency(3, 2, merkle.EMPTY_ROOT, merkle.EMPTY_ROOT, [])
