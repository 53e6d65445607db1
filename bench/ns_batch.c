/* Muon's same-shape batching on this CPU: k Newton-Schulz runs of one
 * shape (the matrices one device owns of one tensor), three ways:
 *   separate  newton_schulz5 on each in turn (what muon.c runs), OpenBLAS
 *             at --threads;
 *   steps     newton_schulz5_batch: step-major, each step of every matrix
 *             before the next (the CPU's form of a batched matmul: there
 *             is no cblas_sgemm_batch in OpenBLAS 0.3.21, and no product
 *             of Newton-Schulz shares an operand across matrices, so no
 *             stacking into one sgemm is exact);
 *   threads   the matrices dealt over --threads threads, each running
 *             newton_schulz5 with OpenBLAS at one thread (a batched
 *             matmul's parallelism, over matrices instead of inside one).
 * Prints per shape the median wall and CPU seconds of each and their ratio
 * to separate, and whether each gives separate's bits. The three are
 * interleaved, round by round, so that a machine's load moving moves
 * all three alike. Built and run by
 * bench/ns_batch.sh against build/libmeshrun.a; not part of meshrun.
 * usage: ns_batch THREADS REPS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

static double now(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

struct job {
	float *const *out;
	const float *const *g;
	int k, R, C, t, T;
	float *scratch;
};

static void *worker(void *arg)
{
	struct job *j = arg;
	for (int i = j->t; i < j->k; i += j->T)
		newton_schulz5(j->out[i], j->g[i], j->scratch, j->R, j->C);
	return NULL;
}

/* mode 0 separate, 1 steps, 2 threads */
static void run(int mode, float *const *out, const float *const *g, float *scratch, int k, int R, int C, int T)
{
	size_t mx = (size_t)(R > C ? R : C), one = 3 * mx * mx + 2 * (size_t)R * C;
	if (mode == 0) {
		for (int i = 0; i < k; i++)
			newton_schulz5(out[i], g[i], scratch, R, C);
	} else if (mode == 1) {
		newton_schulz5_batch(out, g, scratch, k, R, C);
	} else {
		pthread_t th[16];
		struct job jb[16];
		for (int t = 0; t < T; t++) {
			jb[t] = (struct job){ out, g, k, R, C, t, T, scratch + (size_t)t * one };
			pthread_create(&th[t], NULL, worker, &jb[t]);
		}
		for (int t = 0; t < T; t++)
			pthread_join(th[t], NULL);
	}
}

int main(int argc, char **argv)
{
	int T = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 7;
	/* llama-tiny's attention (3 layers x 4) and MLP (3 x 3), deepseek-tiny's
	 * experts (2 layers x 4 x 3), and a 512-wide model's attention */
	const int shapes[][3] = { { 128, 128, 12 }, { 352, 128, 9 }, { 96, 128, 24 }, { 512, 512, 8 } };
	const char *names[] = { "separate", "steps", "threads" };
	if (T < 1 || T > 16 || reps < 1)
		return 2;
	printf("ns_batch: OpenBLAS %s, %d threads, median of %d\n", blas_core_name(), T, reps);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		int R = shapes[s][0], C = shapes[s][1], k = shapes[s][2];
		size_t n = (size_t)R * C, mx = (size_t)(R > C ? R : C);
		size_t scr = (3 * mx * mx + 2 * n) * (size_t)T + 2 * mx * mx + 2 * (size_t)k * n;
		float *gm = malloc(sizeof(float) * n * k), *om = malloc(sizeof(float) * n * k * 3);
		float *scratch = malloc(sizeof(float) * scr);
		float *out[3][64];
		const float *g[64];
		if (!gm || !om || !scratch)
			return 1;
		for (size_t i = 0; i < n * k; i++)
			gm[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
		for (int i = 0; i < k; i++) {
			g[i] = gm + n * i;
			for (int m = 0; m < 3; m++)
				out[m][i] = om + n * ((size_t)m * k + i);
		}
		double wall[3], cpu[3], w[3][64], c[3][64];
		reps = reps < 64 ? reps : 64;
		for (int r = -1; r < reps; r++)  /* round -1: a warm-up */
			for (int m = 0; m < 3; m++) {
				blas_set_threads(m == 2 ? 1 : T);
				double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
				run(m, out[m], g, scratch, k, R, C, T);
				if (r >= 0) {
					w[m][r] = now(CLOCK_MONOTONIC) - w0;
					c[m][r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
				}
			}
		for (int m = 0; m < 3; m++) {
			qsort(w[m], (size_t)reps, sizeof(double), cmp);
			qsort(c[m], (size_t)reps, sizeof(double), cmp);
			wall[m] = w[m][reps / 2];
			cpu[m] = c[m][reps / 2];
		}
		for (int m = 0; m < 3; m++)
			printf("%dx%d k=%d %-8s wall %8.3f ms (%.2fx separate) cpu %8.3f ms (%.2fx) %s\n", R, C, k,
			       names[m], wall[m] * 1e3, wall[m] / wall[0], cpu[m] * 1e3, cpu[m] / cpu[0],
			       memcmp(om, om + n * k * m, sizeof(float) * n * k) ? "bits DIFFER" : "same bits");
		free(gm);
		free(om);
		free(scratch);
	}
	return 0;
}
