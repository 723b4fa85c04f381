// Caffe's SGD update (SGDSolver::Normalize, Regularize, ComputeUpdateValue and Blob::Update) over
// every parameter of a net in one launch (a few for a large net), where the op-by-op pipeline of
// caffe_py/solver/rules.py takes four foreach launches per parameter group (mul, add, add, sub):
// a launch-bound step (LeNet) spent more host time on them than on its forward's convolutions.
//
// Per element, in the reference's order and roundings (rules.py is the test oracle,
// tests/kernels/test_sgd_update_gpu.py compares bit for bit):
//   g = g * grad_scale                        (iter_size > 1: the foreach multiply)
//   g = g + decay * w     (L2)  or  g + decay * sign(w)  (L1)      (the foreach add with alpha)
//   h = h * momentum
//   h = h + rate * g      (a host rate: the foreach add with alpha)
//     h + (g * rate)      (a rate on the device, what a CUDA graph replays: multiply, then add)
//   w = w - h
// The regularized gradient is written back, as the reference leaves it (Caffe's diff).
//
// Blocks take fixed chunks of one tensor; a block finds its tensor by a binary search of the
// tensors' first blocks. The tensors' pointers, sizes, rates and decays travel as the kernel's
// argument (captured by value in a CUDA graph), so a launch needs no host-to-device copy, and
// a launch is bounded by the tensors it names (ResNet-50's 161: 3 launches), not its blocks.
// A tensor whose three pointers are 16-byte aligned streams in float4 packs, every load of a
// thread's packs issued before any math (the update is bound by memory: 20 bytes an element);
// any other tensor, and a tensor's last n % 4 elements, go element by element.
#include "common.cuh"

#include <vector>

