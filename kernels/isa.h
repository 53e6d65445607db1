/* The vector instructions of our elementwise kernels, for the kernels/ sources only
 * (callers see enum kernel_isa in kernels.h). A kernel's loop is written
 * once, as an always-inline NAME_body; KERNEL_VARIANTS compiles it three
 * times (x86-64 baseline SSE2, AVX2, AVX-512F) into a table, and KERNEL()
 * picks the entry kernels/isa.c chose once at start. The variants give the
 * same bits: no FMA contraction (-std=c11 turns -ffp-contract off), the
 * same operations per element in the same order, reductions into the same
 * VW partial sums, combined in the same order, at every width. */
#ifndef MESHRUN_KERNELS_ISA_H
#define MESHRUN_KERNELS_ISA_H

#include "kernels/kernels.h"

#define KERNEL_INLINE static inline __attribute__((always_inline))

/* Loops run in blocks into a local array, then stored, with a scalar
 * tail: gcc 12 at -O2 vectorises only loops whose trip count is a known
 * multiple of the vector width and that need no run-time alias check.
 * VW is a reduction's number of partial sums: it fixes the summation
 * order, so it is part of the result and never changes. EW is an
 * elementwise loop's block: any width gives the same bits; 16 fills an
 * AVX-512 register. */
#define VW 8
#define EW 16

extern enum kernel_isa kernel_isa_now;

/* elsewhere than x86-64 every variant is the baseline build */
#if defined(__x86_64__) && defined(__GNUC__)
#define KERNEL_TARGET(isa) __attribute__((target(isa)))
#else
#define KERNEL_TARGET(isa)
#endif

/* NAME_isa[KERNEL_ISA_COUNT]: NAME_body(args) built for each instruction
 * set; params is the parenthesised parameter list, args the names in it */
#define KERNEL_VARIANTS(name, params, args)                                                    \
	KERNEL_TARGET("avx512f") static void name##_avx512 params { name##_body args; }        \
	KERNEL_TARGET("avx2") static void name##_avx2 params { name##_body args; }             \
	static void name##_base params { name##_body args; }                                   \
	static void (*const name##_isa[KERNEL_ISA_COUNT]) params = {                           \
		[KERNEL_ISA_BASE] = name##_base, [KERNEL_ISA_AVX2] = name##_avx2,              \
		[KERNEL_ISA_AVX512] = name##_avx512 }

/* the same for a body that returns a value of type type */
#define KERNEL_VARIANTS_RET(type, name, params, args)                                          \
	KERNEL_TARGET("avx512f") static type name##_avx512 params { return name##_body args; } \
	KERNEL_TARGET("avx2") static type name##_avx2 params { return name##_body args; }      \
	static type name##_base params { return name##_body args; }                            \
	static type (*const name##_isa[KERNEL_ISA_COUNT]) params = {                           \
		[KERNEL_ISA_BASE] = name##_base, [KERNEL_ISA_AVX2] = name##_avx2,              \
		[KERNEL_ISA_AVX512] = name##_avx512 }

/* KERNEL_VARIANTS, and the public function NAME params calling the variant
 * of the chosen instruction set */
#define KERNEL_DISPATCH(name, params, args)                                                    \
	KERNEL_VARIANTS(name, params, args);                                                   \
	void name params { name##_isa[kernel_isa_now] args; }
#define KERNEL_DISPATCH_RET(type, name, params, args)                                          \
	KERNEL_VARIANTS_RET(type, name, params, args);                                         \
	type name params { return name##_isa[kernel_isa_now] args; }

/* the variant of NAME for the chosen instruction set */
#define KERNEL(name) (name##_isa[kernel_isa_now])

#endif
