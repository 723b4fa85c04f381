// Shared pieces of the activation kernels: 16-byte packs, launch sizing and the math of each
// activation, written once for the forward and once for the backward.
//
// Every kernel streams memory in "memory order": the caller hands tensors that share one dense
// layout (contiguous or channels_last), so element i of one tensor pairs with element i of the
// others. Arithmetic is done in float (double for double tensors) and rounded once on store,
// as PyTorch's own kernels do.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace caffe_py {

// Numbers and shapes go into TORCH_CHECK messages as std::string. On the hosts with torch 2.11
// and CUDA 13, a number or a shape streamed into a message of this extension (c10::str's
// ostream) crashed the process with a segmentation fault instead of raising, whether nvcc or
// g++ built it; strings, dtypes and std::to_string's text raise as they should.
inline std::string num(int64_t v) { return std::to_string(v); }

inline std::string shape(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

// Streaming elementwise kernels (PyTorch's vectorized_elementwise_kernel design): 128-thread
// blocks, each thread moving a fixed chunk of kPacks 16-byte packs, one block per
// kThreads * kPacks packs, many waves and no grid-stride loop. All loads of a chunk are issued
// before any math, so kPacks loads per thread are in flight.
constexpr int kThreads = 128;
constexpr int kPacks = 4;
constexpr int64_t kBlockPacks = static_cast<int64_t>(kThreads) * kPacks;

// Blocks for `packs` items of kPacks per thread; at least one (it also writes the tail).
inline unsigned chunk_blocks(int64_t packs) {
  return static_cast<unsigned>(std::max<int64_t>(1, (packs + kBlockPacks - 1) / kBlockPacks));
}

// How the unary forward (unary.cuh) loads and stores its 16-byte packs.
enum class Ld : int { kPlain = 0, kNc = 1, kCs = 2 };  // plain, __ldg (ld.global.nc), __ldcs
enum class St : int { kPlain = 0, kCs = 1, kCg = 2 };  // plain, __stcs (evict-first), __stcg

// One launch of the unary forward: threads per block, 16-byte packs per thread for 4-byte
// types (packs4; doubles take twice as many) and for 2-byte types (packs2), and the load and
// store flavours.
struct FwdConfig {
  int threads;
  int packs4;
  int packs2;
  Ld load;
  St store;
};

// The shipped forward launches, each the best of `python benchmarks/activations.py --variants`
// (it prints the line to put here when another one wins; docs/kernels.md has the numbers).
// kFwd (ReLU, leaky ReLU: a compare and a multiply per element).
constexpr FwdConfig kFwd{256, 1, 1, Ld::kCs, St::kCs};
// kFwdMath (ELU, Sigmoid, TanH: an exponential or tanh per element): two bfloat16 packs per
// thread, since 16 bfloat16 elements keep enough loads in flight behind the math.
constexpr FwdConfig kFwdMath{128, 1, 2, Ld::kCs, St::kCs};

// The reductions of channel.cu keep a grid-stride design (a thread accumulates as it walks):
// 256-thread blocks and U packs in flight per loop trip: 4 for float; 2 for the 2- and 8-byte
// types, whose conversions take more registers (4 of them spill under the 64-register cap).
constexpr int kBlock = 256;
template <typename T>
struct Unroll {
  static constexpr int value = sizeof(T) == 4 ? 4 : 2;
};
// Resident blocks per multiprocessor the register budget must allow: 4 x 256 threads, half
// occupancy, enough loads in flight to cover HBM latency (caps registers at 64 per thread).
constexpr int kMinBlocks = 4;

// Activation kinds; the numbers are the Python side's constants (kernels/functions.py).
enum Kind : int64_t { kRelu = 0, kElu = 1, kSigmoid = 2, kTanh = 3 };

// N elements loaded or stored with one instruction (16 bytes for the vector path).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements per 16-byte pack: 4 floats, 8 halfs or bfloat16s, 2 doubles.
template <typename T>
constexpr int pack_width() {
  return static_cast<int>(16 / sizeof(T));
}

template <typename T>
struct OpMath {
  using type = float;
};
template <>
struct OpMath<double> {
  using type = double;
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// Threads the current device keeps resident at once: multiprocessors x threads per
// multiprocessor, read once per device (only the reductions of channel.cu size by it).
inline int64_t resident_threads() {
  static int64_t cache[64] = {0};
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && cache[dev] != 0) return cache[dev];
  int sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev));
  const int64_t threads = static_cast<int64_t>(sms) * per_sm;
  if (dev < 64) cache[dev] = threads;
  return threads;
}

// Blocks in one full wave: every multiprocessor at full occupancy.
inline int wave_blocks(int threads_per_block = kBlock) {
  return static_cast<int>(std::max<int64_t>(1, resident_threads() / threads_per_block));
}

