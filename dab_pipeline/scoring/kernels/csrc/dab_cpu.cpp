// Fused elementwise kernels for the bf16 scoring engine on CPU (dab_pipeline/scoring/kernels/cpu.py).
//
// On a CPU with bf16 matrix units the bridge's products run several times faster than
// float32 ones, while ATen's elementwise ops between them (SiLU, the state update, the
// casts) stay as slow as before and each one is a separate pass over memory.  These
// kernels do each of those stretches in one pass, row-parallel, with a polynomial exp
// that vectorises (no libm call) and no denormal results.  They are built on the user's
// machine (-march=native) on first use; kernels/eager.py holds the eager equivalents,
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
#include <vector>

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
#define DAB_BF16_SIMD 1
// Sixteen values at a time, for results that are rounded to bf16 (a relative step of 2^-8):
// they need about 12 bits, not float32's 24, so the exp below is cheaper than exp_poly.

// Sixteen bf16 values (their bits) widened to float32: exact, the bits moved up by 16.
inline __m512 bf16_to_ps(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512 load_bf16_ps(const uint16_t* p) {
  return bf16_to_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The hardware's round-to-nearest-even conversion, as torch's; NaN stays NaN.
inline void store_bf16_ps(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

// 2^t, relative error 2.8e-6: t = k + f with |f| <= 1/2 and a degree-4 fit of 2^f (relative
// minimax on [-1/2, 1/2]); scalef applies 2^k, so a large |t| gives 0 or inf without a range
// clamp.  t = +-inf gives NaN (inf - inf), as does a NaN t.
inline __m512 exp2_ps(__m512 t) {
  const __m512 c4 = _mm512_set1_ps(9.5828531440e-03f), c3 = _mm512_set1_ps(5.5906426730e-02f);
  const __m512 c2 = _mm512_set1_ps(2.4024098623e-01f), c1 = _mm512_set1_ps(6.9312419315e-01f);
  const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, k);
  __m512 p = _mm512_fmadd_ps(c4, f, c3);
  p = _mm512_fmadd_ps(p, f, c2);
  p = _mm512_fmadd_ps(p, f, c1);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

// exp(x) = 2^(x log2 e), with exp2_ps's accuracy: for results rounded to bf16.
inline __m512 exp_ps(__m512 x) { return exp2_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f))); }

// SiLU: v / (1 + 2^(-v log2 e)), with a reciprocal estimate (2^-14 relative) in place of the
// divide.  The exponent is floored at -150 so that v = +inf gives inf, not inf - inf; v = -inf
// gives NaN, as ATen's silu does; a NaN v stays NaN through the final product.
inline __m512 silu_ps(__m512 v) {
  const __m512 e = exp2_ps(_mm512_max_ps(_mm512_mul_ps(v, _mm512_set1_ps(-1.44269504088896341f)),
                                         _mm512_set1_ps(-150.0f)));  // exp(-v)
  return _mm512_mul_ps(v, _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}

// SiLU on a row of bf16 values in place.  Returns how many leading elements it did; the
// portable loop does the rest.
inline int64_t silu_row_simd(uint16_t* row, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) store_bf16_ps(row + j, silu_ps(load_bf16_ps(row + j)));
  return j;
}

// The same on bf16(a + b) (a bf16, b float32), written to out.
inline int64_t add_silu_row_simd(uint16_t* out, const uint16_t* a, const float* b, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 sum = _mm512_add_ps(load_bf16_ps(a + j), _mm512_loadu_ps(b + j));
    const __m512 rounded = bf16_to_ps((__m256i)_mm512_cvtneps_pbh(sum));  // the sum in bf16, as the eager spec
    store_bf16_ps(out + j, silu_ps(rounded));
  }
  return j;
}

// max(lo, min(hi, v)), except that a NaN v stays NaN (tested explicitly: with
// -ffinite-math-only the compiler may reorder min / max operands).
inline __m512 clamp_ps(__m512 v, __m512 lo, __m512 hi) {
  const __m512 c = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
  return _mm512_mask_mov_ps(c, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}
#else
#define DAB_BF16_SIMD 0
inline int64_t silu_row_simd(uint16_t*, int64_t) { return 0; }
inline int64_t add_silu_row_simd(uint16_t*, const uint16_t*, const float*, int64_t) { return 0; }
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

// out <- silu(bf16(a + b[r % Mb])) row by row; out, a (P, H) bfloat16, b (Mb, H) float32: the first
// bridge step, whose pre-activation is the pair's target block plus its text's projected state.
void add_silu_bf16_(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  check_rows(out, "out", at::kBFloat16);
  const int64_t rows = out.size(0), cols = out.size(1);
  check_rows(a, "a", at::kBFloat16, rows, cols);
  check_rows(b, "b", at::kFloat, -1, cols);
  const int64_t mb = b.size(0);
  TORCH_CHECK(mb > 0, "b must have rows");
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const uint16_t* ap = reinterpret_cast<const uint16_t*>(a.data_ptr());
  const float* bp = b.data_ptr<float>();
  const int64_t ldo = out.stride(0), lda = a.stride(0), ldb = b.stride(0);
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uint16_t* orow = op + r * ldo;
      const uint16_t* arow = ap + r * lda;
      const float* brow = bp + (r % mb) * ldb;
      const int64_t done = add_silu_row_simd(orow, arow, brow, cols);
#pragma omp simd
      for (int64_t j = done; j < cols; ++j) {
        orow[j] = float_to_bf16(silu(bf16_to_float(float_to_bf16(bf16_to_float(arow[j]) + brow[j]))));
      }
    }
  });
}

// The bridge's state update, one pass (eager.bridge_update_eager is the spec):
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
        int64_t j0 = 0, j1 = 0;  // where the portable loops start: after the vector part
#if DAB_BF16_SIMD
        const __m512 cv = _mm512_set1_ps(c), lv = _mm512_set1_ps(l), hv = _mm512_set1_ps(h);
        for (; j0 + 16 <= d; j0 += 16) {
          const __m512 v = _mm512_fnmadd_ps(cv, load_bf16_ps(drow + j0), _mm512_loadu_ps(srow + j0));
          _mm512_storeu_ps(srow + j0, v);
          store_bf16_ps(orow + j0, v);
        }
        for (; j1 + 16 <= width - d; j1 += 16) {
          __m512 v = _mm512_fnmadd_ps(cv, load_bf16_ps(drow + d + j1), _mm512_loadu_ps(srow + d + j1));
          v = clamp_ps(v, lv, hv);
          _mm512_storeu_ps(srow + d + j1, v);
          store_bf16_ps(orow + d + j1, exp_ps(v));  // sigma: a bf16 result
        }
