// AMX tile microbenchmarks behind docs/search.md ("Third session: where a product's time goes"); not part of
// the package.  Needs an AMX-BF16 CPU and Linux.  Build and run:
//
//   g++ -O2 -march=native -fopenmp benchmarks/amx_tiles.cpp -o /tmp/amx_tiles
//   /tmp/amx_tiles rates              # ns a TDPBF16PS with its A / B tiles from L1, L2 or L3 (one core)
//   /tmp/amx_tiles blocking [rows]    # 2 x 2 against 1 x 4..6 tile blockings, a (rows, 1024) x (1024, 1024)
//                                     # product split by columns over 2 threads, 1 or 3 weights cycled
//
// The blocking harness has no epilogue and runs slower than the package's kernel (dab_amx.cpp) in absolute
// terms; it compares blockings with each other only.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct TileConfig { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static void cfg() {
  TileConfig c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
  asm volatile("" : : "r"(&c) : "memory");  // GCC 12's _tile_loadconfig declares only 8 bytes read
  _tile_loadconfig(&c);
}

// One core: 4 TDPBF16PS a step on 2 A and 2 B tiles loaded from working sets of akb / bkb KB.
static void rates_one(size_t akb, size_t bkb) {
  uint16_t* A = (uint16_t*)aligned_alloc(4096, akb * 1024);
  uint16_t* B = (uint16_t*)aligned_alloc(4096, bkb * 1024);
  for (size_t i = 0; i < akb * 512; ++i) A[i] = 0x3f80;
  for (size_t i = 0; i < bkb * 512; ++i) B[i] = 0x3c00;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const int n = 2000000;
    size_t ia = 0, ib = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      _tile_loadd(4, A + ia * 512, 64); _tile_loadd(5, A + (ia + 1) * 512, 64); ia += 2; if (ia + 1 >= akb) ia = 0;
      _tile_loadd(6, B + ib * 512, 64); _tile_loadd(7, B + (ib + 1) * 512, 64); ib += 2; if (ib + 1 >= bkb) ib = 0;
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (4.0 * n));
  }
  printf("A tiles from %6zu KB, B tiles from %6zu KB: %5.2f ns a TDPBF16PS\n", akb, bkb, best);
  free(A); free(B);
}

static void rates() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg();
  _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7); _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const int n = 2000000;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
    best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (4.0 * n));
  }
  printf("tiles in registers: %5.2f ns a TDPBF16PS\n", best);
  const size_t sets[][2] = {{16, 16}, {224, 16}, {1024, 16}, {224, 224}, {16, 1024}, {8192, 16}, {16, 8192}};
  for (auto& s : sets) rates_one(s[0], s[1]);
  _tile_release();
}

