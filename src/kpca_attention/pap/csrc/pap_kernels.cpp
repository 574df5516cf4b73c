// PAP's two elementwise kernels on the CPU, each one pass where PyTorch's eager ops take several
// (kpca_attention/pap/kernels.py loads this module; docs/pap.md section 9 says why they exist).
//
//   cutoff_exp_(S, m, l, scale, cutoff): per row of raw scores s (logits = scale * s, scale > 0; -inf =
//     a hidden key): m = row max of the logits, S <- exp(max(scale * s - m, -cutoff)) (0 where hidden),
//     l = row sum. A row with every key hidden: m = 0, S = 0, l = 1. This is the eager
//     amax / subtract / clamp / exp / sum of softmax.py's softmax_block (five passes over the block and
//     torch.exp's 1-ulp exp) in two passes over a row in the L1 cache, with ATen's exp_u20 (the exp
//     SDPA's CPU flash kernel uses; float64 keeps the 1-ulp exp).
//   cutoff_probs_(S, m, l, scale, cutoff): the backward's recomputation with the forward's m and l,
//     S <- exp(max(scale * s - m, -cutoff)) / l, one pass (no hidden keys: the caller masks them after).
//   softmax_backward_sym_(dP, P, delta, scale): a symmetric step's softmax backward, scale (dS + dS^T), in
//     place (PAPSaved's backward; see the function).
//   update_backward_(dX, dR, C, tau, g_k, dL, g_tau, ...): that update's backward after its clamp's, in one
//     pass (PAPSaved's backward; see the function).
//   update_(K, L, R, tau, C, X, R_next): PAP's update (K, L_t, R_t) -> C_t = clamp(K - L_t + W_t, +-tau),
//     R_{t+1} = C_t + L_t, X_{t+1} = R_{t+1} + 2 (L_t - R_t), W_t = R_t - L_t, in one pass (updates.py's
//     update_into takes five). Every element is read before any output is written, so X may be R and
//     R_next may be C (then R_next is kept).
//
// Built by the normal install (setup.py, optional: without a compiler the eager ops run) twice, for
// AVX2 + FMA and for AVX512 (the same source: Vectorized<T> is 8 or 16 floats wide);
// kernels.py loads the build matching torch's CPU capability.

#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using at::vec::Vectorized;

constexpr int64_t kRowGrain = 64;  // rows per parallel task (at::parallel_for: torch's intra-op threads)

template <typename T>
void cutoff_exp_rows(T* S, T* m, T* l, int64_t rows, int64_t n, T scale, T cutoff) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t r0, int64_t r1) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = r0; r < r1; ++r) {
    T* s = S + r * n;
    Vec vmax(ninf);
    int64_t j = 0;
    for (; j + W <= n; j += W) vmax = at::vec::maximum(vmax, Vec::loadu(s + j));
    T mx = at::vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vmax);
    for (; j < n; ++j) mx = std::max(mx, s[j]);
    if (mx == ninf) {  // every key hidden: probabilities 0, output 0 (as SDPA)
      std::fill(s, s + n, T(0));
      m[r] = T(0);
      l[r] = T(1);
      continue;
    }
    const T mrow = mx * scale;
    const Vec vs(scale), vnm(-mrow), vlo(-cutoff), vzero(T(0)), vninf(ninf);
    Vec vsum(T(0));
    j = 0;
    for (; j + W <= n; j += W) {
      const Vec raw = Vec::loadu(s + j);
      Vec x = at::vec::maximum(at::vec::fmadd(raw, vs, vnm), vlo).exp_u20();
      x = Vec::blendv(x, vzero, raw == vninf);  // a hidden key
      x.store(s + j);
      vsum = vsum + x;
    }
    T sum = at::vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, vsum);
    for (; j < n; ++j) {
      const T x = s[j] == ninf ? T(0) : std::exp(std::max(s[j] * scale - mrow, -cutoff));
      s[j] = x;
      sum += x;
    }
    m[r] = mrow;
    l[r] = sum;
  }
  });
}

// The backward's recomputation: S <- exp(max(scale * s - m, -cutoff)) / l with the forward's m and l.
template <typename T>
void cutoff_probs_rows(T* S, const T* m, const T* l, int64_t rows, int64_t n, T scale, T cutoff) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t r0, int64_t r1) {
    using Vec = Vectorized<T>;
    const int64_t W = Vec::size();
    for (int64_t r = r0; r < r1; ++r) {
      T* s = S + r * n;
      const T inv = T(1) / l[r];
      const Vec vs(scale), vnm(-m[r]), vlo(-cutoff), vinv(inv);
      int64_t j = 0;
      for (; j + W <= n; j += W) {
        (at::vec::maximum(at::vec::fmadd(Vec::loadu(s + j), vs, vnm), vlo).exp_u20() * vinv).store(s + j);
      }
      for (; j < n; ++j) s[j] = std::exp(std::max(s[j] * scale - m[r], -cutoff)) * inv;
    }
  });
}

