"""Layer family: Python (Caffe's PythonLayer), a layer whose code is the user's own class.

``python_param {module, layer, param_str}`` names a module and a class in it. The module is
imported from ``sys.path`` (PYTHONPATH, as Caffe's embedded interpreter), and failing that
from the directory of the spec file, which is then added to the end of ``sys.path``; the run
says once which file it imports, before importing it. A net built for inspection (net option
``inspect``: ``cpy net``) imports no module unless the option ``allow_python`` is set: it is
refused naming the file that would run. The class takes one of two forms:

- A Caffe Python layer (pycaffe's ``caffe.Layer`` interface): ``setup`` / ``reshape`` /
  ``forward(bottom, top)`` / ``backward(top, propagate_down, bottom)`` over blobs whose
  ``.data`` and ``.diff`` are numpy arrays. Existing files run unchanged: ``import caffe`` gets
  caffe-py's stand-in (:mod:`caffe_py.layers.pycaffe`) when pycaffe is not already imported.
  The forward copies the bottoms to numpy and the tops back; the backward is wired into
  autograd, so the class's ``backward`` gives the bottoms' and its blobs' gradients.
- A torch-native layer (:class:`TorchLayer`): ``setup(bottom_shapes) -> top shapes`` and
  ``forward(*bottoms) -> top(s)`` on tensors under autograd, on the net's device; no copies,
  no hand-written backward: the fast form.
- A torch-native data source (:class:`DatasetLayer`): batches from a map-style dataset (a
  torch ``Dataset``, torchvision's included, or anything with ``len`` and ``[i]``), in order
  or shuffled per epoch from the run's data seed, replica ``i`` of ``R`` taking records i,
  i+R, ... as from Caffe's DataReader; its read position is saved in the solver state, so a
  resume reads on exactly as from an LMDB.

An error in the user's module (it does not import, lacks the class, or raises in setup,
forward or backward) is one NetError naming the layer, the module and where it was raised.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import logging
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from .. import interrupts
from ..errors import CaffePyError, NetError
from ..spec.layer_params.shared import FillerParameter
from ..spec.schema import location, suggest
from . import pycaffe
from .base import Layer, Shape
from .registry import register

log = logging.getLogger(__name__)


class TorchLayer:
    """Base of a torch-native Python layer: tensors in, tensors out, autograd for backward.

    ::

        from caffe_py.layers.python import TorchLayer

        class ChannelScale(TorchLayer):
            def setup(self, bottom_shapes):            # [(N, C, H, W)] -> top shapes
                self.add_blob((bottom_shapes[0][1],), {"type": "constant", "value": 1.0})
                return [bottom_shapes[0]]

            def forward(self, x):                      # tensors -> tensor or tuple
                return x * self.blobs[0].view(1, -1, 1, 1)

    Set before ``setup``: ``param_str`` (python_param.param_str), ``phase`` ('TRAIN' or
    'TEST') and ``device``. Blobs made with :meth:`add_blob` are the layer's blobs in Caffe
    order (learnable ones are trained by the solver and saved in snapshots).
    """

    param_str: str = ""
    phase: str = "TRAIN"
    device: torch.device = torch.device("cpu")
    _host: Layer | None = None

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        """Check the bottom shapes, add blobs, return the top shapes."""
        raise NotImplementedError(f"{type(self).__name__}.setup")

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def add_blob(self, shape: Sequence[int], filler: FillerParameter | dict | None = None,
                 learnable: bool = True) -> torch.Tensor:
        """Add the next blob (a filler message or dict such as {"type": "xavier"}; None:
        zeros) and return it."""
        if isinstance(filler, dict):
            filler = FillerParameter(**filler)
        host = self._net_layer("add_blob")
        return host.add_blob(f"blob{len(host.blob_names)}", tuple(shape), filler, learnable)

    @property
    def blobs(self) -> list[torch.Tensor]:
        """The blobs in Caffe order, as the net holds them now (weight sharing included)."""
        return self._net_layer("blobs").blobs()

    def _net_layer(self, what: str) -> Layer:
        """The net's Python layer this one runs in, which holds its blobs."""
        if self._host is None:
            name = type(self).__name__
            raise NetError(f"{name}.{what}: a TorchLayer's blobs live in a net; build it "
                           f"from a net spec's Python layer (python_param: {{layer: '{name}', "
                           "module: ...}) instead of calling it on its own")
        return self._host


