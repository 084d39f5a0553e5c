#!/usr/bin/env python
"""How much a conv tile's epilogue costs next to its vpdpbusd, written after the products or among them.

The evidence behind ``tvm_tcutils.dotprod.pipeline``. One loop iteration is a tile of 8 accumulator
registers x 16 ``vpdpbusd`` steps (a 1x1 conv with 64 input channels), plus the epilogue of 8
registers: ``none`` (bias, scale, clip, round, 8-bit store: what a requantized conv ends in) or
``residual`` (the same plus the QDQ residual add: the package's 19 instructions per register; 17 in
``residual_nearbyint``, the conv's rounding as one instruction, as ``dotprod.rounding`` writes it). The
epilogue is placed either after the products (``clumped``: what the schedule's loop nest gives;
each register's epilogue needs its last product) or spread among the next tile's products
(``interleaved``: the pipelined loop). The script writes the loops in assembly, compiles them with
the C compiler (``cc``), runs each ``--iterations`` times and prints cycles per 128 products at
``--ghz`` (the ratio to the products alone does not depend on it). x86-64 with AVX-512 VNNI only.

With ``--ops``, each instruction kind of the epilogues is also timed alone: 16, 32 and 48 independent
copies (no chain between them, none on the accumulators) spread among the 128 products. An instruction
that takes no execution port the dot product needs costs nothing until the machine's other limits are
reached; one that shares the dot product's ports adds its own cycles.

    PYTHONPATH=. python scripts/probe_epilogue_overlap.py --ops --json docs/benchmarks/data/probe_epilogue_overlap.json
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402

#: Epilogue of one accumulator register: {a} the register, {t} a temporary, {off} its output offset.
#: Constants sit in zmm24-31 (scale, bounds, rounding shift, zero points), as the kernels keep them.
EPILOGUES = {
    "none": ["vpsubd %zmm30, %zmm{a}, %zmm{a}", "vcvtdq2ps %zmm{a}, %zmm{a}", "vmulps %zmm29, %zmm{a}, %zmm{a}",
             "vminps %zmm28, %zmm{a}, %zmm{a}", "vmaxps %zmm27, %zmm{a}, %zmm{a}", "vaddps %zmm26, %zmm{a}, %zmm{a}",
             "vpmovdb %zmm{a}, %xmm{a}", "vpaddb %xmm31, %xmm{a}, %xmm{a}", "vmovdqa64 %xmm{a}, {off}(%rdi)"],
    "residual": ["vpaddd %zmm30, %zmm{a}, %zmm{a}", "vcvtdq2ps %zmm{a}, %zmm{a}", "vmulps %zmm29, %zmm{a}, %zmm{a}",
                 "vminps %zmm28, %zmm{a}, %zmm{a}", "vmaxps %zmm27, %zmm{a}, %zmm{a}",
                 "vaddps %zmm26, %zmm{a}, %zmm{a}", "vpaddd %zmm25, %zmm{a}, %zmm{a}", "vcvtdq2ps %zmm{a}, %zmm{a}",
                 "vmulps %zmm24, %zmm{a}, %zmm{a}", "vpmovzxbd {off}(%rsi), %zmm{t}",
                 "vpaddd %zmm25, %zmm{t}, %zmm{t}", "vcvtdq2ps %zmm{t}, %zmm{t}",
                 "vfmadd231ps %zmm{t}, %zmm29, %zmm{a}", "vminps %zmm28, %zmm{a}, %zmm{a}",
                 "vmaxps %zmm27, %zmm{a}, %zmm{a}", "vaddps %zmm26, %zmm{a}, %zmm{a}", "vpmovdb %zmm{a}, %xmm{a}",
                 "vpxorq %xmm31, %xmm{a}, %xmm{a}", "vmovdqa64 %xmm{a}, {off}(%rdi)"],
}
#: The residual epilogue with the conv's rounding back to float as one ``vrndscaleps`` (dotprod.rounding)
#: in place of the float add, integer add and conversion of the bit form: 17 instructions.
EPILOGUES["residual_nearbyint"] = (EPILOGUES["residual"][:5] + ["vrndscaleps $12, %zmm{a}, %zmm{a}"]
                                   + EPILOGUES["residual"][8:])
REGISTERS, STEPS = 8, 16

#: One instruction of each kind the epilogues use (and others a kernel could use instead: the depthwise
#: gathers' byte permutes, integer multiplies, a division, a reciprocal, a power-of-two scale, a gather), for ``--ops``:
#: ``{d}`` a destination among zmm26-31, sources zmm24-25 (never written), so no copy waits for another
#: (``vpermt2b`` also reads its destination: chains of count / 6, short beside the products).
SINGLE_OPS = {
    "vpaddd": "vpaddd %zmm24, %zmm25, %zmm{d}", "vcvtdq2ps": "vcvtdq2ps %zmm24, %zmm{d}",
    "vmulps": "vmulps %zmm24, %zmm25, %zmm{d}", "vfmadd231ps": "vfmadd231ps %zmm24, %zmm25, %zmm{d}",
    "vaddps": "vaddps %zmm24, %zmm25, %zmm{d}", "vminps": "vminps %zmm24, %zmm25, %zmm{d}",
    "vmaxps": "vmaxps %zmm24, %zmm25, %zmm{d}", "vrndscaleps": "vrndscaleps $12, %zmm24, %zmm{d}",
    "vpmovzxbd": "vpmovzxbd 128(%rsi), %zmm{d}", "vpmovdb": "vpmovdb %zmm24, %xmm{d}",
    "vpxorq": "vpxorq %zmm24, %zmm25, %zmm{d}", "vcvtps2dq": "vcvtps2dq %zmm24, %zmm{d}",
    "vpmaxsd": "vpmaxsd %zmm24, %zmm25, %zmm{d}",
    "vpermb": "vpermb %zmm24, %zmm25, %zmm{d}", "vpermt2b": "vpermt2b %zmm24, %zmm25, %zmm{d}",
    "vpmulld": "vpmulld %zmm24, %zmm25, %zmm{d}", "vpmaddwd": "vpmaddwd %zmm24, %zmm25, %zmm{d}",
    "vpsadbw": "vpsadbw %zmm24, %zmm25, %zmm{d}", "vdivps": "vdivps %zmm24, %zmm25, %zmm{d}",
    "vrcp14ps": "vrcp14ps %zmm24, %zmm{d}", "vscalefps": "vscalefps %zmm24, %zmm25, %zmm{d}",
    # A table lookup of 16 dwords (a residual add's output looked up by its two u8 inputs would be one a
    # register): the gather clears its mask, so each copy sets one first; indices in zmm19 (GATHER_INDICES).
    "vpgatherdd": "kxnorw %k0, %k0, %k{k}\nvpgatherdd 0(%rsi,%zmm19,1), %zmm{d}{{%k{k}}}",
}
#: Set before the products when an ``--ops`` variant gathers: 16 byte offsets into the 64 KiB buffer at
#: %rsi, 4 KiB apart (8 distinct lines: the buffer holds i & 7 at byte i), as a lookup table would be read.
GATHER_INDICES = ["vpmovzxbd 0(%rsi), %zmm19", "vpslld $12, %zmm19, %zmm19"]
#: Copies of one instruction per 128 products, for ``--ops``.
OP_COUNTS = (16, 32, 48)


def _products() -> list:
    out = []
    for step in range(STEPS):
        out += [f"vpbroadcastd {4 * step}(%rdx), %zmm20", f"vpbroadcastd {4 * step + 64}(%rdx), %zmm21",
                f"vmovdqu64 {64 * step}(%rcx), %zmm22", f"vmovdqu64 {64 * step + 1024}(%rcx), %zmm23"]
        out += [f"vpdpbusd %zmm{22 + a // 4}, %zmm{20 + a % 2}, %zmm{a}" for a in range(REGISTERS)]
    return out


def _spread(head: list, tail: list) -> list:
    """``tail``'s lines spread evenly among ``head``'s."""
    body, placed = [], 0
    for k, line in enumerate(head):
        body.append(line)
        while placed < len(tail) and placed * len(head) <= k * len(tail):
            body.append(tail[placed])
            placed += 1
    return body + tail[placed:]


def loop_body(epilogue: str, placement: str) -> list:
    """One iteration: zeroed accumulators, the products, and the epilogue (of this tile when clumped,
    of the previous tile's registers zmm8-15 when interleaved); for an ``--ops`` variant (``op:NAME``,
    placement ``xCOUNT``), that many copies of one instruction among the products."""
    zero = [f"vpxord %zmm{a}, %zmm{a}, %zmm{a}" for a in range(REGISTERS)]
    if epilogue.startswith("op:"):
        op, count = SINGLE_OPS[epilogue[3:]], int(placement[1:])
        copies = [line for i in range(count) for line in op.format(d=26 + i % 6, k=1 + i % 6).split("\n")]
        head = GATHER_INDICES if "%zmm19" in op else []
        return head + _spread(zero + _products(), copies)
    ops = EPILOGUES.get(epilogue, [])
    if placement == "clumped":
        tail = [op.format(a=a, t=16 + a % 4, off=16 * a) for a in range(REGISTERS) for op in ops]
        return zero + _products() + tail
    tail = [op.format(a=8 + a, t=16 + a % 4, off=16 * a) for a in range(REGISTERS) for op in ops]
    return _spread(zero + _products(), tail) + [f"vmovdqa64 %zmm{a}, %zmm{8 + a}" for a in range(REGISTERS)]


VARIANTS = [("products", "clumped")] + [(e, p) for e in EPILOGUES for p in ("clumped", "interleaved")]
OP_VARIANTS = [(f"op:{name}", f"x{count}") for name in SINGLE_OPS for count in OP_COUNTS]


def _symbol(epilogue: str, placement: str) -> str:
    return f"{epilogue}_{placement}".replace("op:", "op_")


def _program(iterations: int, variants=VARIANTS) -> tuple:
    asm = [".text"]
    for epilogue, placement in variants:
        name = _symbol(epilogue, placement)
        asm += [f".globl {name}", f"{name}:", "1:"] + ["\t" + line for line in loop_body(epilogue, placement)]
        asm += ["\tdec %r8", "\tjnz 1b", "\tret"]
    c = ["#include <stdio.h>", "#include <stdlib.h>", "#include <time.h>"]
    c += [f"void {_symbol(e, p)}(void*, void*, void*, void*, long);" for e, p in variants]
    c += ["static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);"
          " return t.tv_sec + t.tv_nsec * 1e-9;}",
          "int main(void){ char *o = aligned_alloc(64, 65536), *r = aligned_alloc(64, 65536),"
          " *d = aligned_alloc(64, 65536), *w = aligned_alloc(64, 65536);",
          " for (int i = 0; i < 65536; i++) { o[i] = r[i] = d[i] = w[i] = (char)(i & 7); }"]
    for epilogue, placement in variants:
        c.append(f' {{ double best = 1e30; for (int k = 0; k < 5; k++) {{ double t = now();'
                 f' {_symbol(epilogue, placement)}(o, r, d, w, {iterations}L); t = now() - t;'
                 f' if (t < best) best = t; }}'
                 f' printf("{epilogue} {placement} %.6e\\n", best / {iterations}.0); }}')
    c.append(" return 0; }")
    return "\n".join(asm) + "\n", "\n".join(c) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2_000_000, help="loop iterations per timing")
    parser.add_argument("--ghz", type=float, default=3.67, help="core clock, to print cycles (ratios do not use it)")
    parser.add_argument("--ops", action="store_true",
                        help="also time each epilogue instruction alone among the products (16, 32, 48 copies)")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.iterations < 1:
        raise SystemExit("--iterations must be at least 1")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler (cc) on PATH: the probe assembles and runs its loops with it")
    with open("/proc/cpuinfo") as info:
        if "avx512_vnni" not in info.read():
            raise SystemExit("this CPU has no AVX-512 VNNI: the probe's loops use vpdpbusd on zmm registers")
    asm, c = _program(args.iterations, VARIANTS + (OP_VARIANTS if args.ops else []))
    with tempfile.TemporaryDirectory() as work:
        for name, text in (("loops.S", asm), ("main.c", c)):
            with open(os.path.join(work, name), "w") as handle:
                handle.write(text)
        binary = os.path.join(work, "probe")
        subprocess.run([compiler, "-O1", "-o", binary, os.path.join(work, "main.c"), os.path.join(work, "loops.S")],
                       check=True, capture_output=True)
        lines = subprocess.run([binary], check=True, capture_output=True, text=True).stdout.split("\n")
    seconds = {tuple(line.split()[:2]): float(line.split()[2]) for line in lines if line.strip()}
    base = seconds[("products", "clumped")]
    results = Results(__file__, argv, iterations=args.iterations, ghz=args.ghz, registers=REGISTERS, steps=STEPS)
    print(f"{'epilogue':18s} {'placement':12s} cycles/128 products  vs products alone")
    for (epilogue, placement), value in seconds.items():
        cycles = value * args.ghz * 1e9
        print(f"{epilogue:18s} {placement:12s} {cycles:19.1f}  x{value / base:.3f}")
        if epilogue.startswith("op:"):
            results.add(op=epilogue[3:], copies=int(placement[1:]), seconds_per_iteration=value, ratio=value / base)
        else:
            results.add(epilogue=epilogue, placement=placement, seconds_per_iteration=value, ratio=value / base,
                        instructions_per_register=len(EPILOGUES.get(epilogue, [])))
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
