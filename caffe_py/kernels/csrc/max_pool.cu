// Max pooling of a channels_last (N, H, W, C in memory) tensor, forward and backward, with
// PyTorch's max_pool2d semantics bit for bit (the Pooling layer's oracle): each window is
// clipped to the input (padding never wins), its first maximum in row-major order wins, a NaN
// wins over any number and a later NaN over an earlier one; the backward gives an input the
// float sum of the gradients of the windows whose maximum it is, in the windows' row-major
// order, rounded once.
//
// The forward keeps each output's argmax as its offset inside the window, one byte (windows of
// up to 255 elements), where PyTorch keeps a 64-bit flat index: on ResNet-50's pool1 the
// indices are 51 MB instead of 411 MB. The backward is a gather: one thread per input pixel
// and 16-byte channel pack visits the (at most ceil(k / s)^2) windows that hold it; no atomics,
// so every run gives the same bits.
//
// One thread handles one pixel's pack of V channels (V = 16 bytes / element size), so C must be
// a multiple of V; the caller (functions.max_pool_fits) sends anything else to PyTorch. In a
// window that holds only -inf, the gradient goes to the window's first element (PyTorch's own
// kernels route it elsewhere or drop it).
#include "common.cuh"

namespace caffe_py {
namespace {

struct Window {
  int H, W, OH, OW, kh, kw, sh, sw, ph, pw;
};

template <typename T, int V>
struct alignas(16) Values {
  T v[V];
};

template <int V>
struct alignas(V) Offsets {
  uint8_t v[V];
};

// A thread's place: pixel (n, y, x) of a (height, width) plane, its channel pack cp.
struct Place {
  int64_t pixel, n;
  int y, x, cp;
};

__device__ __forceinline__ Place place_of(int64_t t, int packs, int height, int width) {
  Place p;
  p.cp = static_cast<int>(t % packs);
  p.pixel = t / packs;
  p.x = static_cast<int>(p.pixel % width);
  const int64_t rows = p.pixel / width;
  p.y = static_cast<int>(rows % height);
  p.n = rows / height;
  return p;
}

template <typename T, int V>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                        uint8_t* __restrict__ at, int64_t total, int packs,
                                        Window g) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t C = static_cast<int64_t>(packs) * V;
  const Place at_out = place_of(t, packs, g.OH, g.OW);
  const int64_t n = at_out.n, pixel = at_out.pixel;
  const int oh = at_out.y, ow = at_out.x, cp = at_out.cp;
  const int h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  const int hs = max(h0, 0), he = min(h0 + g.kh, g.H);
  const int ws = max(w0, 0), we = min(w0 + g.kw, g.W);
  float best[V];
  uint8_t where[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    best[i] = -INFINITY;
    where[i] = static_cast<uint8_t>((hs - h0) * g.kw + (ws - w0));
  }
  for (int h = hs; h < he; ++h) {
    const T* row = x + ((n * g.H + h) * g.W) * C + static_cast<int64_t>(cp) * V;
    for (int w = ws; w < we; ++w) {
      const Values<T, V> p = *reinterpret_cast<const Values<T, V>*>(row + w * C);
      const uint8_t offset = static_cast<uint8_t>((h - h0) * g.kw + (w - w0));
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float v = static_cast<float>(p.v[i]);
        if (v > best[i] || isnan(v)) {
          best[i] = v;
          where[i] = offset;
        }
      }
    }
  }
  Values<T, V> out;
  Offsets<V> offsets;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    out.v[i] = static_cast<T>(best[i]);  // a value of x: exact
    offsets.v[i] = where[i];
  }
  const int64_t o = pixel * C + static_cast<int64_t>(cp) * V;
  *reinterpret_cast<Values<T, V>*>(y + o) = out;
  *reinterpret_cast<Offsets<V>*>(at + o) = offsets;
}

template <typename T, int V>
__global__ void max_pool_backward_kernel(const T* __restrict__ gy,
                                         const uint8_t* __restrict__ at, T* __restrict__ gx,
                                         int64_t total, int packs, Window g) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t C = static_cast<int64_t>(packs) * V;
  const Place at_in = place_of(t, packs, g.H, g.W);
  const int64_t n = at_in.n, pixel = at_in.pixel;
  const int ih = at_in.y, iw = at_in.x, cp = at_in.cp;
  // the windows that hold (ih, iw): oh * sh - ph <= ih < oh * sh - ph + kh, likewise for w
  const int oh0 = ih + g.ph < g.kh ? 0 : (ih + g.ph - g.kh) / g.sh + 1;
  const int oh1 = min((ih + g.ph) / g.sh + 1, g.OH);
  const int ow0 = iw + g.pw < g.kw ? 0 : (iw + g.pw - g.kw) / g.sw + 1;
  const int ow1 = min((iw + g.pw) / g.sw + 1, g.OW);
  float sum[V];
#pragma unroll
  for (int i = 0; i < V; ++i) sum[i] = 0.f;
  for (int oh = oh0; oh < oh1; ++oh) {
    for (int ow = ow0; ow < ow1; ++ow) {
      const int offset = (ih - (oh * g.sh - g.ph)) * g.kw + (iw - (ow * g.sw - g.pw));
      const int64_t o = ((n * g.OH + oh) * g.OW + ow) * C + static_cast<int64_t>(cp) * V;
      const Offsets<V> w = *reinterpret_cast<const Offsets<V>*>(at + o);
      const Values<T, V> d = *reinterpret_cast<const Values<T, V>*>(gy + o);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        if (w.v[i] == offset) sum[i] += static_cast<float>(d.v[i]);
      }
    }
  }
  Values<T, V> out;
