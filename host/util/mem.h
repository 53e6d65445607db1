/* Large buffers: a device's parameters and gradients (GBs). Anonymous
 * mappings, 2 MiB aligned, populated before they are returned, on the
 * host's loading threads: first touch (a fault and the kernel's zeroing
 * per page: 569,000 faults for 2.3 GB of 4 KiB pages) is paid once, in
 * the kernel's loop rather than a fault per page of a memset, on every
 * thread. A buffer the kernel will not map (overcommit, an address-space
 * limit) is NULL, as from malloc; memory running out while populating is
 * NULL when the kernel says so (-ENOMEM), or its OOM killer acts, as at
 * any first touch. Transparent huge pages only when
 * asked for (MESHRUN_HUGEPAGES=1): on the machine measured they made
 * the populating 3.5x dearer and the loading no faster
 * (bench/README.md "Loading a checkpoint"; docs/checkpoints.md). */
#ifndef MESHRUN_MEM_H
#define MESHRUN_MEM_H

#include <stddef.h>

/* bytes of zeroed memory, 64-byte aligned (2 MiB aligned when bytes is
 * at least 2 MiB: then a mapping of its own, madvise(MADV_HUGEPAGE)
 * when MESHRUN_HUGEPAGES=1, populated with MADV_POPULATE_WRITE on
 * util_load_threads() threads, or by a write per page where the kernel
 * has no MADV_POPULATE_WRITE). NULL when it cannot be had (nothing is
 * left mapped). Free with util_big_free and the same bytes. */
void *util_big_alloc(size_t bytes);
void util_big_free(void *p, size_t bytes);

/* dst = n floats of src, with streaming stores (AVX-512 when
 * util_stream_avx512, else SSE2): for copies far larger than the caches,
 * which then write memory without reading each destination line in
 * first. util_copy_stream fences its stores; util_copy_stream_nf also
 * writes dst2 when it is not NULL (from the same loads when AVX-512 and
 * the two share an alignment mod 64, else one after the other), and
 * leaves the fence to the caller (util_store_fence once after many rows:
 * a fence waits for every pending streaming store, and one per 4 KiB row
 * costs as much as the copying). None of the ranges may overlap. */
void util_copy_stream(float *restrict dst, const float *restrict src, size_t n);
void util_copy_stream_nf(float *dst, float *dst2, const float *src, size_t n);
void util_store_fence(void);

/* Whether the streaming copies and the checkpoint loader's BF16 widening
 * use AVX-512 (64-byte streaming stores): the CPU has AVX-512F/BW and
 * MESHRUN_LOAD_AVX512 is not "0" (read once per process). The same bits
 * either way. */
int util_stream_avx512(void);

/* Whether util_big_alloc asks for huge pages (MESHRUN_HUGEPAGES=1). */
int util_hugepages(void);

/* Minor page faults of this process so far (getrusage). */
long util_minor_faults(void);

#endif
