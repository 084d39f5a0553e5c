"""What a 4-way dot-product instruction is, as data.

A :class:`DotProductISA` describes one instruction family that computes, for
each of ``lanes`` int32 accumulator lanes, ``acc[l] += sum_{k<4} a[4l+k] * b[4l+k]``
(x86 ``vpdpbusd``, Hexagon HVX ``vrmpy``, ...). Computes, schedules and
tensor intrinsics read the lane count, the operand dtypes and the emitter from
the description, so one schedule serves every ISA.

The emitter gets the accumulator (``int32 x lanes``) and the two operands as
vectors of ``4 * lanes`` 8-bit values in the *data / kernel* order the
schedule uses; the :class:`DotVariant` says which LLVM intrinsic implements
that dtype pair and whether the instruction wants them swapped.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Tuple

from ..._tvm import llvm_version, target_has, tvm  # noqa: F401  (target_has: re-exported to the ISAs)
from tvm import tir

#: The 8-bit operand types a dot-product instruction can take.
INT8_DTYPES = ("uint8", "int8")


@dataclasses.dataclass(frozen=True)
class DotVariant:
    """One (data, kernel) dtype pair an ISA computes natively.

    Parameters
    ----------
    data_dtype, kernel_dtype : str
        ``"uint8"`` or ``"int8"``.
    intrinsic : str
        LLVM intrinsic name (``""`` for emitters that use plain TIR arithmetic).
    swap : bool
        The instruction takes the kernel operand first (its unsigned operand
        is the kernel), e.g. i8 data x u8 kernel on ``vrmpybusv``.
    extern : str
        Name of the C helper implementing one tile (``acc[lanes] += ...``) for
        the C-source route (Hexagon emulation); ``""`` if there is none.
    """

    data_dtype: str
    kernel_dtype: str
    intrinsic: str = ""
    swap: bool = False
    extern: str = ""


#: ``emit(isa, variant, acc, data, kernel) -> new acc`` (all TIR vector expressions).
Emitter = Callable[["DotProductISA", DotVariant, tir.PrimExpr, tir.PrimExpr, tir.PrimExpr], tir.PrimExpr]


@dataclasses.dataclass(frozen=True)
class DotProductISA:
    """A 4-way u8/i8 dot-product instruction family.

    Parameters
    ----------
    name : str
        Short name (``"x86_vnni"``, ``"x86_avx2"``, ``"hexagon_hvx"``).
    lanes : int
        int32 accumulator lanes per instruction.
    variants : tuple of DotVariant
        The (data, kernel) dtype pairs computed natively.
    supports : callable
        ``supports(target) -> bool``: whether the target has the instruction.
    emitter : callable
        Builds the TIR expression of one ``acc += dot4`` per lane.
    target_keys : tuple of str
        Target keys the ISA belongs to (for strategy / hook tables).
    registers : int
        Vector registers, which bound the accumulator tile of the fallback
        schedules.
    reduce : int
        Products summed per lane (4 for every ISA here).
    operand_registers : int
        Vector registers one operand of a step occupies once the emitter has
        prepared it (2 where it is widened into two halves, as on AVX2).
    constant_registers : int
        Vector registers the emitter keeps for constants (shuffle masks).
    wide_data : str
        ``""``, or the dtype (``"int16"``) that conv2d widens its data to once,
        in the padding pass, so that a step reads data words the instruction
        takes as they are instead of widening the same bytes again for every
        output-channel block and kernel tap. The emitter then receives the
        data operand as ``wide_loader(buffer)`` returns it.
    wide_loader : callable or None
        ``wide_loader(buffer) -> operand``: the data operand of one step read
        from a ``wide_data`` buffer of ``reduce`` elements.
    wide_kernel : str
        ``""``, or the dtype (``"int16"``) conv2d packs its kernel in: widened
        when the layout transform is constant-folded at compile time, so a step
        loads kernel operands the instruction takes as they are (no shuffles,
        no mask registers). The emitter then receives the kernel operand as a
        tuple of ``reduce // wide_group`` vectors.
    wide_group : int
        Products per lane one instruction reads from a ``wide_kernel`` kernel
        (the innermost axis of that layout: 2 for ``vpmaddwd``).
    conv_tile_pixels : int
        Output pixels per output-channel block in conv2d's fallback tile (a 2x2
        or 4x1 block where the output has one), or 0 to fill the accumulator
        budget. A CPU with more instructions in flight than that tile has
        accumulators gets more pixels (:meth:`conv_pixels`).
    accumulating : bool
        Whether one step is one instruction that reads and writes its accumulator
        (``vpdpbusd``). Only then does a register-only loop of steps on constant
        operands measure the unit (:func:`~tvm_tcutils.dotprod.cpu_facts.measure_chains_in_flight`):
        a step that adds a product to the accumulator afterwards (AVX2, SSE)
        is hoisted out of such a loop by LLVM, leaving a loop of adds.
    kernel_range : tuple of int, optional
        ``(low, high)``: the instruction is exact only for kernel values in this
        range (a saturating step). Such an ISA is never a target's ISA
        (:func:`~tvm_tcutils.dotprod.isa.for_target`); it is chosen per layer for a
        constant kernel that :meth:`fits` (:func:`~tvm_tcutils.dotprod.isa.for_layer`).
    """

    name: str
    lanes: int
    variants: Tuple[DotVariant, ...]
    supports: Callable[["tvm.target.Target"], bool]
    emitter: Emitter
    target_keys: Tuple[str, ...] = ("cpu",)
    registers: int = 16
    reduce: int = 4
    operand_registers: int = 1
    constant_registers: int = 0
    wide_data: str = ""
    wide_loader: Optional[Callable[[tir.Buffer], object]] = None
    wide_kernel: str = ""
    wide_group: int = 4
    conv_tile_pixels: int = 0
    accumulating: bool = False
    kernel_range: Optional[Tuple[int, int]] = None

    def fits(self, values) -> bool:
        """Whether every value of the array ``values`` lies in :attr:`kernel_range` (always, without one).

        Examples
        --------
        >>> import numpy as np
        >>> from tvm_tcutils.dotprod.isa import X86_AVX2, X86_AVX2_U8S7
        >>> X86_AVX2_U8S7.fits(np.array([-64, 0, 64])), X86_AVX2_U8S7.fits(np.array([65]))
        (True, False)
        >>> X86_AVX2.fits(np.array([127]))
        True
        """
        if self.kernel_range is None:
            return True
        low, high = self.kernel_range
        return values.size == 0 or (int(values.min()) >= low and int(values.max()) <= high)

    def conv_kernel_dtype(self, kernel_dtype: str) -> str:
        """The dtype conv2d's packed kernel has for an 8-bit ``kernel_dtype``.

        Examples
        --------
        >>> from tvm_tcutils.dotprod.isa import X86_VNNI, X86_AVX2
        >>> X86_VNNI.conv_kernel_dtype("int8"), X86_AVX2.conv_kernel_dtype("int8")
        ('int8', 'int16')
        """
        return self.wide_kernel or str(kernel_dtype)

    def kernel_group(self, kernel_dtype: str) -> int:
        """Innermost axis of a packed kernel of ``kernel_dtype``: products per lane and instruction.

        Examples
        --------
        >>> from tvm_tcutils.dotprod.isa import X86_AVX2
        >>> X86_AVX2.kernel_group("int8"), X86_AVX2.kernel_group("int16")
        (4, 2)
        """
        return self.wide_group if self.wide_kernel and str(kernel_dtype) == self.wide_kernel else self.reduce

    def accumulator_budget(self, kernel_blocks: int = 1) -> int:
        """Accumulator registers a tile may use next to its operands.

        A quarter of the registers is kept for operands and addresses, or more
        when the data operand and ``kernel_blocks`` kernel operands need more
        (wide operands on few registers, as on AVX2). Spilled accumulators
        cost a load and a store per step, more than a smaller tile does.

        Examples
        --------
        >>> from tvm_tcutils.dotprod.isa import X86_VNNI, X86_AVX2
        >>> X86_VNNI.accumulator_budget(2), X86_AVX2.accumulator_budget(2)
        (24, 6)
        """
        operands = self.operand_registers * (1 + kernel_blocks) + self.constant_registers
        reserved = max(self.registers // 4, operands)
        return max(1, self.registers - reserved)

    def conv_pixels(self, chains: Optional[float], accumulators_per_pixel: int) -> int:
        """Fewest output pixels per output-channel block of conv2d's fallback tile on a CPU that keeps
        ``chains`` instructions in flight (None: unknown), where each pixel holds
        ``accumulators_per_pixel`` accumulators.

        The ISA's own block (:attr:`conv_tile_pixels`) unless it has fewer accumulators than the CPU
        has instructions in flight: then the unit would wait on their latency, so the tile needs as
        many pixels as cover them (0: the ISA fills the budget instead).

        Examples
        --------
        >>> from tvm_tcutils.dotprod.isa import X86_VNNI, X86_AVX2
        >>> X86_VNNI.conv_pixels(None, 2), X86_VNNI.conv_pixels(4.0, 2), X86_VNNI.conv_pixels(9.2, 2)
        (4, 4, 5)
        >>> X86_AVX2.conv_pixels(9.2, 2)
        0
        """
        own = self.conv_tile_pixels
        if not own or not chains:
            return own
        return max(own, math.ceil(chains / max(1, accumulators_per_pixel)))

    @property
    def vector_bytes(self) -> int:
        """Bytes of each 8-bit operand vector (``lanes * reduce``)."""
        return self.lanes * self.reduce

    def variant(self, data_dtype: str, kernel_dtype: str) -> Optional[DotVariant]:
        """The native variant for a dtype pair, or None.

        Examples
        --------
        >>> from tvm_tcutils.dotprod.isa import X86_VNNI
        >>> X86_VNNI.variant("uint8", "int8").intrinsic
        'llvm.x86.avx512.vpdpbusd.512'
        >>> X86_VNNI.variant("int8", "int8") is None
        True
        """
        if self.wide_kernel and str(kernel_dtype) == self.wide_kernel:
            # Any 8-bit kernel widened (signed, exact) multiplies as the signed one does.
            kernel_dtype = "int8"
        for var in self.variants:
            if (var.data_dtype, var.kernel_dtype) == (str(data_dtype), str(kernel_dtype)):
                return var
        return None

    def emit(self, variant: DotVariant, acc, data, kernel) -> tir.PrimExpr:
        """TIR for ``acc + dot4(data, kernel)`` per lane with this ISA's instruction.

        Examples
        --------
        >>> from tvm_tcutils.dotprod.isa import X86_VNNI
        >>> from tvm import tir
        >>> acc = tir.Broadcast(tir.const(0, "int32"), 16)
        >>> a = tir.Broadcast(tir.const(1, "uint8"), 64); b = tir.Broadcast(tir.const(1, "int8"), 64)
        >>> X86_VNNI.emit(X86_VNNI.variant("uint8", "int8"), acc, a, b).dtype
        'int32x16'
        """
        return self.emitter(self, variant, acc, data, kernel)


# --------------------------------------------------------------------------
# Helpers shared by the emitters.
# --------------------------------------------------------------------------
def reinterpret(value: tir.PrimExpr, dtype: str) -> tir.PrimExpr:
    """Bit-cast ``value`` to ``dtype`` (no-op when it already has it)."""
    if str(value.dtype) == dtype:
        return value
    return tir.call_intrin(dtype, "tir.reinterpret", value)


def as_i32_vector(value: tir.PrimExpr) -> tir.PrimExpr:
    """Bit-cast an 8-bit vector of ``4n`` lanes to ``int32 x n``."""
    lanes = value.dtype.lanes if hasattr(value.dtype, "lanes") else tvm.DataType(value.dtype).lanes
    return reinterpret(value, f"int32x{lanes // 4}")


def llvm_intrin(dtype: str, name: str, *args: tir.PrimExpr) -> tir.PrimExpr:
    """A pure LLVM intrinsic call (argument count passed as TVM expects)."""
    return tir.call_llvm_pure_intrin(dtype, name, tir.const(len(args), "uint32"), *args)


def ordered(variant: DotVariant, data, kernel):
    """The operands in the order the instruction takes them."""
    return (kernel, data) if variant.swap else (data, kernel)


def llvm_major() -> int:
    """The LLVM major version TVM was built with (re-exported for emitters)."""
    return llvm_version()
