// The bf16 bridge's products on AMX tiles with the elementwise work in their epilogues
// (dab_pipeline/scoring/kernels/cpu.py loads it with dab_cpu.cpp; engines/bridge_runner.py runs it).
//
// With oneDNN's products the passes between them (SiLU, the state update) read their
// 1,369 x 1,024 blocks back from L3; here each 32 x 32 output block is finished while it is in
// L1: bias (+ the pair's target block) + SiLU, or the bridge's state update.  Activations
// that feed a next product are written in a tile-blocked layout, (P/16, K/32, 16, 32) with
// every 16 x 32 tile contiguous, so the next product loads each A tile as one 1 KB run.
// Weights are packed once into VNNI tiles.  Each thread takes a range of 16-row tiles, cut into
// 32-row blocks (and a 16-row one where the range is odd), in groups of 8 blocks; for each
// 32-column panel of the weights it runs K in chunks of 8 tiles (the panel's chunk, 16 KB, stays
// in L1 while the group's rows stream from L2), accumulators parked in a per-thread buffer
// between chunks.  Rows are padded to a multiple of 16 (the padding is computed, never read
// back); K and N must be multiples of 32.  Built only where the compiler targets AMX
// (-march=native on such a CPU); elsewhere amx_available() is false and the oneDNN path runs.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512DQ__)
#define DAB_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define DAB_AMX 0
#endif

