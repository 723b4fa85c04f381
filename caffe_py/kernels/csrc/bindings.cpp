// Python bindings of the activation kernels, the fused BatchNorm + ReLU, the fused
// SoftmaxWithLoss, the SGD update and max pooling. The elementwise functions write into tensors
// the caller allocated (so tests can poison them with NaN and see any element a kernel leaves
// unwritten); the backward of a per-channel op returns the parameter's gradient as a new [C]
// tensor, and max pooling returns its outputs.
#include <torch/extension.h>

namespace caffe_py {
void act_forward(const at::Tensor& x, at::Tensor& out, int64_t kind, double p);
void act_backward(const at::Tensor& g, const at::Tensor& s, at::Tensor& grad_in, int64_t kind,
                  double p, bool from_output);
void prelu_forward(const at::Tensor& x, const at::Tensor& slope, at::Tensor& out, int64_t C,
                   int64_t inner);
at::Tensor prelu_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& slope,
                          at::Tensor& grad_x, int64_t C, int64_t inner);
void bias_act_forward(const at::Tensor& x, const at::Tensor& bias, at::Tensor& out, int64_t C,
                      int64_t inner, int64_t kind, double p);
at::Tensor bias_act_backward(const at::Tensor& g, const at::Tensor& y, const at::Tensor& bias,
                             at::Tensor& grad_x, int64_t C, int64_t inner, int64_t kind,
                             double p);
at::Tensor bias_grad(const at::Tensor& g, int64_t C, int64_t inner);
at::Tensor bn_relu_forward(const at::Tensor& x, const c10::optional<at::Tensor>& gamma,
                           const c10::optional<at::Tensor>& beta,
                           const c10::optional<at::Tensor>& residual, at::Tensor& y,
                           at::Tensor& mean_sum, at::Tensor& var_sum, at::Tensor& count,
                           double eps, double maf, double p);
at::Tensor bn_relu_backward(const at::Tensor& g, const at::Tensor& x,
                            const c10::optional<at::Tensor>& residual, const at::Tensor& coef,
                            at::Tensor& dx, const c10::optional<at::Tensor>& dr, double p);
void softmax_loss_forward(const at::Tensor& x, const at::Tensor& label, at::Tensor& prob,
                          at::Tensor& work, at::Tensor& done, at::Tensor& loss,
                          at::Tensor& div, const c10::optional<at::Tensor>& seen, int64_t ignore,
                          bool has_ignore, double divisor, bool count_valid);
void softmax_loss_backward(const at::Tensor& prob, const at::Tensor& label,
                           const at::Tensor& grad, const at::Tensor& div, at::Tensor& dx,
                           int64_t ignore, bool has_ignore);
void crop_transform(const at::Tensor& in, const at::Tensor& where,
                    const c10::optional<at::Tensor>& mean, double scale, bool reverse,
                    at::Tensor& out);
void cropped_transform(const at::Tensor& in, const at::Tensor& where,
                       const c10::optional<at::Tensor>& mean, double scale, bool flip_pixels,
                       at::Tensor& out);
bool sgd_update(const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& g,
                const std::vector<at::Tensor>& h, const std::vector<int64_t>& group,
                const std::vector<double>& rates, const c10::optional<at::Tensor>& device_rates,
                const std::vector<double>& decays, double momentum, double grad_scale, bool l1);
int64_t peer_sum_flag_count();
int64_t peer_sum_counter_count();
void peer_sum(const std::vector<at::Tensor>& parts, int64_t rank,
              const std::vector<at::Tensor>& flags, at::Tensor& scratch, at::Tensor& counters,
              double timeout_s);
bool enable_peer_access(const std::vector<int64_t>& devices);
std::vector<at::Tensor> max_pool_forward(const at::Tensor& x, int64_t kh, int64_t kw,
                                         int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                         int64_t OH, int64_t OW);
at::Tensor max_pool_backward(const at::Tensor& gy, const at::Tensor& at_, int64_t H, int64_t W,
                             int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                             int64_t pw);