template <typename T>
void update_rows(const T* K, const T* L, const T* R, const T* tau, T* C, T* X, T* Rn, int64_t rows, int64_t d,
                 int64_t tau_rows_per_head, int64_t rows_per_head) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t r0, int64_t r1) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  const Vec two(T(2));
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t head = r / rows_per_head, i = r % rows_per_head;
    const T t = tau[head * tau_rows_per_head + (tau_rows_per_head == 1 ? 0 : i)];
    const Vec vt(t), vnt(-t);
    const int64_t o = r * d;
    int64_t j = 0;
    for (; j + W <= d; j += W) {
      const Vec k = Vec::loadu(K + o + j), lv = Vec::loadu(L + o + j), rv = Vec::loadu(R + o + j);
      const Vec e = lv - rv;
      const Vec c = at::vec::maximum(at::vec::minimum((k - e) - lv, vt), vnt);
      const Vec rn = c + lv;
      const Vec x = at::vec::fmadd(e, two, rn);
      c.store(C + o + j);
      rn.store(Rn + o + j);
      x.store(X + o + j);
    }
    for (; j < d; ++j) {
      const T k = K[o + j], lv = L[o + j], rv = R[o + j];
      const T e = lv - rv;
      const T c = std::max(std::min((k - e) - lv, t), -t);
      const T rn = c + lv;
      const T x = rn + T(2) * e;
      C[o + j] = c;
      Rn[o + j] = rn;
      X[o + j] = x;
    }
  }
  });
}

void check_block(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type(),
              name, ": a contiguous CPU tensor of the block's dtype expected");
}

// The checks both row kernels share; returns the number of rows of S.
int64_t check_rows(const at::Tensor& S, const at::Tensor& m, const at::Tensor& l, double scale, double cutoff) {
  check_block(S, S, "S");
  check_block(m, S, "m");
  check_block(l, S, "l");
  const int64_t n = S.size(-1), rows = S.numel() / std::max<int64_t>(n, 1);
  TORCH_CHECK(m.numel() == rows && l.numel() == rows, "m, l: one value per row of S expected");
  TORCH_CHECK(scale > 0 && cutoff > 0, "scale and cutoff must be > 0");
  return rows;
}

// A row kernel (cutoff_exp_rows, cutoff_probs_rows) on S, m, l after the shared checks, in S's dtype.
template <typename RowKernel>
at::Tensor on_rows(at::Tensor S, const at::Tensor& m, const at::Tensor& l, double scale, double cutoff,
                   RowKernel kernel) {
  const int64_t rows = check_rows(S, m, l, scale, cutoff);
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "pap_kernels_rows", [&] {
    kernel(S.data_ptr<scalar_t>(), m.data_ptr<scalar_t>(), l.data_ptr<scalar_t>(), rows, S.size(-1),
           static_cast<scalar_t>(scale), static_cast<scalar_t>(cutoff));
  });
  return S;
}

at::Tensor cutoff_exp_(at::Tensor S, at::Tensor m, at::Tensor l, double scale, double cutoff) {
  return on_rows(S, m, l, scale, cutoff, [](auto... a) { cutoff_exp_rows(a...); });
}

