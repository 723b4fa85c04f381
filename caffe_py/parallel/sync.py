"""Tree synchronisation of N replicas in one process (Caffe rc3's P2PSync, over flat buffers).

Each replica is driven by its own thread and its own Solver; the solver calls two hooks per
iteration and knows nothing else about the other replicas:

``on_start`` (before forward)
    weights flow down the tree, bucket by bucket (:mod:`.pull`): a replica copies each bucket
    of its parent's flat data buffer once the parent holds it, and tells its own children;
    with layer waits (:meth:`TreeSync.watch_layers`) its forward of layer l waits only for the
    buckets layer l reads. The root's weights are those of its last update.
``on_gradient_ready`` (after backward)
    gradients flow up: per bucket, a replica adds its children's subtree sums (in the tree's
    fixed order) into its own flat gradient and pushes the sum into its parent's receive
    buffer; with ``overlap`` a bucket goes as soon as backward has finished it. The root
    scales by 1/N; its Solver (``applies_updates``) then applies Caffe's update to the mean
    gradient, which equals the gradient of one replica with an N times larger batch (each
    loss divides by its own batch).

Waiting is on the CPU only for "my peer has *issued* its copy" (a generation counter); the GPU
order between replicas goes through CUDA events, so a thread never blocks on GPU work. Every
wait is bounded and watches a shared stop event: when any replica fails, all threads unwind
and the error names the failing replica and device.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .. import interrupts
from ..errors import CaffePyError, SolverError, device_fault
from .flat import DEFAULT_BUCKET_BYTES, BucketCount, FlatParams
from .pull import LayerWaits, Pull, Unit
from .topology import Tree, build_tree, peer_matrix

if TYPE_CHECKING:
    from ..net import Net
    from ..solver.callbacks import Callback
    from ..solver.solver import Solver

DEFAULT_TIMEOUT_S = 900.0
_POLL_S = 0.05


class StopReplica(Exception):
    """Raised inside a replica's thread when it must unwind (another replica failed)."""


class RunFinished(Exception):
    """Raised inside a non-root replica when the root ended the run (e.g. a stop signal)."""


class Signal:
    """A counter one thread raises and others wait on: "generation g is issued"."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value = 0
        self.event: Any = None
        """The CUDA event recorded with the last post (None on CPU)."""

    @property
    def value(self) -> int:
        return self._value

    def post(self, value: int, event: Any = None) -> None:
        with self._cond:
            self._value, self.event = value, event
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, value: int, group: SyncGroup, who: int, what: str) -> Any:
        """Wait until the counter reaches ``value``; return the event posted with it."""
        started = time.perf_counter()
        try:
            return self._wait(value, group, who, what)
        finally:
            group.replica(who).wait_s += time.perf_counter() - started

    def _wait(self, value: int, group: SyncGroup, who: int, what: str) -> Any:
        deadline = time.monotonic() + group.timeout
        with self._cond:
            while self._value < value:
                group.check(who)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SolverError(
                        f"replica {who} ({group.devices[who]}) waited {group.timeout:g} s for "
                        f"{what} at iteration {value - 1}; a replica is stuck: "
                        + stuck_where(len(group.devices), "look for an error above, or raise "
                                      "the sync timeout if the root's test phase is longer"))
                self._cond.wait(min(left, _POLL_S * 10))
            return self.event


@dataclass
class Failure:
    """The first exception raised in a replica's thread."""

    replica: int
    device: torch.device
    error: BaseException