namespace caffe_py {
namespace {

constexpr int kMaxTensors = 64;
constexpr int kSgdThreads = 256;
constexpr int kSgdPacks = 4;                                          // float4s per thread
constexpr int64_t kChunk = int64_t{kSgdThreads} * kSgdPacks * 4;      // 4,096 elements a block
constexpr int64_t kMaxBlocks = 0x7fffffff;                            // a grid's x dimension

struct SgdBatch {  // 64 x 49 bytes + 8: within the 4 KB of kernel arguments every toolkit allows
  float* w[kMaxTensors];
  float* g[kMaxTensors];
  float* h[kMaxTensors];
  int64_t n[kMaxTensors];
  float rate[kMaxTensors];   // the host rate (rate * lr_mult) of the tensor's group
  float decay[kMaxTensors];  // weight_decay * decay_mult of the tensor's group
  int group[kMaxTensors];    // the tensor's group: its index into the device rates
  int first[kMaxTensors];    // the tensor's first block in this launch
  bool vec[kMaxTensors];     // the tensor's w, g and h are 16-byte aligned: float4 packs
  int tensors;
};

// One element of Caffe's update in the reference's order and roundings (see the top).
struct SgdMath {
  float momentum, grad_scale, decay, rate;
  bool scale_grad, l1, device_rate;
  __device__ __forceinline__ void operator()(float& w, float& g, float& h) const {
    float gi = g;
    if (scale_grad) gi = __fmul_rn(gi, grad_scale);
    if (decay != 0.f) {
      const float r = l1 ? static_cast<float>((0.f < w) - (w < 0.f)) : w;
      gi = __fmaf_rn(decay, r, gi);
    }
    g = gi;
    const float hm = __fmul_rn(h, momentum);
    h = device_rate ? __fadd_rn(hm, __fmul_rn(gi, rate)) : __fmaf_rn(rate, gi, hm);
    w = __fsub_rn(w, h);
  }
};

__global__ void __launch_bounds__(kSgdThreads)
sgd_update_kernel(SgdBatch b, const float* __restrict__ rates, float momentum, float grad_scale,
                  bool scale_grad, bool l1) {
  int lo = 0, hi = b.tensors - 1;  // the last tensor whose first block is <= this block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.first[mid] <= static_cast<int>(blockIdx.x)) lo = mid; else hi = mid - 1;
  }
  const int t = lo;
  const int64_t start = static_cast<int64_t>(blockIdx.x - b.first[t]) * kChunk;
  const int64_t end = start + kChunk < b.n[t] ? start + kChunk : b.n[t];
  float* __restrict__ w = b.w[t];
  float* __restrict__ g = b.g[t];
  float* __restrict__ h = b.h[t];
  const bool device_rate = rates != nullptr;
  const SgdMath math{momentum, grad_scale, b.decay[t],
                     device_rate ? rates[b.group[t]] : b.rate[t], scale_grad, l1, device_rate};
  int64_t tail = start;
  if (b.vec[t]) {
    const int64_t packs = (end - start) / 4;  // whole float4s of this chunk
    float4 W[kSgdPacks], G[kSgdPacks], H[kSgdPacks];
#pragma unroll
    for (int k = 0; k < kSgdPacks; ++k) {
      const int64_t p = threadIdx.x + k * kSgdThreads;
      if (p < packs) {
        W[k] = reinterpret_cast<const float4*>(w + start)[p];
        G[k] = reinterpret_cast<const float4*>(g + start)[p];
        H[k] = reinterpret_cast<const float4*>(h + start)[p];
      }
    }
#pragma unroll
    for (int k = 0; k < kSgdPacks; ++k) {
      const int64_t p = threadIdx.x + k * kSgdThreads;
      if (p < packs) {
        math(W[k].x, G[k].x, H[k].x);
        math(W[k].y, G[k].y, H[k].y);
        math(W[k].z, G[k].z, H[k].z);
        math(W[k].w, G[k].w, H[k].w);
        reinterpret_cast<float4*>(w + start)[p] = W[k];
        reinterpret_cast<float4*>(g + start)[p] = G[k];
        reinterpret_cast<float4*>(h + start)[p] = H[k];
      }
    }
    tail = start + packs * 4;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += kSgdThreads) {
    float wi = w[i], gi = g[i], hi = h[i];
    math(wi, gi, hi);
    w[i] = wi;
    g[i] = gi;
    h[i] = hi;
  }
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

bool same_dense(const at::Tensor& t, const at::Tensor& w) {
  return t.is_cuda() && t.scalar_type() == at::kFloat && t.device() == w.device() &&
         t.sizes() == w.sizes() && t.strides() == w.strides();
}

}  // namespace

bool sgd_update(const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& g,
                const std::vector<at::Tensor>& h, const std::vector<int64_t>& group,
                const std::vector<double>& rates, const c10::optional<at::Tensor>& device_rates,
                const std::vector<double>& decays, double momentum, double grad_scale, bool l1) {
  const size_t n = w.size();
  TORCH_CHECK(g.size() == n && h.size() == n && group.size() == n,
              "sgd_update: w, g, h and group must have one entry per parameter");
  TORCH_CHECK(decays.size() == rates.size() || device_rates.has_value(),
              "sgd_update: one rate and one decay per group");
  const float* rate_p = nullptr;
  if (device_rates.has_value()) {
    const at::Tensor& r = *device_rates;
    TORCH_CHECK(r.is_cuda() && r.scalar_type() == at::kFloat && r.is_contiguous() &&
                    r.numel() == static_cast<int64_t>(decays.size()),
                "sgd_update: the device rates must be a contiguous float32 CUDA tensor with "
                "one rate per group");
    rate_p = r.data_ptr<float>();
  }
  if (n == 0) return true;
  // Every tensor checked before anything runs: false (nothing written) lets the caller take
  // the op-by-op path for a layout this kernel does not stream.
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(group[i] >= 0 && group[i] < static_cast<int64_t>(decays.size()),
                "sgd_update: a group index is out of range");
    if (!w[i].is_cuda() || w[i].scalar_type() != at::kFloat ||
        !w[i].is_non_overlapping_and_dense() || !same_dense(g[i], w[i]) ||
        !same_dense(h[i], w[i]) || w[i].device() != w[0].device())
      return false;
    if (rate_p != nullptr && device_rates->device() != w[i].device()) return false;
  }
  const c10::cuda::CUDAGuard guard(w[0].device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  SgdBatch b;
  b.tensors = 0;
  int64_t blocks = 0;
  auto launch = [&]() {
    sgd_update_kernel<<<static_cast<unsigned>(blocks), kSgdThreads, 0, stream>>>(
        b, rate_p, static_cast<float>(momentum), static_cast<float>(grad_scale),
        grad_scale != 1.0, l1);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    b.tensors = 0;
    blocks = 0;
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = w[i].numel();
    if (numel == 0) continue;
    const int64_t chunks = (numel + kChunk - 1) / kChunk;
    TORCH_CHECK(chunks <= kMaxBlocks, "sgd_update: a tensor of " + num(numel) +
                " elements is over one launch's blocks");
    if (b.tensors == kMaxTensors || blocks + chunks > kMaxBlocks) launch();
    const int slot = b.tensors++;
    const int64_t k = group[i];
    b.w[slot] = w[i].data_ptr<float>();
    b.g[slot] = g[i].data_ptr<float>();
    b.h[slot] = h[i].data_ptr<float>();
    b.n[slot] = numel;
    b.rate[slot] = rate_p != nullptr ? 0.f : static_cast<float>(rates[k]);
    b.decay[slot] = static_cast<float>(decays[k]);
    b.group[slot] = static_cast<int>(k);
    b.vec[slot] = aligned16(w[i]) && aligned16(g[i]) && aligned16(h[i]);
    b.first[slot] = static_cast<int>(blocks);
    blocks += chunks;
  }
  if (blocks > 0) launch();
  return true;
}

}  // namespace caffe_py