at::Tensor cutoff_probs_(at::Tensor S, at::Tensor m, at::Tensor l, double scale, double cutoff) {
  return on_rows(S, m, l, scale, cutoff, [](auto... a) { cutoff_probs_rows(a...); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> update_(at::Tensor K, at::Tensor L, at::Tensor R, at::Tensor tau,
                                                      at::Tensor C, at::Tensor X, at::Tensor R_next) {
  for (auto* p : {&L, &R, &tau, &C, &X, &R_next}) check_block(*p, K, "update_");
  check_block(K, K, "K");
  TORCH_CHECK(K.dim() == 3 && L.sizes() == K.sizes() && R.sizes() == K.sizes() && C.sizes() == K.sizes() &&
              X.sizes() == K.sizes() && R_next.sizes() == K.sizes(), "update_: K, L, R, C, X, R_next (nb, N, D)");
  const int64_t nb = K.size(0), n = K.size(1), d = K.size(2);
  TORCH_CHECK(tau.dim() == 3 && tau.size(0) == nb && (tau.size(1) == 1 || tau.size(1) == n) && tau.size(2) == 1,
              "update_: tau (nb, 1 | N, 1) expected");
  AT_DISPATCH_FLOATING_TYPES(K.scalar_type(), "update_", [&] {
    update_rows<scalar_t>(K.data_ptr<scalar_t>(), L.data_ptr<scalar_t>(), R.data_ptr<scalar_t>(),
                          tau.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(), X.data_ptr<scalar_t>(),
                          R_next.data_ptr<scalar_t>(), nb * n, d, tau.size(1), n);
  });
  return {C, X, R_next};
}

// The softmax's backward of one step of symmetric PAP, for PAPSaved (fused.py), in place on a block
// (nb, N, N): with dS = (dP - delta) * P (delta_i = sum_d dL_i L_i, per row), the keys' and queries'
// gradients are dS X + dS^T X = (dS + dS^T) X, so dP <- scale * (dS + dS^T): one GEMM where two were
// needed, and the subtract / multiply / scale in two passes over the block (rows, then 16 x 16 tiles).
template <typename T>
void softmax_backward_sym_heads(T* dP, const T* P, const T* delta, int64_t heads, int64_t n, T scale) {
  at::parallel_for(0, heads, 1, [&](int64_t h0, int64_t h1) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  const Vec vs(scale);
  constexpr int64_t kTile = 16;
  for (int64_t h = h0; h < h1; ++h) {
    T* A = dP + h * n * n;
    const T* Ph = P + h * n * n;
    for (int64_t i = 0; i < n; ++i) {  // A <- scale * (dP - delta) * P, row by row
      const T di = delta[h * n + i];
      const Vec vd(di);
      T* a = A + i * n;
      const T* p = Ph + i * n;
      int64_t j = 0;
      for (; j + W <= n; j += W) (((Vec::loadu(a + j) - vd) * Vec::loadu(p + j)) * vs).store(a + j);
      for (; j < n; ++j) a[j] = ((a[j] - di) * p[j]) * scale;
    }
    for (int64_t bi = 0; bi < n; bi += kTile) {  // A <- A + A^T, tile pairs in the L1 cache
      const int64_t ei = std::min(bi + kTile, n);
      for (int64_t bj = bi; bj < n; bj += kTile) {
        const int64_t ej = std::min(bj + kTile, n);
        for (int64_t i = bi; i < ei; ++i) {
          for (int64_t j = (bi == bj ? i : bj); j < ej; ++j) {
            const T v = A[i * n + j] + A[j * n + i];
            A[i * n + j] = v;
            A[j * n + i] = v;
          }
        }
      }
    }
  }
  });
}

at::Tensor softmax_backward_sym_(at::Tensor dP, at::Tensor P, at::Tensor delta, double scale) {
  check_block(dP, dP, "dP");
  check_block(P, dP, "P");
  check_block(delta, dP, "delta");
  TORCH_CHECK(dP.dim() == 3 && dP.size(1) == dP.size(2) && P.sizes() == dP.sizes(),
              "softmax_backward_sym_: dP, P (nb, N, N) expected");
  TORCH_CHECK(delta.numel() == dP.size(0) * dP.size(1), "softmax_backward_sym_: delta (nb, N, 1) expected");
  AT_DISPATCH_FLOATING_TYPES(dP.scalar_type(), "softmax_backward_sym_", [&] {
    softmax_backward_sym_heads<scalar_t>(dP.data_ptr<scalar_t>(), P.data_ptr<scalar_t>(),
                                         delta.data_ptr<scalar_t>(), dP.size(0), dP.size(1),
                                         static_cast<scalar_t>(scale));
  });
  return dP;
}

// The update's backward after its clamp's, for PAPSaved (fused.py), on one block of heads (nb, N, D):
//   dC = dX (+ dR_t when dr_in); dZ = dC where |C| < tau, else 0; g_k = dZ (+ g_k when accumulate_k);
//   g_tau += sum over the outside elements of dC * C / tau (per row or per head, as tau; when defined);
//   when prev: dL_{t-1} = dC + 2 dX - 2 dZ and dR_{t-1} = dZ - 2 dX, the latter over dR_t in place.
// One pass where updates.py's clamp_backward + update_backward take eleven. Parallel over heads (a
// per-head tau sums over a head's rows: one task owns them).
template <typename T>
void update_backward_heads(const T* dX, T* dR, const T* C, const T* tau, T* gK, T* dL, T* gTau, int64_t heads,
                           int64_t n, int64_t d, int64_t tau_rows, bool dr_in, bool acc_k, bool prev) {
  at::parallel_for(0, heads, 1, [&](int64_t h0, int64_t h1) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  const Vec zero(T(0)), two(T(2)), minus_two(T(-2));
  T lanes[Vec::size()];
  for (int64_t h = h0; h < h1; ++h) {
    T head_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t o = (h * n + i) * d;
      const T t = tau[h * tau_rows + (tau_rows == 1 ? 0 : i)];
      const Vec vt(t);
      Vec vsum(T(0));
      T sum = 0;
      int64_t j = 0;
      for (; j + W <= d; j += W) {
        const Vec dx = Vec::loadu(dX + o + j), c = Vec::loadu(C + o + j);
        const Vec dc = dr_in ? dx + Vec::loadu(dR + o + j) : dx;
        const Vec dz = Vec::blendv(zero, dc, c.abs() < vt);
        if (gTau) vsum = at::vec::fmadd(dc - dz, c, vsum);
        (acc_k ? Vec::loadu(gK + o + j) + dz : dz).store(gK + o + j);
        if (prev) {
          at::vec::fmadd(two, dx - dz, dc).store(dL + o + j);
          at::vec::fmadd(minus_two, dx, dz).store(dR + o + j);
        }
      }
      for (; j < d; ++j) {
        const T dx = dX[o + j], c = C[o + j];
        const T dc = dr_in ? dx + dR[o + j] : dx;
        const T dz = std::abs(c) < t ? dc : T(0);
        sum += (dc - dz) * c;
        gK[o + j] = acc_k ? gK[o + j] + dz : dz;
        if (prev) {
          dL[o + j] = dc + T(2) * (dx - dz);
          dR[o + j] = dz - T(2) * dx;
        }
      }
      if (gTau) {
        vsum.store(lanes);
        for (int64_t w = 0; w < W; ++w) sum += lanes[w];
        if (tau_rows == 1) head_sum += sum;
        else gTau[h * n + i] += sum / t;
      }
    }
    if (gTau && tau_rows == 1) gTau[h] += head_sum / tau[h];
  }
  });
}