@dataclass
class ReplicaState:
    """One replica's buffers, stream and signals."""

    index: int
    device: torch.device
    flat: FlatParams
    state: FlatParams
    stream: Any = None
    """The replica's compute stream (CUDA) or None."""
    iteration: int = 0
    wait_s: float = 0.0
    """Seconds this replica's thread spent waiting for its peers (a benchmark diagnostic)."""
    weights: list[Signal] = field(default_factory=list)
    """Per weight unit (:mod:`.pull`): "this iteration's unit u is issued here"."""
    pull: Pull | None = None
    """How this replica's weights arrive from its parent (posts them, at the root)."""
    copy_stream: Any = None
    """CUDA: the side stream where this replica copies its weights from its parent."""
    layer_waits: LayerWaits | None = None
    """The forward pre-hooks that wait per layer (None: the whole model waits at on_start)."""
    grads: list[Signal] = field(default_factory=list)
    """Per bucket: "my subtree's sum of this bucket is in my parent's inbox"."""
    sums: list[Signal] = field(default_factory=list)
    """Model averaging, per unit: "my subtree's model sum is in my parent's inbox"."""
    inbox: dict[int, torch.Tensor] = field(default_factory=dict)
    """child index -> a gradient-sized receive buffer on this replica's device."""
    reduce_stream: Any = None
    """CUDA: the side stream where this replica adds and pushes buckets during backward."""
    counts: BucketCount | None = None
    """When backward has finished each bucket (counting between on_start and
    on_gradient_ready)."""
    early: int = 0
    """Buckets reduced while backward was still running (a benchmark diagnostic)."""
    done: list[bool] = field(default_factory=list)
    """Per bucket: reduced (and pushed) this iteration."""


class SyncGroup:
    """What all replicas of one run share: devices, buffers, the stop event, the first failure.
    A subclass moves weights and gradients: :meth:`callback` is replica i's side of it."""

    def __init__(self, devices: Sequence[torch.device], *, timeout: float = DEFAULT_TIMEOUT_S,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, root_scale: bool = True):
        self.devices = [torch.device(d) for d in devices]
        self.n = len(self.devices)
        self.timeout = timeout
        self.bucket_bytes = bucket_bytes
        self.root_scale = root_scale
        """The tree's root divides the sum by N. False when the roots of several hosts sum
        theirs next and divide by the global replica count (:mod:`.multihost`)."""
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.failure: Failure | None = None
        self.replicas: list[ReplicaState | None] = [None] * self.n
        self._lock = threading.Lock()

    def setup(self, i: int, params: Sequence[torch.Tensor],
              state: Sequence[torch.Tensor] = ()) -> ReplicaState:
        """Move replica ``i``'s learnable params (and state blobs) into flat buffers."""
        device = self.devices[i]
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        rep = ReplicaState(i, device, FlatParams(params, bucket_bytes=self.bucket_bytes),
                           FlatParams(state, with_grad=False, bucket_bytes=self.bucket_bytes),
                           stream)
        self.replicas[i] = rep
        return rep

    def callback(self, i: int) -> Callback:
        """Replica ``i``'s solver callback (on_start, on_gradient_ready)."""
        raise NotImplementedError

    def replica(self, i: int) -> ReplicaState:
        rep = self.replicas[i]
        if rep is None:
            raise RuntimeError(f"replica {i} was not set up before its first iteration")
        return rep

    def check_shapes(self) -> None:
        """All replicas must hold the same parameter layout (the same net)."""
        ref = self.replica(0)
        for i in range(1, self.n):
            rep = self.replica(i)
            if (rep.flat.numel, rep.state.numel) != (ref.flat.numel, ref.state.numel):
                raise SolverError(
                    f"replica {i} ({rep.device}) has {rep.flat.numel} parameter elements, "
                    f"replica 0 has {ref.flat.numel}; every replica must build the same net")

    # --- stopping ---------------------------------------------------------------------------
    def fail(self, i: int, error: BaseException) -> None:
        """Record the first failure and make every other thread unwind."""
        with self._lock:
            if self.failure is None:
                self.failure = Failure(i, self.devices[i], error)
        self.stop.set()
        self.wake_all()

    def finish(self) -> None:
        """The root ended the run: replicas waiting for weights end too."""
        self.finished.set()
        self.wake_all()

    def wake_all(self) -> None:
        for rep in self.replicas:
            if rep is not None:
                for signal in [*rep.weights, *rep.grads, *rep.sums]:
                    signal.wake()

    def check(self, who: int) -> None:
        if self.stop.is_set():
            raise StopReplica(f"replica {who} stops: another replica failed")
        if self.finished.is_set() and who != 0:
            raise RunFinished()