namespace {

struct GemmArgs {
  const uint16_t* a;  // blocked (Pp/16, K/32, 16, 32)
  const uint16_t* w;  // packed (N/16, K/32, 16, 32)
  const float* bias;  // (N,)
  int64_t pp, k, n;
  // kSilu / kSiluTarget: out blocked (Pp/16, N/32, 16, 32); target (P, N) bf16 row-major, not read for the
  // padding rows (>= p), whose outputs are never read back
  // kAddTo: target (rows < p) <- bf16(v), v = target + a @ w^T + bias, in place, row-major, and out (blocked)
  // <- silu(v + init[row % init_rows]) (init: the first step's per-text rows), 0 for the padding
  uint16_t* out;
  const uint16_t* target;
  int64_t p, ld_target;
  // kUpdate: st (Pp, N) float32 -= chi * (a @ w^T + bias); columns >= d are logvar / 2, clamped to
  // [lo, hi]; with write_s, s (blocked, like out) <- bf16([mu, exp(logvar / 2)])
  float* st;
  const float* init;  // kUpdate: if set, the state before this step is init[row % init_rows] (the first step);
                      // kAddTo: if set, the first step's per-text block (see above)
  int64_t init_rows, ld_init;
  int64_t d;
  float chi, lo, hi;
  bool write_s;
};

#if DAB_AMX
inline __m512 bf16_to_ps(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
inline __m512 load_bf16(const uint16_t* p) { return bf16_to_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void store_bf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

// 2^t and SiLU as in dab_cpu.cpp (results rounded to bf16), for amx_add_silu_blocked, which matches
// that kernel bit for bit.
inline __m512 exp2_ps(__m512 t) {
  const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, k);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(9.5828531440e-03f), f, _mm512_set1_ps(5.5906426730e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4024098623e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9312419315e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}
inline __m512 silu_ps(__m512 v) {
  const __m512 e = exp2_ps(_mm512_max_ps(_mm512_mul_ps(v, _mm512_set1_ps(-1.44269504088896341f)),
                                         _mm512_set1_ps(-150.0f)));
  return _mm512_mul_ps(v, _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}
// The epilogues' cheaper forms (their results are rounded to bf16: up to 2^-8 relative): 2^t as
// 2^floor(t) p(t - floor(t)), p of degree 3 on [0, 1) (relative error 7.6e-5), in six instructions;
// SiLU on it in nine.  Large |t| give 0 or inf exactly, so SiLU needs no clamp of its argument.
inline __m512 exp2_lean(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, 0x09);  // t - floor(t), in [0, 1)
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.07803003489971161f), f, _mm512_set1_ps(0.2260730266571045f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6958237290382385f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999268054962158f));
  return _mm512_scalef_ps(p, t);  // p 2^floor(t)
}
inline __m512 silu_lean(__m512 v) {
  const __m512 e = exp2_lean(_mm512_mul_ps(v, _mm512_set1_ps(-1.44269504088896341f)));
  return _mm512_mul_ps(v, _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}
// min(hi, max(lo, v)) with a NaN v kept, found by its bits: the build's -ffinite-math-only lets the compiler
// reorder MAXPS / MINPS operands (which decides what they return for NaN) and drop a floating-point NaN test
inline __m512 clamp_ps(__m512 v, __m512 lo, __m512 hi) {
  const __m512i mag = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_ps(_mm512_min_ps(_mm512_max_ps(v, lo), hi), nan, v);
}

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool request_amx() {  // Linux: the process asks once for the AMX tile state (oneDNN does the same)
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// 0-3: 16 x 16 float32 results; 4-5: 16 x 32 bf16 rows; 6-7: VNNI pairs.  GCC 12's _tile_loadconfig
// tells the compiler it reads only the first 8 bytes of the config, so the stores of the rows and
// columns may be dropped as dead: a build where this function was not inlined loaded garbage rows,
// and the first TILEZERO raised SIGILL.  The barrier makes the whole config live; noinline keeps the
// tests on that path, so that a compiler which drops the stores fails them instead of one build.
__attribute__((noinline)) void load_tile_config() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  asm volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

enum class Epilogue { kSilu, kSiluTarget, kUpdate, kAddTo };

inline int64_t st_offset(const GemmArgs& g, int64_t row, int64_t c0) { return row * g.n + c0; }

// Rows [rb, re) of a finished 32 x 32 block (rows r0.., columns c0..) of v = acc + bias, in buf
// (32 x 32 float32).  v stays float32 until the result is stored: the target block and SiLU, or the
// state update, act on the float32 sums (oneDNN's path rounds its product to bf16 first).
// m0 = r0 % init_rows (with init): the rows' init rows follow without a division each.
template <Epilogue E>
void finish_rows(const GemmArgs& g, const float* buf, int64_t r0, int64_t c0, int rb, int re, int64_t m0) {
  const __m512 b0 = _mm512_loadu_ps(g.bias + c0), b1 = _mm512_loadu_ps(g.bias + c0 + 16);
  const int64_t tiles_k = g.n / 32;
  int64_t m = m0 + rb;  // (r0 + r) % init_rows
  while (g.init != nullptr && m >= g.init_rows) m -= g.init_rows;
  for (int r = rb; r < re; ++r, m = m + 1 == g.init_rows ? 0 : m + 1) {
    const int64_t row = r0 + r;
    __m512 v0 = _mm512_add_ps(_mm512_load_ps(buf + r * 32), b0);
    __m512 v1 = _mm512_add_ps(_mm512_load_ps(buf + r * 32 + 16), b1);
    const int64_t off = ((row / 16) * tiles_k + c0 / 32) * 512 + (row % 16) * 32;
    if constexpr (E == Epilogue::kAddTo) {
      if (row < g.p) {
        uint16_t* t = const_cast<uint16_t*>(g.target) + row * g.ld_target + c0;
        v0 = _mm512_add_ps(v0, load_bf16(t));
        v1 = _mm512_add_ps(v1, load_bf16(t + 16));
        _mm512_storeu_si512(t, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
        const float* f = g.init + m * g.ld_init + c0;
        v0 = silu_lean(_mm512_add_ps(v0, _mm512_loadu_ps(f)));
        v1 = silu_lean(_mm512_add_ps(v1, _mm512_loadu_ps(f + 16)));
        _mm512_storeu_si512(g.out + off, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
      } else {
        _mm512_storeu_si512(g.out + off, _mm512_setzero_si512());
      }
    } else if constexpr (E == Epilogue::kUpdate) {
      float* srow = g.st + st_offset(g, row, c0);
      const float* src = g.init == nullptr ? srow : g.init + m * g.ld_init + c0;
      const __m512 chi = _mm512_set1_ps(g.chi);
      __m512 s0 = _mm512_fnmadd_ps(chi, v0, _mm512_loadu_ps(src));
      __m512 s1 = _mm512_fnmadd_ps(chi, v1, _mm512_loadu_ps(src + 16));
      const bool logvar = c0 >= g.d;  // d is a multiple of 32: a block is all mu or all logvar / 2
      if (logvar) {
        const __m512 lo = _mm512_set1_ps(g.lo), hi = _mm512_set1_ps(g.hi);
        s0 = clamp_ps(s0, lo, hi);
        s1 = clamp_ps(s1, lo, hi);
      }
      _mm512_storeu_ps(srow, s0);
      _mm512_storeu_ps(srow + 16, s1);
      if (g.write_s) {
        const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
        const __m512 o0 = logvar ? exp2_lean(_mm512_mul_ps(s0, log2e)) : s0;
        const __m512 o1 = logvar ? exp2_lean(_mm512_mul_ps(s1, log2e)) : s1;
        _mm512_storeu_si512(g.out + off, (__m512i)_mm512_cvtne2ps_pbh(o1, o0));
      }
    } else {
      if constexpr (E == Epilogue::kSiluTarget) {
        if (row < g.p) {
          const uint16_t* t = g.target + row * g.ld_target + c0;
          v0 = _mm512_add_ps(v0, load_bf16(t));
          v1 = _mm512_add_ps(v1, load_bf16(t + 16));
        }
      }
      _mm512_storeu_si512(g.out + off, (__m512i)_mm512_cvtne2ps_pbh(silu_lean(v1), silu_lean(v0)));
    }
  }
}

// Rows [rb, rb + n) of the epilogue's row-major inputs for block (r0, c0) towards L2 while its
// products run: the float32 state (update) or the target block (first layer), 32 columns a row.
template <Epilogue E>
inline void prefetch_inputs(const GemmArgs& g, int64_t r0, int64_t c0, int rb, int n, int rows) {
  for (int r = rb; r < std::min(rows, rb + n); ++r) {
    if constexpr (E == Epilogue::kUpdate) {
      // st: read and written, or (the first step) only written; init's few rows stay in cache
      const char* p = reinterpret_cast<const char*>(g.st + st_offset(g, r0 + r, c0));
      _mm_prefetch(p, _MM_HINT_T1);
      _mm_prefetch(p + 64, _MM_HINT_T1);
    } else if constexpr (E == Epilogue::kSiluTarget || E == Epilogue::kAddTo) {
      if (r0 + r < g.p) _mm_prefetch(reinterpret_cast<const char*>(g.target + (r0 + r) * g.ld_target + c0), _MM_HINT_T1);

    }
  }
}

// A finished block waiting for its epilogue, which runs a few rows at a time between the next
// block's tile products, so that the vector work overlaps the AMX unit's instead of following it.
struct Pending {
  float* buf = nullptr;
  int64_t r0 = 0, c0 = 0;
  int done = 0, rows = 0;  // rows finished of the block's rows (32, or 16 for a half block); done == rows: none
  int64_t m0 = 0;  // r0 % init_rows, where the epilogue reads init
};

template <Epilogue E>
void gemm(const GemmArgs& g) {
  const int64_t kt_n = g.k / 32;
  constexpr int64_t kChunk = 8;  // k-tiles a pass: a 16 KB chunk of a weight panel, reused from L1
  constexpr int64_t kGroup = 8;  // blocks a group: 256 rows, 512 KB of A at K = 1,024
  // Threads take ranges of 16-row tiles, so that an odd number of 32-row blocks still splits evenly
  // (1,369 rows: 86 tiles, 43 a thread, instead of 22 and 21 blocks); a range is cut into 32-row blocks
  // from its start, the last one a 16-row half block when the range has an odd number of tiles.  Below
  // kSplitRows rows a thread, where streaming the weights through each core costs more than the products
  // (one query's shortlist of 100 videos), the threads take ranges of the weights' 32-column panels instead,
  // every row each, so that each core reads only its part of the weights.
  constexpr int64_t kSplitRows = 256;
  const int64_t tiles = g.pp / 16, panels = g.n / 32;
  const int threads = at::get_num_threads();
  const int64_t col_parts = threads > 1 && g.pp < kSplitRows * threads ? std::min<int64_t>(threads, panels) : 1;
  at::parallel_for(0, col_parts > 1 ? col_parts : tiles, 1, [&](int64_t a0, int64_t a1) {
    const int64_t t0 = col_parts > 1 ? 0 : a0, t1 = col_parts > 1 ? tiles : a1;
    const int64_t nb0 = col_parts > 1 ? a0 * panels / col_parts : 0;
    const int64_t nb1 = col_parts > 1 ? a1 * panels / col_parts : panels;
    load_tile_config();
    alignas(64) float buf[32 * 32];  // the finished block; its epilogue is done before the next one is stored
    Pending pend;
    auto finish_some = [&](int rows) {
      if (pend.done >= pend.rows) return;
      const int re = std::min(pend.rows, pend.done + rows);
      finish_rows<E>(g, pend.buf, pend.r0, pend.c0, pend.done, re, pend.m0);
      pend.done = re;
    };
    alignas(64) float acc[kGroup * 1024];
    const int64_t blocks = (t1 - t0 + 1) / 2;
    for (int64_t g0 = 0; g0 < blocks; g0 += kGroup) {  // a group's rows stay in L2 while all the weights pass
    const int64_t g1 = std::min(blocks, g0 + kGroup);
    for (int64_t nb = nb0; nb < nb1; ++nb) {
      const uint16_t* w0 = g.w + (2 * nb) * kt_n * 512;
      const uint16_t* w1 = w0 + kt_n * 512;
      for (int64_t k0 = 0; k0 < kt_n; k0 += kChunk) {
        const int64_t k1 = std::min(kt_n, k0 + kChunk);
        const bool last = k1 == kt_n;
        const int rows_per_kt = int((32 + (k1 - k0) - 1) / (k1 - k0));
        for (int64_t bi = g0; bi < g1; ++bi) {
          const int64_t ts = t0 + 2 * bi;  // the block's first tile
          const bool half = ts + 1 >= t1;
          const int rows = half ? 16 : 32;
          const uint16_t* a0 = g.a + ts * kt_n * 512;
          const uint16_t* a1 = a0 + kt_n * 512;
          float* c = acc + (bi - g0) * 1024;
          if (k0 == 0) {
            _tile_zero(0); _tile_zero(1);
            if (!half) { _tile_zero(2); _tile_zero(3); }
          } else {
            _tile_loadd(0, c, 64); _tile_loadd(1, c + 256, 64);
            if (!half) { _tile_loadd(2, c + 512, 64); _tile_loadd(3, c + 768, 64); }
          }
          for (int64_t kt = k0; kt < k1; ++kt) {
            _tile_loadd(4, a0 + kt * 512, 64);
            _tile_loadd(6, w0 + kt * 512, 64);
            _tile_loadd(7, w1 + kt * 512, 64);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            if (!half) {
              _tile_loadd(5, a1 + kt * 512, 64);
              _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
            }
            finish_some(rows_per_kt);  // the previous block's epilogue, while these products run
            if (last) prefetch_inputs<E>(g, ts * 16, nb * 32, int(kt - k0) * rows_per_kt, rows_per_kt, rows);
          }
          if (!last) {
            _tile_stored(0, c, 64); _tile_stored(1, c + 256, 64);
            if (!half) { _tile_stored(2, c + 512, 64); _tile_stored(3, c + 768, 64); }
            continue;
          }
          finish_some(32);
          _tile_stored(0, buf, 128); _tile_stored(1, buf + 16, 128);
          if (!half) { _tile_stored(2, buf + 512, 128); _tile_stored(3, buf + 528, 128); }
          pend = Pending{buf, ts * 16, nb * 32, 0, rows, g.init != nullptr ? ts * 16 % g.init_rows : 0};
        }
      }
    }
    }
    finish_some(32);
    _tile_release();
  });
}
#endif  // DAB_AMX

void check_blocked(const at::Tensor& t, const char* name, int64_t tiles_m, int64_t tiles_k) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.is_contiguous() && t.dim() == 4 && t.size(0) == tiles_m &&
                  t.size(1) == tiles_k && t.size(2) == 16 && t.size(3) == 32,
              name, " must be contiguous bf16 (", tiles_m, ", ", tiles_k, ", 16, 32)");
}

bool amx_available() {
#if DAB_AMX
  return request_amx();
#else
  return false;
#endif
}

// w (N, K) bf16 -> (N/16, K/32, 16, 32): tile [nt][kt] row r holds, for n = nt*16 + c, the pair
// (w[n][kt*32 + 2r], w[n][kt*32 + 2r + 1]) at columns 2c, 2c + 1 (the VNNI layout of a B tile).
at::Tensor amx_pack_weight(const at::Tensor& w) {
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && n % 32 == 0 && k % 32 == 0,
              "w must be bf16 (N, K) with N and K multiples of 32");
  return w.contiguous().view({n / 16, 16, k / 32, 16, 2}).permute({0, 2, 3, 1, 4}).contiguous()
      .view({n / 16, k / 32, 16, 32});
}

// x (P, K) bf16 row-major -> blocked (Pp/16, K/32, 16, 32), Pp = P rounded up to 16, padding rows 0.
at::Tensor amx_block_rows(const at::Tensor& x) {
  const int64_t p = x.size(0), k = x.size(1), pp = (p + 15) / 16 * 16;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && k % 32 == 0, "x must be bf16 (P, K), K % 32 == 0");
  at::Tensor padded = x;
  if (pp != p) {
    padded = at::zeros({pp, k}, x.options());
    padded.narrow(0, 0, p).copy_(x);
  }
  return padded.contiguous().view({pp / 16, 16, k / 32, 32}).permute({0, 2, 1, 3}).contiguous();
}

// The checks and fields every product op shares: a blocked (Pp/16, K/32, 16, 32) bf16, w packed
// (N/16, K/32, 16, 32) bf16, bias (N,) float32 (or null: no bias).
GemmArgs product_args(const at::Tensor& a, const at::Tensor& w, const at::Tensor* bias) {
  TORCH_CHECK(amx_available(), "AMX is not available in this build or process");
  const int64_t tiles_m = a.size(0), kt = a.size(1), n = w.size(0) * 16;
  check_blocked(a, "a", tiles_m, kt);
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.dim() == 4 && w.size(1) == kt &&
                  w.size(2) == 16 && w.size(3) == 32 && n % 32 == 0,
              "w must be a packed weight (N/16, K/32, 16, 32) bf16 with K matching a and N a multiple of 32");
  TORCH_CHECK(bias == nullptr || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n),
              "bias must be contiguous float32 (N,)");
  GemmArgs g{};
  g.a = reinterpret_cast<const uint16_t*>(a.data_ptr());
  g.w = reinterpret_cast<const uint16_t*>(w.data_ptr());
  g.bias = bias == nullptr ? nullptr : bias->data_ptr<float>();
  g.pp = tiles_m * 16;
  g.k = kt * 32;
  g.n = n;
  return g;
}

