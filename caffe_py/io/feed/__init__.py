"""A net's data layers fed: each layer's queue of records turned into batches on the device
(a prefetch thread, or gathered in the training loop), transformed as Caffe's DataTransformer
does (README.md)."""
from .feeds import Feed, attach_feeds, feed_of, swap_feed
from .transformer import Transformer

__all__ = ["Feed", "Transformer", "attach_feeds", "feed_of", "swap_feed"]