class TreeCallback:
    """The solver callback of replica ``index`` in a tree-synchronised run."""

    def __init__(self, sync: TreeSync, index: int):
        self.sync, self.index = sync, index

    def on_start(self, solver: Solver | None = None) -> None:
        param = getattr(solver, "param", None)
        self.sync.weights_down(self.index, passes=getattr(param, "iter_size", 1))

    def on_gradient_ready(self, solver: Solver | None = None) -> None:
        self.sync.grads_up(self.index)


class TreeSync(SyncGroup):
    """Weights down and gradients up a :class:`Tree`, bucket by bucket.

    With ``overlap`` (the default) a bucket is reduced while backward is still running: a
    post-accumulate-grad hook per parameter counts the bucket's gradients, and once all are in
    (after the last of iter_size passes) the bucket is added to the children's sums of it, if
    they have arrived, and pushed to the parent, on a side stream. What is left is done after
    backward, in bucket order. Either way each bucket is summed once, own gradient first, then
    the children in the tree's order, so the result is the same bit for bit.
    """

    def __init__(self, devices: Sequence[torch.device], *, tree: Tree | None = None,
                 overlap: bool = True, gradients: bool = True, **kw: Any):
        """``gradients=False``: the tree carries only weights (model averaging,
        :mod:`.averaging`); no gradient inboxes or hooks are made."""
        super().__init__(devices, **kw)
        self.tree = tree or build_tree(self.n, peer_matrix(self.devices))
        if self.tree.n != self.n:
            raise ValueError(f"tree over {self.tree.n} replicas for {self.n} devices")
        self.overlap = overlap and gradients
        self.gradients = gradients

    def callback(self, i: int) -> TreeCallback:
        return TreeCallback(self, i)

    def setup(self, i: int, params: Sequence[torch.Tensor],
              state: Sequence[torch.Tensor] = ()) -> ReplicaState:
        rep = super().setup(i, params, state)
        if rep.stream is not None:
            rep.copy_stream = torch.cuda.Stream(rep.device)
        rep.weights = [Signal() for _ in weight_units(rep)]
        rep.pull = self.weight_pull(rep, [
            Unit(src, [dst], forward=True) for src, dst in zip(
                self._parent_units(i, weight_units), weight_units(rep), strict=True)])
        if not self.gradients:
            return rep
        grad = rep.flat.grad
        assert grad is not None   # learnable params' buffers carry gradients
        for child in self.tree.children(i):
            rep.inbox[child] = torch.zeros_like(grad)
        buckets = rep.flat.buckets
        rep.grads = [Signal() for _ in buckets]
        rep.done = [False] * len(buckets)
        rep.counts = BucketCount(rep.flat, buckets)
        if rep.stream is not None:
            rep.reduce_stream = torch.cuda.Stream(rep.device)
        if self.overlap:
            def complete(b: int) -> None:
                self._on_bucket(rep, b)

            def counts() -> bool:   # not while a graph is being recorded
                return rep.stream is None or not torch.cuda.is_current_stream_capturing()

            rep.counts.hook(complete, counts)
        return rep

    def weight_pull(self, rep: ReplicaState, units: list[Unit]) -> Pull:
        """A :class:`Pull` of ``units`` from ``rep``'s parent into ``rep``, posted on
        ``rep.weights`` (at the root: only posted)."""
        parent = self.tree.parent(rep.index)
        return Pull(self, rep.index, parent, units, rep.weights,
                    None if parent is None else self.replica(parent).weights,
                    rep.stream, rep.copy_stream, lazy=rep.layer_waits is not None)

    def _parent_units(self, i: int, units: Any) -> list[torch.Tensor]:
        """The parent's slices matching ``units(rep)`` (the root's own: never read)."""
        parent = self.tree.parent(i)
        return units(self.replica(i if parent is None else parent))

    def watch_layers(self, i: int, net: Net) -> LayerWaits:
        """Per-layer waits (mshadow-ps's PullWait) on replica ``i``'s TRAIN net: its forward of
        a layer waits only for the weight units that layer reads, not for the whole model."""
        rep = self.replica(i)
        unit_of = {t.data_ptr(): u for u, ts in enumerate(unit_tensors(rep)) for t in ts}
        rep.layer_waits = LayerWaits(net, unit_of, lambda: rep.pull)
        assert rep.pull is not None
        rep.pull.lazy = True
        return rep.layer_waits

    def weights_down(self, i: int, passes: int = 1) -> None:
        """on_start: take this iteration's weights from the parent, unit by unit; each unit is
        offered below as soon as it is issued here."""
        rep = self.replica(i)
        rep.iteration += 1
        assert rep.pull is not None
        with on_stream(rep.stream):
            if self.tree.parent(i) is None:
                rep.pull.publish(rep.iteration, record_event(rep.stream))
            else:
                rep.pull.open(rep.iteration)
        if rep.counts is not None:
            rep.counts.begin(passes)
        rep.done = [False] * len(rep.done)

    def grads_up(self, i: int) -> None:
        """on_gradient_ready: reduce and push every bucket backward has not already sent."""
        rep = self.replica(i)
        if rep.counts is not None:
            rep.counts.end()
        assert rep.pull is not None
        with on_stream(rep.stream):
            rep.pull.close()   # a unit no forward read (children wait for every one)
        if rep.flat.rebind_grads() and any(rep.done):
            raise SolverError(
                f"replica {i}: a gradient was replaced instead of accumulated in place, after "
                "its bucket was already sent; clear gradients in place (zero_), not with None")
        ready = record_event(rep.stream)
        for b in range(len(rep.done)):
            if not rep.done[b]:
                self._reduce_bucket(rep, b, ready, block=True)
        if rep.reduce_stream is not None:
            rep.stream.wait_stream(rep.reduce_stream)   # the update reads the sums

    def _on_bucket(self, rep: ReplicaState, b: int) -> None:
        """Backward (its thread) has finished bucket b: reduce it."""
        if not self.stop.is_set():
            ready = record_event(torch.cuda.current_stream(rep.device)) if rep.stream else None
            self._reduce_bucket(rep, b, ready, block=False)
            rep.early += rep.done[b]

    def _reduce_bucket(self, rep: ReplicaState, b: int, ready: Any, *, block: bool) -> None:
        """grad[b] += each child's bucket b (tree order); the root scales, others push up.

        Without ``block`` nothing is done unless every child's bucket has arrived.
        """
        kids = self.tree.children(rep.index)
        if not block and any(self.replica(c).grads[b].value < rep.iteration for c in kids):
            return
        events = [self.replica(c).grads[b].wait(
            rep.iteration, self, rep.index,
            f"gradient bucket {b} from replica {c} ({self.devices[c]})") for c in kids]
        stream = rep.reduce_stream
        with on_stream(stream):
            wait_event(stream, ready)
            for event in events:
                wait_event(stream, event)
            assert rep.flat.grad is not None
            grad = rep.flat.bucket(rep.flat.grad, b)
            for c in kids:
                grad.add_(rep.flat.bucket(rep.inbox[c], b))
            parent = self.tree.parent(rep.index)
            if parent is None:
                if self.n > 1 and self.root_scale:
                    grad.mul_(1.0 / self.n)
            else:
                rep.flat.bucket(self.replica(parent).inbox[rep.index], b).copy_(
                    grad, non_blocking=True)
            event = record_event(stream)
        rep.done[b] = True
        if parent is not None:
            rep.grads[b].post(rep.iteration, event)


