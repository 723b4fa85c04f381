// Every forward launch variant of fwd_variants.h, as tables of host launchers indexed by
// variant id: ReLU (negative slope 0) over the full grid, ELU, Sigmoid and TanH over the math
// grid. One .cu file per dtype and family so they compile in parallel.
#pragma once

#include <array>
#include <utility>

#include "fwd_variants.h"
#include "unary.cuh"

namespace caffe_py {
namespace sweep {

using Launcher = void (*)(const at::Tensor&, at::Tensor&, float);

// The aligned (16-byte pack) path only: the caller checked alignment.
template <typename T, int kT, int kP, int kL, int kS, typename Op>
void launch_one(const at::Tensor& x, at::Tensor& y, float p) {
  constexpr int V = pack_width<T>();
  const int64_t n = x.numel();
  const int64_t per_block = static_cast<int64_t>(kT) * kP;
  const auto blocks =
      static_cast<unsigned>(std::max<int64_t>(1, (n / V + per_block - 1) / per_block));
  unary_kernel<T, V, kT, kP, static_cast<Ld>(kL), static_cast<St>(kS), Op>
      <<<blocks, kT, 0, c10::cuda::getCurrentCUDAStream()>>>(
          x.const_data_ptr<T>(), y.mutable_data_ptr<T>(), n, p, Op{});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int Id>
void relu_one(const at::Tensor& x, at::Tensor& y, float p) {
  launch_one<T, threads_of(Id), packs_of(Id), load_of(Id), store_of(Id), ReluFwd>(x, y, p);
}

template <typename T, typename Op, int Id>
void math_one(const at::Tensor& x, at::Tensor& y, float p) {
  launch_one<T, math_threads_of(Id), math_packs_of(Id), math_load_of(Id), math_store_of(Id),
             Op>(x, y, p);
}

template <typename T, int... Ids>
constexpr std::array<Launcher, sizeof...(Ids)> relu_table(std::integer_sequence<int, Ids...>) {
  return {&relu_one<T, Ids>...};
}

template <typename T, typename Op, int... Ids>
constexpr std::array<Launcher, sizeof...(Ids)> math_table(std::integer_sequence<int, Ids...>) {
  return {&math_one<T, Op, Ids>...};
}

template <typename T>
void relu_variant(int64_t id, const at::Tensor& x, at::Tensor& y) {
  static constexpr auto kTable = relu_table<T>(std::make_integer_sequence<int, kCount>{});
  kTable[id](x, y, 0.0f);
}

// kind is ELU (p: alpha), Sigmoid or TanH; the caller checked it.
template <typename T>
void math_variant(int64_t kind, int64_t id, const at::Tensor& x, at::Tensor& y, float p) {
  using Ids = std::make_integer_sequence<int, kMathCount>;
  static constexpr auto kElus = math_table<T, EluFwd>(Ids{});
  static constexpr auto kSigmoids = math_table<T, SigmoidFwd>(Ids{});
  static constexpr auto kTanhs = math_table<T, TanhFwd>(Ids{});
  const auto& table = kind == kElu ? kElus : kind == kSigmoid ? kSigmoids : kTanhs;
  table[id](x, y, p);
}

}  // namespace sweep
}  // namespace caffe_py