// Caffe's SoftmaxWithLoss as a C++ autograd Function over the two kernels (softmax_loss.cu):
// forward returns (loss, prob), prob without a gradient; backward runs without Python.
struct SoftmaxLossFunction : public torch::autograd::Function<SoftmaxLossFunction> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& label,
      const c10::optional<at::Tensor>& seen, at::Tensor work, at::Tensor done, int64_t ignore,
      bool has_ignore, double divisor, bool count_valid) {
    at::Tensor prob = at::empty_like(x);
    at::Tensor loss = at::empty({}, x.options());
    at::Tensor div = at::empty({1}, x.options());
    softmax_loss_forward(x, label, prob, work, done, loss, div, seen, ignore, has_ignore, divisor,
                         count_valid);
    ctx->save_for_backward({prob, label, div});
    ctx->saved_data["ignore"] = ignore;
    ctx->saved_data["has_ignore"] = has_ignore;
    ctx->mark_non_differentiable({prob});
    ctx->set_materialize_grads(false);
    return {loss, prob};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(9);  // one per forward argument; only x's is defined
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    auto saved = ctx->get_saved_variables();
    at::Tensor dx = at::empty_like(saved[0]);
    softmax_loss_backward(saved[0], saved[1], g.to(at::kFloat).reshape({1}), saved[2], dx,
                          ctx->saved_data["ignore"].toInt(),
                          ctx->saved_data["has_ignore"].toBool());
    out[0] = dx;
    return out;
  }
};