# --- threads ---------------------------------------------------------------------------------
def run_replicas(group: SyncGroup, targets: Sequence[Callable[[], None]], *,
                 join_timeout: float | None = None) -> None:
    """Run ``targets[i]`` in thread i, each on its replica's device and stream; re-raise a failure.

    The first exception in any thread stops all of them; the error names the replica and its
    device. A thread that does not end within ``join_timeout`` after a stop is reported.
    """
    threads = [threading.Thread(target=_guarded, args=(group, i, fn), name=f"cpy-replica-{i}",
                                daemon=True) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(_POLL_S * 4)
            if group.stop.is_set():
                break
    grace = join_timeout if join_timeout is not None else min(group.timeout, 60.0)
    deadline = time.monotonic() + grace
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if group.failure is not None:
        raise replica_error(group.failure, stuck)
    if stuck:
        raise SolverError(f"replica threads {', '.join(stuck)} did not end within {grace:.0f} s")


def _guarded(group: SyncGroup, i: int, fn: Callable[[], None]) -> None:
    device = group.devices[i]
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
            rep = group.replicas[i]
            if rep is not None and rep.stream is not None:
                # the nets and flat buffers were made on the default stream of another thread
                rep.stream.wait_stream(torch.cuda.default_stream(device))
                torch.cuda.set_stream(rep.stream)
        fn()
        if i == 0:
            group.finish()
    except (StopReplica, RunFinished):
        return
    except BaseException as exc:  # noqa: BLE001 - any failure must stop every replica
        group.fail(i, exc)


def stuck_where(replicas: int, otherwise: str) -> str:
    """What the replica threads are stuck in, when a watchdog knows (a user's Python layer):
    ``cpy-replica-1 has been running layer 'py' (Python: m.C.forward) for 900 s``."""
    found = interrupts.busy_with([f"cpy-replica-{i}" for i in range(replicas)])
    return "; ".join(found) + "; fix that layer" if found else otherwise


def replica_error(failure: Failure, stuck: Sequence[str] = ()) -> CaffePyError:
    """One line naming the replica, its device and what went wrong."""
    err, where = failure.error, f"replica {failure.replica} ({failure.device})"
    if isinstance(err, torch.cuda.OutOfMemoryError):
        msg = (f"{where}: out of GPU memory; lower the net's batch_size (each GPU runs the "
               f"full batch) or use fewer/larger GPUs")
    elif isinstance(err, CaffePyError):
        msg = str(err) if str(err).startswith(where) else f"{where}: {err}"
    elif (fault := device_fault(err)) is not None:
        msg = f"{where}: {fault}"
    else:
        msg = f"{where} failed: {type(err).__name__}: {err}"
    if stuck:
        msg += f" (threads still running: {', '.join(stuck)})"
    out = SolverError(msg)
    out.__cause__ = err
    return out


# --- device helpers (no-ops on CPU) ---------------------------------------------------------
class on_stream:
    """``torch.cuda.stream(s)`` for a CUDA stream, nothing for None."""

    def __init__(self, stream: Any):
        self.ctx = torch.cuda.stream(stream) if stream is not None else None

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def record_event(stream: Any) -> Any:
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def wait_event(stream: Any, event: Any) -> None:
    if stream is not None and event is not None:
        stream.wait_event(event)


def weight_units(rep: ReplicaState) -> list[torch.Tensor]:
    """A replica's weight units: the buckets of its flat weights, then of its state blobs."""
    return [f.bucket(f.data, b) for f in (rep.flat, rep.state) for b in range(len(f.buckets))]


def unit_tensors(rep: ReplicaState) -> list[list[torch.Tensor]]:
    """Per weight unit, the tensors that live in it."""
    return [[f.tensors[k] for k in bucket.members]
            for f in (rep.flat, rep.state) for bucket in f.buckets]