#endif
#pragma omp simd
        for (int64_t j = j0; j < d; ++j) {
          float v = srow[j] - c * bf16_to_float(drow[j]);
          srow[j] = v;
          orow[j] = float_to_bf16(v);
        }
        float* shv = srow + d;
        const uint16_t* dhv = drow + d;
        uint16_t* ohv = orow + d;
#pragma omp simd
        for (int64_t j = j1; j < width - d; ++j) {
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

// The video side of a block of pairs, from the per-video merged basis (eager.pair_heads_eager
// is the spec).  Row r is a pair of video v = vidx[r]:
//   out = coef[r] @ basis[v]     (K) x (K, 3D + H) in float32, read as [tok_g | mu | lv_raw | target]
//   mu[r] <- out[D:2D]
//   lv[r] <- clamp((clamp(lv_raw, lo, hi) + tok_g / g[r] + vtok[v]) / 2, lo, hi)
//   sigma[r] <- bf16(exp(lv / 2)),  target[r] <- bf16(out[3D:])
// One pass: the (P, 3D + H) float32 product is never stored, and its bf16 parts are written
// directly.  Rows arrive grouped by video, so a video's basis stays in cache for its rows.

struct HeadsArgs {
  const float* coef; int64_t ldc;
  const float* g; int64_t gs;
  const float* basis; int64_t ldb_v;  // basis[v] is (K, N) row-major at basis + v * ldb_v
  const int64_t* vidx;
  const float* vtok; int64_t ldv;
  float* mu; int64_t ldm;
  float* lv; int64_t ldl;
  uint16_t* sigma; int64_t lds;
  uint16_t* target; int64_t ldt;
  int64_t k, d, h;
  float lo, hi;
  bool sigma_blocked;  // sigma tile-blocked (Pp/16, D/32, 16, 32), the AMX products' input layout
};

// sigma's element (r, j); 16 elements from a j that is a multiple of 16 are contiguous in either layout
inline uint16_t* sigma_at(const HeadsArgs& a, int64_t r, int64_t j) {
  return a.sigma_blocked ? a.sigma + ((r / 16) * (a.d / 32) + j / 32) * 512 + (r % 16) * 32 + j % 32
                         : a.sigma + r * a.lds + j;
}

// Rows [r, r + 1): the portable version, through a row buffer.
void heads_row(const HeadsArgs& a, int64_t r, float* out) {
  const int64_t n = 3 * a.d + a.h;
  const float* c = a.coef + r * a.ldc;
  const float* bv = a.basis + a.vidx[r] * a.ldb_v;
  for (int64_t j = 0; j < n; ++j) out[j] = 0.0f;
  for (int64_t k = 0; k < a.k; ++k) {
    const float ck = c[k];
    const float* brow = bv + k * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] += ck * brow[j];
  }
  const float inv_g = 1.0f / a.g[r * a.gs];
  const float* vt = a.vtok + a.vidx[r] * a.ldv;
  float* mrow = a.mu + r * a.ldm;
  float* lrow = a.lv + r * a.ldl;
  uint16_t* trow = a.target + r * a.ldt;
  for (int64_t j = 0; j < a.d; ++j) {
    mrow[j] = out[a.d + j];
    const float raw = out[2 * a.d + j];
    const float x1 = 0.5f * ((is_nan(raw) ? raw : clamp(raw, a.lo, a.hi)) + out[j] * inv_g + vt[j]);
    const bool nan = is_nan(x1);
    const float x = nan ? x1 : clamp(x1, a.lo, a.hi);
    lrow[j] = x;
    *sigma_at(a, r, j) = float_to_bf16(nan ? x : exp_poly(0.5f * x));
  }
  for (int64_t j = 0; j < a.h; ++j) trow[j] = float_to_bf16(out[3 * a.d + j]);
}

#if DAB_BF16_SIMD
// NR rows [r, r + NR) of one video: each basis vector loaded serves NR rows.
template <int NR>
void heads_rows_simd(const HeadsArgs& a, int64_t r) {
  const int64_t n = 3 * a.d + a.h;
  const float* bv = a.basis + a.vidx[r] * a.ldb_v;
  const float* vt = a.vtok + a.vidx[r] * a.ldv;
  const float* c[NR];
  __m512 inv_g[NR];
  for (int i = 0; i < NR; ++i) {
    c[i] = a.coef + (r + i) * a.ldc;
    inv_g[i] = _mm512_set1_ps(1.0f / a.g[(r + i) * a.gs]);
  }
  const __m512 lo = _mm512_set1_ps(a.lo), hi = _mm512_set1_ps(a.hi), half = _mm512_set1_ps(0.5f);
  for (int64_t j = 0; j < a.d; j += 16) {
    __m512 tok[NR], mu[NR], lv[NR];
    for (int i = 0; i < NR; ++i) tok[i] = mu[i] = lv[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < a.k; ++k) {
      const float* b = bv + k * n + j;
      const __m512 bt = _mm512_loadu_ps(b), bm = _mm512_loadu_ps(b + a.d), bl = _mm512_loadu_ps(b + 2 * a.d);
      for (int i = 0; i < NR; ++i) {
        const __m512 ck = _mm512_set1_ps(c[i][k]);
        tok[i] = _mm512_fmadd_ps(ck, bt, tok[i]);
        mu[i] = _mm512_fmadd_ps(ck, bm, mu[i]);
        lv[i] = _mm512_fmadd_ps(ck, bl, lv[i]);
      }
    }
    const __m512 vtj = _mm512_loadu_ps(vt + j);
    for (int i = 0; i < NR; ++i) {
      _mm512_storeu_ps(a.mu + (r + i) * a.ldm + j, mu[i]);
      __m512 x = _mm512_add_ps(_mm512_fmadd_ps(tok[i], inv_g[i], clamp_ps(lv[i], lo, hi)), vtj);
      x = clamp_ps(_mm512_mul_ps(x, half), lo, hi);
      _mm512_storeu_ps(a.lv + (r + i) * a.ldl + j, x);
      store_bf16_ps(sigma_at(a, r + i, j), exp_ps(_mm512_mul_ps(x, half)));  // a bf16 result
    }
  }
  for (int64_t j = 0; j < a.h; j += 16) {
    __m512 t[NR];
    for (int i = 0; i < NR; ++i) t[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < a.k; ++k) {
      const __m512 bt = _mm512_loadu_ps(bv + k * n + 3 * a.d + j);
      for (int i = 0; i < NR; ++i) t[i] = _mm512_fmadd_ps(_mm512_set1_ps(c[i][k]), bt, t[i]);
    }
    for (int i = 0; i < NR; ++i) store_bf16_ps(a.target + (r + i) * a.ldt + j, t[i]);
  }
}
#endif

