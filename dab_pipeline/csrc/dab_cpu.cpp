// Fused elementwise kernels for the bf16 scoring engine on CPU (dab_pipeline/cpu_kernels.py).
//
// On a CPU with bf16 matrix units the bridge's products run several times faster than
// float32 ones, while ATen's elementwise ops between them (SiLU, the state update, the
// casts) stay as slow as before and each one is a separate pass over memory.  These
// kernels do each of those stretches in one pass, row-parallel, with a polynomial exp
// that vectorises (no libm call) and no denormal results.  They are built on the user's
// machine (-march=native) on first use; cpu_kernels.py holds the eager equivalents,
// which are the reference in tests and the fallback where no compiler is available.
//
// Conventions: P rows (pairs); a row stride may exceed the row length (views into
// padded buffers); the innermost stride is 1 (checked on the Python side).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGrain = 16;  // rows per task: at H = 1024 a task is >= 16k elements

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// Built with -ffinite-math-only (it lets the compiler use the vector min/max for the
// clamps), under which a comparison may not see a NaN.  NaN is tested on the bits
// instead, and every kernel passes a NaN input through to its output, as ATen would.
inline bool is_nan(float f) { return (float_to_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// Round to nearest even, as torch's float -> bfloat16 conversion; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return is_nan(f) ? uint16_t(0x7FC0) : uint16_t(rounded);
}

inline float clamp(float v, float lo, float hi) {
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

// exp(x) for x in [-87, 88] (clamped there), relative error ~2e-7: Cody-Waite reduction by
// ln 2 and a degree-6 polynomial (the Cephes coefficients).  Results are never denormal.
inline float exp_poly(float x) {
  x = clamp(x, -87.0f, 88.0f);
  float n = std::nearbyint(x * 1.44269504088896341f);  // round(x / ln 2)
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// silu(v) = v / (1 + exp(-v)); exp_poly's clamp keeps a very negative v's result a tiny
// normal number (or zero) instead of inf / inf.
inline float silu(float v) {
  float y = v / (1.0f + exp_poly(-v));
  return is_nan(v) ? v : y;
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// SiLU on 16 bf16 values at a time, written out for AVX-512: a reciprocal estimate (2^-14
// relative, well under one bf16 step) in place of the divide, and the hardware's
// round-to-nearest-even bf16 conversion.  Same exp_poly as the portable loop.  Returns
// how many leading elements it did; the portable loop does the rest.
inline int64_t silu_row_simd(uint16_t* row, int64_t n) {
  const __m512 lo = _mm512_set1_ps(-87.0f), hi = _mm512_set1_ps(88.0f), one = _mm512_set1_ps(1.0f);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __m512 c5 = _mm512_set1_ps(1.9875691500e-4f), c4 = _mm512_set1_ps(1.3981999507e-3f);
  const __m512 c3 = _mm512_set1_ps(8.3334519073e-3f), c2 = _mm512_set1_ps(4.1665795894e-2f);
  const __m512 c1 = _mm512_set1_ps(1.6666665459e-1f), c0 = _mm512_set1_ps(5.0000001201e-1f);
  const __m512i bias = _mm512_set1_epi32(127);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j));
    const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    __m512 x = _mm512_sub_ps(_mm512_setzero_ps(), v);  // exp(-v)
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2_hi, x);
    r = _mm512_fnmadd_ps(k, ln2_lo, r);
    __m512 p = _mm512_fmadd_ps(c5, r, c4);
    p = _mm512_fmadd_ps(p, r, c3);
    p = _mm512_fmadd_ps(p, r, c2);
    p = _mm512_fmadd_ps(p, r, c1);
    p = _mm512_fmadd_ps(p, r, c0);
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, one));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), bias), 23);
    const __m512 ex = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    __m512 y = _mm512_mul_ps(v, _mm512_rcp14_ps(_mm512_add_ps(one, ex)));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);  // NaN stays NaN
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + j), (__m256i)_mm512_cvtneps_pbh(y));
  }
  return j;
}
#else
inline int64_t silu_row_simd(uint16_t*, int64_t) { return 0; }
#endif

