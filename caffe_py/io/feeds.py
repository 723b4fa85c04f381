"""Feeds for a net's Data layers: the one place that knows what a Data layer holds.

:func:`attach_feeds` subscribes each Data layer of a net (its ``data_param``, effective
``transform``, record shape, dtype and color) to a :class:`~.reader.ReaderPool`, builds its feed
(a :class:`~.prefetch.Prefetcher`), hands the feed to the pool (started and closed with the
readers) and gives it to the layer. :func:`feed_of` and :func:`swap_feed` let a step that
replaces a layer's feed for a while (the CUDA-graph step's static feed) do so without reaching
into the layer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from .prefetch import Prefetcher
    from .reader import ReaderPool


class Feed(Protocol):
    """What a Data layer's ``forward`` reads: ``next()`` -> data (B, C, h, w) float32 and
    labels (B,) int64 on the device."""

    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...


class NetWithData(Protocol):
    """A net, as far as feeds go: its Data layers."""

    def data_layers(self) -> list[Any]: ...


def attach_feeds(net: NetWithData, pool: ReaderPool, *, replica: int = 0,
                 device: str | torch.device = "cpu", seed: int) -> list[Prefetcher]:
    """Give every Data layer of ``net`` a feed of replica ``replica``'s records from ``pool``,
    transformed on ``device``; ``seed`` draws the random crops and mirrors (and the rand_skip
    start). Call before ``pool.start()``. Returns the feeds (Prefetchers), in layer order.

    Every replica of a run passes the run's seed: a record's crop and mirror are a function of
    (seed, stream position), so N replicas of batch B then see exactly the images one replica
    of batch N x B sees (Caffe seeds each worker with random_seed + device instead)."""
    from .image_batch import BatchImages
    from .prefetch import Prefetcher
    from .transformer import Transformer

    feeds = []
    for layer in net.data_layers():
        dp, phase = layer.param("data_param"), layer.phase
        stream = f"{phase}/{layer.name}"
        queue = pool.subscribe(dp.source, stream, replica=replica, batch_size=dp.batch_size,
                               prefetch=dp.prefetch, record_shape=layer.record_shape,
                               dtype=layer.record_dtype, color=layer.color,
                               rand_skip=dp.rand_skip, seed=seed, encoded=layer.record_encoded)
        transformer = Transformer(layer.transform, phase, layer.record_shape, seed=seed,
                                  where=f"layer '{layer.name}' ({dp.source}): ")
        device = torch.device(device)
        images = BatchImages(dp.source, layer.record_shape, layer.color, transformer,
                             pool.workers, pool.decode, device) if layer.record_encoded else None
        feed = Prefetcher(queue, transformer, dp.batch_size, device=device,
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