void pair_heads_(const at::Tensor& coef, const at::Tensor& g, const at::Tensor& basis, const at::Tensor& vidx,
                 const at::Tensor& vtok, double lo, double hi, at::Tensor mu, at::Tensor lv, at::Tensor sigma,
                 at::Tensor target) {
  check_rows(coef, "coef", at::kFloat);
  const int64_t rows = coef.size(0), k = coef.size(1);
  check_rows(vtok, "vtok", at::kFloat);
  const int64_t n_v = vtok.size(0), d = vtok.size(1);
  check_rows(mu, "mu", at::kFloat, rows, d);
  check_rows(lv, "lv", at::kFloat, rows, d);
  const int64_t pp = (rows + 15) / 16 * 16;
  const bool blocked = sigma.dim() == 4;
  if (blocked) {
    TORCH_CHECK(sigma.scalar_type() == at::kBFloat16 && sigma.is_contiguous() && d % 32 == 0 &&
                    sigma.size(0) == pp / 16 && sigma.size(1) == d / 32 && sigma.size(2) == 16 && sigma.size(3) == 32,
                "a blocked sigma must be contiguous bf16 (Pp/16, D/32, 16, 32), Pp = P rounded up to 16");
  } else {
    check_rows(sigma, "sigma", at::kBFloat16, rows, d);
  }
  check_rows(target, "target", at::kBFloat16, rows);
  const int64_t h = target.size(1);
  TORCH_CHECK(basis.dim() == 3 && basis.is_contiguous() && basis.scalar_type() == at::kFloat && basis.size(0) == n_v &&
                  basis.size(1) == k && basis.size(2) == 3 * d + h,
              "basis must be contiguous float32 (V, K, 3D + H) = (", n_v, ", ", k, ", ", 3 * d + h, ")");
  TORCH_CHECK(g.dim() == 1 && g.size(0) == rows && g.scalar_type() == at::kFloat, "g must be (P,) float32");
  TORCH_CHECK(vidx.dim() == 1 && vidx.size(0) == rows && vidx.scalar_type() == at::kLong && vidx.is_contiguous(),
              "vidx must be contiguous (P,) int64");
  const int64_t* vp = vidx.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) TORCH_CHECK(vp[r] >= 0 && vp[r] < n_v, "vidx out of range at row ", r);
  const HeadsArgs a{coef.data_ptr<float>(), coef.stride(0), g.data_ptr<float>(), g.stride(0),
                    basis.data_ptr<float>(), k * (3 * d + h), vp, vtok.data_ptr<float>(), vtok.stride(0),
                    mu.data_ptr<float>(), mu.stride(0), lv.data_ptr<float>(), lv.stride(0),
                    reinterpret_cast<uint16_t*>(sigma.data_ptr()), sigma.stride(0),
                    reinterpret_cast<uint16_t*>(target.data_ptr()), target.stride(0), k, d, h, float(lo), float(hi),
                    blocked};
  if (blocked)  // the padding rows are products' inputs too: zeros, not whatever the memory held
    for (int64_t r = rows; r < pp; ++r)
      for (int64_t j = 0; j < d; j += 32) std::memset(sigma_at(a, r, j), 0, 64);
  const bool simd = DAB_BF16_SIMD && d % 16 == 0 && h % 16 == 0;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> out(simd ? 0 : 3 * d + h);
    for (int64_t r = begin; r < end;) {
#if DAB_BF16_SIMD
      if (simd) {
        int64_t nr = 1;  // up to four rows of the same video
        while (nr < 4 && r + nr < end && vp[r + nr] == vp[r]) ++nr;
        switch (nr) {
          case 4: heads_rows_simd<4>(a, r); break;
          case 3: heads_rows_simd<3>(a, r); break;
          case 2: heads_rows_simd<2>(a, r); break;
          default: heads_rows_simd<1>(a, r); break;
        }
        r += nr;
        continue;
      }
#endif
      heads_row(a, r, out.data());
      ++r;
    }
  });
}

// KL(N(mu_v, e^lv_v) || N(mu_t, e^lv_t)) per row, lv_t = 2 hv_t, st = [mu_t, hv_t] (P, 2D)
// -> (P,) float32 (eager.kl_rows_eager is the spec).
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