void update_backward_(at::Tensor dX, at::Tensor dR, at::Tensor C, at::Tensor tau, at::Tensor g_k, at::Tensor dL,
                      at::Tensor g_tau, bool dr_in, bool accumulate_k, bool prev) {
  check_block(dX, dX, "dX");
  for (auto* p : {&C, &tau, &g_k}) check_block(*p, dX, "update_backward_");
  TORCH_CHECK(dX.dim() == 3 && C.sizes() == dX.sizes() && g_k.sizes() == dX.sizes(),
              "update_backward_: dX, C, g_k (nb, N, D) expected");
  const int64_t nb = dX.size(0), n = dX.size(1), d = dX.size(2);
  TORCH_CHECK(tau.dim() == 3 && tau.size(0) == nb && (tau.size(1) == 1 || tau.size(1) == n) && tau.size(2) == 1,
              "update_backward_: tau (nb, 1 | N, 1) expected");
  if (dr_in || prev) {
    check_block(dR, dX, "dR");
    TORCH_CHECK(dR.sizes() == dX.sizes(), "update_backward_: dR (nb, N, D) expected");
  }
  if (prev) {
    check_block(dL, dX, "dL");
    TORCH_CHECK(dL.sizes() == dX.sizes(), "update_backward_: dL (nb, N, D) expected");
  }
  const bool need_tau = g_tau.numel() > 0;
  if (need_tau) {
    check_block(g_tau, dX, "g_tau");
    TORCH_CHECK(g_tau.sizes() == tau.sizes(), "update_backward_: g_tau shaped as tau expected");
  }
  AT_DISPATCH_FLOATING_TYPES(dX.scalar_type(), "update_backward_", [&] {
    update_backward_heads<scalar_t>(
        dX.data_ptr<scalar_t>(), (dr_in || prev) ? dR.data_ptr<scalar_t>() : nullptr, C.data_ptr<scalar_t>(),
        tau.data_ptr<scalar_t>(), g_k.data_ptr<scalar_t>(), prev ? dL.data_ptr<scalar_t>() : nullptr,
        need_tau ? g_tau.data_ptr<scalar_t>() : nullptr, nb, n, d, tau.size(1), dr_in, accumulate_k, prev);
  });
}

template <typename T>
void clamp_rows(const T* K, const T* tau, T* A, int64_t rows, int64_t d, int64_t tau_rows_per_head,
                int64_t rows_per_head) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t head = r / rows_per_head, i = r % rows_per_head;
      const T t = tau[head * tau_rows_per_head + (tau_rows_per_head == 1 ? 0 : i)];
      for (int64_t j = 0; j < d; ++j) A[r * d + j] = std::max(std::min(K[r * d + j], t), -t);
    }
  });
}

template <typename T>
void divide_rows(T* O, const T* l, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T inv = T(1) / l[r];
      for (int64_t j = 0; j < d; ++j) O[r * d + j] *= inv;
    }
  });
}

// One symmetric softmax step of a block, as both whole-loop forwards take it: S = X X^T (a GEMM), the cutoff
// softmax's unnormalised probabilities over S with the row maxima m and sums l (cutoff_exp_rows), L = (S V) / l.
template <typename T>
void softmax_step(const at::Tensor& X, const at::Tensor& V, at::Tensor& S, at::Tensor& L, T* m, T* l, T scale,
                  T cutoff) {
  const int64_t rows = X.size(0) * X.size(1), n = S.size(-1);
  at::bmm_out(S, X, X.transpose(1, 2));
  cutoff_exp_rows<T>(S.data_ptr<T>(), m, l, rows, n, scale, cutoff);
  at::bmm_out(L, S, V);
  divide_rows<T>(L.data_ptr<T>(), l, rows, L.size(-1));
}

