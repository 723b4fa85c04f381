"""Every replica's whole iterations as CUDA graph replays, issued by one thread (the default for
several GPUs of one host).

The one-device loop (:class:`~caffe_py.solver.graph_loop.GraphedLoop`) captures a Solver's whole
iteration: its batch slots, forward and backward passes, loss and Caffe's update. Here its
members are all the replicas of a run, each captured in a graph on its own device (the
captures open at once in the root's thread), and before the updates the replicas' flat
gradients are summed by NCCL's all-reduce, which a graph holds because its kernels meet their
peers through device memory, not through the host (small buckets by a kernel that reads the
peers' memory, :mod:`.peer_sum`, likewise): bucket by bucket on a side stream while backward
still runs (Caffe's ``layer_wise_reduce``, the default; :class:`AllReduceGroup`), or the whole
buffer after backward. Every replica then divides the sum by N and applies the same update
(its own copy of the history), so the replicas' weights stay equal bit for bit without a
broadcast (every device gets the same sum). Several iterations go into one replay when
the step is short, as on one device; per chunk the host fills each replica's batch slots,
copies the rates, replays N graphs and does the Solvers' Step bookkeeping.

On CPU replicas (tests) the same host sequence runs unrecorded (``emulate``) and the all-reduce
is a sum on the host: two replicas give the tree's numbers bit for bit (its root adds its
child's gradient to its own, the same two operands). Where a replica's iteration cannot be
captured (a Python layer, a generator on the host) the loop says why in one line and runs the
same sequence eagerly.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import CaffePyError
from ..io import attach_feeds, feed_of, swap_feed
from ..net import Net
from ..solver.evaluate import raise_device_problems, run_batches
from ..solver.graph_loop import GraphedLoop
from ..solver.graphed_tests import GraphedForward, RowLayout, batch_row, graphed_pass
from .flat import Bucket, BucketCount, plan_reduction
from .peer_sum import PeerCollectives, replica_sum
from .sync import ReplicaState, StopReplica, SyncGroup

if TYPE_CHECKING:
    from ..solver.solver import Solver

log = logging.getLogger(__name__)

SIDE_PRIORITY = 0
"""The CUDA stream priority of each replica's side stream, where its gradient buckets are summed
beside backward (lower is higher; the graphs keep it, as
:data:`~caffe_py.solver.graph_loop.CAPTURE_PRIORITY`)."""


class AllReduceGroup(SyncGroup):
    """The replicas' flat parameter and gradient buffers, and the all-reduce of the gradients
    that :class:`CapturedReplicas` runs between the passes and the updates.

    With ``overlap`` (the default; the solver's ``layer_wise_reduce``, as in Caffe 1.0) each
    replica's gradient is reduced in the buckets of :func:`~.flat.plan_reduction`, last layers
    first: a post-accumulate-grad hook per parameter counts each bucket's gradients, and once
    all are in (after the last of ``iter_size`` passes) it records an event on backward's
    stream; a side stream per device waits for that event, runs NCCL's all-reduce of the
    bucket and its 1/N, and the update's stream waits for the side stream. Captured, the hooks
    run once, while recording, and the graph keeps the events as edges: in every replay a
    bucket's all-reduce runs beside the rest of backward. A bucket whose hooks did not all
    fire (a parameter without a gradient in this iteration) waits for the end of backward.
    Without ``overlap`` the whole buffer is reduced after backward on the update's stream: the
    plain order the overlapped one is tested against. Each element's sum is NCCL's either way:
    on two replicas the same two operands, bit for bit; on more, its ring may add them in
    another order (float rounding)."""

    def __init__(self, devices: Sequence[torch.device], *, overlap: bool = True,
                 **kw: object):
        super().__init__(devices, **kw)  # type: ignore[arg-type]
        self.overlap = overlap
        self.collectives: Any = None
        """``torch.cuda.nccl``, or :class:`~.peer_sum.PeerCollectives` over it where the GPUs
        reach each other's memory (small buckets summed over peer access); None on CPUs."""
        if all(d.type == "cuda" for d in self.devices):
            import torch.cuda.nccl as nccl

            self.collectives = PeerCollectives.on(self.devices, nccl) or nccl
        self.plans: list[list[Bucket]] = [[] for _ in range(self.n)]
        """Per replica, the buckets its gradient is reduced in (overlap only)."""
        self._counts: dict[int, BucketCount] = {}
        """Per replica (overlap only): when backward has finished each bucket."""
        self._ready: list[list[Any]] = []
        """Per replica and bucket this iteration: None until complete, then its event (CUDA)
        or True (CPU)."""
        self._side: list[torch.cuda.Stream] = []
        self._held: list[torch.cuda.Event] = []
        """Events recorded while a graph is being captured, kept until the next eager pass."""
        self.divides: list[bool] = [True] * self.n
        """Per replica: whether the all-reduce divides its sum by N, or leaves that to the
        replica's update (:meth:`hand_mean`)."""
        self.in_backward = 0
        """Buckets (over all replicas) that backward's hooks found complete in the last
        iteration (a diagnostic; the rest waited for the end of backward)."""

    def setup(self, i: int, params: Sequence[torch.Tensor],
              state: Sequence[torch.Tensor] = ()) -> ReplicaState:
        rep = super().setup(i, params, state)
        if not self.overlap:
            return rep
        plan = self.plans[i] = plan_reduction(rep.flat, self.bucket_bytes)
        self._counts[i] = BucketCount(rep.flat, plan)

        def complete(b: int) -> None:
            self._mark_ready(i, b)

        self._counts[i].hook(complete)
        if self.collectives is not None:
            self._side.append(torch.cuda.Stream(rep.device, priority=SIDE_PRIORITY))
        return rep

    def hand_mean(self, i: int, solver: Solver) -> None:
        """Leave the sum's 1/N to replica i's update where it can fold it into its kernel
        (:meth:`~caffe_py.solver.rules.Updater.can_take_mean`): one pass less over the
        gradient, on the side stream that backward shares, the same numbers."""
        if self.collectives is not None and self.n > 1 and solver.can_take_mean():
            solver.updater.mean_of = self.n
            self.divides[i] = False

    def describe(self) -> str:
        """How the banner says the gradients are summed."""
        total = "NCCL's all-reduce" if self.collectives is not None else "a host sum"
        if isinstance(self.collectives, PeerCollectives):
            grad = self.replica(0).flat.grad
            assert grad is not None
            peer = sum(self.collectives.takes(grad[start:end]) for start, end in self._spans())
            up_to = f"up to {self.collectives.limit_text()}"
            if peer == len(self._spans()):
                total = f"reads of the peers' memory (buckets {up_to})"
            elif peer:
                total = (f"reads of the peers' memory ({peer} bucket{'s' * (peer != 1)} "
                         f"{up_to}) and NCCL's all-reduce")
        if not self.overlap:
            return f"gradients summed by {total} inside them after backward"
        k = len(self.plans[0])
        when = ", each started as soon as backward has finished it" \
            if self.collectives is not None else ""
        return f"gradients summed by {total} inside them in {k} bucket{'s' * (k != 1)}{when}"

    def begin(self, passes: int, recording: bool) -> None:
        """Before an iteration's passes: from here the hooks count each bucket's gradients,
        complete after the last of ``passes`` backward passes (``recording``: a graph is being
        captured, whose events must live until it is made)."""
        self._ready = [[None] * len(plan) for plan in self.plans]
        if not recording:
            self._held.clear()
        for counts in self._counts.values():
            counts.begin(passes)

    def _mark_ready(self, i: int, b: int) -> None:
        """Replica i's bucket b holds its final gradient: on CUDA, once the work backward has
        issued so far on its stream is done."""
        if self.collectives is None:
            self._ready[i][b] = True
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.devices[i]))
        self._held.append(event)
        self._ready[i][b] = event

    def all_reduce(self, streams: Sequence[torch.cuda.Stream] | None) -> None:
        """Sum every replica's flat gradient into each, then divide by N, in each replica's
        stream order (``streams``: the capture streams while recording; None: the current
        streams): bucket by bucket with ``overlap``, else the whole buffer at once."""
        for counts in self._counts.values():
            counts.end()
        self.in_backward = sum(r is not None for ready in self._ready for r in ready)
        grads = [g for g in (self.replica(i).flat.grad for i in range(self.n)) if g is not None]
        if self.collectives is None:   # CPU replicas: the sum on the host, in replica order
            for start, end in self._spans():
                _host_sum([g[start:end] for g in grads], self.n)
            return
        use = list(streams) if streams is not None else [
            torch.cuda.current_stream(g.device) for g in grads]
        if not self.overlap:
            self.collectives.all_reduce(grads, streams=use)
            self._divide(grads, use)
            return
        ends = []   # the end of every replica's backward: for buckets the hooks did not finish
        for stream in use:
            ends.append(torch.cuda.Event())
            ends[-1].record(stream)
        self._held.extend(ends)
        for b, (start, end) in enumerate(self._spans()):
            parts = [g[start:end] for g in grads]
            for i, side in enumerate(self._side):
                side.wait_event(self._ready[i][b] or ends[i])
            self.collectives.all_reduce(parts, streams=self._side)
            self._divide(parts, self._side)
        for stream, side in zip(use, self._side, strict=True):
            stream.wait_stream(side)

    def _divide(self, parts: Sequence[torch.Tensor], streams: Sequence[torch.cuda.Stream]
                ) -> None:
        """Each replica's summed part times 1/N on its stream, where its update does not."""
        for part, stream, divides in zip(parts, streams, self.divides, strict=True):
            if divides:
                with torch.cuda.device(part.device), torch.cuda.stream(stream):
                    part.mul_(1.0 / self.n)

    def _spans(self) -> list[tuple[int, int]]:
        """[start, end) of each bucket the gradient is summed in (without overlap: one)."""
        if not self.overlap:
            return [(0, self.replica(0).flat.numel)]
        return [(b.start, b.end) for b in self.plans[0]]

    def spread_state(self) -> None:
        """Every replica takes the root's state blobs (BatchNorm's running sums: each replica
        gathers its own while training; a test pass uses the root's, as Caffe's does)."""
        root = self.replica(0)
        if root.state.numel:
            with torch.no_grad():
                for i in range(1, self.n):
                    self.replica(i).state.data.copy_(root.state.data)

    def spread_root(self, solvers: Sequence[Solver]) -> None:
        """Every replica takes the root's weights, state blobs and update history (at the
        start, after --weights or a resume: each replica updates its own copy from then on)."""
        root = self.replica(0)
        for i, solver in enumerate(solvers[1:], start=1):
            rep = self.replica(i)
            with torch.no_grad():
                rep.flat.data.copy_(root.flat.data)
                if rep.state.numel:
                    rep.state.data.copy_(root.state.data)
                for mine, theirs in zip(solver.updater.history, solvers[0].updater.history,
                                        strict=True):
                    mine.copy_(theirs)
        for i in range(self.n):
            if self.devices[i].type == "cuda":
                torch.cuda.synchronize(self.devices[i])


