// PIDformer's feedback in one pass over the values, on the CPU (kpca_attention/attention/pid.py uses it in a
// forward without autograd and without hooks on hook_error / hook_integral; built into the same extension as
// PAP's kernels, setup.py).
//
//   pid_feedback_(out, v0, v, I_prev, e_prev, a, ki, kd) -> (e, I): per element
//     e = v0 - v;  I = I_prev + e (I_prev empty: e);  out += a e + ki I - kd e_prev (e_prev empty: no term)
//   with a = kp + kd; out is updated in place, e and I are new contiguous (B, H, N, D) tensors.
//
// Why a kernel: the eager ops make five passes over (B, H, N, D) - the error, the integral, and three in-place
// adds into the attention output - reading and writing 15 tensors' worth of memory where one pass reads five
// and writes three; at B 64, H 3, N 197, D 64 (9.7 MB a tensor) that traffic, not the arithmetic, made the
// layer's forward 1.32-1.34x one SDPA call on an Intel Xeon at one thread (target 1.3x, docs/benchmarks.md).
// The tensors may be strided views (the values are a slice of the qkv projection, SDPA's output a transposed
// buffer): each needs only its last dimension contiguous; rows are addressed through their own strides.

#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <tuple>

namespace {

using at::vec::Vectorized;

constexpr int64_t kRowGrain = 64;  // rows per parallel task at least

// the address of row r = ((b * H) + h) * N + i of a (B, H, N, D) tensor with a contiguous last dimension
template <typename T>
inline T* row(const at::Tensor& t, T* base, int64_t r, int64_t heads, int64_t n) {
  const int64_t b = r / (heads * n), h = (r / n) % heads, i = r % n;
  return base + b * t.stride(0) + h * t.stride(1) + i * t.stride(2);
}

void check_values(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == like.scalar_type() && t.dim() == 4 &&
              t.sizes() == like.sizes() && (t.size(3) <= 1 || t.stride(3) == 1),
              "pid_feedback_: ", name, " must be a CPU tensor shaped and typed as out, its last dimension contiguous");
}

std::tuple<at::Tensor, at::Tensor> pid_feedback_(at::Tensor out, at::Tensor v0, at::Tensor v, at::Tensor I_prev,
                                                 at::Tensor e_prev, double a, double ki, double kd) {
  TORCH_CHECK(out.dim() == 4, "pid_feedback_: out (B, H, N, D) expected");
  check_values(out, out, "out");
  check_values(v0, out, "v0");
  check_values(v, out, "v");
  const bool has_i = I_prev.numel() > 0, has_e = e_prev.numel() > 0;
  if (has_i) check_values(I_prev, out, "I_prev");
  if (has_e) check_values(e_prev, out, "e_prev");
  const int64_t heads = out.size(1), n = out.size(2), d = out.size(3), rows = out.size(0) * heads * n;
  at::Tensor e = at::empty(out.sizes(), out.options()), I = at::empty(out.sizes(), out.options());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "pid_feedback_", [&] {
    using Vec = Vectorized<scalar_t>;
    const int64_t W = Vec::size();
    const scalar_t sa = static_cast<scalar_t>(a), si = static_cast<scalar_t>(ki), sd = static_cast<scalar_t>(kd);
    const Vec va(sa), vi(si), vd(sd);
    scalar_t* o0 = out.data_ptr<scalar_t>();
    const scalar_t* r0 = v0.data_ptr<scalar_t>();
    const scalar_t* x0 = v.data_ptr<scalar_t>();
    const scalar_t* i0 = has_i ? I_prev.data_ptr<scalar_t>() : nullptr;
    const scalar_t* p0 = has_e ? e_prev.data_ptr<scalar_t>() : nullptr;
    scalar_t* eo = e.data_ptr<scalar_t>();
    scalar_t* io = I.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* o = row(out, o0, r, heads, n);
        const scalar_t* ref = row(v0, r0, r, heads, n);
        const scalar_t* x = row(v, x0, r, heads, n);
        const scalar_t* ip = has_i ? row(I_prev, i0, r, heads, n) : nullptr;
        const scalar_t* ep = has_e ? row(e_prev, p0, r, heads, n) : nullptr;
        scalar_t* er = eo + r * d;
        scalar_t* ir = io + r * d;
        int64_t j = 0;
        for (; j + W <= d; j += W) {
          const Vec ev = Vec::loadu(ref + j) - Vec::loadu(x + j);
          const Vec iv = has_i ? Vec::loadu(ip + j) + ev : ev;
          Vec ov = at::vec::fmadd(va, ev, Vec::loadu(o + j));
          ov = at::vec::fmadd(vi, iv, ov);
          if (has_e) ov = ov - vd * Vec::loadu(ep + j);
          ev.store(er + j);
          iv.store(ir + j);
          ov.store(o + j);
        }
        for (; j < d; ++j) {
          const scalar_t ev = ref[j] - x[j];
          const scalar_t iv = has_i ? ip[j] + ev : ev;
          scalar_t ov = o[j] + sa * ev + si * iv;
          if (has_e) ov -= sd * ep[j];
          er[j] = ev;
          ir[j] = iv;
          o[j] = ov;
        }
      }
    });
  });
  return {e, I};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kpca_attention, m) {
  m.def("pid_feedback_(Tensor(a!) out, Tensor v0, Tensor v, Tensor I_prev, Tensor e_prev, float a, float ki,"
        " float kd) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kpca_attention, CPU, m) {
  m.impl("pid_feedback_", &pid_feedback_);
}