// KL(N(mu_v, diag(e^lv_v) + U^T U) || N(mu_t, diag(s_t) + U_t U_t^T)) per row p, its text p % M, in one pass over
// the row's D values and L1-resident reads of its R factor rows (covariance lowrank:R; prob's engine).  mu_v, lv_v
// (P, D), u (P, R D) rank-major, texts (M, (3 + R_t) D) = [mu_t | 1 / s_t | 1 / s_t - diag(A^T A) | A's R_t rows]
// (A = L^-1 U_t^T S_t^-1, the text's Woodbury factor), tconst (M,) = sum(log s_t) + log det C_t - D -> (P,) float32
// (eager.kl_lowrank_rows_eager is the spec): 2 KL = sum_d [s_v (1/s_t - (A^T A)_dd) + ((mu_t - mu_v)^2 +
// sum_r U_rd^2) / s_t - log s_v] - ||A U^T||_F^2 - ||A (mu_t - mu_v)||^2 - log det(I + U S_v^-1 U^T) + tconst.
at::Tensor kl_lowrank_rows(const at::Tensor& mu_v, const at::Tensor& lv_v, const at::Tensor& u, const at::Tensor& texts,
                           const at::Tensor& tconst, int64_t rank) {
  check_rows(mu_v, "mu_v", at::kFloat);
  const int64_t rows = mu_v.size(0), d = mu_v.size(1);
  check_rows(lv_v, "lv_v", at::kFloat, rows, d);
  check_rows(u, "u", at::kFloat, rows, rank * d);
  check_rows(texts, "texts", at::kFloat);
  const int64_t m = texts.size(0);
  TORCH_CHECK(m >= 1 && texts.size(1) % d == 0 && texts.size(1) / d >= 4, "texts must be (M, (3 + R_t) D)");
  const int64_t rt = texts.size(1) / d - 3;
  TORCH_CHECK(rank >= 1 && rank <= 16 && rt <= 16, "ranks must be in [1, 16], got ", rank, " and ", rt);
  TORCH_CHECK(tconst.dim() == 1 && tconst.size(0) == m && tconst.scalar_type() == at::kFloat &&
                  tconst.is_contiguous(), "tconst must be (M,) float32, contiguous");
  at::Tensor out = at::empty({rows}, mu_v.options());
  const float* mp = mu_v.data_ptr<float>();
  const float* lp = lv_v.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  const float* tp = texts.data_ptr<float>();
  const float* cp = tconst.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ldm = mu_v.stride(0), ldl = lv_v.stride(0), ldu = u.stride(0), ldt = texts.stride(0);
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    std::vector<float> buf(2 * d);
    float* diff = buf.data();
    float* iv = diff + d;  // 1 / s_v
    float g[16 * 16];
    for (int64_t p = begin; p < end; ++p) {
      const float* mv = mp + p * ldm;
      const float* lv = lp + p * ldl;
      const float* uv = up + p * ldu;
      const float* mt = tp + (p % m) * ldt;
      const float* inv = mt + d;
      const float* e = mt + 2 * d;
      const float* a = mt + 3 * d;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < d; ++j) {
        const float df = mt[j] - mv[j];
        diff[j] = df;
        iv[j] = exp_poly(-lv[j]);
        acc += exp_poly(lv[j]) * e[j] + df * df * inv[j] - lv[j];
      }
      for (int64_t r = 0; r < rank; ++r) {
        const float* ur = uv + r * d;
        float s2 = 0.0f;
#pragma omp simd reduction(+ : s2)
        for (int64_t j = 0; j < d; ++j) s2 += ur[j] * ur[j] * inv[j];
        acc += s2;
        for (int64_t q = 0; q <= r; ++q) {  // U S_v^-1 U^T's lower triangle
          const float* uq = uv + q * d;
          float gq = 0.0f;
#pragma omp simd reduction(+ : gq)
          for (int64_t j = 0; j < d; ++j) gq += ur[j] * uq[j] * iv[j];
          g[r * rank + q] = gq + (q == r ? 1.0f : 0.0f);
        }
      }
      for (int64_t k = 0; k < rt; ++k) {  // ||A (mu_t - mu_v)||^2 and ||A U^T||_F^2
        const float* ak = a + k * d;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < d; ++j) s += ak[j] * diff[j];
        acc -= s * s;
        for (int64_t r = 0; r < rank; ++r) {
          const float* ur = uv + r * d;
          float c = 0.0f;
#pragma omp simd reduction(+ : c)
          for (int64_t j = 0; j < d; ++j) c += ak[j] * ur[j];
          acc -= c * c;
        }
      }
      float logdet = 0.0f;  // log det(I + U S_v^-1 U^T) = 2 sum log L_rr, L its Cholesky factor (in place)
      for (int64_t r = 0; r < rank; ++r) {
        for (int64_t q = 0; q <= r; ++q) {
          float v = g[r * rank + q];
          for (int64_t k = 0; k < q; ++k) v -= g[r * rank + k] * g[q * rank + k];
          if (q == r) {
            v = std::sqrt(v);
            logdet += 2.0f * std::log(v);
          } else {
            v /= g[q * rank + q];
          }
          g[r * rank + q] = v;
        }
      }
      op[p] = 0.5f * (acc + cp[p % m] - logdet);
    }
  });
  return out;
}

// The variational KL(N(mu_v, e^lv_v) || sum_k pi_k N(mu_k, e^lv_k)) = -log sum_k pi_k exp(-KL_k) per row p, its text
// p % M (covariance mixture:K; prob's engine), the K diagonal KLs in one pass over the row: mu_v, lv_v (P, D), texts
// (M, 2 K D) = [mu_k | e^-lv_k] per component, tconst (M, 2 K) = [sum(lv_k) - D | log pi_k] -> (P,) float32
// (eager.kl_mixture_rows_eager is the spec).
at::Tensor kl_mixture_rows(const at::Tensor& mu_v, const at::Tensor& lv_v, const at::Tensor& texts,
                           const at::Tensor& tconst) {
  check_rows(mu_v, "mu_v", at::kFloat);
  const int64_t rows = mu_v.size(0), d = mu_v.size(1);
  check_rows(lv_v, "lv_v", at::kFloat, rows, d);
  check_rows(texts, "texts", at::kFloat);
  const int64_t m = texts.size(0), k = texts.size(1) / (2 * d);
  TORCH_CHECK(m >= 1 && k >= 1 && k <= 64 && texts.size(1) == 2 * k * d, "texts must be (M, 2 K D), K in [1, 64]");
  check_rows(tconst, "tconst", at::kFloat, m, 2 * k);
  TORCH_CHECK(tconst.is_contiguous(), "tconst must be contiguous");
  at::Tensor out = at::empty({rows}, mu_v.options());
  const float* mp = mu_v.data_ptr<float>();
  const float* lp = lv_v.data_ptr<float>();
  const float* tp = texts.data_ptr<float>();
  const float* cp = tconst.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ldm = mu_v.stride(0), ldl = lv_v.stride(0), ldt = texts.stride(0);
  at::parallel_for(0, rows, kGrain, [=](int64_t begin, int64_t end) {
    std::vector<float> var(d);
    float z[64];
    for (int64_t p = begin; p < end; ++p) {
      const float* mv = mp + p * ldm;
      const float* lv = lp + p * ldl;
      const float* tt = tp + (p % m) * ldt;
      const float* c = cp + (p % m) * 2 * k;
      float lsum = 0.0f;
#pragma omp simd reduction(+ : lsum)
      for (int64_t j = 0; j < d; ++j) {
        var[j] = exp_poly(lv[j]);
        lsum += lv[j];
      }
      float zmax = -3.402823466e38f;
      for (int64_t q = 0; q < k; ++q) {
        const float* mu = tt + 2 * q * d;
        const float* inv = mu + d;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < d; ++j) {
          const float df = mu[j] - mv[j];
          acc += (df * df + var[j]) * inv[j];
        }
        z[q] = c[k + q] - 0.5f * (acc - lsum + c[q]);  // log pi_k - KL_k
        zmax = z[q] > zmax ? z[q] : zmax;
      }
      float se = 0.0f;
      for (int64_t q = 0; q < k; ++q) se += std::exp(z[q] - zmax);
      op[p] = -(zmax + std::log(se));
    }
  });
  return out;
}

// --------------------------------------------------------------------------- the one-text path
// (scoring/engines/gaussian.py, GaussianEngine.gaussian_one): one text with each of K videos, without per-video
// bases.  Each video's F frames are normalised and read while they sit in L1, where ATen's ops would make a pass
// over all K videos' frames (24 MB at K = 1000, F = 12, D = 512) for each step.