// PAP's whole no-grad forward, symmetric and unmasked (fused.py's pap_fused: the same arithmetic and
// buffer roles). The heads are independent, so each block of `block` heads runs all its n_iter steps
// before the next block starts - S = X X^T (a GEMM), the cutoff softmax's probabilities
// (cutoff_exp_rows), L = P V / l (a GEMM and a row scaling), the update of the block's rows - while its
// keys, values and iterates stay in the cache; the blocks run in parallel over torch's intra-op threads
// (GEMMs and kernels single-threaded inside, as SDPA's CPU kernel does). Each parallel task keeps its own
// block-sized scratch - the scores, the two iterates A and C, the row maxima and sums - reused by its every
// block: only K and V are read from memory and only L written to it. (Iterates as full (BH, N, D) arrays,
// 2 x 9.7 MB at DeiT-tiny's batch 64 written and read back at every step, cost the 2-thread forward on a
// 2-core Intel Xeon 4.0-4.4x one SDPA call against 3.6-3.9x with the scratch, side by side: docs/benchmarks.md.)
at::Tensor pap_forward(at::Tensor K, at::Tensor V, at::Tensor tau, int64_t n_iter, int64_t block, double scale,
                       double cutoff) {
  check_block(K, K, "K");
  check_block(V, K, "V");
  check_block(tau, K, "tau");
  TORCH_CHECK(K.dim() == 3 && V.dim() == 3 && V.size(0) == K.size(0) && V.size(1) == K.size(1),
              "pap_forward: K (BH, N, D) and V (BH, N, Dv) expected");
  const int64_t bh = K.size(0), n = K.size(1), d = K.size(2), dv = V.size(2);
  TORCH_CHECK(tau.dim() == 3 && tau.size(0) == bh && (tau.size(1) == 1 || tau.size(1) == n) && tau.size(2) == 1,
              "pap_forward: tau (BH, 1 | N, 1) expected");
  TORCH_CHECK(n_iter >= 1 && block >= 1 && scale > 0 && cutoff > 0, "pap_forward: bad n_iter, block, scale or cutoff");
  TORCH_CHECK(n_iter == 1 || dv == d, "pap_forward: the update needs values of the keys' width");
  at::Tensor L = at::empty({bh, n, dv}, K.options());
  const int64_t tr = tau.size(1), nblocks = (bh + block - 1) / block, width = std::min(block, bh);
  AT_DISPATCH_FLOATING_TYPES(K.scalar_type(), "pap_forward", [&] {
    kpca_attention::parallel_for_with_state(0, nblocks, 1, [&](int64_t i0, int64_t i1) {  // ATen ops inside
      // this task's scratch, one block wide: scores, iterates (A, and C where there is a second step), row stats
      at::Tensor S = at::empty({width, n, n}, K.options());
      at::Tensor A = at::empty({width, n, d}, K.options()), C = n_iter > 1 ? at::empty_like(A) : A;
      at::Tensor m = at::empty({width, n}, K.options()), l = at::empty({width, n}, K.options());
      scalar_t* mb = m.data_ptr<scalar_t>();
      scalar_t* lb = l.data_ptr<scalar_t>();
      for (int64_t bi = i0; bi < i1; ++bi) {
        const int64_t b0 = bi * block, nb = std::min(block, bh - b0), o = b0 * n * d;
        const scalar_t* taub = tau.data_ptr<scalar_t>() + b0 * tr;
        at::Tensor Ab = A.narrow(0, 0, nb), Cb = C.narrow(0, 0, nb), Lb = L.narrow(0, b0, nb);
        at::Tensor Vb = V.narrow(0, b0, nb), Sb = S.narrow(0, 0, nb);
        const scalar_t* kp = K.data_ptr<scalar_t>() + o;
        clamp_rows<scalar_t>(kp, taub, Ab.data_ptr<scalar_t>(), nb * n, d, tr, n);  // X_1 = R_1 = clamp(K)
        for (int64_t t = 0; t < n_iter; ++t) {
          // roles as in pap_fused: step 1 X = R = A (spare C); then (X, R) = (A, C), (C, A), (A, C), ...
          const bool x_is_a = t == 0 || t % 2 == 1, r_is_a = t % 2 == 0;
          at::Tensor& X = x_is_a ? Ab : Cb;
          at::Tensor& R = r_is_a ? Ab : Cb;
          at::Tensor& spare = t == 0 ? Cb : X;
          softmax_step<scalar_t>(X, Vb, Sb, Lb, mb, lb, static_cast<scalar_t>(scale), static_cast<scalar_t>(cutoff));
          if (t == n_iter - 1) break;
          // (K, L_t, R_t) -> (R_{t+1}, X_{t+1}): C_t and R_{t+1} into the spare (R_{t+1} kept), X_{t+1} over R_t
          scalar_t* sp = spare.data_ptr<scalar_t>();
          scalar_t* rp = R.data_ptr<scalar_t>();
          update_rows<scalar_t>(kp, Lb.data_ptr<scalar_t>(), rp, taub, sp, rp, sp, nb * n, d, tr, n);
        }
      }
    });
  });
  return L;
}