// t must be a 2-D CPU tensor of dtype with unit inner stride, and of shape (rows, cols)
// where those are given (-1: any).
void check_rows(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t rows = -1,
                int64_t cols = -1) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D, got ", t.dim(), "-D");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.stride(1) == 1, name, " must have unit inner stride");
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK((rows < 0 || t.size(0) == rows) && (cols < 0 || t.size(1) == cols), name, " must be (",
              rows, ", ", cols, "), got (", t.size(0), ", ", t.size(1), ")");
}

// x <- silu(x), in place; x (P, H) bfloat16.
void silu_bf16_(at::Tensor x) {
  check_rows(x, "x", at::kBFloat16);
  const int64_t rows = x.size(0), cols = x.size(1), ld = x.stride(0);
  uint16_t* base = reinterpret_cast<uint16_t*>(x.data_ptr());
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uint16_t* row = base + r * ld;
      const int64_t done = silu_row_simd(row, cols);
#pragma omp simd
      for (int64_t j = done; j < cols; ++j) row[j] = float_to_bf16(silu(bf16_to_float(row[j])));
    }
  });
}

// The bridge's state update, one pass (cpu_kernels.bridge_update_eager is the spec):
//   st <- st - chi * delta                      st (P, W) float32, delta (P, W) bfloat16
//   st[:, d:] <- clamp(st[:, d:], lo, hi)       (only when W > d: the Gaussian bridge's logvar / 2)
//   s[:, :d] <- bf16(st[:, :d]); s[:, d:] <- bf16(exp(st[:, d:]))     (when write_s)
void bridge_update_(at::Tensor st, const at::Tensor& delta, at::Tensor s, double chi, double lo, double hi,
                    int64_t d, bool write_s) {
  check_rows(st, "st", at::kFloat);
  const int64_t rows = st.size(0), width = st.size(1);
  check_rows(delta, "delta", at::kBFloat16, rows, width);
  check_rows(s, "s", at::kBFloat16, rows, width);
  TORCH_CHECK(d > 0 && d <= width, "d out of range");
  float* sp = st.data_ptr<float>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(delta.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(s.data_ptr());
  const int64_t lds = st.stride(0), ldd = delta.stride(0), ldo = s.stride(0);
  const float c = float(chi), l = float(lo), h = float(hi);
  // by value: a captured reference is a load the vectoriser cannot hoist past the stores
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* srow = sp + r * lds;
      const uint16_t* drow = dp + r * ldd;
      uint16_t* orow = op + r * ldo;
      if (write_s) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          float v = srow[j] - c * bf16_to_float(drow[j]);
          srow[j] = v;
          orow[j] = float_to_bf16(v);
        }
        float* shv = srow + d;
        const uint16_t* dhv = drow + d;
        uint16_t* ohv = orow + d;
#pragma omp simd
        for (int64_t j = 0; j < width - d; ++j) {
          float v = shv[j] - c * bf16_to_float(dhv[j]);
          v = is_nan(v) ? v : clamp(v, l, h);
          float e = is_nan(v) ? v : exp_poly(v);
          shv[j] = v;
          ohv[j] = float_to_bf16(e);
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) srow[j] -= c * bf16_to_float(drow[j]);
#pragma omp simd
        for (int64_t j = d; j < width; ++j) {
          float v = srow[j] - c * bf16_to_float(drow[j]);
          srow[j] = is_nan(v) ? v : clamp(v, l, h);
        }
      }
    }
  });
}