static int64_t KT = 32;
// The kernel's blocking (dab_amx.cpp's gemm): 2 x 2 tiles, KC k-tiles a chunk, a 32-column panel at a time.
// Finished blocks go to a scratch tile of acc (no epilogue).
template<int KC>
void v0(const uint16_t* a, const uint16_t* w, int mt, int nt0, int nt1, float* acc) {
  int blocks = (mt + 1) / 2;
  for (int nb = nt0; nb < nt1; nb += 2) {
    const uint16_t* w0 = w + (int64_t)nb * KT * 512; const uint16_t* w1 = w0 + KT * 512;
    for (int k0 = 0; k0 < KT; k0 += KC) {
      bool last = k0 + KC >= KT;
      for (int bi = 0; bi < blocks; ++bi) {
        int ts = 2 * bi; bool half = ts + 1 >= mt;
        const uint16_t* a0 = a + (int64_t)ts * KT * 512; const uint16_t* a1 = a0 + KT * 512;
        float* c = acc + bi * 1024;
        if (k0 == 0) { _tile_zero(0); _tile_zero(1); if (!half) { _tile_zero(2); _tile_zero(3);} }
        else { _tile_loadd(0, c, 64); _tile_loadd(1, c+256, 64); if (!half) { _tile_loadd(2, c+512, 64); _tile_loadd(3, c+768, 64);} }
        for (int kt = k0; kt < k0 + KC; ++kt) {
          _tile_loadd(4, a0 + kt*512, 64); _tile_loadd(6, w0 + kt*512, 64); _tile_loadd(7, w1 + kt*512, 64);
          _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7);
          if (!half) { _tile_loadd(5, a1 + kt*512, 64); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7); }
        }
        if (!last) { _tile_stored(0, c, 64); _tile_stored(1, c+256, 64); if (!half) { _tile_stored(2, c+512, 64); _tile_stored(3, c+768, 64);} continue; }
        float* o = acc + 8*1024; _tile_stored(0, o, 64); _tile_stored(1, o+256, 64);
        if (!half) { _tile_stored(2, o+512, 64); _tile_stored(3, o+768, 64); }
      }
    }
  }
}
// 1 x NR tiles (16 rows x 16 NR columns): each A tile read once a group of NR weight tiles (half the A traffic
// at NR = 4), the group's weight chunk reused from L1.
template<int NR, int KC>
void v1(const uint16_t* a, const uint16_t* w, int mt, int nt0, int nt1, float* acc) {
  for (int nb = nt0; nb < nt1; nb += NR) {
    int nr = std::min(NR, nt1 - nb);
    for (int k0 = 0; k0 < KT; k0 += KC) {
      bool last = k0 + KC >= KT;
      for (int m = 0; m < mt; ++m) {
        const uint16_t* am = a + (int64_t)m * KT * 512;
        float* c = acc + m * NR * 256;
#define LD(j) if (j < nr) { if (k0 == 0) _tile_zero(j); else _tile_loadd(j, c + j*256, 64); }
        LD(0) LD(1) LD(2) LD(3) if (NR > 4) { LD(4) } if (NR > 5) { LD(5) }
        for (int kt = k0; kt < k0 + KC; ++kt) {
#define DP(j, ar, br) if (j < nr) { _tile_loadd(br, w + ((int64_t)(nb+j)*KT + kt)*512, 64); _tile_dpbf16ps(j, ar, br); }
          if constexpr (NR > 5) { _tile_loadd(6, am + kt*512, 64); DP(0,6,7) DP(1,6,7) DP(2,6,7) DP(3,6,7) DP(4,6,7) DP(5,6,7) }
          else { _tile_loadd(5, am + kt*512, 64); DP(0,5,6) DP(1,5,7) DP(2,5,6) DP(3,5,7) if (NR>4) { DP(4,5,6) } }
        }
#define ST(j) if (j < nr) { if (!last) _tile_stored(j, c + j*256, 64); else _tile_stored(j, acc + 16*6*256 + j*256, 64); }
        ST(0) ST(1) ST(2) ST(3) if (NR > 4) { ST(4) } if (NR > 5) { ST(5) }
      }
    }
  }
}

static void blocking(int M) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  const int mt = M / 16, K = 1024, N = 1024, nt = N / 16;
  KT = K / 32;
  std::vector<uint16_t> a((size_t)mt * KT * 512);
  for (auto& x : a) x = 0x3f80 + (rand() & 0x7f);
  std::vector<std::vector<uint16_t>> ws(3);
  for (auto& w : ws) { w.resize((size_t)nt * KT * 512); for (auto& x : w) x = 0x3c00 + (rand() & 0x7f); }
  const char* names[] = {"2x2 kc8", "2x2 kc4", "1x4 kc8", "1x4 kc4", "1x5 kc4", "1x6 kc4", "1x4 kc2", "1x6 kc2"};
  for (int nw : {3, 1})
    for (int v = 0; v < 8; ++v) {
      double best = 1e9;
      for (int it = 0; it < 7; ++it) {
        const int iters = 60;
        auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
        {
          cfg();
          alignas(64) static thread_local float acc[16 * 6 * 256 + 8 * 1024 + 1024];
          const int t = omp_get_thread_num(), n0 = t * nt / 2, n1 = (t + 1) * nt / 2;
          for (int i = 0; i < iters; ++i) {
            const uint16_t* w = ws[i % nw].data();
            switch (v) {
              case 0: v0<8>(a.data(), w, mt, n0, n1, acc); break;
              case 1: v0<4>(a.data(), w, mt, n0, n1, acc); break;
              case 2: v1<4, 8>(a.data(), w, mt, n0, n1, acc); break;
              case 3: v1<4, 4>(a.data(), w, mt, n0, n1, acc); break;
              case 4: v1<5, 4>(a.data(), w, mt, n0, n1, acc); break;
              case 5: v1<6, 4>(a.data(), w, mt, n0, n1, acc); break;
              case 6: v1<4, 2>(a.data(), w, mt, n0, n1, acc); break;
              case 7: v1<6, 2>(a.data(), w, mt, n0, n1, acc); break;
            }
#pragma omp barrier
          }
          _tile_release();
        }
        best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      printf("rows %d, %d weight(s) cycled, %-8s %7.1f us a product\n", M, nw, names[v], best);
    }
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "rates";
  if (mode == "rates") rates();
  else if (mode == "blocking") {
    const int rows = argc > 2 ? atoi(argv[2]) : 112;
    if (rows <= 0 || rows % 16) { fprintf(stderr, "rows must be a positive multiple of 16, got %s\n", argv[2]); return 2; }
    blocking(rows);
  }
  else { fprintf(stderr, "usage: amx_tiles rates | blocking [rows]\n"); return 2; }
  return 0;
}