std::vector<at::Tensor> softmax_loss(const at::Tensor& x, const at::Tensor& label,
                                     const c10::optional<at::Tensor>& seen, at::Tensor work,
                                     at::Tensor done, int64_t ignore, bool has_ignore,
                                     double divisor, bool count_valid) {
  return SoftmaxLossFunction::apply(x, label, seen, work, done, ignore, has_ignore, divisor,
                                    count_valid);
}
}  // namespace caffe_py

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "caffe-py's CUDA activation kernels (see caffe_py/kernels/functions.py)";
  m.def("act_forward", &caffe_py::act_forward, "out = f(x); out may be x", py::arg("x"),
        py::arg("out"), py::arg("kind"), py::arg("p"));
  m.def("act_backward", &caffe_py::act_backward, "grad_in = f'(grad_out, saved)",
        py::arg("grad_out"), py::arg("saved"), py::arg("grad_in"), py::arg("kind"), py::arg("p"),
        py::arg("from_output"));
  m.def("prelu_forward", &caffe_py::prelu_forward, "out = prelu(x, slope)", py::arg("x"),
        py::arg("slope"), py::arg("out"), py::arg("C"), py::arg("inner"));
  m.def("prelu_backward", &caffe_py::prelu_backward, "writes grad_x, returns dslope [C]",
        py::arg("grad_out"), py::arg("x"), py::arg("slope"), py::arg("grad_x"), py::arg("C"),
        py::arg("inner"));
  m.def("bias_act_forward", &caffe_py::bias_act_forward, "out = f(x + bias[c]); out may be x",
        py::arg("x"), py::arg("bias"), py::arg("out"), py::arg("C"), py::arg("inner"),
        py::arg("kind"), py::arg("p"));
  m.def("bias_act_backward", &caffe_py::bias_act_backward, "writes grad_x, returns dbias [C]",
        py::arg("grad_out"), py::arg("y"), py::arg("bias"), py::arg("grad_x"), py::arg("C"),
        py::arg("inner"), py::arg("kind"), py::arg("p"));
  m.def("bias_grad", &caffe_py::bias_grad,
        "returns g [outer, C, inner] summed over outer and inner: [C] float32",
        py::arg("grad_out"), py::arg("C"), py::arg("inner"));
  m.def("bn_relu_forward", &caffe_py::bn_relu_forward,
        "y = relu_p(batchnorm(x) * gamma + beta [+ residual]) with batch statistics, the "
        "running sums updated; returns [4, C] (a, b, mean, rstd)", py::arg("x"),
        py::arg("gamma"), py::arg("beta"), py::arg("residual"), py::arg("y"),
        py::arg("mean_sum"), py::arg("var_sum"), py::arg("count"), py::arg("eps"),
        py::arg("maf"), py::arg("p"));
  m.def("bn_relu_backward", &caffe_py::bn_relu_backward,
        "writes dx (and dr), returns [4, C] whose rows 0 and 1 are dgamma and dbeta",
        py::arg("grad_out"), py::arg("x"), py::arg("residual"), py::arg("coef"), py::arg("dx"),
        py::arg("dr"), py::arg("p"));
  m.def("softmax_loss_forward", &caffe_py::softmax_loss_forward,
        "Caffe's SoftmaxWithLoss on (N, C): prob, loss, div (the divisor); seen = [min, max] "
        "label", py::arg("x"), py::arg("label"), py::arg("prob"), py::arg("work"),
        py::arg("done"), py::arg("loss"), py::arg("div"), py::arg("seen"), py::arg("ignore"),
        py::arg("has_ignore"), py::arg("divisor"), py::arg("count_valid"));
  m.def("softmax_loss", &caffe_py::softmax_loss,
        "Caffe's SoftmaxWithLoss with autograd: [loss, prob]", py::arg("x"), py::arg("label"),
        py::arg("seen"), py::arg("work"), py::arg("done"), py::arg("ignore"),
        py::arg("has_ignore"), py::arg("divisor"), py::arg("count_valid"));
  m.def("crop_transform", &caffe_py::crop_transform,
        "out = (in[crop window, mirrored, channels reversed] - mean) * scale, per record",
        py::arg("records"), py::arg("where"), py::arg("mean"), py::arg("scale"),
        py::arg("reverse"), py::arg("out"));
  m.def("cropped_transform", &caffe_py::cropped_transform,
        "out = (crops, mirrored where flip and flip_pixels - mean at each crop's window) * "
        "scale, per record", py::arg("crops"), py::arg("where"), py::arg("mean"),
        py::arg("scale"), py::arg("flip_pixels"), py::arg("out"));
  m.def("sgd_update", &caffe_py::sgd_update,
        "Caffe's SGD update of every parameter in place (w, g, h); False: a layout it does not "
        "stream, nothing written", py::arg("w"), py::arg("g"), py::arg("h"), py::arg("group"),
        py::arg("rates"), py::arg("device_rates"), py::arg("decays"), py::arg("momentum"),
        py::arg("grad_scale"), py::arg("l1"));
  m.def("peer_sum", &caffe_py::peer_sum,
        "parts[rank] = parts[0] + ... + parts[N-1] (replica order), read over peer access; "
        "every replica's call meets the others' (csrc/peer_sum.cu); a wait for a peer longer than "
        "timeout_s seconds traps (a CUDA error, not a hang)", py::arg("parts"),
        py::arg("rank"), py::arg("flags"), py::arg("scratch"), py::arg("counters"),
        py::arg("timeout_s") = 60.0);
  m.def("peer_sum_flag_count", &caffe_py::peer_sum_flag_count,
        "int32 flags a device holds for peer_sum (zero to start)");
  m.def("peer_sum_counter_count", &caffe_py::peer_sum_counter_count,
        "int32 call counters a device holds for peer_sum (zero to start)");
  m.def("enable_peer_access", &caffe_py::enable_peer_access,
        "peer access between every pair of the devices; False if a pair has none or no "
        "native atomics (a PCIe link)",
        py::arg("devices"));
  m.def("max_pool_forward", &caffe_py::max_pool_forward,
        "channels_last max pooling: [y, offsets], each output's argmax as its offset in the "
        "window (uint8; csrc/max_pool.cu)", py::arg("x"), py::arg("kh"), py::arg("kw"),
        py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("OH"),
        py::arg("OW"));
  m.def("max_pool_backward", &caffe_py::max_pool_backward,
        "the input's gradient (N, C, H, W), channels_last, from the output's and the offsets",
        py::arg("grad_out"), py::arg("offsets"), py::arg("H"), py::arg("W"), py::arg("kh"),
        py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"));
  m.def("softmax_loss_backward", &caffe_py::softmax_loss_backward,
        "dx = (prob - onehot) * grad / divisor", py::arg("prob"), py::arg("label"),
        py::arg("grad"), py::arg("div"), py::arg("dx"), py::arg("ignore"),
        py::arg("has_ignore"));
}