// target (P, N) bf16 with unit inner stride, P <= Pp, rows not overlapping; into g.
void set_target(GemmArgs& g, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kBFloat16 && t.size(1) == g.n && t.stride(1) == 1 &&
                  t.stride(0) >= g.n && t.size(0) <= g.pp,
              "target must be bf16 (P, N), P <= the padded rows, unit inner stride, rows not overlapping");
  g.target = reinterpret_cast<const uint16_t*>(t.data_ptr());
  g.p = t.size(0);
  g.ld_target = t.stride(0);
}

// per-text rows t (Mb, N) float32, unit inner stride, that row r reads as t[r % Mb]; into g.
void set_init(GemmArgs& g, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.size(1) == g.n && t.stride(1) == 1 && t.size(0) > 0,
              name, " must be float32 (Mb, N) with unit inner stride");
  g.init = t.data_ptr<float>();
  g.init_rows = t.size(0);
  g.ld_init = t.stride(0);
}

// h <- silu(a @ w^T + bias [+ target]) as a blocked (Pp/16, N/32, 16, 32) bf16 tensor (one rounding).
at::Tensor amx_linear_silu(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias,
                           const c10::optional<at::Tensor>& target) {
  GemmArgs g = product_args(a, w, &bias);
  at::Tensor out = at::empty({a.size(0), g.n / 32, 16, 32}, a.options());
  g.out = reinterpret_cast<uint16_t*>(out.data_ptr());
#if DAB_AMX
  if (target.has_value()) {
    set_target(g, *target);
    gemm<Epilogue::kSiluTarget>(g);
  } else {
    gemm<Epilogue::kSilu>(g);
  }
#endif
  return out;
}

