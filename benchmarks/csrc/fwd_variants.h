// The forward launch variants that `benchmarks/activations.py --variants` times (a separate
// extension, benchmarks/fwd_variants.py, built against caffe_py/kernels/csrc; the shipped
// module holds only kFwd's and kFwdMath's launches).
// ReLU (kFwd's candidates): id = ((threads_index * 3 + packs_index) * 3 + load) * 3 + store.
// ELU, Sigmoid, TanH (kFwdMath's candidates, a smaller grid: each is 3 kernels per dtype):
// id = (threads_index * 3 + packs_index) * 2 + flavour, flavour 0 plain/plain, 1 cs/cs.
#pragma once

namespace caffe_py {
namespace sweep {

constexpr int kThreadChoices[] = {128, 256};
constexpr int kPackChoices[] = {1, 2, 4};  // 16-byte packs per thread
constexpr int kLoads = 3;                  // Ld: plain, nc (__ldg), cs (__ldcs)
constexpr int kStores = 3;                 // St: plain, cs (__stcs), cg (__stcg)
constexpr int kCount = 2 * 3 * kLoads * kStores;

constexpr int threads_of(int id) { return kThreadChoices[id / (3 * kLoads * kStores)]; }
constexpr int packs_of(int id) { return kPackChoices[id / (kLoads * kStores) % 3]; }
constexpr int load_of(int id) { return id / kStores % kLoads; }
constexpr int store_of(int id) { return id % kStores; }

constexpr int kMathCount = 2 * 3 * 2;
constexpr int math_threads_of(int id) { return kThreadChoices[id / 6]; }
constexpr int math_packs_of(int id) { return kPackChoices[id / 2 % 3]; }
constexpr int math_load_of(int id) { return id % 2 == 0 ? 0 : 2; }   // Ld::kPlain or Ld::kCs
constexpr int math_store_of(int id) { return id % 2 == 0 ? 0 : 1; }  // St::kPlain or St::kCs

}  // namespace sweep
}  // namespace caffe_py
