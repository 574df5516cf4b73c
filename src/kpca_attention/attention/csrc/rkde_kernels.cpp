// Robust KDE attention's Gram kernels reduced to their column sums, on the CPU, without forming them in memory
// (kpca_attention/attention/kde.py uses it; built into the same extension as PAP's kernels, setup.py).
//
//   rkde_colsums(Xk, Xv, scale) -> (s_k, s_kv): for each head h of Xk (BH, N, D) and Xv (BH, N, Dv),
//     s_k[h, j]  = sum_l exp(min(0, -scale ||k_j - k_l||^2))
//     s_kv[h, j] = sum_l exp(min(0, -scale ||k_j - k_l||^2) + min(0, -scale ||v_j - v_l||^2))
//   the column sums of kde.py's two Gram kernels (exp of _log_gram_kernel, the clamp included). Without a mask
//   and with one KIRWLS step (the official default) the weights need the kernels only through these sums:
//   from uniform weights w = 1/N, t = w K = s / N and w^T K w = mean(t).
//
// Why a kernel: the eager path writes each (B, H, N, N) kernel to memory (30 MB each at B 64, H 3, N 197), reads
// it back for the distance terms, the clamp, the exp and the weights' product - the memory traffic, not the
// arithmetic, made RKDE's forward 3.6-4.1x one SDPA call (docs/benchmarks.md). Here each head's two N x N Gram
// matrices are one GEMM each into a buffer of the task's own that stays in the L2 cache, and the kernels are
// symmetric, so the exps run over the upper triangle only (half of them) and each one adds to two sums.
// The heads run in parallel over torch's intra-op threads (GEMMs single-threaded inside, as SDPA's).

#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "../../pap/csrc/parallel.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace {

using at::vec::Vectorized;

// exp of a vector: ATen's exp_u20 (SDPA's CPU kernel's) in float32, the 1-ulp exp in float64
template <typename T>
inline Vectorized<T> vexp(const Vectorized<T>& x) { return x.exp(); }
template <>
inline Vectorized<float> vexp<float>(const Vectorized<float>& x) { return x.exp_u20(); }

template <typename T>
void squared_norms(const T* x, int64_t n, int64_t d, T scale, T* out) {
  for (int64_t j = 0; j < n; ++j) {
    T s = 0;
    for (int64_t c = 0; c < d; ++c) s += x[j * d + c] * x[j * d + c];
    out[j] = -scale * s;
  }
}

// K_k and K_kv of the pairs (j, l .. l + W - 1) from their Gram entries and scaled squared norms: the exps of
// min(0, 2 s G_jl + n_j + n_l) for the keys and of that plus the same for the values (kde.py's _log_gram_kernel)
template <typename T>
inline void kernel_pairs(const T* gkj, const T* gvj, const T* nk, const T* nv, int64_t l, const Vectorized<T>& nkj,
                         const Vectorized<T>& nvj, const Vectorized<T>& v2s, Vectorized<T>& ek, Vectorized<T>& ekv) {
  using Vec = Vectorized<T>;
  const Vec lk = at::vec::minimum(at::vec::fmadd(Vec::loadu(gkj + l), v2s, nkj + Vec::loadu(nk + l)), Vec(T(0)));
  const Vec lv = at::vec::minimum(at::vec::fmadd(Vec::loadu(gvj + l), v2s, nvj + Vec::loadu(nv + l)), Vec(T(0)));
  ek = vexp(lk);
  ekv = vexp(lk + lv);
}

// the same for one pair (j, l), in scalars
template <typename T>
inline void kernel_pair(const T* gkj, const T* gvj, const T* nk, const T* nv, int64_t j, int64_t l, T scale, T& ek,
                        T& ekv) {
  const T lk = std::min(T(0), T(2) * scale * gkj[l] + nk[j] + nk[l]);
  const T lv = std::min(T(0), T(2) * scale * gvj[l] + nv[j] + nv[l]);
  ek = std::exp(lk);
  ekv = std::exp(lk + lv);
}

