// Fused elementwise kernels for the bf16 scoring engine on CPU (dab_pipeline/scoring/kernels/cpu.py).
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

// The video side of a block of pairs, from the per-video merged basis (cpu_kernels.pair_heads_eager
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
  const int64_t pp = (rows + 31) / 32 * 32;
  const bool blocked = sigma.dim() == 4;
  if (blocked) {
    TORCH_CHECK(sigma.scalar_type() == at::kBFloat16 && sigma.is_contiguous() && d % 32 == 0 &&
                    sigma.size(0) == pp / 16 && sigma.size(1) == d / 32 && sigma.size(2) == 16 && sigma.size(3) == 32,
                "a blocked sigma must be contiguous bf16 (Pp/16, D/32, 16, 32), Pp = P rounded up to 32");
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
  m.def("add_silu_bf16_(Tensor(a!) out, Tensor a, Tensor b) -> ()");
  m.def("bridge_update_(Tensor(a!) st, Tensor delta, Tensor(b!) s, float chi, float lo, float hi, int d, "
        "bool write_s) -> ()");
  m.def("pair_heads_(Tensor coef, Tensor g, Tensor basis, Tensor vidx, Tensor vtok, float lo, float hi, "
        "Tensor(a!) mu, Tensor(b!) lv, Tensor(c!) sigma, Tensor(d!) target) -> ()");
  m.def("kl_rows(Tensor mu_v, Tensor lv_v, Tensor st) -> Tensor");
}

TORCH_LIBRARY_IMPL(dab_cpu, CPU, m) {
  m.impl("silu_bf16_", &silu_bf16_);
  m.impl("add_silu_bf16_", &add_silu_bf16_);
  m.impl("bridge_update_", &bridge_update_);
  m.impl("pair_heads_", &pair_heads_);
  m.impl("kl_rows", &kl_rows);
}