class DatasetLayer(TorchLayer):
    """Base of a torch-native data source: a Python layer without bottoms whose tops are the
    fields of a dataset's records, batch by batch.

    ::

        from caffe_py.layers.python import DatasetLayer

        class Fashion(DatasetLayer):
            batch_size = 64                     # or python_param.param_str: "batch_size: 64"
            shuffle = True                      # a new order each epoch, from the run's seed

            def dataset(self):                  # len(d) records; d[i] -> (image, label)
                return torchvision.datasets.FashionMNIST("data", train=self.phase == "TRAIN",
                                                         transform=ToTensor())

    A record is a tuple with one field per top (a tensor, an array or a number; one top: the
    field alone); a top is the stacked field, float32 on the net's device, e.g. data
    (B, 1, 28, 28) and label (B,). ``param_str`` may be a YAML mapping of ``batch_size``,
    ``shuffle`` and the subclass's own attributes. Epoch ``e``'s order is a permutation drawn
    from (data seed, e) when ``shuffle``, else the dataset's. The read position (records this
    replica has read) is the layer's :meth:`source_state`: the solver state keeps it, and a
    resume reads on from the next record, in the same order.
    """

    batch_size: int = 0
    shuffle: bool = False

    def dataset(self) -> Any:
        """The records: an object with ``__len__`` and ``__getitem__`` (a torch Dataset)."""
        raise NotImplementedError(f"{type(self).__name__}.dataset")

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        if bottom_shapes:
            raise ValueError(f"a data source takes no bottoms, got {len(bottom_shapes)}")
        options = yaml.safe_load(self.param_str) if self.param_str.strip() else {}
        if not isinstance(options, dict):
            raise ValueError(f"param_str {self.param_str!r} is not a YAML mapping such as "
                             "'batch_size: 64'")
        for key, value in options.items():
            setattr(self, str(key), value)
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size is {self.batch_size!r}; set it (a class attribute, "
                             "or param_str 'batch_size: 64') to a number >= 1")
        self.records = self.dataset()
        self.count = len(self.records)
        if self.count == 0:
            raise ValueError("the dataset has no records")
        self.position, self.seed, self.replica, self.replicas = 0, 0, 0, 1
        self._orders: dict[int, torch.Tensor] = {}
        first = self._fields(0)
        tops = len(self._host.spec.top) if self._host is not None else len(first)
        if len(first) != tops:
            raise ValueError(f"a record has {len(first)} field(s) for {tops} top(s)")
        return [(self.batch_size, *f.shape) for f in first]

    def _fields(self, index: int) -> list[torch.Tensor]:
        record = self.records[index]
        fields = record if isinstance(record, (tuple, list)) else (record,)
        return [f.detach() if isinstance(f, torch.Tensor) else torch.as_tensor(np.asarray(f))
                for f in fields]

    def _record_at(self, position: int) -> int:
        """The dataset index of record ``position`` of the one order (epoch after epoch)."""
        epoch, i = divmod(position, self.count)
        if not self.shuffle:
            return i
        if epoch not in self._orders:
            self._orders = {epoch: torch.randperm(self.count, generator=torch.Generator()
                                                  .manual_seed(self.seed * 1_000_003 + epoch))}
        return int(self._orders[epoch][i])

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        rows = []  # a source: no bottoms
        for k in range(self.batch_size):
            position = (self.position + k) * self.replicas + self.replica
            rows.append(self._fields(self._record_at(position)))
        self.position += self.batch_size
        tops = tuple(torch.stack(column).to(self.device, torch.float32)
                     for column in zip(*rows, strict=True))
        return tops[0] if len(tops) == 1 else tops

    def state_dict(self) -> dict[str, Any]:
        """The read position (records this replica has read), saved in the solver state."""
        return {"position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.position = int(state["position"])

    def bind(self, seed: int, replica: int, replicas: int) -> None:
        """The run's data seed and this replica's share (records replica, replica + replicas,
        ... of the one order)."""
        self.seed, self.replica, self.replicas = seed, replica, replicas
        self._orders = {}


@register("Python")
class Python(Layer):
    """A layer implemented by the class python_param names (see the module's docstring)."""

    bottoms = (0, None)
    tops = (0, None)
    capturable = False   # the user's code runs on the host every forward

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        self.where = f"{p.module}.{p.layer}"
        cls = self._load_class(p.module, p.layer)
        if isinstance(cls, type) and issubclass(cls, TorchLayer):
            self.impl: Any = self._call(cls, "__init__")
            self.impl.param_str, self.impl.phase = p.param_str, self.phase
            self.impl.device, self.impl._host = torch.device(self.ctx.device), self
            tops = self._call(self.impl.setup, "setup", [tuple(s) for s in bottom_shapes])
            return [tuple(int(d) for d in s) for s in tops]
        self.impl = _CaffeForm(self, self._call(cls, "__init__", self.spec))
        return self.impl.setup(bottom_shapes, p.param_str)

    # --- loading the user's class -----------------------------------------------------------
    def _load_class(self, module_name: str, class_name: str) -> Any:
        module = self._import(module_name)
        cls = getattr(module, class_name, None)
        if cls is None:
            names = [n for n, v in vars(module).items() if isinstance(v, type)]
            near = suggest(class_name, names)
            raise self.fail(f"module '{module_name}' ({getattr(module, '__file__', '?')}) has "
                            f"no class '{class_name}'",
                            f"did you mean '{near}'?" if near else
                            f"its classes: {', '.join(sorted(names)) or 'none'}")
        if any(getattr(c, "__module__", "") == "caffe._caffe" for c in getattr(cls, "__mro__",
                                                                               ())):
            raise self.fail(f"{self.where} derives from BVLC pycaffe's caffe.Layer (pycaffe "
                            "was imported in this process)", "build the net before importing "
                            "pycaffe, so that 'import caffe' gets caffe-py's stand-in")
        return cls

    def _import(self, name: str) -> Any:
        self._announce(name)
        sys.modules.setdefault("caffe", pycaffe)
        try:
            try:
                return importlib.import_module(name)
            except ModuleNotFoundError as exc:
                beside = self._spec_dir()
                if not _is_missing(exc, name) or beside is None or str(beside) in sys.path:
                    raise
                sys.path.append(str(beside))  # Caffe users keep layers beside the prototxt
                return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if _is_missing(exc, name):
                beside = self._spec_dir()
                raise self.fail(f"cannot find python_param.module '{name}'",
                                f"put {name.replace('.', '/')}.py on PYTHONPATH"
                                + (f" or in {beside}" if beside else "")) from None
            raise self._user_error(exc, f"importing module '{name}'") from None
        except CaffePyError:
            raise
        except Exception as exc:  # the module's own code failed (SyntaxError included)
            raise self._user_error(exc, f"importing module '{name}'") from None

    def _announce(self, name: str) -> None:
        """Say once per module which file will run (a module already imported: nothing), or,
        where the net is built for inspection without ``allow_python``, refuse to run it."""
        if name in sys.modules:
            return
        beside = self._spec_dir()
        found = module_file(name, beside)
        shown = "not found on sys.path" if found is None else found[0] + (
            " (beside the spec: its directory joins sys.path)" if found[1] else "")
        if self.ctx.options.get("inspect") and not self.ctx.options.get("allow_python"):
            raise self.fail(f"its top shapes come from running python_param.module '{name}' "
                            f"({shown}), which this inspection does not import",
                            "pass --allow-python to import it")
        if found and name not in _ANNOUNCED:
            _ANNOUNCED.add(name)
            log.info(f"Python layer '{self.name}': importing module '{name}' from {shown}")

    def _spec_dir(self) -> Path | None:
        """The directory of the spec file the layer was read from (None: not from a file)."""
        loc = location(self.spec)
        if loc is None or not loc.file or not Path(loc.file).is_file():
            return None
        return Path(loc.file).resolve().parent

    # --- calling the user's code ------------------------------------------------------------
    def _call(self, fn: Any, what: str, *args: Any) -> Any:
        """``fn(*args)``, with any exception it raises made one NetError naming the layer; the
        thread is recorded as busy in the user's code meanwhile (for a watchdog's message)."""
        try:
            with interrupts.busy(f"layer '{self.name}' (Python: {self.where}.{what})"):
                return fn(*args)
        except CaffePyError:
            raise
        except Exception as exc:
            raise self._user_error(exc, f"{self.where}.{what}") from None

    def _user_error(self, exc: BaseException, what: str) -> NetError:
        frames = traceback.extract_tb(exc.__traceback__)
        here = str(Path(__file__).resolve())
        outside = [f for f in frames if str(Path(f.filename).resolve()) != here]
        at = f" ({outside[-1].filename}:{outside[-1].lineno})" if outside else ""
        text = str(exc)
        if isinstance(exc, SyntaxError):  # raised by the compiler: the place is its own
            at, text = f" ({exc.filename}:{exc.lineno})", exc.msg
        text = " ".join(text.split()) or "(no message)"
        return self.fail(f"{what} raised {type(exc).__name__}: {text}{at}")

    def forward(self, *bottoms: torch.Tensor) -> Any:
        if isinstance(self.impl, _CaffeForm):
            return self.impl.forward(bottoms)
        return self._call(self.impl.forward, "forward", *bottoms)

    # --- a DatasetLayer: its read position in the solver state --------------------------------
    def source_state(self) -> dict[str, Any] | None:
        if not isinstance(self.impl, DatasetLayer):
            return None
        return dict(self._call(self.impl.state_dict, "state_dict"))

    def load_source_state(self, state: Mapping[str, Any]) -> None:
        if isinstance(self.impl, DatasetLayer):
            self._call(self.impl.load_state_dict, "load_state_dict", state)

    def bind_source(self, seed: int, replica: int = 0, replicas: int = 1) -> None:
        if isinstance(self.impl, DatasetLayer):
            self.impl.bind(seed, replica, replicas)


_ANNOUNCED: set[str] = set()
"""The modules whose file this process has named already."""


def module_file(name: str, beside: Path | None = None) -> tuple[str, bool] | None:
    """Where ``import name`` would load the module from (its file, and whether it was found
    only in ``beside``, the spec's directory), found without running anything: a package on
    the way is looked into, not imported. None: not found."""
    spec = None
    search: list[str] | None = None   # None: sys.path
    from_beside = False
    for depth, part in enumerate(name.split(".")):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None and depth == 0 and beside is not None:
            spec = importlib.machinery.PathFinder.find_spec(part, [str(beside)])
            from_beside = spec is not None
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    if spec is None or not spec.origin:
        return None
    return spec.origin, from_beside


def _is_missing(exc: ModuleNotFoundError, name: str) -> bool:
    """Whether ``exc`` is about ``name`` itself (or a package on its path), not something the
    module imports."""
    missing = exc.name or ""
    return missing == name or name.startswith(missing + ".")


class _CaffeForm:
    """Runs a pycaffe-style layer object: numpy blobs in and out, its backward in autograd."""

    def __init__(self, host: Python, obj: Any):
        self.host, self.obj = host, obj
        self.bottom: list[pycaffe.Blob] = []
        self.top: list[pycaffe.Blob] = [pycaffe.Blob() for _ in host.spec.top]

    def setup(self, bottom_shapes: list[Shape], param_str: str) -> list[Shape]:
        """Caffe's Layer::SetUp: param_str and phase, setup, reshape; learnable blobs after."""
        obj, host = self.obj, self.host
        if not isinstance(getattr(obj, "blobs", None), pycaffe.BlobVec):
            obj.blobs = pycaffe.BlobVec()
        obj.param_str, obj.phase = param_str, pycaffe.TRAIN if host.phase == "TRAIN" else \
            pycaffe.TEST
        obj.param_str_ = param_str  # pycaffe's name until 2016 (Faster R-CNN's layers read it)
        self.bottom = [pycaffe.Blob(s) for s in bottom_shapes]
        self._require(("setup", "reshape"))   # a class of another kind: before it is called
        host._call(obj.setup, "setup", self.bottom, self.top)
        host._call(obj.reshape, "reshape", self.bottom, self.top)
        self._require(("forward", "backward"))
        for i, blob in enumerate(obj.blobs):
            param = host.add_blob(f"blob{i}", blob.shape)
            with torch.no_grad():
                param.copy_(torch.from_numpy(np.asarray(blob.data, dtype=np.float32)))
        return [tuple(t.shape) for t in self.top]

    def _require(self, methods: tuple[str, ...]) -> None:
        for method in methods:
            if not callable(getattr(self.obj, method, None)):
                raise self.host.fail(f"{self.host.where} has no {method}(...) method",
                                     f"define {method} as a Caffe Python layer does (subclass "
                                     "caffe.Layer and define setup, reshape, forward and "
                                     "backward)")

    def params(self) -> list[torch.Tensor]:
        return self.host.blobs()

    def bind_params(self, with_diff: bool = False) -> list[np.ndarray]:
        """Point the object's blobs at the parameters' current values (shared on the CPU);
        with ``with_diff`` their diffs hold the gradients accumulated so far. Returns those."""
        before = []
        for blob, param in zip(self.obj.blobs, self.params(), strict=True):
            data = param.detach().cpu().numpy()
            diff = None
            if with_diff:
                diff = (param.grad.detach().cpu().numpy().copy() if param.grad is not None
                        else np.zeros_like(data))
                before.append(diff.copy())
            blob._bind(data, diff)
        return before

    def forward(self, bottoms: Sequence[torch.Tensor]) -> Any:
        if not self.top:  # nothing to back-propagate from
            self.run_forward(bottoms)
            return ()
        tops = _CaffeFunction.apply(self, len(bottoms), *bottoms, *self.params())
        if len(self.top) == 1:
            return tops[0] if isinstance(tops, tuple) else tops
        return tops

    def run_forward(self, bottoms: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        like = bottoms[0] if bottoms else self.params()[0] if self.params() else None
        dtype = like.dtype if like is not None else torch.float32
        device = like.device if like is not None else torch.device(self.host.ctx.device)
        arrays = [x.detach().cpu().numpy().copy() for x in bottoms]
        self.bottom = [pycaffe.Blob() for _ in arrays]
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        for blob in self.top:  # tops in the bottoms' precision (float32 as Caffe's, or 64)
            if blob.data.dtype != np_dtype:
                blob._bind(blob.data.astype(np_dtype))
        for blob, array in zip(self.bottom, arrays, strict=True):
            blob._bind(array)
        self.bind_params()
        self.host._call(self.obj.reshape, "reshape", self.bottom, self.top)
        self.host._call(self.obj.forward, "forward", self.bottom, self.top)
        return tuple(torch.as_tensor(np.array(t.data), dtype=dtype, device=device)
                     for t in self.top)

    def run_backward(self, top_grads: Sequence[torch.Tensor | None],
                     propagate_down: list[bool]) -> list[torch.Tensor | None]:
        for blob, grad in zip(self.top, top_grads, strict=True):
            blob._diff = (np.zeros_like(blob.data) if grad is None else
                          grad.detach().cpu().numpy().astype(blob.data.dtype).reshape(
                              blob.data.shape))
        for blob in self.bottom:
            blob._diff = np.zeros_like(blob.data)
        before = self.bind_params(with_diff=True)
        self.host._call(self.obj.backward, "backward", self.top, propagate_down, self.bottom)
        grads: list[torch.Tensor | None] = [
            torch.from_numpy(np.array(b.diff)) if down else None
            for b, down in zip(self.bottom, propagate_down, strict=True)]
        grads += [torch.from_numpy(np.array(blob.diff) - old)
                  for blob, old in zip(self.obj.blobs, before, strict=True)]
        return grads


class _CaffeFunction(torch.autograd.Function):
    """Autograd's view of a pycaffe-style layer: forward and backward call the object's."""

    @staticmethod
    def forward(ctx, form: _CaffeForm, n_bottoms: int, *tensors: torch.Tensor):
        ctx.form, ctx.n_bottoms = form, n_bottoms
        ctx.likes = [(t.dtype, t.device) for t in tensors]
        ctx.state = None
        tops = form.run_forward(tensors[:n_bottoms])
        # Caffe's backward reads the blobs of its own forward: keep them for it
        ctx.state = ([b.data for b in form.bottom], [t.data.copy() for t in form.top])
        return tops

    @staticmethod
    def backward(ctx, *top_grads: torch.Tensor):
        form = ctx.form
        bottoms, tops = ctx.state
        for blob, data in zip(form.bottom, bottoms, strict=True):
            blob._bind(data)
        for blob, data in zip(form.top, tops, strict=True):
            blob._bind(data)
        down = list(ctx.needs_input_grad[2:2 + ctx.n_bottoms])
        grads = form.run_backward(top_grads, down)
        out = [None if g is None else g.to(dtype=dt, device=dev)
               for g, (dt, dev) in zip(grads, ctx.likes, strict=True)]
        return (None, None, *out)
