// The replicas' gradient sum for small buckets, GPU to GPU over peer access (one process, N
// devices): every device reads the same range of every replica's bucket and adds them in
// replica order, so each device computes the same bits, with no ring and no protocol.
//
// NCCL's all-reduce pays several microseconds of latency a call however small the bucket; a
// LeNet iteration (0.22 ms on an H200) has two buckets, one of them after backward, on the
// critical path. Here a call is one kernel a device: block b of every device owns elements
// [b * per, (b + 1) * per) of the bucket.
//
//   1. Start: block b tells every peer that its bucket is final (the kernel runs after the
//      bucket's backward on its stream) and waits until every peer has said the same.
//   2. Sum: in[0][i] + in[1][i] + ... in replica order over its range, into scratch.
//   3. End: block b tells every peer it has read their range, and waits until every peer has
//      read its own; then copies scratch into its bucket (nobody reads it any more).
//
// The flags are counters in each device's memory: a call's epoch is the block's call count
// plus one, kept per block on its own device (every device makes the same calls in the same
// order: the buckets of one iteration, in one order). A peer that is one call ahead has
// already written epoch + 1, so a wait is "flag >= epoch". Stores to peers are st.release.sys
// and the waits ld.acquire.sys: what a device wrote before its signal is visible to the peer
// that sees the signal. A wait that lasts the call's timeout (a peer that never launched: a
// failed replica) traps, which the host sees as a CUDA error instead of a hang.
#include "common.cuh"

