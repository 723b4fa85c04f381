"""Mean average precision over a test pass, as SSD's Caffe computes it (Solver::TestDetection
with ``eval_type: "detection"``, and ComputeAP in util/bbox_util.cpp).

A DetectionEvaluate layer's top holds, per batch, one row [-1, class, positives, -1, -1] per
class and one row [image, class, score, tp, fp] per detection. Over the test batches the
positives are summed per class and the (score, tp) and (score, fp) pairs collected; each
class's AP is then computed from its precision/recall curve by ``ap_version``:

- ``11point``: VOC2007's mean of the highest precision at recall >= 0, 0.1, ..., 1;
- ``MaxIntegral``: VOC2012's area under the precision envelope;
- ``Integral`` (the fork's default): the plain sum of precision x recall steps.

The mAP is the sum of the APs over the number of classes (a class with no detection counts
0). A detection matched to a difficult box that is not evaluated (tp = fp = 0) is ignored.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import SolverError
from ..net import Net

log = logging.getLogger(__name__)
F32 = np.float32
AP_VERSIONS = ("11point", "MaxIntegral", "Integral")


@dataclass
class DetectionScores:
    """One output's true and false positives over a test pass."""

    num_pos: dict[int, int] = field(default_factory=dict)
    true_pos: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    false_pos: dict[int, list[tuple[float, int]]] = field(default_factory=dict)

    def add(self, rows: np.ndarray) -> None:
        """One batch's DetectionEvaluate rows (n, 5)."""
        for item, label_f, third, tp_f, fp_f in rows.reshape(-1, 5).tolist():
            label = int(label_f)
            if int(item) == -1:
                self.num_pos[label] = self.num_pos.get(label, 0) + int(third)
                continue
            tp, fp = int(tp_f), int(fp_f)
            if tp == 0 and fp == 0:
                continue
            self.true_pos.setdefault(label, []).append((float(F32(third)), tp))
            self.false_pos.setdefault(label, []).append((float(F32(third)), fp))

    def average_precisions(self, version: str) -> dict[int, float]:
        """AP per class that has detections (the others are missing, as in the fork)."""
        out = {}
        for label, positives in sorted(self.num_pos.items()):
            if label not in self.true_pos:
                continue
            out[label] = compute_ap(self.true_pos[label], positives, self.false_pos[label],
                                    version)
        return out

    def mean_ap(self, version: str) -> float:
        aps = self.average_precisions(version)
        total = F32(0)
        for value in aps.values():
            total = F32(total + F32(value))
        return float(F32(total / F32(len(self.num_pos)))) if self.num_pos else 0.0


def _cumsum(pairs: list[tuple[float, int]]) -> np.ndarray:
    """CumSum: the flags in descending score order (a stable sort), summed."""
    order = sorted(range(len(pairs)), key=lambda i: -pairs[i][0])
    return np.cumsum([pairs[i][1] for i in order], dtype=np.int64)


def compute_ap(tp: list[tuple[float, int]], num_pos: int, fp: list[tuple[float, int]],
               version: str) -> float:
    """ComputeAP, in float as the fork."""
    if version not in AP_VERSIONS:
        raise SolverError(f"unknown ap_version '{version}'; use one of "
                          f"{', '.join(AP_VERSIONS)}")
    if not tp or num_pos == 0:
        return 0.0
    tp_sum, fp_sum = _cumsum(tp), _cumsum(fp)
    prec = [F32(F32(t) / F32(t + f)) for t, f in zip(tp_sum.tolist(), fp_sum.tolist(),
                                                     strict=True)]
    rec = [F32(F32(t) / F32(num_pos)) for t in tp_sum.tolist()]
    eps = F32(1e-6)
    ap = F32(0)
    n = len(prec)
    if version == "11point":
        max_precs = [F32(0)] * 11
        start = n - 1
        for j in range(10, -1, -1):
            for i in range(start, -1, -1):
                if float(rec[i]) < j / 10.0:
                    start = i
                    if j > 0:
                        max_precs[j - 1] = max_precs[j]
                    break
                if max_precs[j] < prec[i]:
                    max_precs[j] = prec[i]
        for j in range(10, -1, -1):
            ap = F32(ap + F32(max_precs[j] / F32(11)))
    elif version == "MaxIntegral":
        cur_rec, cur_prec = rec[-1], prec[-1]
        for i in range(n - 2, -1, -1):
            cur_prec = max(prec[i], cur_prec)
            if abs(F32(cur_rec - rec[i])) > eps:
                ap = F32(ap + F32(cur_prec * abs(F32(cur_rec - rec[i]))))
            cur_rec = rec[i]
        ap = F32(ap + F32(cur_rec * cur_prec))
    else:
        prev = F32(0)
        for i in range(n):
            if abs(F32(rec[i] - prev)) > eps:
                ap = F32(ap + F32(prec[i] * abs(F32(rec[i] - prev))))
            prev = rec[i]
    return float(ap)


def detection_outputs(net: Net) -> list[str]:
    """The net's outputs that DetectionEvaluate layers produce."""
    tops = {t for layer in net.layers if layer.spec.type == "DetectionEvaluate"
            for t in layer.spec.top}
    return [name for name in net.output_names if name in tops]


def run_detection_batches(net: Net, iterations: int, ap_version: str, *,
                          per_class: bool = False,
                          autocast: Callable = contextlib.nullcontext,
                          between: Callable[[], bool] | None = None,
                          on_batch: Callable[[int, dict[str, torch.Tensor], float], None]
                          | None = None) -> dict[str, torch.Tensor] | None:
    """``iterations`` forward passes: the mAP of each DetectionEvaluate output and the mean
    of every other output, in the form of :func:`~.evaluate.run_batches` (``"__loss__"``
    holds the mean loss)."""
    from .evaluate import raise_device_problems

    detection = set(detection_outputs(net))
    scores = {name: DetectionScores() for name in detection}
    sums: dict[str, torch.Tensor] = {}
    loss_sum = 0.0
    with torch.no_grad():
        for i in range(iterations):
            if between is not None and between():
                return None
            with autocast():
                out = net()
            loss_sum += float(out.loss)
            for name, value in out.outputs.items():
                if name in detection:
                    rows = value.detach().float().cpu().numpy()
                    if rows.shape[-1] != 5:
                        raise SolverError(f"output '{name}' has rows of {rows.shape[-1]} "
                                          "values; DetectionEvaluate gives 5")
                    scores[name].add(rows)
                    continue
                flat = value.detach().float().reshape(-1)
                sums[name] = sums[name] + flat if name in sums else flat.clone()
            if on_batch is not None:
                on_batch(i, {n: v.detach().float().reshape(-1).cpu()
                             for n, v in out.outputs.items()}, float(out.loss))
    raise_device_problems(net)
    means: dict[str, torch.Tensor] = {}
    for name in net.output_names:
        if name in detection:
            if per_class:
                for label, ap in scores[name].average_precisions(ap_version).items():
                    log.info(f"class{label}: {ap:g}")
            means[name] = torch.tensor([scores[name].mean_ap(ap_version)])
        elif name in sums:
            means[name] = (sums[name] / iterations).cpu()
    means["__loss__"] = torch.tensor([loss_sum / iterations])
    return means


def is_detection_net(net: Net) -> bool:
    return bool(detection_outputs(net))


__all__ = ["AP_VERSIONS", "DetectionScores", "compute_ap", "detection_outputs",
           "run_detection_batches", "is_detection_net"]
