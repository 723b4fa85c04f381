"""The reduction tree: every N from 1 to 16, full and partial peer-access matrices."""
from __future__ import annotations

import math
import random

import pytest

from caffe_py.parallel.topology import build_tree


def _check_tree(n, tree, can):
    assert tree.root == 0 and tree.n == n
    assert tree.parent(0) is None
    # every replica but the root is a child exactly once, and every path ends at the root
    assert sorted(e.child for e in tree.edges) == list(range(1, n))
    for i in range(n):
        seen, node = set(), i
        while node != 0:
            assert node not in seen
            seen.add(node)
            node = tree.parent(node)
    bound = math.ceil(math.log2(n)) if n > 1 else 0
    assert tree.height() <= bound and tree.rounds <= bound
    for r in range(1, tree.rounds + 1):
        pairs = [e for e in tree.edges if e.round == r]
        used = [x for e in pairs for x in (e.parent, e.child)]
        assert len(used) == len(set(used)), f"round {r} pairs a replica twice"
        in_play = {0} | {x for e in tree.edges if e.round >= r for x in (e.parent, e.child)}
        # all but at most one replica in play is paired in every round
        assert len(in_play) - len(used) <= 1
        # peers first: no host pair while two host-paired (or unpaired) replicas are peers
        left = [x for e in pairs if not e.peer for x in (e.parent, e.child)]
        left += sorted(in_play - set(used))
        for a in left:
            for b in left:
                assert a == b or not can(a, b), f"round {r}: {a} and {b} are peers but unpaired"
        for e in pairs:
            assert e.peer == can(e.parent, e.child) and e.parent < e.child


@pytest.mark.parametrize("n", range(1, 17))
def test_full_peer_access(n):
    tree = build_tree(n)
    _check_tree(n, tree, lambda a, b: True)
    assert all(e.peer for e in tree.edges)
    assert tree.rounds == (math.ceil(math.log2(n)) if n > 1 else 0)


@pytest.mark.parametrize("n", range(1, 17))
@pytest.mark.parametrize("seed", range(4))
def test_partial_peer_access(n, seed):
    rng = random.Random(seed * 100 + n)
    m = [[i == j for j in range(n)] for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            m[i][j] = m[j][i] = rng.random() < 0.4
    tree = build_tree(n, m)
    _check_tree(n, tree, lambda a, b: m[a][b])


def test_two_islands_pair_inside_first():
    # 0,2 share a switch and 1,3 share another; index order alone would pair 0-1 and 2-3
    m = [[True, False, True, False], [False, True, False, True],
         [True, False, True, False], [False, True, False, True]]
    tree = build_tree(4, m)
    assert [(e.parent, e.child, e.round, e.peer) for e in tree.edges] == [
        (0, 2, 1, True), (1, 3, 1, True), (0, 1, 2, False)]


def test_odd_counts_without_peer_access():
    # Caffe rc3 indexed past its list here (3 GPUs, no P2P)
    tree = build_tree(3, [[True, False, False], [False, True, False], [False, False, True]])
    assert [(e.parent, e.child, e.round, e.peer) for e in tree.edges] == [
        (0, 1, 1, False), (0, 2, 2, False)]
    assert tree.children(0) == [1, 2]


def test_summation_order_and_log_format():
    tree = build_tree(5)
    assert tree.children(0) == [1, 2, 4] and tree.children(2) == [3]
    names = [f"cuda:{i}" for i in range(5)]
    assert tree.describe(names) == (
        "reduction tree over 5 replica(s): root cuda:0, height 2 (<= ceil(log2 5) = 3)\n"
        "  round 1: cuda:0 <- cuda:1 (p2p), cuda:2 <- cuda:3 (p2p)\n"
        "  round 2: cuda:0 <- cuda:2 (p2p)\n"
        "  round 3: cuda:0 <- cuda:4 (p2p)")
    assert tree.draw(names) == (
        "cuda:0 (root)\n|- cuda:1\n|- cuda:2\n|  `- cuda:3\n`- cuda:4")


def test_one_replica_and_bad_count():
    tree = build_tree(1)
    assert tree.edges == () and tree.height() == 0 and tree.children(0) == []
    with pytest.raises(ValueError, match="at least one replica, got 0"):
        build_tree(0)