// The video Gaussian's log-variance and sigma (cpu_kernels.video_gaussian_eager is the spec):
//   lv <- clamp((clamp(lv, lo, hi) + tok_g / g + vtok[r / group]) / 2, lo, hi)    lv, tok_g (P, D) float32
//   sigma <- bf16(exp(lv / 2))                                                     sigma (P, D) bfloat16
void video_gaussian_(at::Tensor lv, const at::Tensor& tok_g, const at::Tensor& g, const at::Tensor& vtok,
                     at::Tensor sigma, double lo, double hi, int64_t group) {
  check_rows(lv, "lv", at::kFloat);
  const int64_t rows = lv.size(0), d = lv.size(1);
  check_rows(tok_g, "tok_g", at::kFloat, rows, d);
  check_rows(vtok, "vtok", at::kFloat, -1, d);
  check_rows(sigma, "sigma", at::kBFloat16, rows, d);
  TORCH_CHECK(g.dim() == 1 && g.size(0) == rows && g.scalar_type() == at::kFloat, "g must be (P,) float32");
  TORCH_CHECK(group > 0 && vtok.size(0) * group >= rows, "vtok must hold a row per group");
  float* lp = lv.data_ptr<float>();
  const float* tp = tok_g.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  const float* vp = vtok.data_ptr<float>();
  uint16_t* sp = reinterpret_cast<uint16_t*>(sigma.data_ptr());
  const int64_t ldl = lv.stride(0), ldt = tok_g.stride(0), ldv = vtok.stride(0), lds = sigma.stride(0);
  const int64_t gs = g.stride(0);
  const float l = float(lo), h = float(hi);
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      // lv is read and written as bits: a NaN test on a plain float load defeats the vectoriser
      uint32_t* __restrict__ lrow = reinterpret_cast<uint32_t*>(lp + r * ldl);
      const float* __restrict__ trow = tp + r * ldt;
      const float* __restrict__ vrow = vp + (r / group) * ldv;
      uint16_t* __restrict__ srow = sp + r * lds;
      const float inv_g = 1.0f / gp[r * gs];
      const float lo_r = l, hi_r = h;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        const uint32_t u = lrow[j];
        const float x0 = bits_to_float(u);
        const float c0 = clamp(x0, lo_r, hi_r);  // unconditional, then selected: no masked loads
        const float x1 = 0.5f * (((u & 0x7FFFFFFFu) > 0x7F800000u ? x0 : c0) + trow[j] * inv_g + vrow[j]);
        const float c1 = clamp(x1, lo_r, hi_r);
        const bool nan = is_nan(x1);
        const float x = nan ? x1 : c1;
        const float e = exp_poly(0.5f * c1);
        lrow[j] = float_to_bits(x);
        srow[j] = float_to_bf16(nan ? x1 : e);
      }
    }
  });
}

// KL(N(mu_v, e^lv_v) || N(mu_t, e^lv_t)) per row, lv_t = 2 hv_t, st = [mu_t, hv_t] (P, 2D)
// -> (P,) float32 (cpu_kernels.kl_rows_eager is the spec).
at::Tensor kl_rows(const at::Tensor& mu_v, const at::Tensor& lv_v, const at::Tensor& st) {
  check_rows(mu_v, "mu_v", at::kFloat);
  const int64_t rows = mu_v.size(0), d = mu_v.size(1);
  check_rows(lv_v, "lv_v", at::kFloat, rows, d);
  check_rows(st, "st", at::kFloat, rows, 2 * d);
  at::Tensor out = at::empty({rows}, mu_v.options());
  const float* mp = mu_v.data_ptr<float>();
  const float* lp = lv_v.data_ptr<float>();
  const float* sp = st.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ldm = mu_v.stride(0), ldl = lv_v.stride(0), lds = st.stride(0);
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* mrow = mp + r * ldm;
      const float* lrow = lp + r * ldl;
      const float* mt = sp + r * lds;
      const float* ht = mt + d;
      float acc = 0.0f;
      // a NaN reaches the sum through the plain terms (diff, lv_t, lv_v) even where exp_poly clamps it
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < d; ++j) {
        const float lt = 2.0f * ht[j];
        const float diff = mt[j] - mrow[j];
        acc += diff * diff * exp_poly(-lt) + exp_poly(lrow[j] - lt) - 1.0f + (lt - lrow[j]);
      }
      op[r] = 0.5f * acc;
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(dab_cpu, m) {
  m.def("silu_bf16_(Tensor(a!) x) -> ()");
  m.def("bridge_update_(Tensor(a!) st, Tensor delta, Tensor(b!) s, float chi, float lo, float hi, int d, "
        "bool write_s) -> ()");
  m.def("video_gaussian_(Tensor(a!) lv, Tensor tok_g, Tensor g, Tensor vtok, Tensor(b!) sigma, float lo, float hi, "
        "int group) -> ()");
  m.def("kl_rows(Tensor mu_v, Tensor lv_v, Tensor st) -> Tensor");
}

TORCH_LIBRARY_IMPL(dab_cpu, CPU, m) {
  m.impl("silu_bf16_", &silu_bf16_);
  m.impl("bridge_update_", &bridge_update_);
  m.impl("video_gaussian_", &video_gaussian_);
  m.impl("kl_rows", &kl_rows);
}
