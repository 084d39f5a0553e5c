#!/usr/bin/env python
"""What bounds a one-depth AMX product (attention scores, K = 64): its int32 output, not its products.

The evidence behind the attention-scores row of docs/benchmarks/dotprod.md. A C replica of the tile
program ``batch_matmul_amx`` runs for a 256 x 64 x 256 product (strips of 2 weight tiles, steps of 2
data tiles, each step zeroing 4 accumulators, one ``tdpbuud`` each, 4 tile stores into rows of 1 KB):

* ``kernel``: as the package writes it;
* ``prefetchw``: the same, asking for the next step's output lines for writing during the products;
* ``streamed``: tiles stored to an L1 scratch, then written out with non-temporal vector stores;
* ``l1_output``: every step stores to the same 4 KB (what the products and loads cost when the output
  stays in L1);
* ``products``: the products alone, no stores.

Times are in TSC ticks per output tile (``--tsc-ghz`` converts them to ns; the ratios do not need it).
Needs a CPU with AMX-INT8 (``amx_int8`` in /proc/cpuinfo) and clang or gcc with ``-mamx-int8``.

    PYTHONPATH=. python scripts/probe_amx_stores.py --json docs/benchmarks/data/probe_amx_stores.json
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.amx_probe import probe_arguments, probe_rows  # noqa: E402
from tvm_tcutils.bench.results import Results  # noqa: E402

#: The variants, in the order the program runs them (its mode numbers).
VARIANTS = ("kernel", "prefetchw", "streamed", "l1_output", "products")

PROGRAM = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>
typedef struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static uint8_t A[256 * 64] __attribute__((aligned(64))), B[256 * 64] __attribute__((aligned(64)));
static int32_t OUT[256 * 256] __attribute__((aligned(64)));
static int32_t SCRATCH[4][256] __attribute__((aligned(64)));
static void step_stores(int mode, int32_t* o) {
  if (mode == 4) return;
  if (mode == 3) o = OUT;
  if (mode == 2) {
    _tile_stored(0, SCRATCH[0], 64); _tile_stored(1, SCRATCH[1], 64);
    _tile_stored(2, SCRATCH[2], 64); _tile_stored(3, SCRATCH[3], 64);
    for (int r = 0; r < 16; r++) {
      _mm512_stream_si512((__m512i*)(o + r * 256), _mm512_load_si512(SCRATCH[0] + r * 16));
      _mm512_stream_si512((__m512i*)(o + r * 256 + 16), _mm512_load_si512(SCRATCH[1] + r * 16));
      _mm512_stream_si512((__m512i*)(o + (r + 16) * 256), _mm512_load_si512(SCRATCH[2] + r * 16));
      _mm512_stream_si512((__m512i*)(o + (r + 16) * 256 + 16), _mm512_load_si512(SCRATCH[3] + r * 16));
    }
    return;
  }
  _tile_stored(0, o, 1024); _tile_stored(1, o + 16, 1024);
  _tile_stored(2, o + 16 * 256, 1024); _tile_stored(3, o + 16 * 256 + 16, 1024);
}
static void run(int mode) {
  for (int strip = 0; strip < 8; strip++) {
    _tile_loadd(6, B + strip * 2048, 64); _tile_loadd(7, B + strip * 2048 + 1024, 64);
    for (int step = 0; step < 8; step++) {
      int32_t* o = OUT + step * 32 * 256 + strip * 32;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      _tile_loadd(4, A + step * 2048, 64); _tile_loadd(5, A + step * 2048 + 1024, 64);
      _tile_dpbuud(0, 4, 6); _tile_dpbuud(1, 4, 7); _tile_dpbuud(2, 5, 6); _tile_dpbuud(3, 5, 7);
      if (mode == 1) {
        int32_t* next = step < 7 ? o + 32 * 256 : OUT + ((strip + 1) % 8) * 32;
        for (int r = 0; r < 32; r++) { _m_prefetchw(next + r * 256); _m_prefetchw(next + r * 256 + 16); }
      }
      step_stores(mode, o);
    }
  }
}
int main(int argc, char** argv) {
  int iterations = atoi(argv[1]);
  if (syscall(158, 0x1023, 18) != 0) { fprintf(stderr, "arch_prctl(ARCH_REQ_XCOMP_PERM) refused\n"); return 3; }
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  for (int mode = 0; mode < 5; mode++) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      run(mode);
      uint64_t t0 = __rdtsc();
      for (int i = 0; i < iterations; i++) run(mode);
      double ticks = (double)(__rdtsc() - t0) / ((double)iterations * 256);
      if (ticks < best) best = ticks;
    }
    printf("%d %.3f\n", mode, best);
  }
  _tile_release();
  return 0;
}
"""


def main(argv=None) -> int:
    args = probe_arguments(__doc__.splitlines()[0], __file__, 2000, "256 x 64 x 256 products", argv)
    program = PROGRAM.replace("#include <unistd.h>", "#include <unistd.h>\n#include <stdlib.h>")
    rows = probe_rows(program, args.iterations, ["-mprfchw"])
    ticks = {VARIANTS[int(mode)]: float(value) for mode, value in rows}
    results = Results(__file__, argv, iterations=args.iterations, tsc_ghz=args.tsc_ghz, product="256x64x256 u8 x u8",
                      tile_bytes=1024)
    base = ticks["kernel"]
    print(f"{'variant':10s} ticks/tile  vs kernel" + ("   ns/tile  output GB/s" if args.tsc_ghz else ""))
    for name, value in ticks.items():
        extra = ""
        if args.tsc_ghz:
            ns = value / args.tsc_ghz
            extra = f"  {ns:8.2f}  {1024 / ns:10.1f}"
        print(f"{name:10s} {value:10.1f}  x{value / base:.2f}{extra}")
        results.add(variant=name, ticks_per_tile=value, ratio=value / base)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