class CapturedReplicas(GraphedLoop):
    """The root's runner: every replica a member of one graph loop (module docstring).
    ``solvers`` is the run's list (index = replica), filled after the root is made."""

    def __init__(self, group: AllReduceGroup, solvers: Sequence[Solver], *,
                 chunk: int | None = None, required: bool = False):
        super().__init__(chunk=chunk, emulate=group.collectives is None, required=required)
        self.group, self.solvers = group, solvers

    def members(self, s: Solver) -> list[Solver]:
        return list(self.solvers)

    def before(self, streams: list[torch.cuda.Stream] | None) -> None:
        self.group.begin(self.solvers[0].param.iter_size, recording=streams is not None)

    def between(self, streams: list[torch.cuda.Stream] | None) -> None:
        self.group.all_reduce(streams)

    @contextlib.contextmanager
    def on_member(self, i: int, s: Solver) -> Iterator[None]:
        """Replica i's device and stream; a worker's own failure (its data, its memory) is
        reported as its own, naming its replica and device, and unwinds the root's thread."""
        try:
            with super().on_member(i, s):
                yield
        except (CaffePyError, torch.cuda.OutOfMemoryError) as exc:
            if i == 0:
                raise
            self.group.fail(i, exc)
            raise StopReplica(f"replica {i} failed") from exc


