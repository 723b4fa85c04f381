"""Caffe's DataTransformer (data_transformer.cpp), split into a host half and a device half.

Per record, in Caffe's order: crop (random offsets in TRAIN, the centre in TEST) -> mirror
(at random, when set, in both phases) -> ``(x - mean) * scale``. The mean is a full-size image
(``mean_file``, indexed at the crop offset and mirrored with the crop, as Caffe indexes it) or
one value per channel (``mean_value``).

- :meth:`Transformer.host` crops and mirrors records into a (B, C, h, w) batch of the records'
  own dtype (uint8 for pixel records), so the host-to-device copy moves bytes, not floats.
- :meth:`Transformer.device` turns that batch into float32 on the device and subtracts the
  mean and scales there.
- :meth:`Transformer.device_transform` does both halves on the device for whole records (crop,
  mirror, mean, scale): on CUDA in one kernel (``caffe_py/kernels/csrc/transform.cu``), whose
  reference, bit for bit, is :meth:`Transformer.device_crop` followed by ``device``.

Random choices are a pure function of (seed, record position in the stream): a batch gets the
same crops whichever thread assembles it and however far ahead, a resumed run repeats them, and
N replicas of batch B draw exactly what one replica of batch N x B draws.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from ...errors import DataError
from ...spec.net_spec import TransformationParameter
from ..formats import blobproto

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def force_color(tp: TransformationParameter) -> bool | None:
    """The ``color`` argument for decoding encoded records: True, False or None (native)."""
    if tp.force_color:
        return True
    if tp.force_gray:
        return False
    return None


@dataclass(frozen=True)
class Choices:
    """The random choices for one batch: crop offsets (B, 2) as (h_off, w_off), flips (B,)."""

    offsets: np.ndarray
    flips: np.ndarray


class Transformer:
    """Applies one layer's ``transform_param`` to records of shape ``record_shape`` (C, H, W).

    ``where`` names the layer and database in error messages. Construction validates the
    parameters against the record shape (crop size, mean shape, mean_value count).
    """

    def __init__(self, tp: TransformationParameter, phase: str, record_shape: Sequence[int],
                 *, seed: int = 0, where: str = ""):
        self.tp, self.phase, self.seed = tp, phase, int(seed) & _MASK64
        self.where = where
        c, h, w = (int(d) for d in record_shape)
        self.record_shape = (c, h, w)
        crop = tp.crop_size
        if crop and (crop > h or crop > w):
            raise DataError(f"{where}transform_param.crop_size {crop} is larger than the "
                            f"records ({c} x {h} x {w}); use a crop_size <= {min(h, w)}")
        self.out_shape = (c, crop, crop) if crop else (c, h, w)
        self.random = bool((crop and phase == "TRAIN") or tp.mirror)
        """Whether records get random crops or flips (else every batch has one Choices)."""
        self.mean = self._load_mean()  # (C, H, W) float32, (C, 1, 1), or None
        self._fixed_choices: dict[int, Choices] = {}
        self._windows: tuple[np.ndarray, np.ndarray] | None = None  # see gather()

    # --- validation ---------------------------------------------------------------------------
    def _load_mean(self) -> np.ndarray | None:
        c = self.record_shape[0]
        if self.tp.mean_file:
            mean = read_mean_file(self.tp.mean_file)
            if tuple(mean.shape) != self.record_shape:
                raise DataError(f"{self.where}mean_file {self.tp.mean_file} has shape "
                                f"{list(mean.shape)} but the records are "
                                f"{list(self.record_shape)}; compute the mean of this "
                                "database (cpy compute-mean) or fix transform_param.mean_file")
            return mean
        values = self.tp.mean_value
        if not values:
            return None
        if len(values) not in (1, c):
            raise DataError(f"{self.where}transform_param.mean_value has {len(values)} values "
                            f"for {c} channels; give one value, or one per channel")
        return np.asarray(values * c if len(values) == 1 else values,
                          dtype=np.float32).reshape(c, 1, 1)

    # --- random choices -----------------------------------------------------------------------
    def choices(self, positions: Sequence[int] | np.ndarray) -> Choices:
        """Crop offsets and flips for the records at these stream positions.

        Per record, as Caffe draws them: mirror first, then h_off, then w_off (TRAIN only);
        TEST crops the centre. Drawn for the whole batch at once (splitmix64 in uint64
        numpy); without random choices the same constant Choices is returned every batch.
        """
        _, h, w = self.record_shape
        crop = self.tp.crop_size
        n = len(positions)
        random_crop = crop and self.phase == "TRAIN"
        if not (random_crop or self.tp.mirror):
            return self._fixed(n)
        with np.errstate(over="ignore"):
            state = np.asarray(positions, dtype=np.uint64) * np.uint64(_GOLDEN)
            state ^= np.uint64(self.seed)
            r_mirror, state = _splitmix64_np(state)
            r_h, state = _splitmix64_np(state)
            r_w, _ = _splitmix64_np(state)
        flips = (r_mirror & np.uint64(1)).astype(bool) if self.tp.mirror else np.zeros(n, bool)
        if random_crop:
            offsets = np.stack([r_h % np.uint64(h - crop + 1),
                                r_w % np.uint64(w - crop + 1)], 1).astype(np.int64)
        else:
            offsets = self._fixed(n).offsets
        return Choices(offsets, flips)

    def choices_for(self, first: int, step: int, n: int) -> Choices:
        """:meth:`choices` for positions first, first + step, ... (n of them): a feed's batch.
        Without random choices no position array is made at all."""
        if not self.random:
            return self._fixed(n)
        return self.choices(np.arange(first, first + step * n, step))

    def _fixed(self, n: int) -> Choices:
        """The choices without randomness: the centre crop (or none), no flips; cached."""
        fixed = self._fixed_choices.get(n)
        if fixed is None:
            _, h, w = self.record_shape
            crop = self.tp.crop_size
            offsets = np.zeros((n, 2), dtype=np.int64)
            if crop:
                offsets[:] = ((h - crop) // 2, (w - crop) // 2)
            offsets.flags.writeable = False
            flips = np.zeros(n, dtype=bool)
            flips.flags.writeable = False
            fixed = self._fixed_choices[n] = Choices(offsets, flips)
        return fixed

    # --- the host half ------------------------------------------------------------------------
    def host(self, arrays: Sequence[np.ndarray] | np.ndarray, choices: Choices, out: np.ndarray,
             *, mirror: bool = True) -> None:
        """Crop each (C, H, W) record into ``out`` (B, C, h, w), keeping its dtype; mirror too
        unless ``mirror`` is False (the device half flips instead). ``arrays`` is a list of
        records or one (B, C, H, W) array (one numpy copy when every record has the same
        window and none is flipped)."""
        _, ch, cw = self.out_shape
        flips = choices.flips
        flipped = mirror and flips.any()
        if not flipped and (not self.tp.crop_size or choices is self._fixed_choices.get(len(out))):
            h0, w0 = (int(v) for v in choices.offsets[0]) if len(out) else (0, 0)
            if isinstance(arrays, np.ndarray):
                np.copyto(out, arrays[:, :, h0:h0 + ch, w0:w0 + cw])
            else:
                np.stack([a[:, h0:h0 + ch, w0:w0 + cw] for a in arrays], out=out)
            return
        for i, array in enumerate(arrays):
            h0, w0 = (int(v) for v in choices.offsets[i])
            window = array[:, h0:h0 + ch, w0:w0 + cw]
            out[i] = window[:, :, ::-1] if flipped and flips[i] else window

    def gather(self, records: np.ndarray, index: np.ndarray, choices: Choices,
               out: np.ndarray | None = None, *, mirror: bool = True) -> np.ndarray:
        """Records ``index`` (B,) of a decoded database ``records`` (N, C, H, W), cropped (and
        mirrored unless ``mirror`` is False) exactly as :meth:`host` does, into ``out`` or a
        new (B, C, h, w) array: one numpy gather (plus one flip), no Python per record."""
        _, ch, cw = self.out_shape
        offsets = choices.offsets
        fixed = choices is self._fixed_choices.get(len(index))  # no flips, one window for all
        if not self.tp.crop_size:  # whole records: one take (mode clip: no buffered copy)
            picked = np.take(records, index, axis=0, out=out, mode="clip")
        else:
            if fixed:
                h0, w0 = (int(v) for v in offsets[0]) if len(index) else (0, 0)
                picked = records[index, :, h0:h0 + ch, w0:w0 + cw]
            else:  # a window per record: index the (N, C, H', W', h, w) view of all windows
                if self._windows is None or self._windows[0] is not records:
                    self._windows = (records, sliding_window_view(records, (ch, cw), (2, 3)))
                picked = self._windows[1][index, :, offsets[:, 0], offsets[:, 1]]
            if out is not None:
                np.copyto(out, picked)
                picked = out
        flips = choices.flips
        if mirror and not fixed and flips.any():
            picked[flips] = picked[flips][..., ::-1]
        return picked

    # --- numpy only (the CPU feed thread) -------------------------------------------------------
    def numpy(self, arrays: np.ndarray, choices: Choices) -> np.ndarray:
        """The whole transform of a (B, C, H, W) record array with numpy only: (B, C, h, w)
        float32, equal to :meth:`__call__` bit for bit (the same float32 subtract and
        multiply). numpy's loops release the GIL and start no OpenMP team."""
        if self.tp.crop_size or choices.flips.any():
            cropped = np.empty((len(arrays), *self.out_shape), arrays.dtype)
            self.host(arrays, choices, cropped)
            arrays = cropped
        return self.numpy_values(arrays, choices)

    def numpy_values(self, arrays: np.ndarray, choices: Choices) -> np.ndarray:
        """The value half of :meth:`numpy` for records already cropped and mirrored
        (B, C, h, w): ``(x - mean) * scale`` in float32, always a new array."""
        scale = np.float32(self.tp.scale)
        if self.mean is not None:
            x = np.subtract(arrays, self._mean_np(choices), dtype=np.float32)
            return np.multiply(x, scale, out=x) if scale != 1 else x
        if scale != 1:
            return np.multiply(arrays, scale, dtype=np.float32)
        return arrays.astype(np.float32)

    def _mean_np(self, choices: Choices) -> np.ndarray:
        """:meth:`_mean_for` in numpy: (C, 1, 1), (C, h, w) or (B, C, h, w)."""
        mean = self.mean
        assert mean is not None  # numpy_values calls this only with a mean
        if self.tp.mean_file == "":
            return mean
        _, ch, cw = self.out_shape
        if (choices.offsets == choices.offsets[0]).all() and \
                (choices.flips == choices.flips[0]).all():
            h0, w0 = (int(v) for v in choices.offsets[0])
            window = mean[:, h0:h0 + ch, w0:w0 + cw]
            return window[:, :, ::-1] if choices.flips[0] else window
        rows = choices.offsets[:, :1] + np.arange(ch)  # (B, h)
        steps = np.where(choices.flips[:, None], cw - 1 - np.arange(cw), np.arange(cw))
        cols = choices.offsets[:, 1:] + steps  # (B, w), reversed for flipped records
        return mean[:, rows[:, :, None], cols[:, None, :]].transpose(1, 0, 2, 3)

    # --- the device half ----------------------------------------------------------------------
    def device_mean(self, device: torch.device) -> torch.Tensor | None:
        """The mean as a float32 tensor on ``device`` (computed once per feed)."""
        return None if self.mean is None else torch.from_numpy(self.mean).to(device)

    def device(self, batch: torch.Tensor, choices: Choices, mean: torch.Tensor | None, *,
               mirror: bool = False) -> torch.Tensor:
        """(B, C, h, w) cropped records -> float32 ``(x - mean) * scale``; with ``mirror`` the
        records the choices flip are flipped here (``host`` was called with mirror=False).

        ``mean`` is :meth:`device_mean` on the batch's device. ``batch`` may be consumed
        (flipped in place); the result is always a new tensor, so ``batch`` may be a staging
        buffer that is written again later. On CUDA one kernel does it all (a ResNet-50 batch
        of crops took 0.9 ms of GPU time in the four passes of the ops below, beside the
        training kernels); the results are the same bits.
        """
        if _values_fusable(batch, mean):
            from ...kernels import functions

            out = torch.empty(batch.shape, dtype=torch.float32, device=batch.device)
            return functions.cropped_transform(batch, _where(choices, batch.device), mean,
                                               self.tp.scale, mirror, out)
        if mirror and choices.flips.any():
            idx = _to_device(np.flatnonzero(choices.flips), batch.device)
            batch[idx] = batch[idx].flip(-1)
        scale = self.tp.scale
        if mean is not None:  # uint8 - float32 -> float32: the float conversion comes free
            x = torch.sub(batch, self._mean_for(mean, choices, batch.device))
            return x.mul_(scale) if scale != 1.0 else x
        if scale != 1.0 and batch.dtype in (torch.uint8, torch.float32):
            return torch.mul(batch, scale)  # one op: float32 out, as to(float32).mul_(scale)
        x = batch.to(torch.float32, copy=True)
        return x.mul_(scale) if scale != 1.0 else x

    def device_crop(self, images: torch.Tensor, choices: Choices, *,
                    reverse_channels: bool = False) -> torch.Tensor:
        """Whole records (B, C, H, W) on a device -> their crops (B, C, h, w), mirrored where
        the choices flip: the pixels :meth:`host` picks, in one gather on the device.
        ``reverse_channels`` turns a decoder's RGB into Caffe's BGR in the same gather."""
        b, c = images.shape[:2]
        _, ch, cw = self.out_shape
        device = images.device
        if choices is self._fixed_choices.get(b):  # one window for all, no flips: a slice
            h0, w0 = (int(v) for v in choices.offsets[0]) if b else (0, 0)
            window = images[:, :, h0:h0 + ch, w0:w0 + cw]
            return window.flip(1) if reverse_channels else window
        steps = np.arange(cw)
        rows = choices.offsets[:, :1] + np.arange(ch)  # (B, h)
        cols = choices.offsets[:, 1:] + np.where(choices.flips[:, None], cw - 1 - steps, steps)
        index = _to_device(np.concatenate([rows, cols], 1), device)  # one copy: (B, h + w)
        rows_t, cols_t = index[:, :ch], index[:, ch:]
        channels = torch.arange(c, device=device)
        if reverse_channels:
            channels = channels.flip(0)
        batch = torch.arange(b, device=device)
        return images[batch[:, None, None, None], channels[None, :, None, None],
                      rows_t[:, None, :, None], cols_t[:, None, None, :]]

    def device_transform(self, records: torch.Tensor, choices: Choices,
                         mean: torch.Tensor | None, *,
                         reverse_channels: bool = False) -> torch.Tensor:
        """Whole records (B, C, H, W) on a device -> the transformed batch (B, C, h, w)
        float32: :meth:`device_crop`, then :meth:`device`. On CUDA one kernel does it all (a
        read of each crop window and one write), where the two calls take four passes over
        the batch; the results are the same bits. ``mean`` is :meth:`device_mean`'s."""
        if _fusable(records, mean, self.out_shape):
            from ...kernels import functions

            out = torch.empty((len(records), *self.out_shape), dtype=torch.float32,
                              device=records.device)
            return functions.crop_transform(records, _where(choices, records.device), mean,
                                            self.tp.scale, reverse_channels, out)
        crops = self.device_crop(records, choices, reverse_channels=reverse_channels)
        return self.device(crops, choices, mean)

    def _mean_for(self, mean: torch.Tensor, choices: Choices,
                  device: torch.device) -> torch.Tensor:
        """The mean each record subtracts: (C, 1, 1), (C, h, w), or (B, C, h, w) when the
        crop offsets or flips differ between records."""
        if self.tp.mean_file == "":
            return mean
        _, ch, cw = self.out_shape
        same = (choices.offsets == choices.offsets[0]).all() and \
            (choices.flips == choices.flips[0]).all()
        if same:
            h0, w0 = (int(v) for v in choices.offsets[0])
            window = mean[:, h0:h0 + ch, w0:w0 + cw]
            return window.flip(-1) if choices.flips[0] else window
        offsets = _to_device(choices.offsets, device)
        flips = _to_device(choices.flips, device)
        rows = offsets[:, :1] + torch.arange(ch, device=device)  # (B, h)
        steps = torch.arange(cw, device=device)
        steps = torch.where(flips[:, None], cw - 1 - steps, steps)
        cols = offsets[:, 1:] + steps  # (B, w), reversed for flipped records
        picked = mean[:, rows[:, :, None], cols[:, None, :]]  # (C, B, h, w)
        return picked.permute(1, 0, 2, 3)

    def __call__(self, arrays: Sequence[np.ndarray], positions: Sequence[int]) -> torch.Tensor:
        """The whole transform on the CPU, for a list of records: (B, C, h, w) float32."""
        choices = self.choices(positions)
        out = np.empty((len(arrays), *self.out_shape), dtype=arrays[0].dtype)
        self.host(arrays, choices, out)
        return self.device(torch.from_numpy(out), choices, self.device_mean(torch.device("cpu")))


