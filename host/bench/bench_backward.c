/* See host/bench/bench_backward.h. */
#include "host/bench/bench_backward.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/config/config.h"
#include "host/model/model.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

/* F, B, I and W; I and W again with W reading the activations in place */
enum { T_F, T_B, T_I, T_W, T_I2, T_W2, T_COUNT };

/* Deterministic values in [-s, s). */
static void fill(float *x, size_t n, unsigned seed, float s)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		x[i] = s * ((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
	}
}

/* model_activation_bytes of d with L layers of d's one kind and that
 * many stashes; 0 when out of memory. */
static size_t plan_bytes(const struct model_dims *d, int rows, int L, int stashes, bool in_place)
{
	struct model_dims x = *d;
	char err[256];
	x.L = L;
	x.L_dense = d->L_dense ? L : 0;
	x.L_moe = d->L_moe ? L : 0;
	struct model_mesh mm = { .pipe_w_stashes = stashes, .pipe_w_reads_acts = in_place };
	struct model *p = model_plan_new(&x, &mm, err, sizeof(err));
	size_t b = p ? model_activation_bytes(p, rows) : 0;
	model_free(p);
	return b;
}

/* Runs call k on m (I2, W2: on m2, whose W reads the activations). */
static int call(struct model *m, struct model *m2, int k, float *x, float *y, float *g, const float *dy, size_t n)
{
	switch (k) {
	case T_F:
		return model_layers_forward(m, 0, 1, y, x);
	case T_B:
		memcpy(g, dy, n * sizeof(float));
		return model_layers_backward(m, 0, 1, g, x);
	case T_I:
	case T_I2:
		return model_layers_backward_input(k == T_I ? m : m2, 0, 1, g, dy, x);
	default:
		return model_layers_backward_weight(k == T_W ? m : m2, 0, 1, dy, x);
	}
}

/* One layer of kind moe: cpu[k][r], wall[k][r] of each call in round r;
 * stash[0], stash[1]: the bytes of its stash (inputs copied, read in
 * place); *acts: of its saved activations (with its input: what one more
 * such layer adds). */
static int time_layer(const struct model_dims *whole, bool moe, int rows, int rounds, double (*cpu)[64],
		      double (*wall)[64], size_t *stash, size_t *acts, char *err, size_t errlen)
{
	struct model_dims d = *whole;
	d.L = 1;
	d.L_dense = moe ? 0 : 1;
	d.L_moe = moe ? 1 : 0;
	struct model_mesh one = { .pipe_w_stashes = 1 }, in_place = { .pipe_w_stashes = 1, .pipe_w_reads_acts = true };
	size_t bare = plan_bytes(&d, rows, 1, 0, false), two = plan_bytes(&d, rows, 2, 0, false);
	struct model *m = model_new(&d, rows, &one, err, errlen), *m2 = model_new(&d, rows, &in_place, err, errlen);
	if (!m || !m2 || !bare || !two) {
		snprintf(err, errlen, "bench backward: out of memory");
		model_free(m);
		model_free(m2);
		return -ENOMEM;
	}
	stash[0] = plan_bytes(&d, rows, 1, 1, false) - bare;
	stash[1] = plan_bytes(&d, rows, 1, 1, true) - bare;
	*acts = two - bare;
	model_init(m, 1, 0.02f);
	model_init(m2, 1, 0.02f);
	size_t n = (size_t)rows * d.T * d.C;
	float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
	float *g = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
	int rc = x && y && g && dy ? 0 : -ENOMEM;
	if (rc)
		snprintf(err, errlen, "bench backward: out of memory");
	fill(x, rc ? 0 : n, 1, 1.0f);
	fill(dy, rc ? 0 : n, 2, 1e-3f);
	struct model_step st = { .loss_scale = 1.0f, .lb_weight = d.lb_weight, .global_tokens = (double)rows * d.T };
	for (int r = 0; r < rounds && !rc; r++) {
		model_step_begin(m, &st);
		model_step_begin(m2, &st);
		rc = model_layers_forward(m2, 0, 1, y, x);
		for (int k = 0; k < T_COUNT && !rc; k++) {
			double c0 = util_thread_cpu_s(), w0 = util_now_s();
			rc = call(m, m2, k, x, y, g, dy, n);
			cpu[k][r] = util_thread_cpu_s() - c0;
			wall[k][r] = util_now_s() - w0;
		}
		rc = rc ? rc : model_step_end(m);
		rc = rc ? rc : model_step_end(m2);
	}
	free(x);
	free(y);
	free(g);
	free(dy);
	model_free(m);
	model_free(m2);
	return rc;
}

int bench_backward_run(const struct cfg *c, int rows, int rounds)
{
	struct model_dims d;
	char err[1024];
	int rc = model_dims_from_cfg(&d, c, err, sizeof(err));
	if (!rc && (rounds < 1 || rounds > 64 || rows < 1)) {
		snprintf(err, sizeof(err), "bench backward: --rounds must be 1..64 and the rows at least 1");
		rc = -EINVAL;
	}
	/* one OpenBLAS thread (a device of a host with several runs so), so
	 * the calling thread's CPU time is all the call costs */
	int threads = blas_get_threads();
	blas_set_threads(1);
	if (!rc)
		printf("# one layer on one device, %d sequences of %d, OpenBLAS on 1 thread; medians of %d "
		       "rounds (thread CPU ms, wall ms)\n", rows, d.T, rounds);
	for (int moe = 0; moe < 2 && !rc; moe++) {
		double cpu[T_COUNT][64], wall[T_COUNT][64], mc[T_COUNT], mw[T_COUNT];
		size_t stash[2], acts;
		if ((moe && !d.L_moe) || (!moe && !d.L_dense))
			continue;
		if ((rc = time_layer(&d, moe, rows, rounds, cpu, wall, stash, &acts, err, sizeof(err))))
			break;
		for (int k = 0; k < T_COUNT; k++) {
			mc[k] = util_median(cpu[k], rounds) * 1e3;
			mw[k] = util_median(wall[k], rounds) * 1e3;
		}
		printf("%s layer: F %.3f (%.3f)  B %.3f (%.3f)  I %.3f (%.3f)  W %.3f (%.3f)  "
		       "I/B %.2f  W/B %.2f  (I+W)/B %.2f  F:I:W 1:%.2f:%.2f  stash %.2f MB\n",
		       moe ? "moe" : "dense", mc[T_F], mw[T_F], mc[T_B], mw[T_B], mc[T_I], mw[T_I], mc[T_W], mw[T_W],
		       mc[T_I] / mc[T_B], mc[T_W] / mc[T_B], (mc[T_I] + mc[T_W]) / mc[T_B], mc[T_I] / mc[T_F],
		       mc[T_W] / mc[T_F], stash[0] / 1e6);
		printf("%s layer, W reading the activations: I %.3f (%.3f)  W %.3f (%.3f)  I/B %.2f  W/B %.2f  "
		       "(I+W)/B %.2f  F:I:W 1:%.2f:%.2f  stash %.2f MB; saved activations %.2f MB\n",
		       moe ? "moe" : "dense", mc[T_I2], mw[T_I2], mc[T_W2], mw[T_W2], mc[T_I2] / mc[T_B],
		       mc[T_W2] / mc[T_B], (mc[T_I2] + mc[T_W2]) / mc[T_B], mc[T_I2] / mc[T_F], mc[T_W2] / mc[T_F],
		       stash[1] / 1e6, acts / 1e6);
	}
	blas_set_threads(threads);
	if (rc)
		fprintf(stderr, "meshrun: bench backward: %s\n", err);
	return rc;
}