namespace caffe_py {
namespace {

constexpr int kMaxPeers = 8;
constexpr int kPeerThreads = 256;
// Blocks a call uses at most; the flag arrays hold this many per phase and source.
constexpr int kPeerBlocks = 64;

struct PeerArgs {
  const float* in[kMaxPeers];   // each replica's bucket, on its own device
  unsigned* flags[kMaxPeers];   // each device's flags: [2 phases][kMaxPeers sources][blocks]
};

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Threads 0..n-1 but `rank` each signal one peer, then wait for that peer's signal.
__device__ __forceinline__ void meet(const PeerArgs& a, int phase, int rank, int n,
                                     unsigned epoch, unsigned long long timeout_ns) {
  const int p = threadIdx.x;
  if (p < n && p != rank) {
    const int slot = (phase * kMaxPeers) * kPeerBlocks + blockIdx.x;
    store_release(a.flags[p] + slot + rank * kPeerBlocks, epoch);
    const unsigned* mine = a.flags[rank] + slot + p * kPeerBlocks;
    const unsigned long long start = now_ns();
    while (static_cast<int>(load_acquire(mine) - epoch) < 0) {
      if (now_ns() - start > timeout_ns) __trap();
    }
  }
  __syncthreads();
}

template <int V>
__global__ void __launch_bounds__(kPeerThreads)
peer_sum_kernel(PeerArgs a, float* out, float* scratch, unsigned* counters, int64_t numel,
                int64_t per, int rank, int n, unsigned long long timeout_ns) {
  __shared__ unsigned epoch;
  if (threadIdx.x == 0) epoch = counters[blockIdx.x] + 1;
  __syncthreads();
  meet(a, 0, rank, n, epoch, timeout_ns);
  const int64_t lo = blockIdx.x * per;
  const int64_t hi = lo + per < numel ? lo + per : numel;
  using P = Pack<float, V>;
  for (int64_t i = lo + threadIdx.x * V; i < hi; i += kPeerThreads * V) {
    if (i + V <= hi) {
      P acc = *reinterpret_cast<const P*>(a.in[0] + i);
      for (int r = 1; r < n; ++r) {
        const P x = *reinterpret_cast<const P*>(a.in[r] + i);
#pragma unroll
        for (int v = 0; v < V; ++v) acc.v[v] += x.v[v];
      }
      *reinterpret_cast<P*>(scratch + i) = acc;
    } else {
      for (int64_t j = i; j < hi; ++j) {
        float acc = a.in[0][j];
        for (int r = 1; r < n; ++r) acc += a.in[r][j];
        scratch[j] = acc;
      }
    }
  }
  __syncthreads();
  meet(a, 1, rank, n, epoch, timeout_ns);
  for (int64_t i = lo + threadIdx.x * V; i < hi; i += kPeerThreads * V) {   // as written above
    if (i + V <= hi) {
      *reinterpret_cast<P*>(out + i) = *reinterpret_cast<const P*>(scratch + i);
    } else {
      for (int64_t j = i; j < hi; ++j) out[j] = scratch[j];
    }
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = epoch;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int64_t peer_sum_flag_count() { return 2 * kMaxPeers * kPeerBlocks; }

int64_t peer_sum_counter_count() { return kPeerBlocks; }

void peer_sum(const std::vector<at::Tensor>& parts, int64_t rank,
              const std::vector<at::Tensor>& flags, at::Tensor& scratch, at::Tensor& counters,
              double timeout_s) {
  const int64_t n = static_cast<int64_t>(parts.size());
  TORCH_CHECK(n >= 2 && n <= kMaxPeers, "peer_sum: needs 2 to 8 replicas");
  TORCH_CHECK(static_cast<int64_t>(flags.size()) == n, "peer_sum: one flag tensor a replica");
  TORCH_CHECK(rank >= 0 && rank < n, "peer_sum: rank outside the replicas");
  TORCH_CHECK(timeout_s > 0 && timeout_s <= 3600, "peer_sum: the timeout must be above 0 and at "
              "most 3600 s");
  const at::Tensor& out = parts[rank];
  const int64_t numel = out.numel();
  PeerArgs a{};
  bool vec = aligned(scratch.data_ptr());
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(parts[r].is_cuda() && parts[r].scalar_type() == at::kFloat &&
                    parts[r].is_contiguous() && parts[r].numel() == numel,
                "peer_sum: every part must be a contiguous float32 CUDA tensor of one size");
    TORCH_CHECK(flags[r].is_cuda() && flags[r].scalar_type() == at::kInt &&
                    flags[r].numel() == peer_sum_flag_count() &&
                    flags[r].device() == parts[r].device(),
                "peer_sum: each flag tensor must be the int32 flags on its part's device");
    a.in[r] = parts[r].const_data_ptr<float>();
    a.flags[r] = reinterpret_cast<unsigned*>(flags[r].data_ptr<int>());
    vec = vec && aligned(a.in[r]);
  }
  TORCH_CHECK(scratch.is_cuda() && scratch.scalar_type() == at::kFloat &&
                  scratch.device() == out.device() && scratch.numel() >= numel,
              "peer_sum: the scratch must be float32 on the rank's device, as long as a part");
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.device() == out.device() &&
                  counters.numel() == peer_sum_counter_count(),
              "peer_sum: the counters must be the int32 counters on the rank's device");
  if (numel == 0) return;
  const c10::cuda::CUDAGuard guard(out.device());
  // Blocks of at least 4 float4s a thread, at most kPeerBlocks; `per` a multiple of 4 floats so
  // that every block's range starts on a 16-byte boundary.
  const int64_t want = (numel + kPeerThreads * 16 - 1) / (kPeerThreads * 16);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(kPeerBlocks, want));
  const int64_t per = ((numel + blocks - 1) / blocks + 3) / 4 * 4;
  const unsigned grid = static_cast<unsigned>((numel + per - 1) / per);
  float* dst = out.data_ptr<float>();
  float* tmp = scratch.data_ptr<float>();
  unsigned* cnt = reinterpret_cast<unsigned*>(counters.data_ptr<int>());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto timeout_ns = static_cast<unsigned long long>(timeout_s * 1e9);
  if (vec)
    peer_sum_kernel<4><<<grid, kPeerThreads, 0, stream>>>(a, dst, tmp, cnt, numel, per,
                                                            static_cast<int>(rank),
                                                            static_cast<int>(n), timeout_ns);
  else
    peer_sum_kernel<1><<<grid, kPeerThreads, 0, stream>>>(a, dst, tmp, cnt, numel, per,
                                                            static_cast<int>(rank),
                                                            static_cast<int>(n), timeout_ns);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool enable_peer_access(const std::vector<int64_t>& devices) {
  int current = 0;
  C10_CUDA_CHECK(cudaGetDevice(&current));
  bool ok = true;
  for (int64_t d : devices) {
    for (int64_t p : devices) {
      if (p == d) continue;
      const int a = static_cast<int>(d), b = static_cast<int>(p);
      // Native atomics between the pair: an NVLink-class link. Over PCIe a peer read is slow
      // enough that NCCL's all-reduce is the better sum at any size.
      int can = 0, atomics = 0;
      C10_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      C10_CUDA_CHECK(
          cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b));
      if (!can || !atomics) {
        ok = false;
        continue;
      }
      C10_CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();   // enabled before (PyTorch's copies enable it too)
      } else if (err != cudaSuccess) {
        (void)cudaGetLastError();
        ok = false;
      }
    }
  }
  C10_CUDA_CHECK(cudaSetDevice(current));
  return ok;
}

}  // namespace caffe_py