// The bridge's first step straight into the tile-blocked layout: row r < P of the result is
// silu(bf16(a[r] + b[r % Mb])) (a (P, H) bf16, b (Mb, H) float32, as add_silu_bf16_), rows P..Pp-1
// are 0; (Pp/16, H/32, 16, 32) with Pp = P rounded up to 16.
at::Tensor amx_add_silu_blocked(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(amx_available(), "AMX is not available in this build or process");
  TORCH_CHECK(a.dim() == 2 && a.scalar_type() == at::kBFloat16 && a.stride(1) == 1, "a must be bf16 (P, H)");
  TORCH_CHECK(b.dim() == 2 && b.scalar_type() == at::kFloat && b.stride(1) == 1 && b.size(1) == a.size(1) &&
                  b.size(0) > 0, "b must be float32 (Mb, H)");
  const int64_t p = a.size(0), h = a.size(1), pp = (p + 15) / 16 * 16, mb = b.size(0);
  TORCH_CHECK(h % 32 == 0, "H must be a multiple of 32");
  at::Tensor out = at::empty({pp / 16, h / 32, 16, 32}, a.options());
#if DAB_AMX
  const uint16_t* ap = reinterpret_cast<const uint16_t*>(a.data_ptr());
  const float* bp = b.data_ptr<float>();
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t lda = a.stride(0), ldb = b.stride(0), tiles_k = h / 32;
  at::parallel_for(0, pp / 16, 1, [&](int64_t t0, int64_t t1) {  // 16-row tiles: each written as whole KBs
    for (int64_t kt_r = t0 * tiles_k; kt_r < t1 * tiles_k; ++kt_r)
      for (int64_t r = (kt_r / tiles_k) * 16; r < (kt_r / tiles_k) * 16 + 16; ++r) {
        const int64_t kt = kt_r % tiles_k;
        uint16_t* dst = op + ((r / 16) * tiles_k + kt) * 512 + (r % 16) * 32;
        if (r >= p) {
          std::memset(dst, 0, 64);
          continue;
        }
        const uint16_t* x = ap + r * lda + kt * 32;
        const float* y = bp + (r % mb) * ldb + kt * 32;
        const __m512 v0 = bf16_to_ps((__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(load_bf16(x), _mm512_loadu_ps(y))));
        const __m512 v1 = bf16_to_ps((__m256i)_mm512_cvtneps_pbh(
            _mm512_add_ps(load_bf16(x + 16), _mm512_loadu_ps(y + 16))));
        _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(silu_ps(v1), silu_ps(v0)));
      }
  });
