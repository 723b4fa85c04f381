"""mAP as SSD's fork computes it (ComputeAP, Solver::TestDetection): the three ap_versions on a
worked example, the accumulation over batches, and the test phase's output."""
from __future__ import annotations

import pytest
import torch
import yaml

from caffe_py.errors import SolverError
from caffe_py.net import Net
from caffe_py.solver.detection_eval import DetectionScores, compute_ap, run_detection_batches
from caffe_py.spec.net_spec import load_net

# three detections of one class, best first: right, wrong, right; two boxes to find
TP = [(0.9, 1), (0.8, 0), (0.7, 1)]
FP = [(s, 1 - t) for s, t in TP]


@pytest.mark.parametrize(("version", "expected"), [
    ("Integral", 0.5 * 1 + 0.5 * 2 / 3),
    ("MaxIntegral", 0.5 * 1 + 0.5 * 2 / 3),
    ("11point", (6 * 1 + 5 * 2 / 3) / 11),  # recall 0..0.5: precision 1; 0.6..1: 2/3
])
def test_average_precision_versions(version, expected):
    assert compute_ap(TP, 2, FP, version) == pytest.approx(expected, rel=1e-6)


def test_average_precision_edge_cases():
    assert compute_ap([], 3, [], "Integral") == 0.0
    assert compute_ap(TP, 0, FP, "Integral") == 0.0
    # a lower-scored right detection after a wrong one: the envelope lifts the precision
    tp, fp = [(0.9, 0), (0.8, 1)], [(0.9, 1), (0.8, 0)]
    assert compute_ap(tp, 1, fp, "Integral") == pytest.approx(0.5)
    assert compute_ap(tp, 1, fp, "MaxIntegral") == pytest.approx(0.5)
    with pytest.raises(SolverError, match="unknown ap_version 'VOC'"):
        compute_ap(TP, 2, FP, "VOC")


def test_scores_accumulate_over_batches_and_average_over_every_class():
    scores = DetectionScores()
    scores.add(torch.tensor([[-1, 1, 1, -1, -1], [-1, 2, 2, -1, -1], [0, 1, .9, 1, 0],
                             [0, 1, .5, 0, 0]]).numpy())  # tp = fp = 0: ignored (difficult)
    scores.add(torch.tensor([[-1, 1, 0, -1, -1], [-1, 2, 1, -1, -1]]).numpy())
    assert scores.num_pos == {1: 1, 2: 3}
    assert scores.true_pos == {1: [(pytest.approx(0.9), 1)]}
    assert scores.average_precisions("Integral") == {1: 1.0}  # class 2: no detection
    assert scores.mean_ap("Integral") == pytest.approx(0.5)


class Fed:
    """A net whose forward gets fixed inputs (as a data layer would give them)."""

    def __init__(self, net: Net, inputs: dict[str, torch.Tensor]):
        self.net, self.inputs = net, inputs

    def __getattr__(self, name: str):
        return getattr(self.net, name)

    def __call__(self):
        return self.net(self.inputs)


def test_run_detection_batches_gives_the_map_of_the_evaluate_layer(tmp_path):
    spec = {"name": "eval", "layer": [
        {"name": "det", "type": "Input", "top": "det",
         "input_param": {"shape": {"dim": [1, 1, 3, 7]}}},
        {"name": "gt", "type": "Input", "top": "gt",
         "input_param": {"shape": {"dim": [1, 1, 2, 8]}}},
        {"name": "ev", "type": "DetectionEvaluate", "bottom": ["det", "gt"], "top": "ev",
         "detection_evaluate_param": {"num_classes": 2}}]}
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(spec))
    net = Net(load_net(tmp_path / "net.yaml"), "TEST")
    det = torch.tensor([[[[0, 1, .9, .1, .1, .5, .5], [0, 1, .8, .6, .6, .9, .9],
                          [0, 1, .7, .5, .5, .8, .8]]]])
    gt = torch.tensor([[[[0, 1, 0, .1, .1, .5, .5, 0], [0, 1, 1, .5, .5, .8, .8, 0]]]])
    means = run_detection_batches(Fed(net, {"det": det, "gt": gt}), 2, "Integral")
    # two passes over the same batch: 4 positives; tp, fp, tp per pass
    expected = DetectionScores()
    for _ in range(2):
        expected.add(net({"det": det, "gt": gt}).outputs["ev"].numpy())
    assert float(means["ev"]) == pytest.approx(expected.mean_ap("Integral"))
    assert 0.5 < float(means["ev"]) < 1
