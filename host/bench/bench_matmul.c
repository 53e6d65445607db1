/* Measures square sgemm through matmul_forward, the path every linear layer
 * takes, so the figure is the ceiling the model's MFU is measured against. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/bench/bench_matmul.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

struct sgemm_bufs {
	float *a, *b, *c;
	int n;
};

static int bufs_init(struct sgemm_bufs *s, int n)
{
	size_t nn = (size_t)n * n;
	s->n = n;
	s->a = malloc(sizeof(float) * nn);
	s->b = malloc(sizeof(float) * nn);
	s->c = malloc(sizeof(float) * nn);
	if (!s->a || !s->b || !s->c) {
		free(s->a);
		free(s->b);
		free(s->c);
		return -1;
	}
	/* small values that stay finite; content does not affect sgemm speed */
	for (size_t i = 0; i < nn; i++) {
		s->a[i] = (float)((i * 7) % 13) * 0.01f - 0.06f;
		s->b[i] = (float)((i * 5) % 11) * 0.01f - 0.05f;
	}
	return 0;
}

static void bufs_release(struct sgemm_bufs *s)
{
	free(s->a);
	free(s->b);
	free(s->c);
}

/* seconds of one call */
static double time_one(struct sgemm_bufs *s)
{
	double t = util_now_s();
	matmul_forward(s->c, s->a, s->b, s->n, s->n, s->n, 0);
	return util_now_s() - t;
}

static double gflops(int n, double secs)
{
	return 2.0 * n * n * (double)n / secs / 1e9;
}

double bench_sgemm_peak_gflops(int threads, double seconds)
{
	struct sgemm_bufs s;
	int old = blas_get_threads();
	double best, start;

	if (bufs_init(&s, 1024))
		return 0.0;
	blas_set_threads(threads);
	time_one(&s); /* warm-up: OpenBLAS sets up its buffers on first use */
	start = util_now_s();
	best = time_one(&s);
	while (util_now_s() - start < seconds) {
		double t = time_one(&s);
		if (t < best)
			best = t;
	}
	blas_set_threads(old);
	bufs_release(&s);
	return gflops(1024, best);
}

int bench_matmul_run(int threads, int size, int reps)
{
	struct sgemm_bufs s;
	double best = 0.0, total = 0.0;

	if (bufs_init(&s, size)) {
		fprintf(stderr, "bench matmul: unable to allocate 3 x %d^2 floats\n", size);
		return -ENOMEM;
	}
	blas_set_threads(threads);
	time_one(&s);
	for (int r = 0; r < reps; r++) {
		double t = time_one(&s);
		total += t;
		if (r == 0 || t < best)
			best = t;
	}
	printf("sgemm %dx%dx%d, %d threads, core %s: best %.1f GFLOP/s, mean %.1f GFLOP/s over %d reps\n",
	       size, size, size, blas_get_threads(), blas_core_name(), gflops(size, best),
	       gflops(size, total / reps), reps);
	bufs_release(&s);
	return 0;
}
