// at::parallel_for for the project's kernels that call ATen ops inside their parallel tasks (pap_kernels.cpp,
// attention/csrc/rkde_kernels.cpp).
//
// The kernels are compiled with OpenMP (setup.py), so at::parallel_for runs its tasks on OpenMP's worker
// threads - which start without the caller's thread-local state: grad mode, inference mode and the dispatch
// keys the dispatcher excluded before calling the kernel (autograd's). An ATen op inside a task then
// dispatches as if called from Python outside any mode: at::mm_out on a tensor that requires grad raises
// "functions with out=... arguments don't support automatic differentiation", and writing into a tensor
// made under torch.inference_mode raises "Inplace update to inference tensor outside InferenceMode".
// parallel_for_with_state gives every task the caller's state (at::ThreadLocalStateGuard, as at::launch
// does). Loops that only read and write raw pointers need none of it and use at::parallel_for.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <cstdint>

namespace kpca_attention {

template <typename F>
void parallel_for_with_state(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const at::ThreadLocalState state;  // the caller's
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    at::ThreadLocalStateGuard guard(state);
    f(b, e);
  });
}

}  // namespace kpca_attention