// PAP's whole forward for training (fused.py's PAPSaved: the same arithmetic and buffer roles as its Python
// loop), symmetric and unmasked: pap_forward's blocks, each running all its steps in the cache, writing what
// the backward reads - every step's normalised probabilities P (n_iter, BH, N, N), iterates X
// (n_iter, BH, N, D; X[0] = clamp(K)), outputs L (n_iter, BH, N, D) and the update's clamped parts C
// (n_iter - 1, BH, N, D: C_1 .. C_{n_iter - 1}; C_0 is X[0]). L[n_iter - 1] is PAP's output. Returns what it
// wrote (so the tests' dispatch spy sees every saved tensor).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pap_forward_saved(
    at::Tensor K, at::Tensor V, at::Tensor tau, int64_t n_iter, int64_t block, double scale, double cutoff,
    at::Tensor P, at::Tensor X, at::Tensor L, at::Tensor C) {
  check_block(K, K, "K");
  for (auto* p : {&V, &tau, &P, &X, &L}) check_block(*p, K, "pap_forward_saved");
  TORCH_CHECK(K.dim() == 3 && V.sizes() == K.sizes(), "pap_forward_saved: K and V (BH, N, D) expected");
  const int64_t bh = K.size(0), n = K.size(1), d = K.size(2);
  TORCH_CHECK(tau.dim() == 3 && tau.size(0) == bh && (tau.size(1) == 1 || tau.size(1) == n) && tau.size(2) == 1,
              "pap_forward_saved: tau (BH, 1 | N, 1) expected");
  TORCH_CHECK(n_iter >= 1 && block >= 1 && scale > 0 && cutoff > 0,
              "pap_forward_saved: bad n_iter, block, scale or cutoff");
  TORCH_CHECK(P.sizes() == at::IntArrayRef({n_iter, bh, n, n}), "pap_forward_saved: P (n_iter, BH, N, N) expected");
  TORCH_CHECK(X.sizes() == at::IntArrayRef({n_iter, bh, n, d}) && L.sizes() == X.sizes(),
              "pap_forward_saved: X and L (n_iter, BH, N, D) expected");
  if (n_iter > 1) {
    check_block(C, K, "C");
    TORCH_CHECK(C.sizes() == at::IntArrayRef({n_iter - 1, bh, n, d}), "pap_forward_saved: C (n_iter - 1, BH, N, D)");
  }
  const int64_t tr = tau.size(1), nblocks = (bh + block - 1) / block, width = std::min(block, bh);
  AT_DISPATCH_FLOATING_TYPES(K.scalar_type(), "pap_forward_saved", [&] {
    kpca_attention::parallel_for_with_state(0, nblocks, 1, [&](int64_t i0, int64_t i1) {  // ATen ops inside
      at::Tensor R = at::empty({width, n, d}, K.options());  // R_{t+1}, this task's scratch
      at::Tensor m = at::empty({width, n}, K.options()), l = at::empty({width, n}, K.options());
      scalar_t* mb = m.data_ptr<scalar_t>();
      scalar_t* lb = l.data_ptr<scalar_t>();
      for (int64_t bi = i0; bi < i1; ++bi) {
        const int64_t b0 = bi * block, nb = std::min(block, bh - b0), o = b0 * n * d;
        const scalar_t* taub = tau.data_ptr<scalar_t>() + b0 * tr;
        const scalar_t* kp = K.data_ptr<scalar_t>() + o;
        at::Tensor Vb = V.narrow(0, b0, nb);
        scalar_t* rp = R.data_ptr<scalar_t>();
        clamp_rows<scalar_t>(kp, taub, X[0].narrow(0, b0, nb).data_ptr<scalar_t>(), nb * n, d, tr, n);
        for (int64_t t = 0; t < n_iter; ++t) {
          at::Tensor Xb = X[t].narrow(0, b0, nb), Lb = L[t].narrow(0, b0, nb), Sb = P[t].narrow(0, b0, nb);
          softmax_step<scalar_t>(Xb, Vb, Sb, Lb, mb, lb, static_cast<scalar_t>(scale), static_cast<scalar_t>(cutoff));
          divide_rows<scalar_t>(Sb.data_ptr<scalar_t>(), lb, nb * n, n);  // the probabilities, normalised
          if (t == n_iter - 1) break;
          // (K, L_t, R_t) -> (C_t, X_{t+1}, R_{t+1}); R_1 = X_1
          const scalar_t* r_in = t == 0 ? Xb.data_ptr<scalar_t>() : rp;
          scalar_t* cp = C[t].narrow(0, b0, nb).data_ptr<scalar_t>();
          scalar_t* xp = X[t + 1].narrow(0, b0, nb).data_ptr<scalar_t>();
          update_rows<scalar_t>(kp, Lb.data_ptr<scalar_t>(), r_in, taub, cp, xp, rp, nb * n, d, tr, n);
        }
      }
    });
  });
  return {P, X, L, C};
}