// one head: Gk = Xk Xk^T and Gv = Xv Xv^T in the task's buffers, then the upper triangle's kernels into the sums
template <typename T>
void head_colsums(const T* gk, const T* gv, const T* nk, const T* nv, int64_t n, T scale, T* sk, T* skv) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  const Vec v2s(T(2) * scale);
  std::fill(sk, sk + n, T(0));
  std::fill(skv, skv + n, T(0));
  for (int64_t j = 0; j < n; ++j) {
    const T* gkj = gk + j * n;
    const T* gvj = gv + j * n;
    const Vec nkj(nk[j]), nvj(nv[j]);
    // the diagonal, as the eager path computes it (exp of the clamped rounding, ~1)
    T rk, rkv;
    kernel_pair<T>(gkj, gvj, nk, nv, j, j, scale, rk, rkv);
    Vec vrk(T(0)), vrkv(T(0));
    int64_t l = j + 1;
    for (; l + W <= n; l += W) {
      Vec ek, ekv;
      kernel_pairs<T>(gkj, gvj, nk, nv, l, nkj, nvj, v2s, ek, ekv);
      vrk = vrk + ek;
      vrkv = vrkv + ekv;
      (Vec::loadu(sk + l) + ek).store(sk + l);  // K_jl = K_lj: the same value adds to column l
      (Vec::loadu(skv + l) + ekv).store(skv + l);
    }
    for (; l < n; ++l) {
      T ek, ekv;
      kernel_pair<T>(gkj, gvj, nk, nv, j, l, scale, ek, ekv);
      rk += ek;
      rkv += ekv;
      sk[l] += ek;
      skv[l] += ekv;
    }
    auto add = [](Vec& a, Vec& b) { return a + b; };
    sk[j] += rk + at::vec::vec_reduce_all<T>(add, vrk);
    skv[j] += rkv + at::vec::vec_reduce_all<T>(add, vrkv);
  }
}

std::tuple<at::Tensor, at::Tensor> rkde_colsums(at::Tensor Xk, at::Tensor Xv, double scale) {
  TORCH_CHECK(Xk.device().is_cpu() && Xv.device().is_cpu(), "rkde_colsums: CPU tensors expected");
  TORCH_CHECK(Xk.dim() == 3 && Xv.dim() == 3 && Xk.size(0) == Xv.size(0) && Xk.size(1) == Xv.size(1),
              "rkde_colsums: Xk (BH, N, D) and Xv (BH, N, Dv) expected");
  TORCH_CHECK(Xk.scalar_type() == Xv.scalar_type() && Xk.is_floating_point(),
              "rkde_colsums: Xk and Xv of one floating dtype expected");
  TORCH_CHECK(scale > 0, "rkde_colsums: scale > 0 expected");
  Xk = Xk.contiguous();
  Xv = Xv.contiguous();
  const int64_t bh = Xk.size(0), n = Xk.size(1), d = Xk.size(2), dv = Xv.size(2);
  at::Tensor sk = at::empty({bh, n}, Xk.options()), skv = at::empty({bh, n}, Xk.options());
  if (bh == 0 || n == 0) return {sk, skv};
  AT_DISPATCH_FLOATING_TYPES(Xk.scalar_type(), "rkde_colsums", [&] {
    kpca_attention::parallel_for_with_state(0, bh, 1, [&](int64_t h0, int64_t h1) {  // ATen ops inside
      // this task's buffers: the two Gram matrices and the scaled squared norms of one head
      at::Tensor G = at::empty({2, n, n}, Xk.options()), norms = at::empty({2, n}, Xk.options());
      at::Tensor Gk = G.select(0, 0), Gv = G.select(0, 1);
      scalar_t* nk = norms.data_ptr<scalar_t>();
      scalar_t* nv = nk + n;
      const scalar_t s = static_cast<scalar_t>(scale);
      for (int64_t h = h0; h < h1; ++h) {
        at::Tensor xk = Xk.select(0, h), xv = Xv.select(0, h);
        at::mm_out(Gk, xk, xk.t());
        at::mm_out(Gv, xv, xv.t());
        squared_norms<scalar_t>(xk.data_ptr<scalar_t>(), n, d, s, nk);
        squared_norms<scalar_t>(xv.data_ptr<scalar_t>(), n, dv, s, nv);
        head_colsums<scalar_t>(Gk.data_ptr<scalar_t>(), Gv.data_ptr<scalar_t>(), nk, nv, n, s,
                               sk.data_ptr<scalar_t>() + h * n, skv.data_ptr<scalar_t>() + h * n);
      }
    });
  });
  return {sk, skv};
}

