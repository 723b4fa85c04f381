// Every forward launch variant of fwd_variants.h for ReLU (negative slope 0), as a table of
// host launchers indexed by variant id; one .cu file per dtype so they compile in parallel.
#pragma once

#include <array>
#include <utility>

#include "fwd_variants.h"
#include "unary.cuh"

namespace caffe_py {
namespace sweep {

using Launcher = void (*)(const at::Tensor&, at::Tensor&);

// The aligned (16-byte pack) path only: the caller checked alignment.
template <typename T, int Id>
void relu_one(const at::Tensor& x, at::Tensor& y) {
  constexpr int kT = threads_of(Id), kP = packs_of(Id), V = pack_width<T>();
  const int64_t n = x.numel();
  const int64_t per_block = static_cast<int64_t>(kT) * kP;
  const auto blocks =
      static_cast<unsigned>(std::max<int64_t>(1, (n / V + per_block - 1) / per_block));
  unary_kernel<T, V, kT, kP, static_cast<Ld>(load_of(Id)), static_cast<St>(store_of(Id)),
               ReluFwd><<<blocks, kT, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<T>(), y.mutable_data_ptr<T>(), n, 0.0f, ReluFwd{});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int... Ids>
constexpr std::array<Launcher, sizeof...(Ids)> table(std::integer_sequence<int, Ids...>) {
  return {&relu_one<T, Ids>...};
}

template <typename T>
void relu_variant(int64_t id, const at::Tensor& x, at::Tensor& y) {
  static constexpr auto kTable = table<T>(std::make_integer_sequence<int, kCount>{});
  kTable[id](x, y);
}

}  // namespace sweep
}  // namespace caffe_py
