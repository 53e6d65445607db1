/* See host/util/mem.h. */
#include "host/util/mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "host/util/threads.h"

#define BIG_ALIGN ((size_t)2 << 20)

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14 */
#endif

int util_hugepages(void)
{
	const char *v = getenv("MESHRUN_HUGEPAGES");
	return v && !strcmp(v, "1");
}

long util_minor_faults(void)
{
	struct rusage r;
	return getrusage(RUSAGE_SELF, &r) ? 0 : r.ru_minflt;
}

struct populate {
	char *p;
	size_t n;
	int rc;
};

/* Faults in [p, p + n) for writing: the kernel's loop when it has one,
 * else a write per 4 KiB (of a zero into zeroed memory). -ENOMEM when
 * the pages cannot be had. */
static void *populate(void *arg)
{
	struct populate *w = arg;
	if (!madvise(w->p, w->n, MADV_POPULATE_WRITE))
		return NULL;
	if (errno != EINVAL) {
		w->rc = -ENOMEM;
		return NULL;
	}
	for (size_t i = 0; i < w->n; i += 4096)
		((volatile char *)w->p)[i] = 0;
	return NULL;
}

/* n bytes at p (2 MiB aligned) populated on up to 64 threads, in 2 MiB
 * pieces of equal count; 0 or -ENOMEM. */
static int populate_all(char *p, size_t n)
{
	struct populate w[64];
	pthread_t th[64];
	int t = util_load_threads(), started = 0, rc = 0;
	size_t pages = n / BIG_ALIGN, at = 0;
	if ((size_t)t > pages)
		t = pages ? (int)pages : 1;
	for (int i = 0; i < t; i++) {
		size_t len = (pages / (size_t)t + ((size_t)i < pages % (size_t)t)) * BIG_ALIGN;
		if (i == t - 1)
			len = n - at;
		w[i] = (struct populate){ p + at, len, 0 };
		at += len;
	}
	for (int i = 1; i < t; i++) {
		if (pthread_create(&th[i], NULL, populate, &w[i]))
			break;  /* the rest on this thread */
		started = i;
	}
	populate(&w[0]);
	for (int i = started + 1; i < t; i++)
		populate(&w[i]);
	for (int i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < t; i++)
		rc = rc ? rc : w[i].rc;
	return rc;
}

void *util_big_alloc(size_t bytes)
{
	if (bytes < BIG_ALIGN) {
		void *p = aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
		if (p)
			memset(p, 0, bytes);
		return p;
	}
	if (bytes > SIZE_MAX - 2 * BIG_ALIGN)
		return NULL;
	/* map one piece more, then unmap the ends to leave a 2 MiB boundary */
	size_t len = (bytes + BIG_ALIGN - 1) & ~(BIG_ALIGN - 1), map = len + BIG_ALIGN;
	char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	char *p = (char *)(((uintptr_t)m + BIG_ALIGN - 1) & ~(uintptr_t)(BIG_ALIGN - 1));
	if (p > m)
		munmap(m, (size_t)(p - m));
	if (m + map > p + len)
		munmap(p + len, (size_t)(m + map - (p + len)));
	if (util_hugepages())
		madvise(p, len, MADV_HUGEPAGE);  /* a hint: 4 KiB pages where refused */
	if (populate_all(p, len)) {
		munmap(p, len);
		return NULL;
	}
	return p;
}

void util_big_free(void *p, size_t bytes)
{
	if (!p)
		return;
	if (bytes < BIG_ALIGN) {
		free(p);
		return;
	}
	munmap(p, (bytes + BIG_ALIGN - 1) & ~(BIG_ALIGN - 1));
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_STREAM_AVX512 1
#else
#define HAVE_STREAM_AVX512 0
#endif

static int stream_avx512;
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;

static void stream_pick(void)
{
	const char *v = getenv("MESHRUN_LOAD_AVX512");
#if HAVE_STREAM_AVX512
	/* libgcc checks that the OS saves the AVX-512 state too */
	__builtin_cpu_init();
	stream_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && !(v && !strcmp(v, "0"));
#else
	(void)v;
#endif
}

int util_stream_avx512(void)
{
	pthread_once(&stream_once, stream_pick);
	return stream_avx512;
}

#if HAVE_STREAM_AVX512
/* 16 floats a store, a whole 64-byte line (d0, d1 aligned to 64), into
 * d0 and d1 (when not NULL) from one load. Returns the floats done. */
__attribute__((target("avx512f"))) static size_t copy_avx512(float *d0, float *d1, const float *s, size_t n)
{
	size_t j = 0;
	for (; j + 16 <= n; j += 16) {
		__m512 v = _mm512_loadu_ps(s + j);
		_mm512_stream_ps(d0 + j, v);
		if (d1)
			_mm512_stream_ps(d1 + j, v);
	}
	return j;
}
#endif

void util_copy_stream_nf(float *dst, float *dst2, const float *src, size_t n)
{
	size_t j = 0;
	if (dst2 && (!util_stream_avx512() || ((uintptr_t)dst - (uintptr_t)dst2) % 64)) {
		util_copy_stream_nf(dst, NULL, src, n);  /* one after the other (src still in cache) */
		util_copy_stream_nf(dst2, NULL, src, n);
		return;
	}
#if HAVE_STREAM_AVX512
	if (util_stream_avx512()) {
		for (; j < n && ((uintptr_t)(dst + j) & 63); j++) {
			dst[j] = src[j];
			if (dst2)
				dst2[j] = src[j];
		}
		j += copy_avx512(dst + j, dst2 ? dst2 + j : NULL, src + j, n - j);
		if (dst2) {
			memcpy(dst2 + j, src + j, (n - j) * sizeof(float));
			memcpy(dst + j, src + j, (n - j) * sizeof(float));
			return;
		}
	}
#endif
#if defined(__SSE2__)
	for (; j < n && ((uintptr_t)(dst + j) & 15); j++)
		dst[j] = src[j];
	for (; j + 8 <= n; j += 8) {
		_mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
		_mm_stream_ps(dst + j + 4, _mm_loadu_ps(src + j + 4));
	}
#endif
	memcpy(dst + j, src + j, (n - j) * sizeof(float));
}

void util_store_fence(void)
{
#if defined(__SSE2__)
	_mm_sfence();
#endif
}

void util_copy_stream(float *restrict dst, const float *restrict src, size_t n)
{
	util_copy_stream_nf(dst, NULL, src, n);
	util_store_fence();
}
