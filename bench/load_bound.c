/* bench/load_bound.c: what writing a 2 x 2 host's parameters costs on this
 * machine without the loader around it (bench/load_bound.sh builds and runs
 * it). One process = one host: it widens NSRC bytes of BF16 (a host's half
 * of the checkpoint, in anonymous memory filled before the clock) into
 * COPIES float32 destinations, or only writes those destinations, and prints
 * its wall and CPU seconds. Destinations are populated before the clock
 * ("prefaulted", as util_big_alloc makes parameters) or left to fault
 * ("fresh": the first touch is in the timed region).
 *
 * usage: load_bound MODE NSRC COPIES prefaulted|fresh
 *   memset    memset of the destinations (plain stores)
 *   stream    SSE2 streaming stores of zeros (no source)
 *   widen     SSE2 unpack + streaming stores from the source, 64 Ki values
 *             at a time into each destination in turn (the loader's SSE2)
 *   widen512  the same with AVX-512 (64-byte streaming stores)
 *   widen_plain  SSE2 unpack + plain stores
 *   rowsR, rowsRf  widen in rows of R values, each row into each
 *             destination in turn; f: a store fence after every row
 *   dual, dual512  both destinations from one load of the source (COPIES
 *             2), SSE2 or AVX-512 (the loader's AVX-512 path)
 * Compiled without -march: the AVX-512 functions carry their own target;
 * run them only on a CPU that has AVX-512F/BW.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

static void *big(size_t n, int populate)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	if (populate && madvise(p, n, MADV_POPULATE_WRITE)) {
		perror("madvise");
		exit(1);
	}
	return p;
}

static void widen_sse(float *dst, const uint16_t *s, size_t n, int plain)
{
	const __m128i z = _mm_setzero_si128();
	size_t j = 0;
	for (; j + 8 <= n; j += 8) {
		__m128i v = _mm_loadu_si128((const __m128i *)(s + j));
		__m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(z, v)), hi = _mm_castsi128_ps(_mm_unpackhi_epi16(z, v));
		if (plain) {
			_mm_store_ps(dst + j, lo);
			_mm_store_ps(dst + j + 4, hi);
		} else {
			_mm_stream_ps(dst + j, lo);
			_mm_stream_ps(dst + j + 4, hi);
		}
	}
	for (; j < n; j++) {
		uint32_t u = (uint32_t)s[j] << 16;
		memcpy(dst + j, &u, 4);
	}
}

__attribute__((target("avx512f,avx512bw"))) static void widen_512(float *dst, const uint16_t *s, size_t n)
{
	size_t j = 0;
	for (; j + 16 <= n; j += 16) {
		__m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + j))), 16);
		_mm512_stream_si512((void *)(dst + j), v);
	}
	for (; j < n; j++) {
		uint32_t u = (uint32_t)s[j] << 16;
		memcpy(dst + j, &u, 4);
	}
}

/* both destinations from one load of the source */
static void widen_dual(float *d0, float *d1, const uint16_t *s, size_t n)
{
	const __m128i z = _mm_setzero_si128();
	size_t j = 0;
	for (; j + 8 <= n; j += 8) {
		__m128i v = _mm_loadu_si128((const __m128i *)(s + j));
		__m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(z, v)), hi = _mm_castsi128_ps(_mm_unpackhi_epi16(z, v));
		_mm_stream_ps(d0 + j, lo);
		_mm_stream_ps(d0 + j + 4, hi);
		_mm_stream_ps(d1 + j, lo);
		_mm_stream_ps(d1 + j + 4, hi);
	}
}

__attribute__((target("avx512f,avx512bw"))) static void widen_dual512(float *d0, float *d1, const uint16_t *s, size_t n)
{
	size_t j = 0;
	for (; j + 16 <= n; j += 16) {
		__m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + j))), 16);
		_mm512_stream_si512((void *)(d0 + j), v);
		_mm512_stream_si512((void *)(d1 + j), v);
	}
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: load_bound memset|stream|widen|widen512|widen_plain|rowsR[f]|dual|dual512 NSRC COPIES prefaulted|fresh\n");
		return 2;
	}
	const char *mode = argv[1];
	size_t nsrc = strtoull(argv[2], NULL, 10) & ~(size_t)63, n = nsrc / 2;
	int copies = atoi(argv[3]), pre = !strcmp(argv[4], "prefaulted");
	uint16_t *src = big(nsrc, 1);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint16_t)(0x3f80 + (i & 0x7f));
	float *dst[8];
	for (int c = 0; c < copies; c++)
		dst[c] = big(n * sizeof(float), pre);
	double t0 = now(), c0 = cpu();
	const size_t chunk = 64 << 10;
	if (!strcmp(mode, "memset")) {
		for (int c = 0; c < copies; c++)
			memset(dst[c], 0, n * sizeof(float));
	} else if (!strcmp(mode, "stream")) {
		for (int c = 0; c < copies; c++) {
			for (size_t j = 0; j + 4 <= n; j += 4)
				_mm_stream_ps(dst[c] + j, _mm_setzero_ps());
			_mm_sfence();
		}
	} else if (!strncmp(mode, "rows", 4)) {  /* rowsR[f]: rows of R values, f: a fence after each */
		size_t row = strtoull(mode + 4, NULL, 10);
		int fence = mode[strlen(mode) - 1] == 'f';
		for (size_t at = 0; at < n; at += row) {
			size_t m = n - at < row ? n - at : row;
			for (int c = 0; c < copies; c++) {
				widen_sse(dst[c] + at, src + at, m, 0);
				if (fence)
					_mm_sfence();
			}
		}
		_mm_sfence();
	} else if (!strcmp(mode, "dual") || !strcmp(mode, "dual512")) {  /* COPIES must be 2 */
		if (mode[4])
			widen_dual512(dst[0], dst[1], src, n);
		else
			widen_dual(dst[0], dst[1], src, n);
		_mm_sfence();
	} else {
		for (size_t at = 0; at < n; at += chunk) {
			size_t m = n - at < chunk ? n - at : chunk;
			for (int c = 0; c < copies; c++) {
				if (!strcmp(mode, "widen512"))
					widen_512(dst[c] + at, src + at, m);
				else
					widen_sse(dst[c] + at, src + at, m, !strcmp(mode, "widen_plain"));
			}
		}
		_mm_sfence();
	}
	double t1 = now(), c1 = cpu();
	unsigned sum = 0;  /* keep the stores */
	for (int c = 0; c < copies; c++)
		sum += ((unsigned *)dst[c])[n / 3];
	printf("%s %s: %.3f s wall, %.3f s CPU, %.2f GB written (%.1f GB/s) [%u]\n", mode, argv[4], t1 - t0, c1 - c0,
	       copies * n * 4.0 / 1e9, copies * n * 4.0 / 1e9 / (t1 - t0), sum & 1);
	return 0;
}
