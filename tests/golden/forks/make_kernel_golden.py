"""Golden fixtures for the R-CNN forks' GPU-only layers, from the forks' own CUDA kernels run on
the CPU: tests/golden/forks/fast_rcnn/ (rbgirshick/caffe-fast-rcnn, branch faster-rcnn:
ROIPooling, SmoothL1Loss) and tests/golden/forks/rfcn/ (daijifeng001/caffe-rfcn, branch
r-fcn: PSROIPooling, SmoothL1Loss).

Those forks implement these layers for the GPU only (their Forward_cpu/Backward_cpu are
NOT_IMPLEMENTED, except caffe-fast-rcnn's ROIPooling forward), so a CPU build cannot run
them. This script takes each layer's ``__global__`` kernels verbatim from the fork's .cu file,
compiles them as host C++ (``CUDA_KERNEL_LOOP`` becomes a loop over the thread indices, an
atomic add a plain add, the device math functions their float overloads), and calls them with
the arguments the layer's Forward_gpu/Backward_gpu pass; the few element-wise steps between
kernel calls (a difference, a product, a sum) are done in float32 as caffe_gpu_* does. The
results go into the fixture format of make_golden.py, compared by test_fork_golden.py.

    python tests/golden/forks/make_kernel_golden.py \\
        --fast-rcnn /path/to/caffe-fast-rcnn[.git] --rfcn /path/to/caffe-rfcn[.git]

(git repositories of the two forks; the commits used are pinned below). Needs g++; CI never
runs it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import re
import subprocess
import tempfile
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FAST_RCNN_COMMIT = "4115385d"  # branch faster-rcnn's head
RFCN_COMMIT = "543f8f6a"       # branch r-fcn's head

SHIM = r"""
#include <cfloat>
#include <cmath>
using std::floor; using std::ceil; using std::round; using std::abs;
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline float max(float a, float b) { return a > b ? a : b; }
static inline float min(float a, float b) { return a < b ? a : b; }
static inline double max(double a, double b) { return a > b ? a : b; }
static inline double min(double a, double b) { return a < b ? a : b; }
template <typename T> static inline void caffe_gpu_atomic_add(T v, T* p) { *p += v; }
"""


def source(git: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _block(text: str, start: int) -> int:
    """The index after the brace block opening at ``text[start]``."""
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i


def kernels(cu: str) -> str:
    """Every ``template <typename Dtype> __global__`` kernel of a .cu file as host code: the
    body of its ``CUDA_KERNEL_LOOP(index, n)`` becomes a function of one thread index taking
    the kernel's arguments by value (a CUDA thread's own copies: the kernels move their
    pointer arguments), called for every index in turn."""
    out = []
    pattern = re.compile(r"template\s*<typename Dtype>\s*__global__\s+void\s+(\w+)\s*\(")
    for m in pattern.finditer(cu):
        name = m.group(1)
        close = cu.index(")", m.end())
        params = cu[m.end():close]
        names = [re.findall(r"\w+", p)[-1] for p in params.split(",")]
        body_start = cu.index("{", close)
        body_end = _block(cu, body_start)
        loop = re.search(r"CUDA_KERNEL_LOOP\((\w+),\s*([^)]+)\)\s*\{",
                         cu[body_start:body_end])
        assert loop is not None, f"{name}: no CUDA_KERNEL_LOOP"
        inner_start = body_start + loop.end() - 1
        inner = cu[inner_start:_block(cu, inner_start)]
        index, count = loop.group(1), loop.group(2)
        out.append(f"template <typename Dtype>\nstatic void {name}_thread(int {index}, "
                   f"{params}) {inner}\n"
                   f"template <typename Dtype>\nstatic void {name}({params}) {{\n"
                   f"  for (int i_ = 0; i_ < {count}; ++i_) "
                   f"{name}_thread<Dtype>(i_, {', '.join(names)});\n}}\n")
    return "\n".join(out)


WRAPPERS = r"""
extern "C" {
void roi_forward(int n, const float* x, float scale, int c, int h, int w, int ph, int pw,
                 const float* rois, float* top, int* argmax) {
  ROIPoolForward<float>(n, x, scale, c, h, w, ph, pw, rois, top, argmax); }
void roi_backward(int n, const float* dy, const int* argmax, int rois_n, float scale, int c,
                  int h, int w, int ph, int pw, float* dx, const float* rois) {
  ROIPoolBackward<float>(n, dy, argmax, rois_n, scale, c, h, w, ph, pw, dx, rois); }
void frcnn_l1_forward(int n, const float* in, float* out, float sigma2) {
  SmoothL1Forward<float>(n, in, out, sigma2); }
void frcnn_l1_backward(int n, const float* in, float* out, float sigma2) {
  SmoothL1Backward<float>(n, in, out, sigma2); }
}
"""

RFCN_WRAPPERS = r"""
extern "C" {
void psroi_forward(int n, const float* x, float scale, int c, int h, int w, int ph, int pw,
                   const float* rois, int dim, int group, float* top, int* mapping) {
  PSROIPoolingForward<float>(n, x, scale, c, h, w, ph, pw, rois, dim, group, top, mapping); }
void psroi_backward(int n, const float* dy, const int* mapping, int rois_n, float scale,
                    int c, int h, int w, int ph, int pw, int dim, float* dx,
                    const float* rois) {
  PSROIPoolingBackwardAtomic<float>(n, dy, mapping, rois_n, scale, c, h, w, ph, pw, dim, dx,
                                    rois); }
void rfcn_l1_forward(int n, const float* in, float* out) { SmoothL1ForwardGPU<float>(n, in, out); }
void rfcn_l1_backward(int n, const float* in, float* out) {
  SmoothL1BackwardGPU<float>(n, in, out); }
void rfcn_channel_sum(int num, int channels, int spatial, const float* data, float* out) {
  kernel_channel_sum<float>(num, channels, spatial, data, out); }
}
"""


def compile_library(code: str, tmp: Path, name: str) -> ctypes.CDLL:
    cpp, lib = tmp / f"{name}.cpp", tmp / f"{name}.so"
    cpp.write_text(SHIM + code)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(lib), str(cpp)], check=True)
    return ctypes.CDLL(str(lib))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


# --- cases ------------------------------------------------------------------------------------
def rois(rng: np.random.RandomState, n: int, images: int, width: float, height: float
         ) -> np.ndarray:
    """n regions [batch, x1, y1, x2, y2] in image pixels: most inside, one partly outside,
    one inverted (x2 < x1: the forks' 1 x 1 case)."""
    out = []
    for i in range(n):
        x1, y1 = rng.uniform(0, width * 0.7), rng.uniform(0, height * 0.7)
        x2, y2 = x1 + rng.uniform(2, width * 0.6), y1 + rng.uniform(2, height * 0.6)
        out.append([i % images, x1, y1, x2, y2])
    out[-1] = [0, width * 0.8, height * 0.5, width * 1.3, height * 1.2]
    out[-2] = [images - 1, 10.0, 12.0, 4.0, 6.0]
    return np.asarray(out, np.float32)


def case(type_name: str, name: str, params: dict, bottoms: list[np.ndarray], grad: list[int],
         tops: int) -> dict:
    return {"type": type_name, "name": name, "params": params,
            "bottoms": [{"shape": list(b.shape), "gen": "fixture"} for b in bottoms],
            "grad": grad, "tops": tops, "phase": "TRAIN", "blobs": None}


def roi_pooling_cases(lib: ctypes.CDLL) -> list[tuple[dict, dict]]:
    out = []
    for name, (n, c, h, w), (ph, pw), scale in [
            ("3x3_quarter", (2, 3, 12, 14), (3, 3), 0.25),
            ("2x4_half", (2, 2, 9, 11), (2, 4), 0.5),
            ("7x7_sixteenth", (1, 4, 20, 24), (7, 7), 0.0625)]:
        rng = np.random.RandomState(zlib.crc32(f"ROIPooling/{name}".encode()))
        x = rng.randn(n, c, h, w).astype(np.float32)
        r = rois(rng, 6, n, w / scale, h / scale)
        top = np.zeros((len(r), c, ph, pw), np.float32)
        arg = np.zeros(top.shape, np.int32)
        lib.roi_forward(top.size, ptr(x), ctypes.c_float(scale), c, h, w, ph, pw, ptr(r),
                        ptr(top), ptr(arg))
        dy = rng.randn(*top.shape).astype(np.float32)
        dx = np.zeros_like(x)
        lib.roi_backward(x.size, ptr(dy), ptr(arg), len(r), ctypes.c_float(scale), c, h, w,
                         ph, pw, ptr(dx), ptr(r))
        spec = case("ROIPooling", name, {"roi_pooling_param": {
            "pooled_h": ph, "pooled_w": pw, "spatial_scale": scale}}, [x, r], [0], 1)
        out.append((spec, {"bottom0": x, "bottom1": r, "top0": top, "top_diff0": dy,
                           "bottom_diff0": dx}))
    return out


def frcnn_smooth_l1_cases(lib: ctypes.CDLL) -> list[tuple[dict, dict]]:
    out = []
    for name, shape, sigma, weights in [("plain", (4, 8), 1.0, False),
                                        ("rpn_sigma3", (1, 12, 3, 4), 3.0, True),
                                        ("weighted", (6, 8), 1.0, True)]:
        rng = np.random.RandomState(zlib.crc32(f"SmoothL1Loss/{name}".encode()))
        a = rng.randn(*shape).astype(np.float32)
        b = rng.randn(*shape).astype(np.float32)
        bottoms = [a, b]
        d = (a - b).astype(np.float32)
        if weights:
            w_in = (rng.rand(*shape) < 0.7).astype(np.float32) * rng.uniform(0.5, 2, shape) \
                .astype(np.float32)
            w_out = rng.uniform(0, 1, shape).astype(np.float32)
            bottoms += [w_in, w_out]
            d = (w_in * d).astype(np.float32)
        sigma2 = np.float32(sigma) * np.float32(sigma)
        err = np.zeros_like(d)
        lib.frcnn_l1_forward(d.size, ptr(d), ptr(err), ctypes.c_float(sigma2))
        if weights:
            err = (w_out * err).astype(np.float32)
        loss = np.float32(err.astype(np.float32).sum(dtype=np.float32) / np.float32(shape[0]))
        dy = np.float32(rng.randn())
        slope = np.zeros_like(d)
        lib.frcnn_l1_backward(d.size, ptr(d), ptr(slope), ctypes.c_float(sigma2))
        grads = []
        for sign in (1, -1):
            g = (np.float32(sign) * dy / np.float32(shape[0]) * slope).astype(np.float32)
            if weights:
                g = (w_in * g).astype(np.float32)
                g = (w_out * g).astype(np.float32)
            grads.append(g)
        params = {} if sigma == 1.0 else {"smooth_l1_loss_param": {"sigma": sigma}}
        spec = case("SmoothL1Loss", name, params, bottoms, [0, 1], 1)
        arrays = {f"bottom{i}": v for i, v in enumerate(bottoms)}
        arrays.update({"top0": np.asarray(loss, np.float32), "top_diff0": np.asarray(dy),
                       "bottom_diff0": grads[0], "bottom_diff1": grads[1]})
        out.append((spec, arrays))
    return out


def psroi_cases(lib: ctypes.CDLL) -> list[tuple[dict, dict]]:
    out = []
    for name, (n, h, w), dim, group, scale in [("g3_half", (2, 10, 12), 2, 3, 0.5),
                                               ("g2_quarter", (1, 9, 13), 3, 2, 0.25),
                                               ("g7_sixteenth", (1, 14, 16), 2, 7, 0.0625)]:
        rng = np.random.RandomState(zlib.crc32(f"PSROIPooling/{name}".encode()))
        c = dim * group * group
        x = rng.randn(n, c, h, w).astype(np.float32)
        r = rois(rng, 5, n, w / scale, h / scale)
        top = np.zeros((len(r), dim, group, group), np.float32)
        mapping = np.full(top.shape, -1, np.int32)
        lib.psroi_forward(top.size, ptr(x), ctypes.c_float(scale), c, h, w, group, group,
                          ptr(r), dim, group, ptr(top), ptr(mapping))
        dy = rng.randn(*top.shape).astype(np.float32)
        dx = np.zeros_like(x)
        lib.psroi_backward(top.size, ptr(dy), ptr(mapping), len(r), ctypes.c_float(scale), c,
                           h, w, group, group, dim, ptr(dx), ptr(r))
        spec = case("PSROIPooling", name, {"psroi_pooling_param": {
            "spatial_scale": scale, "output_dim": dim, "group_size": group}}, [x, r], [0], 1)
        out.append((spec, {"bottom0": x, "bottom1": r, "top0": top, "top_diff0": dy,
                           "bottom_diff0": dx}))
    return out


def rfcn_smooth_l1_cases(lib: ctypes.CDLL) -> list[tuple[dict, dict]]:
    """R-FCN's SmoothL1Loss: optional weights multiply the difference, loss_param's
    normalization (VALID: N x H x W), a second top with each instance's loss."""
    out = []
    for name, shape, norm, weights in [("valid_weighted", (6, 8), "VALID", True),
                                       ("spatial_valid", (2, 8, 3, 2), "VALID", True),
                                       ("batch_size", (2, 8, 3, 2), "BATCH_SIZE", False)]:
        rng = np.random.RandomState(zlib.crc32(f"SmoothL1Loss/rfcn_{name}".encode()))
        a = rng.randn(*shape).astype(np.float32) * 2
        b = rng.randn(*shape).astype(np.float32)
        bottoms = [a, b]
        d = (a - b).astype(np.float32)
        if weights:
            wt = (rng.rand(*shape) < 0.6).astype(np.float32)
            bottoms.append(wt)
            d = (wt * d).astype(np.float32)
        err = np.zeros_like(d)
        lib.rfcn_l1_forward(d.size, ptr(d), ptr(err))
        inner = int(np.prod(shape[2:])) if len(shape) > 2 else 1
        normalizer = np.float32(max(1, shape[0] * inner if norm == "VALID" else shape[0]))
        loss = np.float32(np.abs(err).sum(dtype=np.float32) / normalizer)
        per = np.zeros((shape[0], 1, *shape[2:]), np.float32)
        lib.rfcn_channel_sum(shape[0], shape[1], inner, ptr(err), ptr(per))
        dy = np.float32(rng.randn())
        slope = np.zeros_like(d)
        lib.rfcn_l1_backward(d.size, ptr(d), ptr(slope))
        grads = [(np.float32(s) * dy / normalizer * slope).astype(np.float32) for s in (1, -1)]
        spec = case("SmoothL1Loss", f"rfcn_{name}", {"loss_param": {"normalization": norm}},
                    bottoms, [0, 1], 2)
        arrays = {f"bottom{i}": v for i, v in enumerate(bottoms)}
        arrays.update({"top0": np.asarray(loss), "top_diff0": np.asarray(dy), "top1": per,
                       "top_diff1": np.zeros_like(per), "bottom_diff0": grads[0],
                       "bottom_diff1": grads[1]})
        out.append((spec, arrays))
    return out


def save(fork: str, cases: list[tuple[dict, dict]]) -> None:
    by_type: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for spec, arrays in cases:
        by_type[spec["type"]][f"{spec['name']}__spec"] = np.array(json.dumps(spec,
                                                                             sort_keys=True))
        for key, value in arrays.items():
            by_type[spec["type"]][f"{spec['name']}__{key}"] = np.asarray(value)
        print(f"{fork}: {spec['type']}/{spec['name']}", flush=True)
    out = HERE / fork
    out.mkdir(exist_ok=True)
    for type_name, arrays in by_type.items():
        np.savez_compressed(out / f"{type_name}.npz", **arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast-rcnn", required=True, help="git directory of caffe-fast-rcnn")
    parser.add_argument("--rfcn", required=True, help="git directory of caffe-rfcn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        frcnn = "\n".join(kernels(source(args.fast_rcnn, FAST_RCNN_COMMIT, f))
                          for f in ("src/caffe/layers/roi_pooling_layer.cu",
                                    "src/caffe/layers/smooth_L1_loss_layer.cu"))
        lib = compile_library(frcnn + WRAPPERS, Path(tmp), "fast_rcnn")
        save("fast_rcnn", roi_pooling_cases(lib) + frcnn_smooth_l1_cases(lib))
        rfcn = "\n".join(kernels(source(args.rfcn, RFCN_COMMIT, f))
                         for f in ("src/caffe/layers/psroi_pooling_layer.cu",
                                   "src/caffe/layers/smooth_L1_loss_layer.cu"))
        lib = compile_library(rfcn + RFCN_WRAPPERS, Path(tmp), "rfcn")
        save("rfcn", psroi_cases(lib) + rfcn_smooth_l1_cases(lib))


if __name__ == "__main__":
    main()