// A row of d values stored as float32 or bf16 (rounded to nearest even), and loaded back as float32.
inline void store_row(float* out, const float* x, int64_t d) { std::memcpy(out, x, sizeof(float) * d); }
inline void store_row(uint16_t* out, const float* x, int64_t d) {
  int64_t j = 0;
#if DAB_BF16_SIMD
  for (; j + 16 <= d; j += 16) store_bf16_ps(out + j, _mm512_loadu_ps(x + j));
#endif
  for (; j < d; ++j) out[j] = float_to_bf16(x[j]);
}
inline void load_row(float* out, const float* x, int64_t d) { std::memcpy(out, x, sizeof(float) * d); }
inline void load_row(float* out, const uint16_t* x, int64_t d) {
  int64_t j = 0;
#if DAB_BF16_SIMD
  for (; j + 16 <= d; j += 16) _mm512_storeu_ps(out + j, load_bf16_ps(x + j));
#endif
  for (; j < d; ++j) out[j] = bf16_to_float(x[j]);
}

// row[0, f) <- the softmax of the entries whose real[j] is set, 0 elsewhere; with none set, uniform: what
// masked_softmax gives (it fills the masked entries with the dtype's minimum, which then tie).
void masked_softmax_row(float* row, const bool* real, int64_t f) {
  float mx = -3.402823466e38f;
  bool any = false;
  for (int64_t j = 0; j < f; ++j)
    if (real[j]) {
      mx = row[j] > mx ? row[j] : mx;
      any = true;
    }
  if (!any) {
    for (int64_t j = 0; j < f; ++j) row[j] = 1.0f / float(f);
    return;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < f; ++j) {
    row[j] = real[j] ? exp_poly(row[j] - mx) : 0.0f;
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < f; ++j) row[j] *= inv;
}

// Row helpers of the one-text kernels, sixteen lanes at a time where the CPU has AVX-512 (GCC does not
// vectorise these reductions reliably from a pragma); the loops after the vector ones do the rest.
inline float dot(const float* a, const float* b, int64_t d) {
  int64_t j = 0;
  float acc = 0.0f;
#if defined(__AVX512F__)
  __m512 v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
  for (; j + 32 <= d; j += 32) {
    v0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), v0);
    v1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16), v1);
  }
  for (; j + 16 <= d; j += 16) v0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), v0);
  acc = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
#endif
  for (; j < d; ++j) acc += a[j] * b[j];
  return acc;
}

// Whether rows of T are dotted as they are, by dot_raw (bf16 rows with AVX512-BF16's pair products, d a multiple
// of 32), instead of as float32 copies by dot
inline bool raw_dots(const float*, int64_t) { return false; }
inline bool raw_dots(const uint16_t*, int64_t d) { return DAB_BF16_SIMD && d % 32 == 0; }
inline float dot_raw(const float* a, const float* b, int64_t d) { return dot(a, b, d); }
inline float dot_raw(const uint16_t* a, const uint16_t* b, int64_t d) {
#if DAB_BF16_SIMD
  __m512 v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 64 <= d; j += 64) {
    v0 = _mm512_dpbf16_ps(v0, (__m512bh)_mm512_loadu_si512(a + j), (__m512bh)_mm512_loadu_si512(b + j));
    v1 = _mm512_dpbf16_ps(v1, (__m512bh)_mm512_loadu_si512(a + j + 32), (__m512bh)_mm512_loadu_si512(b + j + 32));
  }
  if (j < d) v0 = _mm512_dpbf16_ps(v0, (__m512bh)_mm512_loadu_si512(a + j), (__m512bh)_mm512_loadu_si512(b + j));
  return _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
#else
  float acc = 0.0f;
  for (int64_t j = 0; j < d; ++j) acc += bf16_to_float(a[j]) * bf16_to_float(b[j]);
  return acc;
#endif
}

// out[c] = a . b[c * ldb ..] for c < 4: four rows against one, each a's load shared and four independent sums
inline void dot4_raw(const float* a, const float* b, int64_t ldb, int64_t d, float* out) {
  for (int c = 0; c < 4; ++c) out[c] = dot(a, b + c * ldb, d);
}
inline void dot4_raw(const uint16_t* a, const uint16_t* b, int64_t ldb, int64_t d, float* out) {
#if DAB_BF16_SIMD
  __m512 v[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t j = 0; j + 32 <= d; j += 32) {
    const __m512bh x = (__m512bh)_mm512_loadu_si512(a + j);
    for (int c = 0; c < 4; ++c) v[c] = _mm512_dpbf16_ps(v[c], x, (__m512bh)_mm512_loadu_si512(b + c * ldb + j));
  }
  for (int c = 0; c < 4; ++c) out[c] = _mm512_reduce_add_ps(v[c]);
#else
  for (int c = 0; c < 4; ++c) out[c] = dot_raw(a, b + c * ldb, d);
#endif
}

// sum of x, and of (x - c)^2
inline float row_sum(const float* x, int64_t d, float c, bool square) {
  int64_t j = 0;
  float acc = 0.0f;
#if defined(__AVX512F__)
  const __m512 cv = _mm512_set1_ps(c);
  __m512 v = _mm512_setzero_ps();
  for (; j + 16 <= d; j += 16) {
    const __m512 x0 = _mm512_sub_ps(_mm512_loadu_ps(x + j), cv);
    v = square ? _mm512_fmadd_ps(x0, x0, v) : _mm512_add_ps(v, x0);
  }
  acc = _mm512_reduce_add_ps(v);
#endif
  for (; j < d; ++j) acc += square ? (x[j] - c) * (x[j] - c) : x[j] - c;
  return acc;
}

// out <- (x - c) * a, or out += a * x (accumulate)
inline void row_axpy(float* out, const float* x, int64_t d, float a, float c, bool accumulate) {
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 av = _mm512_set1_ps(a), cv = _mm512_set1_ps(c);
  for (; j + 16 <= d; j += 16) {
    const __m512 x0 = _mm512_loadu_ps(x + j);
    _mm512_storeu_ps(out + j, accumulate ? _mm512_fmadd_ps(av, x0, _mm512_loadu_ps(out + j))
                                         : _mm512_mul_ps(_mm512_sub_ps(x0, cv), av));
  }
#endif
  for (; j < d; ++j) out[j] = accumulate ? out[j] + a * x[j] : (x[j] - c) * a;
}

