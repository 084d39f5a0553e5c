#!/usr/bin/env python
"""Whether an AMX conv's epilogue could hide its tile work: a 1x1 conv's tile program and requantize
epilogue written one after the other, step by step, or software-pipelined.

Evidence for issue 60's CNN rows. ResNet-50's 1x1 convs of 64 input channels (one tile of depth) spend
most of their time in the vector epilogue (requantize and the QDQ residual add, 15 instructions per 16
outputs) and the rest in the tile program; the package's kernel runs the whole task's tile program, then
its epilogue. A C replica of that kernel (1x1 conv, 64 -> 256 channels, 56 x 56 pixels, ``NCHW64c``;
tasks of 224 pixels x 64 channels; 2 x 2 tiles a step) runs in five forms:

* ``task``: as the package writes it (the tile program of a task, then its epilogue);
* ``step``: each step's epilogue right after its tile stores (an L1-sized buffer);
* ``pipelined``: a step's tile program, then the previous step's epilogue (two buffers), so the tile
  engine and the vector units have independent work side by side;
* ``epilogue``: the epilogues alone (over the same task buffers);
* ``tiles``: the tile programs alone;
* ``step_calls``: ``step`` as a kernel of one tile program per step would run it (each step stores the
  caller's tile configuration, loads its own and the step's weight tiles, and loads the caller's back);
* ``pixel_calls``: the same per 32 pixels x 64 channels (both strips a call);
* ``tasks_configured``: ``task`` with the kernel's configuration per task (stored, loaded, loaded back):
  the kernel's form exactly; ``half_tasks_configured``: the same with tasks of 112 pixels (the last step
  of each 16 pixels over, recomputed by the next task).

Times are TSC ticks per conv, best of 5 (``--tsc-ghz`` prints microseconds too). Needs a CPU with
AMX-INT8 and clang or gcc with ``-mamx-int8``.

    PYTHONPATH=. python scripts/probe_amx_epilogue.py --tsc-ghz 2.6 --json docs/benchmarks/data/probe_amx_epilogue.json
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.amx_probe import probe_arguments, probe_rows  # noqa: E402
from tvm_tcutils.bench.results import Results  # noqa: E402

#: The forms, in the order the program runs them (its mode numbers).
VARIANTS = ("task", "step", "pipelined", "epilogue", "tiles", "step_calls", "pixel_calls", "half_tasks_configured",
            "tasks_configured")

PROGRAM = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>
#define PIX 3136
#define TASK 224
#define BLOCKS 4
typedef struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static uint8_t X[PIX * 64] __attribute__((aligned(64)));               /* NCHW64c, one input block */
static int8_t W[BLOCKS][16 * 64 * 4] __attribute__((aligned(64)));    /* OIHW16i64o4i, one tap */
static uint8_t RES[BLOCKS][PIX * 64] __attribute__((aligned(64)));     /* the residual input */
static uint8_t OUT[BLOCKS][PIX * 64] __attribute__((aligned(64)));
static int32_t BIAS[BLOCKS][64] __attribute__((aligned(64)));
static float SCALE[BLOCKS][64] __attribute__((aligned(64)));
static int32_t TASKBUF[TASK * 64] __attribute__((aligned(64)));        /* a task's int32 (57 KB) */
static cfg_t CFG;
static int32_t STEPBUF[2][32 * 64] __attribute__((aligned(64)));       /* a step's, two of them */

/* The residual requantize of 16 outputs (channels c0.., one pixel), as the package's kernels compute it. */
static inline void epilogue16(const int32_t* acc, int block, int c0, int pixel) {
  __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512(acc), _mm512_load_si512(BIAS[block] + c0)));
  v = _mm512_mul_ps(v, _mm512_load_ps(SCALE[block] + c0));
  v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(125.0f)), _mm512_set1_ps(-130.0f));
  v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_mul_ps(v, _mm512_set1_ps(0.373f));
  __m512i r = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i*)(RES[block] + pixel * 64 + c0)));
  __m512 rf = _mm512_cvtepi32_ps(_mm512_sub_epi32(r, _mm512_set1_epi32(129)));
  v = _mm512_fmadd_ps(rf, _mm512_set1_ps(1.94f), v);
  v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(255.0f)), _mm512_setzero_ps());
  v = _mm512_add_ps(v, _mm512_set1_ps(12582912.0f));
  _mm_store_si128((__m128i*)(OUT[block] + pixel * 64 + c0), _mm512_cvtepi32_epi8(_mm512_castps_si512(v)));
}

/* One step: 32 pixels from p0 x 32 channels of strip s; accumulators stored at buf (int32, row pitch bytes). */
static inline void tile_step(int block, int strip, int p0, int32_t* buf, int pitch) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, X + p0 * 64, 64); _tile_loadd(5, X + (p0 + 16) * 64, 64);
  _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
  _tile_stored(0, buf, pitch); _tile_stored(1, buf + 16, pitch);
  _tile_stored(2, (char*)buf + 16 * pitch, pitch); _tile_stored(3, (char*)buf + 16 * pitch + 64, pitch);
  (void)block; (void)strip;
}

static void weights(int block, int strip) {
  _tile_loadd(6, W[block] + strip * 128, 256); _tile_loadd(7, W[block] + strip * 128 + 64, 256);
}

static void step_epilogue(const int32_t* buf, int block, int strip, int p0) {
  for (int p = 0; p < 32; p++) {
    epilogue16(buf + p * 32, block, strip * 32, p0 + p);
    epilogue16(buf + p * 32 + 16, block, strip * 32 + 16, p0 + p);
  }
}

static void run(int mode) {
  for (int block = 0; block < BLOCKS; block++) {
    for (int t0 = 0; t0 < PIX; t0 += TASK) {
      if (mode == 0 || mode == 3 || mode == 4) {
        if (mode != 3)
          for (int strip = 0; strip < 2; strip++) {
            weights(block, strip);
            for (int p = 0; p < TASK; p += 32) tile_step(block, strip, t0 + p, TASKBUF + p * 64 + strip * 32, 256);
          }
        if (mode != 4)
          for (int p = 0; p < TASK; p++)
            for (int c = 0; c < 64; c += 16) epilogue16(TASKBUF + p * 64 + c, block, c, t0 + p);
      } else if (mode == 1) {
        for (int strip = 0; strip < 2; strip++) {
          weights(block, strip);
          for (int p = 0; p < TASK; p += 32) {
            tile_step(block, strip, t0 + p, STEPBUF[0], 128);
            step_epilogue(STEPBUF[0], block, strip, t0 + p);
          }
        }
      } else if (mode == 5) {
        for (int strip = 0; strip < 2; strip++) {
          for (int p = 0; p < TASK; p += 32) {
            cfg_t saved; _tile_storeconfig(&saved); _tile_loadconfig(&CFG);
            weights(block, strip);
            tile_step(block, strip, t0 + p, STEPBUF[0], 128);
            _tile_loadconfig(&saved);
            step_epilogue(STEPBUF[0], block, strip, t0 + p);
          }
        }
      } else if (mode == 7 || mode == 8) {
        /* the kernel's form with its per-task configuration: tasks of 112 (7) or 224 (8) pixels */
        int task = mode == 7 ? 112 : TASK;
        for (int h = 0; h < TASK; h += task) {
          cfg_t saved; _tile_storeconfig(&saved); _tile_loadconfig(&CFG);
          for (int strip = 0; strip < 2; strip++) {
            weights(block, strip);
            for (int p = 0; p < task; p += 32) tile_step(block, strip, t0 + h + p, TASKBUF + p * 64 + strip * 32, 256);
          }
          _tile_loadconfig(&saved);
          for (int p = 0; p < task; p++)
            for (int c = 0; c < 64; c += 16) epilogue16(TASKBUF + p * 64 + c, block, c, t0 + h + p);
        }
      } else if (mode == 6) {
        /* 64 channels a call: both strips of a 32-pixel step, then its epilogue over 64 channels */
        for (int p = 0; p < TASK; p += 32) {
          cfg_t saved; _tile_storeconfig(&saved); _tile_loadconfig(&CFG);
          for (int strip = 0; strip < 2; strip++) {
            weights(block, strip);
            tile_step(block, strip, t0 + p, STEPBUF[0] + strip * 32, 256);
          }
          _tile_loadconfig(&saved);
          for (int q = 0; q < 32; q++)
            for (int c = 0; c < 64; c += 16) epilogue16(STEPBUF[0] + q * 64 + c, block, c, t0 + p + q);
        }
      } else {
        for (int strip = 0; strip < 2; strip++) {
          weights(block, strip);
          int steps = TASK / 32;
          for (int i = 0; i <= steps; i++) {
            if (i < steps) tile_step(block, strip, t0 + i * 32, STEPBUF[i & 1], 128);
            if (i > 0) step_epilogue(STEPBUF[(i - 1) & 1], block, strip, t0 + (i - 1) * 32);
          }
        }
      }
    }
  }
}

int main(int argc, char** argv) {
  int iterations = atoi(argv[1]);
  if (syscall(158, 0x1023, 18) != 0) { fprintf(stderr, "arch_prctl(ARCH_REQ_XCOMP_PERM) refused\n"); return 3; }
  srand(1);
  for (int i = 0; i < PIX * 64; i++) X[i] = rand() & 255;
  for (int b = 0; b < BLOCKS; b++) {
    for (int i = 0; i < 16 * 64 * 4; i++) W[b][i] = (rand() & 255) - 128;
    for (int i = 0; i < PIX * 64; i++) RES[b][i] = rand() & 255;
    for (int c = 0; c < 64; c++) { BIAS[b][c] = (rand() % 6000) - 3000; SCALE[b][c] = 1e-4f * (1 + rand() % 5); }
  }
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  CFG = cfg;
  _tile_loadconfig(&cfg);
  uint64_t check = 0;
  for (int mode = 0; mode < 9; mode++) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      run(mode);
      uint64_t t0 = __rdtsc();
      for (int i = 0; i < iterations; i++) run(mode);
      double ticks = (double)(__rdtsc() - t0) / iterations;
      if (ticks < best) best = ticks;
    }
    uint64_t sum = 0;
    for (int b = 0; b < BLOCKS; b++) for (int i = 0; i < PIX * 64; i++) sum = sum * 31 + OUT[b][i];
    if (mode == 0) check = sum;
    printf("%d %.1f %d\n", mode, best, (mode < 3 || mode > 4) ? sum == check : 1);
  }
  _tile_release();
  return 0;
}
"""


def main(argv=None) -> int:
    args = probe_arguments(__doc__.splitlines()[0], __file__, 200, "convs", argv)
    rows = probe_rows(PROGRAM, args.iterations, ["-mavx512bw"])
    ticks = {VARIANTS[int(mode)]: float(value) for mode, value, _ in rows}
    same = {VARIANTS[int(mode)]: flag == "1" for mode, _, flag in rows}
    if not all(same.values()):
        raise SystemExit(f"the forms wrote different outputs: {same}")
    results = Results(__file__, argv, iterations=args.iterations, tsc_ghz=args.tsc_ghz,
                      conv="1x1, 64 -> 256 channels, 56 x 56, residual requantize")
    base = ticks["task"]
    print(f"{'form':10s} ticks/conv  vs task" + ("   us/conv" if args.tsc_ghz else ""))
    for name, value in ticks.items():
        extra = f"  {value / args.tsc_ghz / 1e3:8.1f}" if args.tsc_ghz else ""
        print(f"{name:10s} {value:10.0f}  x{value / base:.3f}{extra}")
        results.add(form=name, ticks_per_conv=value, ratio=value / base)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