def _whose_turn(queues: Sequence[Any]) -> int:
    """The replica whose turn the stream's next batch is: the one whose record queue reads the
    stream's next position."""
    return min(range(len(queues)), key=lambda r: queues[r].next_position)


class _Turns:
    """The root's feed of one TEST Data layer of a split-able net: each batch from the feed of
    the replica whose turn it is (the one that reads the stream's next position), made on the
    root's device (:meth:`~caffe_py.io.feed.prefetch.Prefetcher.next_on`). Split, the root's
    net runs only on its own turns; on the root alone (or driven by anything else, as the
    detection evaluation drives it) it reads every batch, in the stream's order."""

    def __init__(self, feeds: Sequence[Any], device: torch.device):
        self.feeds, self.device = list(feeds), device
        self.queues = [feed.records for feed in self.feeds]

    def turn(self) -> int:
        """The replica whose turn the stream's next batch is."""
        return _whose_turn(self.queues)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        turn = self.turn()
        if turn == 0:
            return self.feeds[0].next()
        return self.feeds[turn].next_on(self.device)


class SplitTests:
    """The root's test passes spread over every replica (the root's ``test_batches``; every
    replica holds the root's weights when whole iterations are captured). Every replica's copy
    of a TEST net reads its own batches: the root's TEST readers serve the N replicas in turns
    of a whole batch (:func:`~caffe_py.io.attach_feeds` ``by_batch``), so batch g of the
    stream, the one a single device reads there, is read and transformed by replica g mod N's
    feed, on its own device and its own feed thread. A pass takes the stream's batches in
    order, each from the replica whose turn it is. Split, that replica computes it too, and
    nothing crosses between devices until the pass ends: a round waits for no device but the
    one computing it. Each batch's outputs stay on the device that computed them until the
    pass ends; then each replica's come to the host in one copy, are summed there in batch
    order (float32 adds, as one device sums them) and divided on the root as one device divides
    them: the pass prints the one device's numbers. With ``graphed`` (GPUs with graphs on)
    every replica's forward runs chunks of batches as CUDA graph replays
    (:class:`~caffe_py.solver.graphed_tests.GraphedForward`, its ``"rows"``): a round reads
    up to a chunk of batches a replica into their slots, in the stream's order, then replays
    each replica's chunk once, so the one thread that launches every replica's forward
    launches one graph a replica a round (``emulate``: CPU replicas run the same rounds
    without a graph, as the tests do).

    On the root alone, the root computes every batch, its Data layers reading each from the
    feed whose turn it is, made on the root's device (:class:`_Turns`; from the decoded
    database, a small one, with no copy between devices); so does anything else that drives
    the root's TEST net (the detection evaluation). A small net's forward (LeNet: 0.1
    ms) may be shorter than the host's work a batch, which the split does not share out, and
    switching devices every batch costs the host more; so with ``split`` None the passes choose
    by measurement: the first two on the root alone (the first captures), the third split
    (timed after its captures), then whichever of the second and third took less time a batch,
    said in one line; True splits every pass, False none.

    :meth:`attach` builds the replicas' TEST nets and subscribes them, before the readers
    start (and before a resume loads their positions). A TEST net with a source the readers
    do not serve (DummyData, a Python layer, an Input), or one the detection evaluation runs
    (it gathers every batch's detections on the root), tests on the root alone, reading every
    batch itself, and says so once."""

    def __init__(self, group: AllReduceGroup, solvers: Sequence[Solver], *,
                 graphed: bool = False, emulate: bool = False, split: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.group, self.solvers, self.graphed = group, solvers, graphed
        self.emulate, self.split, self.clock = emulate, split, clock
        self._nets: dict[int, list[Net] | None] = {}
        """Per TEST net: every replica's copy (the root's first), or None: the root alone."""
        self._queues: dict[int, list[Any]] = {}
        """Per split-able TEST net: each replica's record queue of its first Data layer
        (whose next position says whose turn the next batch is)."""
        self._forwards: dict[int, list[GraphedForward]] = {}
        self._timed: dict[int, list[float]] = {}
        """Per TEST net: seconds a batch of the passes that measure (root alone, split)."""
        self._chosen: dict[int, bool] = {}
        """Per TEST net: whether its passes are split, once measured."""

    def attach(self) -> None:
        """Every replica's copy of each TEST net the root's readers feed, subscribed to the
        root's TEST readers in turns of a batch (call before the readers start)."""
        root = self.solvers[0]
        specs = root.param.test_net_specs()
        for k, net in enumerate(root.test_nets):
            self._nets[k] = nets = self._replica_nets(k, net, specs[k], root.test_pool)
            if self.graphed:
                self._forwards[k] = [
                    GraphedForward(replica, f"test net #{k}" + (f" on replica {r}" if r else ""),
                                   emulate=self.emulate)
                    for r, replica in enumerate([net] if nets is None else nets)]

    def __call__(self, k: int, net: Net, iterations: int, *,
                 autocast: Callable[[], AbstractContextManager[Any]],
                 between: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
        nets = self._nets[k]
        forwards = self._forwards.get(k, [])
        split = nets is not None and self._splits(k)
        if nets is None or not split:
            started = self.clock()
            means = (graphed_pass(forwards[0], iterations, autocast=autocast, between=between)
                     if forwards else
                     run_batches(net, iterations, autocast=autocast, between=between))
            per_batch = (self.clock() - started) / max(1, iterations)
        else:
            means, per_batch = self._split_pass(k, nets, iterations, autocast, between)
        if nets is not None and means is not None and k not in self._chosen:
            self._measured(k, per_batch, len(nets))
        return means

    def _splits(self, k: int) -> bool:
        """Whether test net k's next pass is split."""
        if self.split is not None:
            return self.split
        if k in self._chosen:
            return self._chosen[k]
        return len(self._timed.get(k, [])) == 2   # passes 1-2 root alone, pass 3 split

    def _measured(self, k: int, per_batch: float, n: int) -> None:
        if self.split is not None:
            return
        timed = self._timed.setdefault(k, [])
        timed.append(per_batch)
        if len(timed) == 3:
            alone, split = timed[1], timed[2]   # the first pass paid for the root's capture
            self._chosen[k] = split < alone
            where = (f"split over {n} replicas" if split < alone
                     else "on the root alone")
            log.info(f"Test net #{k} tests {where}: {split * 1e3:.3g} ms a batch split over "
                     f"{n}, {alone * 1e3:.3g} ms on the root alone")

    def _split_pass(self, k: int, nets: list[Net], iterations: int,
                    autocast: Callable[[], AbstractContextManager[Any]],
                    between: Callable[[], bool]
                    ) -> tuple[dict[str, torch.Tensor] | None, float]:
        """A split pass's means (None when ``between`` stopped it) and its seconds a batch,
        timed after the replicas' chunks are captured."""
        n, queues = len(nets), self._queues[k]
        forwards = self._forwards.get(k, [])
        self.group.spread_state()
        first = _whose_turn(queues)
        graphed = [False] * n
        for r, forward in enumerate(forwards):
            forward.check_layout()
            with _on_device(nets[r].device):
                graphed[r] = forward.ready(autocast)
        chunk = min((forwards[r].slots for r in range(n) if graphed[r]), default=1)
        rounds = _rounds(first, n, iterations, chunk)
        counts = _counts(rounds, n)
        for r, forward in enumerate(forwards):
            if graphed[r]:
                with _on_device(nets[r].device):
                    graphed[r] = forward.capture([c[r] for c in counts if c[r]], "rows",
                                                 autocast)
        layout = next((forwards[r].layout for r in range(n) if graphed[r]), None)
        started = self.clock()
        rows: list[list[torch.Tensor]] = [[] for _ in nets]
        for batches in rounds:
            if between():
                return None, 0.0
            filled = [0] * n
            for r in batches:   # in the stream's order: each replica's turn, its feed's batch
                if graphed[r]:   # indices only need no device
                    with (contextlib.nullcontext() if forwards[r].fills_on_host
                          else _on_device(nets[r].device)):
                        forwards[r].fill(filled[r])
                    filled[r] += 1
                    continue
                with _on_device(nets[r].device), autocast(), torch.no_grad():
                    out = nets[r]()
                layout = layout or RowLayout.of(out)
                rows[r].append(batch_row(out).reshape(1, -1))
            for r in range(n):
                if filled[r]:
                    with _on_device(nets[r].device):
                        forwards[r].replay(filled[r], "rows", autocast)
                        chunk_rows = forwards[r].rows
                        assert chunk_rows is not None
                        # a copy: the next replay writes the rows again
                        rows[r].append(chunk_rows[:filled[r]].clone())
        for replica_net in nets:
            raise_device_problems(replica_net)
        assert layout is not None   # a batch ran, graphed or not
        means = _host_means([r for batches in rounds for r in batches], rows, layout,
                            iterations, nets[0].device)
        return means, (self.clock() - started) / max(1, iterations)

    def _replica_nets(self, k: int, net: Net, spec_state: tuple[Any, Any],
                      pool: Any) -> list[Net] | None:
        fed = {id(layer) for layer in net.data_layers()}
        own = [layer for layer in net.layers if not layer.spec.bottom and id(layer) not in fed]
        if own:
            log.info(f"Note: test net #{k} runs on the root alone: layer '{own[0].name}' "
                     f"({own[0].spec.type}) makes its own data, which the other replicas "
                     "cannot read their share of")
            return None
        root = self.solvers[0]
        if root.param.eval_type == "detection":
            log.info(f"Note: test net #{k} runs on the root alone: the detection evaluation "
                     "gathers every batch's detections there")
            return None
        if self.split is False or len(self.solvers) < 2 or pool is None:
            return None
        spec, state = spec_state
        nets: list[Net] = [net]
        feeds: list[list[Any]] = [[feed_of(layer) for layer in net.data_layers()]]
        for r, worker in enumerate(self.solvers[1:], start=1):
            copy = Net(spec, state.phase, stages=state.stage, level=state.level,
                       device=worker.device, seed=worker.seeds.model)
            copy.share_weights_with(worker.net)
            feeds.append(attach_feeds(copy, pool, replica=r, device=worker.device,
                                      seed=root.seeds.data, by_batch=True))
            nets.append(copy)
        self._queues[k] = [replica_feeds[0].records for replica_feeds in feeds]
        for i, layer in enumerate(net.data_layers()):   # the root reads through the turns
            swap_feed(layer, _Turns([replica_feeds[i] for replica_feeds in feeds], net.device))
        return nets


def _rounds(first: int, n: int, iterations: int, chunk: int) -> list[list[int]]:
    """A split pass's rounds: up to ``chunk`` batches a replica, each round the replica of
    each of its batches in the stream's order (batch i is replica (first + i) mod n's)."""
    order = [(first + i) % n for i in range(iterations)]
    size = chunk * n
    return [order[at:at + size] for at in range(0, iterations, size)]


def _counts(rounds: list[list[int]], n: int) -> list[list[int]]:
    """Each round's batches per replica."""
    return [[batches.count(r) for r in range(n)] for batches in rounds]


def _host_means(order: Sequence[int], rows: Sequence[Sequence[torch.Tensor]],
                layout: RowLayout, iterations: int, root: torch.device
                ) -> dict[str, torch.Tensor]:
    """The means of a split pass as :func:`~caffe_py.solver.evaluate.run_batches` computes
    them on one device: each replica's rows (its batches' values,
    :func:`~caffe_py.solver.graphed_tests.batch_row`) come to the host in one copy, are put in
    batch order (``order``: the replica of each batch) after the total's start (+0.0 for the
    loss, -0.0 for the outputs: what one device adds the first batch to), are summed in that
    order in float32 (``np.add.accumulate``: one add after another down each column, where
    ``np.sum`` would add in pairs), and are divided on the root's device (where one device
    divides, the same operation)."""
    host = [torch.cat(list(part)).cpu().numpy() if part else None for part in rows]
    replicas = np.asarray(order)
    batches = np.empty((len(order) + 1, layout.width), dtype=np.float32)
    batches[0] = layout.start(torch.device("cpu")).numpy()
    for r, part in enumerate(host):
        if part is not None:   # replica r's rows, in its batches' order, where they fall
            batches[1:][replicas == r] = part
    total = np.add.accumulate(batches, axis=0)[-1]
    return layout.means(torch.from_numpy(total).to(root), iterations)


def _host_sum(parts: Sequence[torch.Tensor], n: int) -> None:
    """CPU replicas: each part becomes the sum of all (in replica order) divided by n."""
    total = replica_sum(parts)
    for part in parts:
        part.copy_(total).mul_(1.0 / n)


def _on_device(device: torch.device) -> AbstractContextManager[Any]:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