#pragma unroll
  for (int i = 0; i < V; ++i) out.v[i] = static_cast<T>(sum[i]);
  *reinterpret_cast<Values<T, V>*>(gx + pixel * C + static_cast<int64_t>(cp) * V) = out;
}

constexpr int kPoolThreads = 256;

unsigned pool_blocks(int64_t total) {
  const int64_t blocks = (total + kPoolThreads - 1) / kPoolThreads;
  TORCH_CHECK(blocks <= INT32_MAX, "max_pool: " + num(total) + " threads are too many");
  return static_cast<unsigned>(blocks);
}

// float32, float16 and bfloat16: the kernels compare and add in float
#define CAFFE_PY_DISPATCH_POOL(TYPE, NAME, ...)                  \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                 \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)   \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)    \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

void check_nhwc(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast),
              name, " must be a channels_last 4-D CUDA tensor");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0, name,
              " must start on a 16-byte boundary");
}

void check_dtype(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf ||
                  t.scalar_type() == at::kBFloat16,
              "max_pool: float32, float16 or bfloat16 only, got ", t.scalar_type());
}

// The geometry as the kernels take it, checked: windows of 1 to 255 elements, padding smaller
// than the window, and every window starting inside the input.
Window window_of(int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh, int64_t kw,
                 int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  TORCH_CHECK(kh >= 1 && kw >= 1 && kh * kw <= 255 && sh >= 1 && sw >= 1 && ph >= 0 &&
                  pw >= 0 && ph < kh && pw < kw && OH >= 1 && OW >= 1 &&
                  (OH - 1) * sh - ph < H && (OW - 1) * sw - pw < W && H <= INT32_MAX &&
                  W <= INT32_MAX,
              "max_pool: a window of " + num(kh) + " x " + num(kw) + ", stride " + num(sh) +
                  " x " + num(sw) + ", pad " + num(ph) + " x " + num(pw) + " from " + num(H) +
                  " x " + num(W) + " to " + num(OH) + " x " + num(OW) +
                  " is not one this kernel takes");
  return Window{static_cast<int>(H),  static_cast<int>(W),  static_cast<int>(OH),
                static_cast<int>(OW), static_cast<int>(kh), static_cast<int>(kw),
                static_cast<int>(sh), static_cast<int>(sw), static_cast<int>(ph),
                static_cast<int>(pw)};
}

int64_t pack_of(const at::Tensor& t) {
  const int64_t V = 16 / static_cast<int64_t>(t.element_size());
  TORCH_CHECK(t.size(1) % V == 0, "max_pool: the channels, " + num(t.size(1)) +
                                      ", must be a multiple of " + num(V));
  return V;
}

}  // namespace

// Returns (y, at): the pooled values and each one's offset in its window (uint8), both
// channels_last (N, C, OH, OW).
std::vector<at::Tensor> max_pool_forward(const at::Tensor& x, int64_t kh, int64_t kw,
                                         int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                         int64_t OH, int64_t OW) {
  check_nhwc(x, "x");
  check_dtype(x);
  const int64_t V = pack_of(x);
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const Window g = window_of(H, W, OH, OW, kh, kw, sh, sw, ph, pw);
  const auto cl = at::MemoryFormat::ChannelsLast;
  at::Tensor y = at::empty({N, C, OH, OW}, x.options().memory_format(cl));
  at::Tensor at_ = at::empty({N, C, OH, OW}, x.options().dtype(at::kByte).memory_format(cl));
  const int64_t total = N * OH * OW * (C / V);
  if (total == 0) return {y, at_};
  const c10::cuda::CUDAGuard guard(x.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int packs = static_cast<int>(C / V);
  const unsigned blocks = pool_blocks(total);
  CAFFE_PY_DISPATCH_POOL(x.scalar_type(), "max_pool_fwd", [&] {
    constexpr int kV = 16 / sizeof(scalar_t);
    max_pool_forward_kernel<scalar_t, kV><<<blocks, kPoolThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), at_.data_ptr<uint8_t>(), total,
        packs, g);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, at_};
}

// Returns the input's gradient (N, C, H, W), channels_last, from the output's gradient and the
// forward's offsets.
at::Tensor max_pool_backward(const at::Tensor& gy, const at::Tensor& at_, int64_t H, int64_t W,
                             int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                             int64_t pw) {
  check_nhwc(gy, "the output's gradient");
  check_dtype(gy);
  check_nhwc(at_, "the offsets");
  TORCH_CHECK(at_.scalar_type() == at::kByte && at_.sizes() == gy.sizes() &&
                  at_.device() == gy.device(),
              "max_pool: the offsets must be uint8 of the gradient's shape " +
                  shape(gy.sizes()) + ", got " + shape(at_.sizes()));
  const int64_t V = pack_of(gy);
  const int64_t N = gy.size(0), C = gy.size(1), OH = gy.size(2), OW = gy.size(3);
  const Window g = window_of(H, W, OH, OW, kh, kw, sh, sw, ph, pw);
  at::Tensor gx =
      at::empty({N, C, H, W}, gy.options().memory_format(at::MemoryFormat::ChannelsLast));
  const int64_t total = N * H * W * (C / V);
  if (total == 0) return gx;
  const c10::cuda::CUDAGuard guard(gy.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int packs = static_cast<int>(C / V);
  const unsigned blocks = pool_blocks(total);
  CAFFE_PY_DISPATCH_POOL(gy.scalar_type(), "max_pool_bwd", [&] {
    constexpr int kV = 16 / sizeof(scalar_t);
    max_pool_backward_kernel<scalar_t, kV><<<blocks, kPoolThreads, 0, stream>>>(
        gy.const_data_ptr<scalar_t>(), at_.const_data_ptr<uint8_t>(), gx.data_ptr<scalar_t>(),
        total, packs, g);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return gx;
}

}  // namespace caffe_py