// Blocks for a grid-stride loop over `work` thread-sized items: at most one full wave, so each
// thread loops instead of blocks relaunching.
inline int grid_size(int64_t work, int threads_per_block = kBlock) {
  const int64_t need = (work + threads_per_block - 1) / threads_per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(need, wave_blocks())));
}

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_(double x) { return tanh(x); }

// expm1(x) for x <= 0 (ELU's negative side) without expm1f's long path: below -0.5,
// __expf(x) - 1 (absolute error < 2e-7 on a result in (-1, -0.39]); on [-0.5, 0] the Taylor
// series to x^8 / 8! (truncation < 2e-8 relative). Both are computed and one is selected, so a
// warp does not diverge. NaN stays NaN (it takes the series).
__device__ __forceinline__ float expm1_neg(float x) {
  const float e = __expf(x) - 1.0f;
  float q = 1.0f / 40320.0f;
  q = fmaf(q, x, 1.0f / 5040.0f);
  q = fmaf(q, x, 1.0f / 720.0f);
  q = fmaf(q, x, 1.0f / 120.0f);
  q = fmaf(q, x, 1.0f / 24.0f);
  q = fmaf(q, x, 1.0f / 6.0f);
  q = fmaf(q, x, 0.5f);
  q = fmaf(q, x, 1.0f);
  return x < -0.5f ? e : x * q;
}
__device__ __forceinline__ double expm1_neg(double x) { return expm1(x); }

// 1 / (1 + exp(-x)) with the fast exponential and division: absolute error < 4e-7 over all x
// (the relative error of __expf is damped by y(1-y)); 0 and 1 at -inf and inf, NaN kept.
__device__ __forceinline__ float sigmoid_(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ double sigmoid_(double x) { return 1.0 / (1.0 + exp(-x)); }

// ---- forward: y = f(x); p is negative_slope (ReLU) or alpha (ELU) ----------------------------
struct ReluFwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A p) const {
    // Caffe: max(x, 0) + p * min(x, 0). With p == 0 this is torch.relu: 0 for -inf, NaN kept.
    if (x > A(0)) return x;
    if (p == A(0)) return x != x ? x : A(0);
    return x * p;
  }
};
struct EluFwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A p) const {
    return x > A(0) ? x : p * expm1_neg(x);
  }
};
struct SigmoidFwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A) const {
    return sigmoid_(x);
  }
};
struct TanhFwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A) const {
    return tanh_(x);
  }
};

// ---- backward: dL/dx from dL/dy (g) and a saved tensor s -------------------------------------
// ReLU: s is x or y (same sign when p >= 0). Caffe: g * ((s > 0) + p * (s <= 0)).
struct ReluBwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A g, A s, A p) const {
    if (s > A(0)) return g;
    return p == A(0) ? A(0) : g * p;
  }
};
// ELU from its output (alpha >= 0): y <= 0 exactly where x <= 0, and dy/dx = y + alpha there.
struct EluBwdFromOutput {
  template <typename A>
  __device__ __forceinline__ A operator()(A g, A y, A p) const {
    return y > A(0) ? g : g * (y + p);
  }
};
// ELU from its input (any alpha): dy/dx = alpha * exp(x) for x <= 0.
struct EluBwdFromInput {
  template <typename A>
  __device__ __forceinline__ A operator()(A g, A x, A p) const {
    return x > A(0) ? g : g * p * exp_(x);
  }
};
struct SigmoidBwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A g, A y, A) const {
    return g * (A(1) - y) * y;
  }
};
struct TanhBwd {
  template <typename A>
  __device__ __forceinline__ A operator()(A g, A y, A) const {
    return g * (A(1) - y * y);
  }
};

// ---- argument checks shared by the host wrappers ---------------------------------------------
inline bool dense_like(const at::Tensor& a, const at::Tensor& ref) {
  if (a.sizes() != ref.sizes()) return false;
  if (a.strides() == ref.strides()) return true;
  if (a.is_contiguous() && ref.is_contiguous()) return true;
  if (a.dim() == 4 && a.is_contiguous(at::MemoryFormat::ChannelsLast) &&
      ref.is_contiguous(at::MemoryFormat::ChannelsLast))
    return true;
  return a.dim() == 5 && a.is_contiguous(at::MemoryFormat::ChannelsLast3d) &&
         ref.is_contiguous(at::MemoryFormat::ChannelsLast3d);
}

inline void check_same(const at::Tensor& a, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(a.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(a.device() == ref.device(), name, " is on " + a.device().str() + " but x is on " +
              ref.device().str());
  TORCH_CHECK(a.scalar_type() == ref.scalar_type(), name, " has dtype ", a.scalar_type(),
              " but x has ", ref.scalar_type());
  TORCH_CHECK(dense_like(a, ref), name, " must have x's shape " + shape(ref.sizes()) +
              " and the same dense memory layout");
}

inline void check_input(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  TORCH_CHECK(x.is_non_overlapping_and_dense(),
              "x must be dense (contiguous or channels_last); call .contiguous() first");
}

}  // namespace caffe_py
