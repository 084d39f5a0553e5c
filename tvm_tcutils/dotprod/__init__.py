"""int8 conv2d and dense on 4-way dot-product instructions (x86 VNNI / AVX2 / SSE, Hexagon HVX).

Nothing here needs calling: ``import tvm_tcutils`` installs :mod:`.hooks`, and
``relay.build`` of an int8 model for a target with a dot-product ISA then picks
the package's kernels. The parts, in the order the compiler meets them:

* :mod:`.isa`: one table row per instruction set (lanes, operand types, LLVM
  intrinsics); :func:`.isa.for_target` picks the target's;
* :mod:`.strategy`: legalize (operand types the ISA can multiply), alter-layout
  (NCHWc data, packed constant kernels) and the strategy rows;
* :mod:`.topi`: the TE computes and schedules, tensorized with the ISA's
  intrinsic, and the byte-shuffle u8 layout transforms;
* :mod:`.quantize`: int8 model preparation for ``tvm-tcutils tune`` / ``bench``;
* :mod:`.qdq`: QDQ models (onnxruntime's ``quantize_static`` default) as integer ``qnn``
  ops, which :func:`tvm_tcutils.measure.build` applies on dot-product targets;
* :mod:`.hexagon`: compiles and runs HVX kernels under ``qemu-hexagon``; :mod:`.hexagon_model`
  (``run_model``) a whole int8 Relay model built for a Hexagon target, the same way.

Examples
--------
>>> from tvm_tcutils.dotprod.isa import for_target
>>> for_target("llvm -mcpu=cascadelake").name
'x86_vnni'
"""
