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
// Blocks take fixed chunks of one tensor; the tensors' pointers, sizes, rates and decays and the
// block -> (tensor, chunk) map travel as the kernel's argument (captured by value in a CUDA
// graph), so a launch needs no host-to-device copy.
#include "common.cuh"

#include <vector>

namespace caffe_py {
namespace {

constexpr int kMaxTensors = 24;
constexpr int kMaxBlocks = 320;
constexpr int kSgdThreads = 256;
constexpr int64_t kChunk = 8192;  // elements per block: 32 per thread

struct SgdBatch {  // 2.7 KB, within the 4 KB of kernel arguments every toolkit allows
  float* w[kMaxTensors];
  float* g[kMaxTensors];
  float* h[kMaxTensors];
  int64_t n[kMaxTensors];
  float rate[kMaxTensors];   // the host rate (rate * lr_mult) of the tensor's group
  float decay[kMaxTensors];  // weight_decay * decay_mult of the tensor's group
  int group[kMaxTensors];    // the tensor's group: its index into the device rates
  unsigned char tensor[kMaxBlocks];
  int chunk[kMaxBlocks];
};

__global__ void __launch_bounds__(kSgdThreads)
sgd_update_kernel(SgdBatch b, const float* __restrict__ rates, float momentum, float grad_scale,
                  bool scale_grad, bool l1) {
  const int t = b.tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(b.chunk[blockIdx.x]) * kChunk;
  const int64_t end = start + kChunk < b.n[t] ? start + kChunk : b.n[t];
  float* __restrict__ w = b.w[t];
  float* __restrict__ g = b.g[t];
  float* __restrict__ h = b.h[t];
  const float decay = b.decay[t];
  const bool device_rate = rates != nullptr;
  const float rate = device_rate ? rates[b.group[t]] : b.rate[t];
  for (int64_t i = start + threadIdx.x; i < end; i += kSgdThreads) {
    const float wi = w[i];
    float gi = g[i];
    if (scale_grad) gi = __fmul_rn(gi, grad_scale);
    if (decay != 0.f) {
      const float r = l1 ? static_cast<float>((0.f < wi) - (wi < 0.f)) : wi;
      gi = __fmaf_rn(decay, r, gi);
    }
    g[i] = gi;
    const float hm = __fmul_rn(h[i], momentum);
    const float hi = device_rate ? __fadd_rn(hm, __fmul_rn(gi, rate)) : __fmaf_rn(rate, gi, hm);
    h[i] = hi;
    w[i] = __fsub_rn(wi, hi);
  }
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
  int tensors = 0, blocks = 0;
  auto launch = [&]() {
    sgd_update_kernel<<<blocks, kSgdThreads, 0, stream>>>(
        b, rate_p, static_cast<float>(momentum), static_cast<float>(grad_scale),
        grad_scale != 1.0, l1);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    tensors = 0;
    blocks = 0;
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = w[i].numel();
    const int64_t chunks = (numel + kChunk - 1) / kChunk;
    int slot = -1;
    for (int64_t c = 0; c < chunks; ++c) {
      if (slot < 0) {  // the tensor's entry in this launch (again after a launch went out)
        if (tensors == kMaxTensors) launch();
        slot = tensors++;
        const int64_t k = group[i];
        b.w[slot] = w[i].data_ptr<float>();
        b.g[slot] = g[i].data_ptr<float>();
        b.h[slot] = h[i].data_ptr<float>();
        b.n[slot] = numel;
        b.rate[slot] = rate_p != nullptr ? 0.f : static_cast<float>(rates[k]);
        b.decay[slot] = static_cast<float>(decays[k]);
        b.group[slot] = static_cast<int>(k);
      }
      b.tensor[blocks] = static_cast<unsigned char>(slot);
      b.chunk[blocks] = static_cast<int>(c);
      if (++blocks == kMaxBlocks) {
        launch();
        slot = -1;
      }
    }
  }
  if (blocks > 0) launch();
  return true;
}

}  // namespace caffe_py