// frames (K, F, D) -> n (K, F, D), each frame (x - mean) / sqrt(var + eps) (a LayerNorm without its scale and
// shift; not written where nout is null: the token branch's video terms come from a cache), and nbar (K, Hh, D):
// each head's softmax-weighted mean of the video's n, the weights of its real frames softmax(qk_h . n_f), qk (Hh, D)
// for every video or one (Hh, D) a video: qk_stride = 0 or Hh D (eager.one_frames_eager is the spec).
template <typename T>
void one_frames_impl(const float* fr, const bool* mk, const float* qk, int64_t qk_stride, float* nbar, T* nout,
                     int64_t n_v, int64_t f, int64_t d, int64_t hh, float eps) {
  at::parallel_for(0, n_v, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(f * d), lg(f);
    for (int64_t v = begin; v < end; ++v) {
      for (int64_t i = 0; i < f; ++i) {
        const float* x = fr + (v * f + i) * d;
        float* ni = buf.data() + i * d;
        const float mean = row_sum(x, d, 0.0f, false) / float(d);
        const float rs = 1.0f / std::sqrt(row_sum(x, d, mean, true) / float(d) + eps);
        row_axpy(ni, x, d, rs, mean, false);
        if (nout != nullptr) store_row(nout + (v * f + i) * d, ni, d);
      }
      for (int64_t h = 0; h < hh; ++h) {
        for (int64_t i = 0; i < f; ++i) lg[i] = dot(qk + v * qk_stride + h * d, buf.data() + i * d, d);
        masked_softmax_row(lg.data(), mk + v * f, f);
        float* out = nbar + (v * hh + h) * d;
        std::memset(out, 0, sizeof(float) * d);
        for (int64_t i = 0; i < f; ++i) row_axpy(out, buf.data() + i * d, d, lg[i], 0.0f, true);
      }
    }
  });
}

void check_frames(const at::Tensor& t, const char* name, int64_t n_v, int64_t f, int64_t d) {
  TORCH_CHECK(t.dim() == 3 && t.is_contiguous() && t.device().is_cpu() && t.size(0) == n_v && t.size(1) == f &&
                  t.size(2) == d,
              name, " must be a contiguous CPU tensor (", n_v, ", ", f, ", ", d, ")");
}

void one_frames_(const at::Tensor& frames, const at::Tensor& mask, const at::Tensor& qk, double eps, at::Tensor nbar,
                 const c10::optional<at::Tensor>& n) {
  TORCH_CHECK(frames.dim() == 3 && frames.scalar_type() == at::kFloat, "frames must be float32 (K, F, D)");
  const int64_t n_v = frames.size(0), f = frames.size(1), d = frames.size(2);
  check_frames(frames, "frames", n_v, f, d);
  if (n.has_value()) check_frames(*n, "n", n_v, f, d);
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.is_contiguous() && mask.dim() == 2 && mask.size(0) == n_v &&
                  mask.size(1) == f, "mask must be contiguous bool (K, F)");
  TORCH_CHECK(qk.scalar_type() == at::kFloat && qk.is_contiguous() && qk.size(-1) == d &&
                  (qk.dim() == 2 || (qk.dim() == 3 && qk.size(0) == n_v)),
              "qk must be contiguous float32 (Hh, D), or (K, Hh, D): one a video");
  const int64_t hh = qk.size(-2), qk_stride = qk.dim() == 3 ? hh * d : 0;
  TORCH_CHECK(nbar.scalar_type() == at::kFloat, "nbar must be float32");
  check_frames(nbar, "nbar", n_v, hh, d);
  const float* fr = frames.data_ptr<float>();
  const bool* mk = mask.data_ptr<bool>();
  if (n.has_value() && n->scalar_type() == at::kBFloat16) {
    one_frames_impl(fr, mk, qk.data_ptr<float>(), qk_stride, nbar.data_ptr<float>(),
                    reinterpret_cast<uint16_t*>(n->data_ptr()), n_v, f, d, hh, float(eps));
  } else {
    TORCH_CHECK(!n.has_value() || n->scalar_type() == at::kFloat, "n must be bfloat16 or float32");
    one_frames_impl(fr, mk, qk.data_ptr<float>(), qk_stride, nbar.data_ptr<float>(),
                    n.has_value() ? n->data_ptr<float>() : nullptr, n_v, f, d, hh, float(eps));
  }
}

// p, n (K, F, D) (both bf16 or both float32), mask (K, F) -> xo (K, D) = sum_j om_j n_j and s (K,) = sum_j om_j,
// om_j the mean over real frames i of softmax_j(p_i . n_j) over real frames j (eager.one_token_eager).
template <typename T>
void one_token_impl(const T* p, const T* n, const bool* mk, float* xo, float* s, int64_t n_v, int64_t f, int64_t d) {
  at::parallel_for(0, n_v, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> pb(f * d), nb(f * d), w(f * f), om(f);
    for (int64_t v = begin; v < end; ++v) {
      const bool* real = mk + v * f;
      const T* pv = p + v * f * d;
      const T* nv = n + v * f * d;
      const bool raw = raw_dots(pv, d);
      if (!raw) load_row(pb.data(), pv, f * d);
      load_row(nb.data(), nv, f * d);
      float count = 0.0f;
      for (int64_t i = 0; i < f; ++i) {
        if (!real[i]) continue;  // a padded query frame is not in the mean
        int64_t j = 0;
        if (raw)
          for (; j + 4 <= f; j += 4) dot4_raw(pv + i * d, nv + j * d, d, d, w.data() + i * f + j);
        for (; j < f; ++j)
          w[i * f + j] = raw ? dot_raw(pv + i * d, nv + j * d, d) : dot(pb.data() + i * d, nb.data() + j * d, d);
        masked_softmax_row(w.data() + i * f, real, f);
        count += 1.0f;
      }
      const float inv = 1.0f / (count > 1.0f ? count : 1.0f);
      float total = 0.0f;
      for (int64_t j = 0; j < f; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < f; ++i) acc += real[i] ? w[i * f + j] : 0.0f;
        om[j] = acc * inv;
        total += om[j];
      }
      float* out = xo + v * d;
      std::memset(out, 0, sizeof(float) * d);
      for (int64_t j = 0; j < f; ++j) row_axpy(out, nb.data() + j * d, d, om[j], 0.0f, true);
      s[v] = total;
    }
  });
}

void one_token_(const at::Tensor& p, const at::Tensor& n, const at::Tensor& mask, at::Tensor xo, at::Tensor s) {
  TORCH_CHECK(n.dim() == 3, "n must be (K, F, D)");
  const int64_t n_v = n.size(0), f = n.size(1), d = n.size(2);
  check_frames(p, "p", n_v, f, d);
  check_frames(n, "n", n_v, f, d);
  TORCH_CHECK(p.scalar_type() == n.scalar_type(), "p and n must have one dtype");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.is_contiguous() && mask.dim() == 2 && mask.size(0) == n_v &&
                  mask.size(1) == f, "mask must be contiguous bool (K, F)");
  check_rows(xo, "xo", at::kFloat, n_v, d);
  TORCH_CHECK(xo.is_contiguous() && s.is_contiguous() && s.scalar_type() == at::kFloat && s.numel() == n_v,
              "xo (K, D) and s (K,) must be contiguous float32");
  const bool* mk = mask.data_ptr<bool>();
  if (n.scalar_type() == at::kBFloat16) {
    one_token_impl(reinterpret_cast<const uint16_t*>(p.data_ptr()), reinterpret_cast<const uint16_t*>(n.data_ptr()),
                   mk, xo.data_ptr<float>(), s.data_ptr<float>(), n_v, f, d);
  } else {
    TORCH_CHECK(n.scalar_type() == at::kFloat, "p and n must be bfloat16 or float32");
    one_token_impl(p.data_ptr<float>(), n.data_ptr<float>(), mk, xo.data_ptr<float>(), s.data_ptr<float>(), n_v, f,
                   d);
  }
}