def _fusable(records: torch.Tensor, mean: torch.Tensor | None,
             out_shape: tuple[int, int, int]) -> bool:
    """Whether :meth:`Transformer.device_transform` can take the CUDA kernel: dense uint8 or
    float32 records on CUDA, a float32 mean of one value per channel or per pixel beside them,
    and the kernels built."""
    return (_dense_cuda(records) and tuple(records.shape[1:2]) == out_shape[:1]
            and out_shape[1] <= min(records.shape[2], 65535) and out_shape[2] <= records.shape[3]
            and _mean_fits(mean, records, records.shape[2:], exact=True) and _built())


def _values_fusable(crops: torch.Tensor, mean: torch.Tensor | None) -> bool:
    """Whether :meth:`Transformer.device` can take the CUDA kernel: dense uint8 or float32
    crops on CUDA, no taller than 65,535 rows, a float32 mean of one value per channel or per
    record pixel (C, H, W) beside them, and the kernels built."""
    return (_dense_cuda(crops) and crops.shape[2] <= 65535
            and _mean_fits(mean, crops, crops.shape[2:]) and _built())


def _dense_cuda(batch: torch.Tensor) -> bool:
    return (batch.is_cuda and batch.dim() == 4 and batch.is_contiguous()
            and batch.dtype in (torch.uint8, torch.float32))