// delta_i = G_i . L_i for each of `rows` rows of width d (the softmax backward's row term: sum_j dP_ij P_ij).
template <typename T>
void row_dots(const T* G, const T* L, T* out, int64_t rows, int64_t d) {
  using Vec = Vectorized<T>;
  const int64_t W = Vec::size();
  T lanes[Vec::size()];
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = G + r * d;
    const T* l = L + r * d;
    Vec acc(T(0));
    int64_t j = 0;
    for (; j + W <= d; j += W) acc = at::vec::fmadd(Vec::loadu(g + j), Vec::loadu(l + j), acc);
    acc.store(lanes);
    T sum = 0;
    for (int64_t w = 0; w < W; ++w) sum += lanes[w];
    for (; j < d; ++j) sum += g[j] * l[j];
    out[r] = sum;
  }
}

// PAPSaved's whole backward (fused.py; the same steps as its Python loop) from what pap_forward_saved kept:
// each block of heads runs every step in reverse while its gradients stay in the cache - the row terms
// delta, dP = G V^T, dV += P^T G, the symmetric softmax backward (softmax_backward_sym_heads), dX = dP X,
// the update's backward (update_backward_heads) - the blocks in parallel over torch's threads, each task
// with block-sized scratch for dP, dX, dL and dR. G: (BH, N, D), the gradient of L[n_iter - 1].
// Returns (dK, dV, dtau); dtau is empty unless need_tau.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pap_backward_saved(
    at::Tensor G, at::Tensor V, at::Tensor tau, at::Tensor P, at::Tensor X, at::Tensor L, at::Tensor C,
    int64_t block, double scale, bool need_tau) {
  check_block(G, G, "G");
  for (auto* p : {&V, &tau, &P, &X, &L}) check_block(*p, G, "pap_backward_saved");
  TORCH_CHECK(G.dim() == 3 && V.sizes() == G.sizes(), "pap_backward_saved: G and V (BH, N, D) expected");
  const int64_t bh = G.size(0), n = G.size(1), d = G.size(2), n_iter = P.size(0);
  TORCH_CHECK(n_iter >= 1 && P.sizes() == at::IntArrayRef({n_iter, bh, n, n}),
              "pap_backward_saved: P (n_iter, BH, N, N) expected");
  TORCH_CHECK(X.sizes() == at::IntArrayRef({n_iter, bh, n, d}) && L.sizes() == X.sizes(),
              "pap_backward_saved: X and L (n_iter, BH, N, D) expected");
  if (n_iter > 1) {
    check_block(C, G, "C");
    TORCH_CHECK(C.sizes() == at::IntArrayRef({n_iter - 1, bh, n, d}), "pap_backward_saved: C (n_iter - 1, BH, N, D)");
  }
  TORCH_CHECK(tau.dim() == 3 && tau.size(0) == bh && (tau.size(1) == 1 || tau.size(1) == n) && tau.size(2) == 1,
              "pap_backward_saved: tau (BH, 1 | N, 1) expected");
  TORCH_CHECK(block >= 1 && scale > 0, "pap_backward_saved: bad block or scale");
  at::Tensor gK = at::empty_like(G), gV = at::empty_like(G);
  at::Tensor gTau = need_tau ? at::zeros_like(tau) : at::empty({0}, G.options());
  const int64_t tr = tau.size(1), nblocks = (bh + block - 1) / block, width = std::min(block, bh);
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "pap_backward_saved", [&] {
    kpca_attention::parallel_for_with_state(0, nblocks, 1, [&](int64_t i0, int64_t i1) {  // ATen ops inside
      at::Tensor dP = at::empty({width, n, n}, G.options()), dX = at::empty({width, n, d}, G.options());
      at::Tensor dL = at::empty({n_iter > 1 ? width : 0, n, d}, G.options()), dR = at::empty_like(dL);
      std::vector<scalar_t> delta(width * n);
      for (int64_t bi = i0; bi < i1; ++bi) {
        const int64_t b0 = bi * block, nb = std::min(block, bh - b0);
        at::Tensor Vb = V.narrow(0, b0, nb), gVb = gV.narrow(0, b0, nb), dPb = dP.narrow(0, 0, nb);
        at::Tensor dXb = dX.narrow(0, 0, nb), dLb = n_iter > 1 ? dL.narrow(0, 0, nb) : dL;
        scalar_t* dx = dXb.data_ptr<scalar_t>();
        scalar_t* gk = gK.data_ptr<scalar_t>() + b0 * n * d;
        scalar_t* gt = need_tau ? gTau.data_ptr<scalar_t>() + b0 * tr : nullptr;
        const scalar_t* taub = tau.data_ptr<scalar_t>() + b0 * tr;
        for (int64_t t = n_iter - 1; t >= 0; --t) {
          const bool last = t == n_iter - 1;
          at::Tensor Gb = last ? G.narrow(0, b0, nb) : dLb;
          at::Tensor Pt = P[t].narrow(0, b0, nb), Xt = X[t].narrow(0, b0, nb);
          const scalar_t* ct = (t == 0 ? X[0] : C[t - 1]).narrow(0, b0, nb).data_ptr<scalar_t>();
          row_dots<scalar_t>(Gb.data_ptr<scalar_t>(), L[t].narrow(0, b0, nb).data_ptr<scalar_t>(), delta.data(),
                             nb * n, d);
          at::bmm_out(dPb, Gb, Vb.transpose(1, 2));
          if (last) at::bmm_out(gVb, Pt.transpose(1, 2), Gb);
          else gVb.baddbmm_(Pt.transpose(1, 2), Gb);
          softmax_backward_sym_heads<scalar_t>(dPb.data_ptr<scalar_t>(), Pt.data_ptr<scalar_t>(), delta.data(), nb, n,
                                               static_cast<scalar_t>(scale));
          at::bmm_out(dXb, dPb, Xt);
          // dL and dR for step t - 1 (G, which is dL, was read above: the update's backward may write it now)
          scalar_t* dr = (last && t == 0) ? nullptr : dR.data_ptr<scalar_t>();
          scalar_t* dl = t > 0 ? dLb.data_ptr<scalar_t>() : nullptr;
          update_backward_heads<scalar_t>(dx, dr, ct, taub, gk, dl, gt, nb, n, d, tr, !last, !last, t > 0);
        }
      }
    });
  });
  return {gK, gV, gTau};
}