// The row passes between the one-text path's products, bf16 rows in and out (the products' inputs and results),
// float32 inside: LN_attn; LN_out with the probabilistic head's LayerNorm of v_c / |v_c|; the video Gaussian
// from the heads' product (eager.one_norm_eager, one_pooled_eager, one_heads_eager are the specs).

// out <- (x - mean) / sqrt(var + eps) * g + b, x and out float32 (may alias)
inline void ln_row(const float* x, float* out, int64_t d, const float* g, const float* b, float eps) {
  const float mean = row_sum(x, d, 0.0f, false) / float(d);
  const float rs = 1.0f / std::sqrt(row_sum(x, d, mean, true) / float(d) + eps);
  row_axpy(out, x, d, rs, mean, false);
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) out[j] = out[j] * g[j] + b[j];
}

void check_vec(const at::Tensor& t, const char* name, int64_t n) {
  TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, name,
              " must be contiguous float32 (", n, ",)");
}

inline const uint16_t* bf16_ptr(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
inline uint16_t* bf16_ptr(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// out (K, D) bf16 <- LayerNorm(y) with scale g and shift b, y (K, D) bf16
void one_norm_(const at::Tensor& y, const at::Tensor& g, const at::Tensor& b, double eps, at::Tensor out) {
  check_rows(y, "y", at::kBFloat16);
  const int64_t rows = y.size(0), d = y.size(1);
  check_rows(out, "out", at::kBFloat16, rows, d);
  check_vec(g, "g", d);
  check_vec(b, "b", d);
  const uint16_t* yp = bf16_ptr(y);
  uint16_t* op = bf16_ptr(out);
  const int64_t ldy = y.stride(0), ldo = out.stride(0);
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> x(d);
    for (int64_t r = begin; r < end; ++r) {
      load_row(x.data(), yp + r * ldy, d);
      ln_row(x.data(), x.data(), d, g.data_ptr<float>(), b.data_ptr<float>(), float(eps));
      store_row(op + r * ldo, x.data(), d);
    }
  });
}

// v_c = LayerNorm(y; g, b, eps), y (K, D) bf16 -> vx (K, 2D) bf16 <- [v_c | xo] (xo (K, D) float32) and
// h (K, D) bf16 <- LayerNorm(v_c / max(|v_c|, 1e-12); gp, bp, eps_p)
void one_pooled_(const at::Tensor& y, const at::Tensor& g, const at::Tensor& b, double eps, const at::Tensor& gp,
                 const at::Tensor& bp, double eps_p, const at::Tensor& xo, at::Tensor vx, at::Tensor h) {
  check_rows(y, "y", at::kBFloat16);
  const int64_t rows = y.size(0), d = y.size(1);
  check_rows(xo, "xo", at::kFloat, rows, d);
  check_rows(vx, "vx", at::kBFloat16, rows, 2 * d);
  check_rows(h, "h", at::kBFloat16, rows, d);
  for (const at::Tensor* t : {&g, &b, &gp, &bp}) check_vec(*t, "a LayerNorm's scale or shift", d);
  const uint16_t* yp = bf16_ptr(y);
  uint16_t* vp = bf16_ptr(vx);
  uint16_t* hp = bf16_ptr(h);
  const float* xp = xo.data_ptr<float>();
  const int64_t ldy = y.stride(0), ldx = xo.stride(0), ldv = vx.stride(0), ldh = h.stride(0);
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> v(d);
    for (int64_t r = begin; r < end; ++r) {
      load_row(v.data(), yp + r * ldy, d);
      ln_row(v.data(), v.data(), d, g.data_ptr<float>(), b.data_ptr<float>(), float(eps));
      store_row(vp + r * ldv, v.data(), d);
      store_row(vp + r * ldv + d, xp + r * ldx, d);
      const float norm = std::sqrt(row_sum(v.data(), d, 0.0f, true));
      const float inv = 1.0f / (norm > 1e-12f ? norm : 1e-12f);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) v[j] *= inv;
      ln_row(v.data(), v.data(), d, gp.data_ptr<float>(), bp.data_ptr<float>(), float(eps_p));
      store_row(hp + r * ldh, v.data(), d);
    }
  });
}