def _mean_fits(mean: torch.Tensor | None, batch: torch.Tensor, plane: Sequence[int], *,
               exact: bool = False) -> bool:
    """A mean the kernels read: none, or float32 and dense on the batch's device, one value
    per channel or (C, H, W) with (H, W) ``plane`` (``exact``) or at least as large."""
    if mean is None:
        return True
    c = batch.shape[1]
    if not (mean.device == batch.device and mean.dtype == torch.float32
            and mean.is_contiguous()):
        return False
    if mean.numel() == c:
        return True
    if mean.dim() != 3 or mean.shape[0] != c:
        return False
    if exact:
        return tuple(mean.shape[1:]) == tuple(plane)
    return mean.shape[1] >= plane[0] and mean.shape[2] >= plane[1]


def _built() -> bool:
    from ...kernels import build

    return build.available()


def _where(choices: Choices, device: torch.device) -> torch.Tensor:
    """The kernels' (B, 3) int32 rows of (h0, w0, flip), on ``device``."""
    where = np.empty((len(choices.flips), 3), np.int32)
    where[:, :2] = choices.offsets
    where[:, 2] = choices.flips
    return _to_device(where, device)


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array as a tensor on ``device``, without blocking the thread: to CUDA via
    pinned memory and a non_blocking copy on the current stream (torch's pinned allocator keeps
    the block until the copy is done), where a copy from pageable memory would wait for every
    kernel queued on that stream. A copy of ``array``, which may be read-only."""
    tensor = torch.from_numpy(np.array(array))
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _splitmix64_np(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_splitmix64` on a uint64 array (numpy's uint64 arithmetic wraps mod 2^64)."""
    state = state + np.uint64(_GOLDEN)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31)), state


def _splitmix64(state: int) -> tuple[int, int]:
    """One step of splitmix64: (a 64-bit random value, the next state)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31), state


# --- mean files -----------------------------------------------------------------------------
def read_mean_file(path: str | Path) -> np.ndarray:
    """transform_param.mean_file as a (C, H, W) float32 array; errors name the field."""
    try:
        return blobproto.read_mean_file(path)
    except DataError as exc:
        raise DataError(f"mean_file {exc}") from None
