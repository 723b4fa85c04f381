// The float32 instances of fwd_variants.cuh's math grid (ELU, Sigmoid, TanH).
#include "fwd_variants.cuh"

namespace caffe_py {
namespace sweep {
void math_f32(int64_t kind, int64_t id, const at::Tensor& x, at::Tensor& y, float p) {
  math_variant<float>(kind, id, x, y, p);
}
}  // namespace sweep
}  // namespace caffe_py
