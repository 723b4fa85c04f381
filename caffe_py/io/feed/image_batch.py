"""A feed's batches of image files (encoded records the reader hands over undecoded), decoded
and cropped (and the big raw records of an LMDB, cropped by the decode processes): by the CPU
decode processes (:mod:`~caffe_py.io.decoders.decode_processes`), by the decode threads
(torchvision's libjpeg-turbo binding, :mod:`~caffe_py.io.decoders.libjpeg`, or PIL), or on the
GPU (nvJPEG, :mod:`~caffe_py.io.decoders.nvjpeg`).

CPU: each worker decodes its part of the batch and writes each record's crop window, mirrored
where the transform flips it and in Caffe's BGR order, straight into the batch buffer (the
pinned slot on CUDA): the decoded image is read once. The pixels are those of the reader's
own decoder (:func:`~caffe_py.io.formats.datum.decode_image`), bit for bit.

GPU: the batch's files go to nvJPEG in one call and the images are stacked; the feed then crops,
mirrors and turns RGB into BGR with the rest of the transform in one pass on the device
(:meth:`~.transformer.Transformer.device_transform`).
A batch holding anything but JPEG files, or one nvJPEG refuses, is decoded by the CPU workers
instead (a file that no decoder reads is then reported by its key).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from ...errors import DataError
from ..decoders import libjpeg
from ..decoders.decode_processes import DecodeProcesses, InFlight, NoSharedMemory, ProcessCrops
from ..decoders.file_crops import PIL, RAW, TORCHVISION, check_record, crop_record
from ..decoders.workers import THREADS_OVER_NVJPEG, DecodeOptions, DecodeWorkers
from ..formats.envelope import is_jpeg
from ..reader.records import RecordBatch, image_files
from .transformer import Choices

log = logging.getLogger(__name__)


class BatchImages:
    """Decodes the image files of one feed's batches of records of ``record_shape`` (C, H, W)
    from database ``path`` (``color`` as the reader's decoder). ``device`` is the feed's; JPEG
    files are decoded there when ``options`` allow it. ``processes``: the pool's decode
    processes (None: the threads decode); ``feeds``: how many feeds share the threads.
    ``raw``: the files are raw records' pixels (uint8 ``record_shape``), for the processes to
    crop (the reader hands a big LMDB's raw records over so: :attr:`.RecordQueue.raw_files`)."""

    def __init__(self, path: str, record_shape: tuple[int, int, int], color: bool | None,
                 workers: DecodeWorkers, options: DecodeOptions, device: torch.device,
                 processes: DecodeProcesses | None = None, feeds: int = 1, *,
                 raw: bool = False):
        self.path, self.record_shape, self.color = path, record_shape, color
        self.workers = workers
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())  # as the feed's
        self.options, self.device = options, device
        self.gpu_error: str | None = None  # nvJPEG refused a batch: see host()
        self.raw = raw
        self.libjpeg = (not raw and record_shape[0] == 3 and color is not False
                        and self._cpu_decoder() == "torchvision")
        """Whether the CPU workers (and the decode processes) decode colour JPEGs with
        torchvision (:mod:`~caffe_py.io.decoders.libjpeg`)."""
        self.reads = RAW if raw else TORCHVISION if self.libjpeg else PIL
        """What the files are and what reads them (:func:`~.file_crops.crop_record`)."""
        self.crops = (ProcessCrops(processes, path, record_shape, color, self.reads)
                      if processes is not None else None)
        """The decode processes' side of this feed (None: the decode threads decode)."""
        self.gpu = None
        if device.type == "cuda" and options.gpu != "off" and record_shape[0] in (1, 3) \
                and not raw:
            if options.gpu == "auto" and self.crops is not None:
                log.info("%s: JPEG records are decoded in %d CPU processes by %s (faster than "
                         "nvJPEG beside training; CPY_GPU_DECODE=on for nvJPEG)", path,
                         self.crops.processes.count, self.reads)
            elif options.gpu == "auto" and self.libjpeg \
                    and workers.count // max(1, feeds) >= THREADS_OVER_NVJPEG:
                log.info("%s: JPEG records are decoded by torchvision on %d CPU threads (faster "
                         "than nvJPEG beside training; CPY_GPU_DECODE=on for nvJPEG)", path,
                         workers.count)
            else:
                self.gpu = self._gpu_decoder()

    def _cpu_decoder(self) -> str:
        """The CPU workers' JPEG decoder: "torchvision" or "pil" (see DecodeOptions.cpu)."""
        if self.options.cpu == "pil":
            return "pil"
        reason = libjpeg.unavailable()
        if reason is None:
            return "torchvision"
        if self.options.cpu == "torchvision":
            raise DataError(f"{self.path}: cannot decode JPEG records with torchvision: "
                            f"{reason}; install torchvision, or set CPY_CPU_DECODE=auto or pil")
        return "pil"

    def _gpu_decoder(self):
        from ..decoders import nvjpeg

        reason = nvjpeg.unavailable()
        if reason is None:
            return nvjpeg.GpuJpegDecoder(self.device, self.record_shape[0])
        if self.options.gpu == "on":
            raise DataError(f"{self.path}: cannot decode JPEG records on the GPU: {reason}; "
                            "install torchvision, or set CPY_GPU_DECODE=auto or off")
        log.info("%s: JPEG records are decoded on %d CPU threads (%s)", self.path,
                 self.workers.count, reason)
        return None

    # --- the CPU workers ----------------------------------------------------------------------
    def host(self, batch: RecordBatch, choices: Choices, out: np.ndarray) -> None:
        """Decode the batch's files into ``out`` (B, C, h, w) uint8: each record's crop,
        mirrored where ``choices`` flip it."""
        flight = self.start_host(batch, choices, out)
        if flight is not None:
            flight.wait()

    def start_host(self, batch: RecordBatch, choices: Choices, out: np.ndarray,
                   shared: str | None = None) -> InFlight | None:
        """As :meth:`host`; with the decode processes it returns as soon as the batch is
        theirs, and ``out`` holds it after the returned batch's ``wait()`` (None: decoded
        already, by the threads). ``shared``: the shared buffer ``out`` starts at
        (:func:`~caffe_py.io.decoders.decode_processes.shared_buffer`), which the processes
        write the crops into."""
        keys = batch.keys
        offsets, flips = choices.offsets.tolist(), choices.flips.tolist()
        flight = (self._submitted(batch.files, keys, offsets, flips, out, shared)
                  if self.crops is not None else None)
        if flight is not None and self.gpu_error is None:
            return flight
        # the threads decode: files left in the database are read here
        files = image_files(batch.files) if flight is None else ()

        def part(start: int, stop: int) -> None:
            for i in range(start, stop):
                self._decode_into(files[i], keys[i], out[i], offsets[i], flips[i])

        try:
            if flight is not None:  # nvJPEG refused the batch: say so once it is decoded
                flight.wait()
            else:
                self.workers.run(part, len(files), where=self.path)
        except BaseException:
            self.gpu_error = None  # a file no decoder reads: its error is the one to raise
            raise
        if self.gpu_error is not None:
            self._gpu_refused()
        return None

    def _submitted(self, files, keys, offsets: list, flips: list, out: np.ndarray,
                   shared: str | None) -> InFlight | None:
        """The batch submitted to the processes; None where there is too little shared memory
        for them and the threads are to decode it (``auto``; ``on`` raises)."""
        assert self.crops is not None
        try:
            return self.crops.submit(files, keys, offsets, flips, out, shared)
        except NoSharedMemory as exc:
            if self.options.processes == "on":
                raise DataError(f"{exc}; give it more room (docker run --shm-size=1g) or set "
                                "CPY_DECODE_PROCESSES=off") from None
            log.warning("%s; this feed decodes on %d CPU threads instead (give it more room, "
                        "e.g. docker run --shm-size=1g)", exc, self.workers.count)
            crops, self.crops = self.crops, None
            try:  # a batch already in the processes (the buffers of its turn fitted) is theirs
                crops.collect_all()
            finally:
                crops.close()
            return None

    def _decode_into(self, file, key: bytes, out: np.ndarray, offset: list[int],
                     flip: bool) -> None:
        """One record: decode, check its size, write the crop window into ``out``."""
        crop_record(self.path, self.record_shape, self.color, self.reads, file, key, out,
                    offset, flip)

    def close(self) -> None:
        """Let go of the shared buffers of the decode processes (the feed has stopped)."""
        if self.crops is not None:
            self.crops.close()

    # --- the GPU ------------------------------------------------------------------------------
    @property
    def rgb(self) -> bool:
        """Whether :meth:`on_device`'s images are RGB (their channels reversed give Caffe's
        BGR records)."""
        return self.record_shape[0] == 3

    def on_device(self, batch: RecordBatch) -> torch.Tensor | None:
        """The batch's whole images (B, C, H, W) uint8 on the feed's device (its current
        stream), decoded by nvJPEG: RGB (:attr:`rgb`) or gray; None when this batch is the CPU
        workers' (no GPU decoder, files other than JPEG, or nvJPEG refused them)."""
        if self.gpu is None:
            return None
        files = image_files(batch.files)
        if not all(is_jpeg(f) for f in files):
            return None
        try:
            images = self.gpu.decode(files)
        except RuntimeError as exc:  # a file nvJPEG cannot read: the CPU decides (host())
            self.gpu_error = " ".join(str(exc).split())
            return None
        shape = self.record_shape
        for key, image in zip(batch.keys, images, strict=True):
            if tuple(image.shape) != shape:
                check_record(self.path, key, np.empty(tuple(image.shape), np.uint8), shape,
                             np.dtype(np.uint8))
        if self.gpu.stream is None:
            return torch.stack(images)
        # decoded on another device: stack there and copy over, both on its stream (the copy
        # orders this device's after)
        with torch.cuda.stream(self.gpu.stream):
            return torch.stack(images).to(self.device, non_blocking=True)

    def _gpu_refused(self) -> None:
        """nvJPEG refused files the CPU decoded: stop using it (auto), or say so (on)."""
        reason, self.gpu_error = self.gpu_error, None
        if self.options.gpu == "on":
            raise DataError(f"{self.path}: nvJPEG could not decode a batch of JPEG records "
                            f"that PIL decodes ({reason}); set CPY_GPU_DECODE=off or auto")
        log.info("%s: nvJPEG could not decode a batch (%s); JPEG records are decoded on %d "
                 "CPU threads from now on", self.path, reason, self.workers.count)
        self.gpu = None
