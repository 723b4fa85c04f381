// Bindings of the forward sweep: variants() lists (threads, packs, load, store) per id;
// relu(x, out, id) writes out = relu(x) with that launch (float32 or bfloat16, contiguous,
// 16-byte aligned).
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <tuple>
#include <vector>

#include "fwd_variants.h"

namespace caffe_py {
namespace sweep {
void relu_f32(int64_t id, const at::Tensor& x, at::Tensor& y);
void relu_bf16(int64_t id, const at::Tensor& x, at::Tensor& y);

std::vector<std::tuple<int, int, int, int>> variants() {
  std::vector<std::tuple<int, int, int, int>> out;
  for (int id = 0; id < kCount; ++id)
    out.emplace_back(threads_of(id), packs_of(id), load_of(id), store_of(id));
  return out;
}

void relu(const at::Tensor& x, at::Tensor& out, int64_t id) {
  TORCH_CHECK(id >= 0 && id < kCount, "variant id ", id, " is outside [0, ", kCount, ")");
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && out.is_contiguous(),
              "x and out must be contiguous CUDA tensors");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type() &&
                  out.device() == x.device(),
              "out must match x's shape, dtype and device");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
              "x and out must be 16-byte aligned");
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.scalar_type() == at::kFloat) relu_f32(id, x, out);
  else if (x.scalar_type() == at::kBFloat16) relu_bf16(id, x, out);
  else TORCH_CHECK(false, "the sweep has float32 and bfloat16 only, not ", x.scalar_type());
}
}  // namespace sweep
}  // namespace caffe_py

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "caffe-py's forward launch variants (benchmarks/activations.py --variants)";
  m.def("variants", &caffe_py::sweep::variants, "(threads, packs, load, store) per variant id");
  m.def("relu", &caffe_py::sweep::relu, "out = relu(x) with variant `id`", py::arg("x"),
        py::arg("out"), py::arg("id"));
}
