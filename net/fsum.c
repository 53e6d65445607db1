#include "net/fsum.h"

#include <string.h>

/* Explicit 8-wide blocks: -O2's cheap vectorizer skips loops that need an
 * epilogue, and these sit on the receive path of every reduction. */
typedef float v8f __attribute__((vector_size(32)));

void fsum_add(float *restrict dst, const float *restrict a, const float *restrict b, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		v8f x, y;
		memcpy(&x, a + i, sizeof(x));
		memcpy(&y, b + i, sizeof(y));
		x += y;
		memcpy(dst + i, &x, sizeof(x));
	}
	for (; i < n; i++)
		dst[i] = a[i] + b[i];
}

void fsum_acc(float *restrict dst, const float *restrict a, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		v8f x, y;
		memcpy(&x, dst + i, sizeof(x));
		memcpy(&y, a + i, sizeof(y));
		x += y;
		memcpy(dst + i, &x, sizeof(x));
	}
	for (; i < n; i++)
		dst[i] += a[i];
}
