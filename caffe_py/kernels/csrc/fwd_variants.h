// The forward launch variants that `benchmarks/activations.py --variants` times (a separate
// extension, caffe_py/kernels/variants.py; the shipped module holds only kFwd's launch).
// Variant id = ((threads_index * 3 + packs_index) * 3 + load) * 3 + store.
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

}  // namespace sweep
}  // namespace caffe_py
