"""The reduction tree over N replicas: Caffe rc3's P2PSync pairing, for any N.

Devices are paired in rounds. In each round every device still in play is paired at most once:
first with a device it has peer access to (a greedy maximal matching in index order), then the
devices left without such a partner are paired among themselves (their copies go through the
host). In a pair the lower index is the parent and stays in play; the child leaves. An odd one
out waits for the next round. Each round halves the devices in play (rounded up), so the tree is
at most ceil(log2 N) deep, and the last one in play, replica 0, is the root.

Caffe rc3 indexed past the end of its list for odd counts without peer access; here every N
from 1 up works, and the builder is tested for N = 1..16 and partial peer matrices.

Gradients are summed up the tree in a fixed order (each parent adds its children in the order
they were paired), so two runs give bit-identical sums.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

PeerAccess = Sequence[Sequence[bool]] | Callable[[int, int], bool]


@dataclass(frozen=True)
class Edge:
    """One parent-child link, made in ``round`` (1-based); ``peer`` when the copy is P2P."""

    parent: int
    child: int
    round: int
    peer: bool


@dataclass(frozen=True)
class Tree:
    """A reduction tree over replicas 0..n-1 with root 0."""

    n: int
    edges: tuple[Edge, ...]
    """In the order they were made: round by round, within a round peer pairs first."""

    @property
    def root(self) -> int:
        return 0

    @property
    def rounds(self) -> int:
        return max((e.round for e in self.edges), default=0)

    def parent(self, i: int) -> int | None:
        """The replica ``i`` sends gradients to and takes weights from (None for the root)."""
        for e in self.edges:
            if e.child == i:
                return e.parent
        return None

    def children(self, i: int) -> list[int]:
        """The children of ``i`` in the fixed order their gradients are added."""
        return [e.child for e in self.edges if e.parent == i]

    def edge_to(self, child: int) -> Edge | None:
        return next((e for e in self.edges if e.child == child), None)

    def depth(self, i: int) -> int:
        """Hops from ``i`` up to the root."""
        hops = 0
        while (p := self.parent(i)) is not None:
            i, hops = p, hops + 1
        return hops

    def height(self) -> int:
        return max(self.depth(i) for i in range(self.n))

    def describe(self, names: Sequence[str] | None = None, links: bool = True) -> str:
        """One line per round, e.g. ``round 1: cuda:0 <- cuda:1 (p2p), cuda:2 <- cuda:3 (host)``.

        The first line names the replica count, the root and the height; ``links=False``
        leaves out the (p2p)/(host) marks (CPU replicas share one memory).
        """
        names = list(names) if names is not None else [str(i) for i in range(self.n)]
        lines = [f"reduction tree over {self.n} replica(s): root {names[0]}, "
                 f"height {self.height()} (<= ceil(log2 {self.n}) = {_log2_ceil(self.n)})"]
        for r in range(1, self.rounds + 1):
            pairs = [f"{names[e.parent]} <- {names[e.child]}"
                     + (f" ({'p2p' if e.peer else 'host'})" if links else "")
                     for e in self.edges if e.round == r]
            lines.append(f"  round {r}: " + ", ".join(pairs))
        return "\n".join(lines)

    def draw(self, names: Sequence[str] | None = None) -> str:
        """The tree as indented lines, children in their summation order."""
        names = list(names) if names is not None else [str(i) for i in range(self.n)]
        out = [f"{names[0]} (root)"]

        def walk(node: int, prefix: str) -> None:
            kids = self.children(node)
            for k, child in enumerate(kids):
                last = k == len(kids) - 1
                out.append(f"{prefix}{'`- ' if last else '|- '}{names[child]}")
                walk(child, prefix + ("   " if last else "|  "))

        walk(0, "")
        return "\n".join(out)


def build_tree(n: int, peer_access: PeerAccess | None = None) -> Tree:
    """Pair ``n`` replicas into a tree rooted at 0, peer pairs first in every round.

    ``peer_access[i][j]`` (or ``peer_access(i, j)``) says whether device i can copy to/from
    device j directly; None means every pair can (CPU replicas, or one NVLink island).
    """
    if n < 1:
        raise ValueError(f"a reduction tree needs at least one replica, got {n}")
    can = _peer_fn(peer_access)
    in_play = list(range(n))
    edges: list[Edge] = []
    r = 0
    while len(in_play) > 1:
        r += 1
        pairs = _pair_round(in_play, can)
        for parent, child in pairs:
            edges.append(Edge(parent, child, r, can(parent, child)))
        children = {c for _, c in pairs}
        in_play = [i for i in in_play if i not in children]
    return Tree(n, tuple(edges))


def _pair_round(in_play: list[int], can: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """Peer pairs (greedy maximal matching), then the rest in index order."""
    free = list(in_play)
    pairs: list[tuple[int, int]] = []
    for needs_peer in (True, False):
        i = 0
        while i < len(free):
            a = free[i]
            mate = next((b for b in free[i + 1:] if not needs_peer or can(a, b)), None)
            if mate is None:
                i += 1
                continue
            pairs.append((a, mate))
            free.remove(mate)
            free.remove(a)
    return sorted(pairs, key=lambda p: (not can(*p), p))


def _peer_fn(peer_access: PeerAccess | None) -> Callable[[int, int], bool]:
    if peer_access is None:
        return lambda i, j: True
    if callable(peer_access):
        fn = peer_access
        return lambda i, j: bool(fn(i, j)) and bool(fn(j, i))
    matrix = peer_access
    return lambda i, j: bool(matrix[i][j]) and bool(matrix[j][i])


def _log2_ceil(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def peer_matrix(devices: Sequence[torch.device]) -> list[list[bool]]:
    """Which replica pairs can copy directly: CUDA peer access, or True between CPU replicas."""
    n = len(devices)
    out = [[True] * n for _ in range(n)]
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            if i == j or a.type != "cuda" or b.type != "cuda":
                continue
            out[i][j] = a.index == b.index or torch.cuda.can_device_access_peer(a.index, b.index)
    return out
