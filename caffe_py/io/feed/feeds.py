"""Feeds for a net's data layers: the one place that knows what a data layer holds.

:func:`attach_feeds` subscribes each data layer of a net (what its :meth:`feed_spec` says: the
source, batch, record shape, dtype and color, effective ``transform``, how its database opens and
what decodes its records) to a :class:`~caffe_py.io.reader.reader.ReaderPool`, builds its feed (a
:class:`~.prefetch.Prefetcher`), hands the feed to the pool (started and closed with the readers)
and gives it to the layer. :func:`feed_of` and :func:`swap_feed` let a step that replaces a layer's
feed for a while (the CUDA-graph step's static feed) do so without reaching into the layer. """
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ..reader.reader import ReaderPool
    from ..reader.records import FeedSpec


class Feed(Protocol):
    """What a Data layer's ``forward`` reads: ``next()`` -> data (B, C, h, w) float32 and
    labels (B,) int64 on the device."""

    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...


class NetWithData(Protocol):
    """A net, as far as feeds go: its data layers (each with ``feed_spec(seed, draws)``,
    ``phase``, ``name`` and ``attach(feed)``; ``draws`` is the net's
    :class:`~caffe_py.io.db.caffe_rng.GlobalDraws`, Caffe's caffe_rng_rand() stream)."""

    def data_layers(self) -> list[Any]: ...


def attach_feeds(net: NetWithData, pool: ReaderPool, *, replica: int = 0,
                 device: str | torch.device = "cpu", seed: int,
                 by_batch: bool = False) -> list[Any]:
    """Give every Data layer of ``net`` a feed of replica ``replica``'s records from ``pool``,
    transformed on ``device``; ``seed`` draws the random crops and mirrors (and the rand_skip
    start); ``by_batch``: the replicas take whole batches in turn (a test pass split over
    them), not Caffe's records in turn. Call before ``pool.start()``. Returns the feeds
    (Prefetchers, or a layer's own feed where its FeedSpec has ``make_feed``), in layer
    order.

    Every replica of a run passes the run's seed: a record's crop and mirror are a function of
    (seed, stream position), so N replicas of batch B then see exactly the images one replica
    of batch N x B sees (Caffe seeds each worker with random_seed + device instead)."""
    from ..db.caffe_rng import GlobalDraws
    from .image_batch import BatchImages
    from .prefetch import Prefetcher
    from .transformer import Transformer

    feeds = []
    draws = GlobalDraws(seed)  # the net's data layers draw their seeds in order, as in Caffe
    for layer in net.data_layers():
        spec: FeedSpec = layer.feed_spec(seed, draws)
        stream = f"{layer.phase}/{layer.name}"
        queue = pool.subscribe(spec, stream, replica=replica, seed=seed, by_batch=by_batch)
        on = torch.device(device)
        if spec.make_feed is not None:  # the layer's own feed (AnnotatedData's)
            own = spec.make_feed(queue, on, seed, f"{stream}#{replica}")
            pool.manage(own)
            layer.attach(own)
            feeds.append(own)
            continue
        transformer = Transformer(spec.transform, layer.phase, spec.record_shape, seed=seed,
                                  where=f"layer '{layer.name}' ({spec.source}): ")
        images = (BatchImages(spec.source, spec.record_shape, spec.color, pool.workers,
                              pool.decode, on, pool.processes, pool.replicas,
                              raw=not spec.encoded)
                  if spec.encoded or queue.leaves_raw else None)
        feed = Prefetcher(queue, transformer, spec.batch_size, device=on,
                          name=f"{stream}#{replica}", images=images)
        pool.manage(feed)
        layer.attach(feed)
        feeds.append(feed)
    return feeds


def feed_of(layer: Any) -> Feed | None:
    """The feed a Data layer reads (None before :func:`attach_feeds`)."""
    return layer.feed


def swap_feed(layer: Any, feed: Feed) -> Feed | None:
    """Make a Data layer read ``feed``; returns the feed it read before (to put back)."""
    previous = layer.feed
    layer.attach(feed)
    return previous