// one head's kernels in full (both triangles) over the Gram matrices, in place: Gk <- K_k, Gv <- K_kv
template <typename T>
void head_kernels(T* gk, T* gv, const T* nk, const T* nv, int64_t n, T scale) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  const Vec v2s(T(2) * scale);
  for (int64_t j = 0; j < n; ++j) {
    T* gkj = gk + j * n;
    T* gvj = gv + j * n;
    const Vec nkj(nk[j]), nvj(nv[j]);
    int64_t l = j;
    for (; l + W <= n; l += W) {  // in place: each Gram entry is read before its kernel overwrites it
      Vec ek, ekv;
      kernel_pairs<T>(gkj, gvj, nk, nv, l, nkj, nvj, v2s, ek, ekv);
      ek.store(gkj + l);
      ekv.store(gvj + l);
    }
    for (; l < n; ++l) {
      T ek, ekv;
      kernel_pair<T>(gkj, gvj, nk, nv, j, l, scale, ek, ekv);
      gkj[l] = ek;
      gvj[l] = ekv;
    }
    for (int64_t i = 0; i < j; ++i) {  // the lower triangle of row j: the upper triangle's column j
      gkj[i] = gk[i * n + j];
      gvj[i] = gv[i * n + j];
    }
  }
}

// The backward of rkde_colsums: with a_k = dL/ds_k and a_kv = dL/ds_kv, the gradient reaching each log-kernel
// entry is D_jl = a_j K_jl (a row scaling of a symmetric K), and kde.py's _log_gram_backward of D gives
//   dL/dx = 2 scale (a (K x) + K (a x) - (a s + K a) x)       (rowsum D = a s, colsum D = K a),
// for the keys from both kernels (log K_kv = log K_k + log K_v), for the values from K_kv only. Per head the
// kernels are formed again in the cache and multiplied once each by [x, a x, (v, a v,) a, 1]: the last column
// gives s = K 1. Nothing of size N x N is kept between the forward and the backward.
std::tuple<at::Tensor, at::Tensor> rkde_colsums_backward(at::Tensor Xk, at::Tensor Xv, at::Tensor Ak,
                                                         at::Tensor Akv, double scale) {
  TORCH_CHECK(Xk.dim() == 3 && Xv.dim() == 3 && Xk.size(0) == Xv.size(0) && Xk.size(1) == Xv.size(1),
              "rkde_colsums_backward: Xk (BH, N, D) and Xv (BH, N, Dv) expected");
  TORCH_CHECK(Ak.dim() == 2 && Akv.dim() == 2 && Ak.size(0) == Xk.size(0) && Ak.size(1) == Xk.size(1)
                  && Akv.sizes() == Ak.sizes(), "rkde_colsums_backward: gradients (BH, N) expected");
  TORCH_CHECK(Xk.scalar_type() == Xv.scalar_type() && Ak.scalar_type() == Xk.scalar_type()
                  && Akv.scalar_type() == Xk.scalar_type() && Xk.is_floating_point(),
              "rkde_colsums_backward: one floating dtype expected");
  Xk = Xk.contiguous();
  Xv = Xv.contiguous();
  Ak = Ak.contiguous();
  Akv = Akv.contiguous();
  const int64_t bh = Xk.size(0), n = Xk.size(1), d = Xk.size(2), dv = Xv.size(2);
  at::Tensor gXk = at::empty_like(Xk), gXv = at::empty_like(Xv);
  if (bh == 0 || n == 0) return {gXk, gXv};
  const int64_t wk = 2 * d + 2, wkv = 2 * d + 2 * dv + 2;  // widths of the right-hand sides
  AT_DISPATCH_FLOATING_TYPES(Xk.scalar_type(), "rkde_colsums_backward", [&] {
    kpca_attention::parallel_for_with_state(0, bh, 1, [&](int64_t h0, int64_t h1) {  // ATen ops inside
      at::Tensor G = at::empty({2, n, n}, Xk.options()), norms = at::empty({2, n}, Xk.options());
      at::Tensor Gk = G.select(0, 0), Gv = G.select(0, 1);
      at::Tensor Rk = at::empty({n, wk}, Xk.options()), Rkv = at::empty({n, wkv}, Xk.options());
      at::Tensor Pk = at::empty({n, wk}, Xk.options()), Pkv = at::empty({n, wkv}, Xk.options());
      scalar_t* nk = norms.data_ptr<scalar_t>();
      scalar_t* nv = nk + n;
      const scalar_t s = static_cast<scalar_t>(scale), two_s = scalar_t(2) * s;
      for (int64_t h = h0; h < h1; ++h) {
        at::Tensor xk = Xk.select(0, h), xv = Xv.select(0, h);
        const scalar_t* x = xk.data_ptr<scalar_t>();
        const scalar_t* y = xv.data_ptr<scalar_t>();
        const scalar_t* ak = Ak.data_ptr<scalar_t>() + h * n;
        const scalar_t* akv = Akv.data_ptr<scalar_t>() + h * n;
        at::mm_out(Gk, xk, xk.t());
        at::mm_out(Gv, xv, xv.t());
        squared_norms<scalar_t>(x, n, d, s, nk);
        squared_norms<scalar_t>(y, n, dv, s, nv);
        head_kernels<scalar_t>(Gk.data_ptr<scalar_t>(), Gv.data_ptr<scalar_t>(), nk, nv, n, s);
        scalar_t* rk = Rk.data_ptr<scalar_t>();
        scalar_t* rkv = Rkv.data_ptr<scalar_t>();
        for (int64_t j = 0; j < n; ++j) {  // [x, a_k x, a_k, 1] and [x, a_kv x, y, a_kv y, a_kv, 1]
          scalar_t* r1 = rk + j * wk;
          scalar_t* r2 = rkv + j * wkv;
          for (int64_t c = 0; c < d; ++c) {
            const scalar_t xc = x[j * d + c];
            r1[c] = xc;
            r1[d + c] = ak[j] * xc;
            r2[c] = xc;
            r2[d + c] = akv[j] * xc;
          }
          for (int64_t c = 0; c < dv; ++c) {
            r2[2 * d + c] = y[j * dv + c];
            r2[2 * d + dv + c] = akv[j] * y[j * dv + c];
          }
          r1[2 * d] = ak[j];
          r1[2 * d + 1] = scalar_t(1);
          r2[2 * d + 2 * dv] = akv[j];
          r2[2 * d + 2 * dv + 1] = scalar_t(1);
        }
        at::mm_out(Pk, Gk, Rk);
        at::mm_out(Pkv, Gv, Rkv);
        const scalar_t* pk = Pk.data_ptr<scalar_t>();
        const scalar_t* pkv = Pkv.data_ptr<scalar_t>();
        scalar_t* gx = gXk.data_ptr<scalar_t>() + h * n * d;
        scalar_t* gy = gXv.data_ptr<scalar_t>() + h * n * dv;
        for (int64_t j = 0; j < n; ++j) {
          const scalar_t* p1 = pk + j * wk;    // (K_k x, K_k a_k x, K_k a_k, s_k) of row j
          const scalar_t* p2 = pkv + j * wkv;  // (K_kv x, K_kv a_kv x, K_kv y, K_kv a_kv y, K_kv a_kv, s_kv)
          const scalar_t ck = ak[j] * p1[2 * d + 1] + p1[2 * d];
          const scalar_t ckv = akv[j] * p2[2 * d + 2 * dv + 1] + p2[2 * d + 2 * dv];
          for (int64_t c = 0; c < d; ++c) {
            const scalar_t xc = x[j * d + c];
            gx[j * d + c] = two_s * (ak[j] * p1[c] + p1[d + c] - ck * xc + akv[j] * p2[c] + p2[d + c] - ckv * xc);
          }
          for (int64_t c = 0; c < dv; ++c) {
            const scalar_t yc = y[j * dv + c];
            gy[j * dv + c] = two_s * (akv[j] * p2[2 * d + c] + p2[2 * d + dv + c] - ckv * yc);
          }
        }
      }
    });
  });
  return {gXk, gXv};
}

}  // namespace

// a fragment of the kpca_attention operator library (pap_kernels.cpp defines the library)
TORCH_LIBRARY_FRAGMENT(kpca_attention, m) {
  m.def("rkde_colsums(Tensor Xk, Tensor Xv, float scale) -> (Tensor, Tensor)");
  m.def("rkde_colsums_backward(Tensor Xk, Tensor Xv, Tensor Ak, Tensor Akv, float scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kpca_attention, CPU, m) {
  m.impl("rkde_colsums", &rkde_colsums);
  m.impl("rkde_colsums_backward", &rkde_colsums_backward);
}