#endif
  return out;
}

// target (P, N) bf16 <- bf16(v), v = target + a @ w^T, in place: the last block of the bridge's first layer
// that a pair adds to its target (the sigma_v block of DAB); and the bridge's first step straight from it:
// returns h (Pp/16, N/32, 16, 32) bf16, row r < P silu(v[r] + first[r % Mb]) with v[r] before its rounding
// (first (Mb, N) float32: the per-text block with its time feature and bias), the padding rows 0.
at::Tensor amx_linear_add_first_(const at::Tensor& a, const at::Tensor& w, at::Tensor target, const at::Tensor& first) {
  GemmArgs g = product_args(a, w, nullptr);
  set_target(g, target);
  set_init(g, first, "first");
  const at::Tensor zero = at::zeros({g.n}, target.options().dtype(at::kFloat));
  at::Tensor out = at::empty({a.size(0), g.n / 32, 16, 32}, a.options());
  g.bias = zero.data_ptr<float>();
  g.out = reinterpret_cast<uint16_t*>(out.data_ptr());
#if DAB_AMX
  gemm<Epilogue::kAddTo>(g);
#endif
  return out;
}

// st (Pp, N) float32 -= chi * (a @ w^T + bias), in float32; columns >= d clamped to [lo, hi]; with
// write_s, s (blocked (Pp/16, N/32, 16, 32) bf16) <- [mu, exp(st[:, d:])].
// With init (Mb, N) float32, the state before the update is init[r % Mb] instead of st[r] (the
// first step: a grid's M texts repeat for every video), so st needs no initial fill; every row of
// st, padding included, is written.
void amx_linear_update_(const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias, at::Tensor st,
                        at::Tensor s, double chi, double lo, double hi, int64_t d, bool write_s,
                        const c10::optional<at::Tensor>& init) {
  GemmArgs g = product_args(a, w, &bias);
  check_blocked(s, "s", a.size(0), g.n / 32);
  TORCH_CHECK(d % 32 == 0 && d > 0 && d <= g.n, "d must be a multiple of 32 in (0, N]");
  TORCH_CHECK(st.scalar_type() == at::kFloat && st.is_contiguous() && st.dim() == 2 && st.size(0) == g.pp &&
                  st.size(1) == g.n, "st must be contiguous float32 (Pp, N)");
  g.out = reinterpret_cast<uint16_t*>(s.data_ptr());
  g.st = st.data_ptr<float>();
  g.d = d;
  g.chi = float(chi);
  g.lo = float(lo);
  g.hi = float(hi);
  g.write_s = write_s;
  if (init.has_value()) set_init(g, *init, "init");
#if DAB_AMX
  gemm<Epilogue::kUpdate>(g);
#endif
}

}  // namespace

