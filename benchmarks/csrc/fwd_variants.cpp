// Bindings of the forward sweep: variants() and math_variants() list (threads, packs, load,
// store) per id; relu(x, out, id) writes out = relu(x) and math(x, out, kind, p, id) writes
// out = ELU (alpha p), Sigmoid or TanH of x with that launch (float32 or bfloat16,
// contiguous, 16-byte aligned).
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <tuple>
#include <vector>

#include "fwd_variants.h"

namespace caffe_py {
namespace sweep {
void relu_f32(int64_t id, const at::Tensor& x, at::Tensor& y);
void relu_bf16(int64_t id, const at::Tensor& x, at::Tensor& y);
void math_f32(int64_t kind, int64_t id, const at::Tensor& x, at::Tensor& y, float p);
void math_bf16(int64_t kind, int64_t id, const at::Tensor& x, at::Tensor& y, float p);

// The kinds of common.cuh's Kind that the math grid has: ELU, Sigmoid, TanH.
constexpr int64_t kMathKinds[] = {1, 2, 3};

std::vector<std::tuple<int, int, int, int>> variants() {
  std::vector<std::tuple<int, int, int, int>> out;
  for (int id = 0; id < kCount; ++id)
    out.emplace_back(threads_of(id), packs_of(id), load_of(id), store_of(id));
  return out;
}

std::vector<std::tuple<int, int, int, int>> math_variants() {
  std::vector<std::tuple<int, int, int, int>> out;
  for (int id = 0; id < kMathCount; ++id)
    out.emplace_back(math_threads_of(id), math_packs_of(id), math_load_of(id),
                     math_store_of(id));
  return out;
}

void check_args(const at::Tensor& x, const at::Tensor& out, int64_t id, int64_t count) {
  TORCH_CHECK(id >= 0 && id < count, "variant id ", id, " is outside [0, ", count, ")");
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && out.is_contiguous(),
              "x and out must be contiguous CUDA tensors");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type() &&
                  out.device() == x.device(),
              "out must match x's shape, dtype and device");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
              "x and out must be 16-byte aligned");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "the sweep has float32 and bfloat16 only, not ", x.scalar_type());
}

void relu(const at::Tensor& x, at::Tensor& out, int64_t id) {
  check_args(x, out, id, kCount);
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.scalar_type() == at::kFloat) relu_f32(id, x, out);
  else relu_bf16(id, x, out);
}

void math(const at::Tensor& x, at::Tensor& out, int64_t kind, double p, int64_t id) {
  check_args(x, out, id, kMathCount);
  TORCH_CHECK(kind == kMathKinds[0] || kind == kMathKinds[1] || kind == kMathKinds[2],
              "the math grid has kinds 1 (ELU), 2 (Sigmoid) and 3 (TanH), not ", kind);
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.scalar_type() == at::kFloat) math_f32(kind, id, x, out, static_cast<float>(p));
  else math_bf16(kind, id, x, out, static_cast<float>(p));
}
}  // namespace sweep
}  // namespace caffe_py

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "caffe-py's forward launch variants (benchmarks/activations.py --variants)";
  m.def("variants", &caffe_py::sweep::variants, "ReLU grid: (threads, packs, load, store) per id");
  m.def("math_variants", &caffe_py::sweep::math_variants,
        "ELU/Sigmoid/TanH grid: (threads, packs, load, store) per id");
  m.def("relu", &caffe_py::sweep::relu, "out = relu(x) with variant `id`", py::arg("x"),
        py::arg("out"), py::arg("id"));
  m.def("math", &caffe_py::sweep::math, "out = f(x) (kind 1 ELU alpha p, 2 Sigmoid, 3 TanH) with "
        "math variant `id`", py::arg("x"), py::arg("out"), py::arg("kind"), py::arg("p"),
        py::arg("id"));
}