// How many threads the kernels' parallel loops run on now: torch's intra-op thread count where this library
// was compiled with OpenMP (setup.py), 1 where it was not (at::parallel_for then runs inline).
int64_t parallel_threads() {
  std::atomic<int64_t> tasks{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) { ++tasks; });
  return tasks.load();
}

}  // namespace

// Registered as torch operators (torch.ops.kpca_attention.*): they go through the dispatcher, so
// TorchDispatchMode sees them (the tests' subnormal checks) like any aten op. Each returns what it wrote.
TORCH_LIBRARY(kpca_attention, m) {
  m.def("cutoff_exp_(Tensor(a!) S, Tensor(b!) m, Tensor(c!) l, float scale, float cutoff) -> Tensor(a!)");
  m.def("cutoff_probs_(Tensor(a!) S, Tensor m, Tensor l, float scale, float cutoff) -> Tensor(a!)");
  m.def("update_(Tensor K, Tensor L, Tensor R, Tensor tau, Tensor(a!) C, Tensor(b!) X, Tensor(c!) R_next)"
        " -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  m.def("pap_forward(Tensor K, Tensor V, Tensor tau, int n_iter, int block, float scale, float cutoff) -> Tensor");
  m.def("pap_forward_saved(Tensor K, Tensor V, Tensor tau, int n_iter, int block, float scale, float cutoff,"
        " Tensor(a!) P, Tensor(b!) X, Tensor(c!) L, Tensor(d!) C) -> (Tensor(a!), Tensor(b!), Tensor(c!), Tensor(d!))");
  m.def("pap_backward_saved(Tensor G, Tensor V, Tensor tau, Tensor P, Tensor X, Tensor L, Tensor C, int block,"
        " float scale, bool need_tau) -> (Tensor, Tensor, Tensor)");
  m.def("softmax_backward_sym_(Tensor(a!) dP, Tensor P, Tensor delta, float scale) -> Tensor(a!)");
  m.def("update_backward_(Tensor dX, Tensor(a!) dR, Tensor C, Tensor tau, Tensor(b!) g_k, Tensor(c!) dL,"
        " Tensor(d!) g_tau, bool dr_in, bool accumulate_k, bool prev) -> ()");
  m.def("parallel_threads() -> int", &parallel_threads);  // no tensor: one kernel for every backend
}

TORCH_LIBRARY_IMPL(kpca_attention, CPU, m) {
  m.impl("cutoff_exp_", &cutoff_exp_);
  m.impl("cutoff_probs_", &cutoff_probs_);
  m.impl("update_", &update_);
  m.impl("pap_forward", &pap_forward);
  m.impl("pap_forward_saved", &pap_forward_saved);
  m.impl("pap_backward_saved", &pap_backward_saved);
  m.impl("update_backward_", &update_backward_);
  m.impl("softmax_backward_sym_", &softmax_backward_sym_);
}

// importing the module (kernels.py) loads the library, which registers the operators above
PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) { mod.doc() = "PAP's fused CPU kernels (kpca_attention/pap/kernels.py)"; }