// The video Gaussian from the heads' product heads (K, 2D + H) bf16 = [mu | lv_raw | target] and the token term
// tokp (K, D) bf16 (W2 v_c + b2 + W1 W_o W_v x_bar): mu (K, D) f32 <- mu; lv (K, D) f32 <- clamp((clamp(lv_raw, lo,
// hi) + tokp + s tok_e + b1) / 2, lo, hi), b1 (D,) or one row a video (K, D: the cached video terms); sigma bf16 <- exp(lv / 2), rows (K, D) or tile-blocked (Kp/16, D/32,
// 16, 32) (the AMX products' input, padding rows 0); target (K, H) bf16 <- target.  sigma, target: optional.
void one_heads_(const at::Tensor& heads, const at::Tensor& tokp, const at::Tensor& s, const at::Tensor& tok_e,
                const at::Tensor& b1, double lo, double hi, at::Tensor mu, at::Tensor lv,
                const c10::optional<at::Tensor>& sigma, const c10::optional<at::Tensor>& target) {
  check_rows(tokp, "tokp", at::kBFloat16);
  const int64_t rows = tokp.size(0), d = tokp.size(1);
  check_rows(heads, "heads", at::kBFloat16, rows);
  const int64_t h = heads.size(1) - 2 * d;
  TORCH_CHECK(h >= 0, "heads must be (K, 2D + H)");
  check_rows(mu, "mu", at::kFloat, rows, d);
  check_rows(lv, "lv", at::kFloat, rows, d);
  check_vec(tok_e, "tok_e", d);
  if (b1.dim() == 2) {
    check_rows(b1, "b1", at::kFloat, rows, d);
  } else {
    check_vec(b1, "b1", d);
  }
  const int64_t ldb = b1.dim() == 2 ? b1.stride(0) : 0;
  check_vec(s, "s", rows);
  const int64_t pp = (rows + 15) / 16 * 16;
  const bool blocked = sigma.has_value() && sigma->dim() == 4;
  if (blocked) {
    TORCH_CHECK(sigma->scalar_type() == at::kBFloat16 && sigma->is_contiguous() && d % 32 == 0 &&
                    sigma->size(0) == pp / 16 && sigma->size(1) == d / 32 && sigma->size(2) == 16 &&
                    sigma->size(3) == 32,
                "a blocked sigma must be contiguous bf16 (Kp/16, D/32, 16, 32), Kp = K rounded up to 16");
  } else if (sigma.has_value()) {
    check_rows(*sigma, "sigma", at::kBFloat16, rows, d);
  }
  if (target.has_value()) check_rows(*target, "target", at::kBFloat16, rows, h);
  uint16_t* sp = sigma.has_value() ? bf16_ptr(const_cast<at::Tensor&>(*sigma)) : nullptr;
  uint16_t* tp = target.has_value() ? bf16_ptr(const_cast<at::Tensor&>(*target)) : nullptr;
  const int64_t lds = sigma.has_value() && !blocked ? sigma->stride(0) : 0, ldt = tp ? target->stride(0) : 0;
  if (blocked)
    for (int64_t r = rows; r < pp; ++r)
      for (int64_t j = 0; j < d; j += 32) std::memset(sp + ((r / 16) * (d / 32) + j / 32) * 512 + (r % 16) * 32, 0, 64);
  const uint16_t* hp = bf16_ptr(heads);
  const uint16_t* kp = bf16_ptr(tokp);
  const int64_t ldh = heads.stride(0), ldk = tokp.stride(0), ldm = mu.stride(0), ldl = lv.stride(0);
  const float flo = float(lo), fhi = float(hi);
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> raw(d), tok(d), sig(d);
    for (int64_t r = begin; r < end; ++r) {
      load_row(mu.data_ptr<float>() + r * ldm, hp + r * ldh, d);
      load_row(raw.data(), hp + r * ldh + d, d);
      load_row(tok.data(), kp + r * ldk, d);
      float* l = lv.data_ptr<float>() + r * ldl;
      const float sr = s.data_ptr<float>()[r];
      const float* e = tok_e.data_ptr<float>();
      const float* c = b1.data_ptr<float>() + r * ldb;
      int64_t j = 0;
#if DAB_BF16_SIMD
      const __m512 vlo = _mm512_set1_ps(flo), vhi = _mm512_set1_ps(fhi), half = _mm512_set1_ps(0.5f);
      for (; j + 16 <= d; j += 16) {
        __m512 t = _mm512_add_ps(clamp_ps(_mm512_loadu_ps(raw.data() + j), vlo, vhi), _mm512_loadu_ps(tok.data() + j));
        t = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(sr), _mm512_loadu_ps(e + j), t), _mm512_loadu_ps(c + j));
        const __m512 x = clamp_ps(_mm512_mul_ps(half, t), vlo, vhi);
        _mm512_storeu_ps(l + j, x);
        _mm512_storeu_ps(sig.data() + j, exp_ps(_mm512_mul_ps(half, x)));  // a bf16 result
      }
#endif
      for (; j < d; ++j) {
        const float rc = is_nan(raw[j]) ? raw[j] : clamp(raw[j], flo, fhi);
        const float t = rc + tok[j] + sr * e[j] + c[j];
        l[j] = is_nan(t) ? t : clamp(0.5f * t, flo, fhi);
        sig[j] = exp_poly(0.5f * l[j]);
      }
      if (blocked) {
        for (int64_t j = 0; j < d; j += 32) store_row(sp + ((r / 16) * (d / 32) + j / 32) * 512 + (r % 16) * 32, sig.data() + j, 32);
      } else if (sp != nullptr) {
        store_row(sp + r * lds, sig.data(), d);
      }
      if (tp != nullptr) std::memcpy(tp + r * ldt, hp + r * ldh + 2 * d, sizeof(uint16_t) * h);
    }
  });
}

}  // namespace

TORCH_LIBRARY(dab_cpu, m) {
  m.def("silu_bf16_(Tensor(a!) x) -> ()");
  m.def("add_silu_bf16_(Tensor(a!) out, Tensor a, Tensor b) -> ()");
  m.def("bridge_update_(Tensor(a!) st, Tensor delta, Tensor(b!) s, float chi, float lo, float hi, int d, "
        "bool write_s) -> ()");
  m.def("pair_heads_(Tensor coef, Tensor g, Tensor basis, Tensor vidx, Tensor vtok, float lo, float hi, "
        "Tensor(a!) mu, Tensor(b!) lv, Tensor(c!) sigma, Tensor(d!) target) -> ()");
  m.def("kl_rows(Tensor mu_v, Tensor lv_v, Tensor st) -> Tensor");
  m.def("kl_lowrank_rows(Tensor mu_v, Tensor lv_v, Tensor u, Tensor texts, Tensor tconst, int rank) -> Tensor");
  m.def("kl_mixture_rows(Tensor mu_v, Tensor lv_v, Tensor texts, Tensor tconst) -> Tensor");
  m.def("one_frames_(Tensor frames, Tensor mask, Tensor qk, float eps, Tensor(a!) nbar, Tensor(b!)? n) -> ()");
  m.def("one_token_(Tensor p, Tensor n, Tensor mask, Tensor(a!) xo, Tensor(b!) s) -> ()");
  m.def("one_norm_(Tensor y, Tensor g, Tensor b, float eps, Tensor(a!) out) -> ()");
  m.def("one_pooled_(Tensor y, Tensor g, Tensor b, float eps, Tensor gp, Tensor bp, float eps_p, Tensor xo, "
        "Tensor(a!) vx, Tensor(b!) h) -> ()");
  m.def("one_heads_(Tensor heads, Tensor tokp, Tensor s, Tensor tok_e, Tensor b1, float lo, float hi, "
        "Tensor(a!) mu, Tensor(b!) lv, Tensor(c!)? sigma, Tensor(d!)? target) -> ()");
}

TORCH_LIBRARY_IMPL(dab_cpu, CPU, m) {
  m.impl("silu_bf16_", &silu_bf16_);
  m.impl("add_silu_bf16_", &add_silu_bf16_);
  m.impl("bridge_update_", &bridge_update_);
  m.impl("pair_heads_", &pair_heads_);
  m.impl("kl_rows", &kl_rows);
  m.impl("kl_lowrank_rows", &kl_lowrank_rows);
  m.impl("kl_mixture_rows", &kl_mixture_rows);
  m.impl("one_frames_", &one_frames_);
  m.impl("one_token_", &one_token_);
  m.impl("one_norm_", &one_norm_);
  m.impl("one_pooled_", &one_pooled_);
  m.impl("one_heads_", &one_heads_);
}