TORCH_LIBRARY(dab_amx, m) {
  m.def("amx_available() -> bool", &amx_available);
  m.def("amx_pack_weight(Tensor w) -> Tensor");
  m.def("amx_block_rows(Tensor x) -> Tensor");
  m.def("amx_linear_silu(Tensor a, Tensor w, Tensor bias, Tensor? target=None) -> Tensor");
  m.def("amx_add_silu_blocked(Tensor a, Tensor b) -> Tensor");
  m.def("amx_linear_add_first_(Tensor a, Tensor w, Tensor(a!) target, Tensor first) -> Tensor");
  m.def("amx_linear_update_(Tensor a, Tensor w, Tensor bias, Tensor(a!) st, Tensor(b!) s, float chi, float lo, "
        "float hi, int d, bool write_s, Tensor? init=None) -> ()");
}

TORCH_LIBRARY_IMPL(dab_amx, CPU, m) {
  m.impl("amx_pack_weight", &amx_pack_weight);
  m.impl("amx_block_rows", &amx_block_rows);
  m.impl("amx_linear_silu", &amx_linear_silu);
  m.impl("amx_add_silu_blocked", &amx_add_silu_blocked);
  m.impl("amx_linear_add_first_", &amx_linear_add_first_);
  m.impl("amx_linear_update_", &amx_linear_update_);
}
