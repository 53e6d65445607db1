#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels/kernels.h"
/* bench/attn_blocks.sh: one llama-bench layer's attention (B 8, T 256, 8 heads
 * of 64), forward and backward, best of REPS; the outputs (out, att, dq, dk,
 * dv) written to DUMP for a bit comparison.
 * usage: attn_blocks REPS DUMP THREADS */
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv)
{
	int B = 8, T = 256, H = 8, D = 64, reps = argc > 1 ? atoi(argv[1]) : 10;
	const char *dump = argc > 2 ? argv[2] : NULL;
	if (argc > 3) blas_set_threads(atoi(argv[3]));
	size_t n = (size_t)B * T * H * D, na = (size_t)B * H * T * T;
	float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *out = malloc(n * 4), *dout = malloc(n * 4);
	float *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4);
	float *att = calloc(na, 4), *scr = malloc((size_t)T * T * 4 + T * D * 4);
	srand(1);
	for (size_t i = 0; i < n; i++) { q[i] = rand() / (float)RAND_MAX - 0.5f; k[i] = rand() / (float)RAND_MAX - 0.5f; v[i] = rand() / (float)RAND_MAX - 0.5f; dout[i] = rand() / (float)RAND_MAX - 0.5f; }
	double bf = 1e9, bb = 1e9;
	for (int r = 0; r < reps; r++) {
		double t0 = now_s();
		attention_forward(out, att, q, k, v, B, T, H, H, D, D, 0.125f);
		double t1 = now_s();
		attention_backward(dq, dk, dv, scr, dout, q, k, v, att, B, T, H, H, D, D, 0.125f, 0);
		double t2 = now_s();
		if (t1 - t0 < bf) bf = t1 - t0;
		if (t2 - t1 < bb) bb = t2 - t1;
	}
	printf("fwd %.2f ms bwd %.2f ms\n", bf * 1e3, bb * 1e3);
	if (dump) { FILE *f = fopen(dump, "w"); fwrite(out, 4, n, f); fwrite(att, 4, na, f); fwrite(dq, 4, n, f); fwrite(dk, 4, n, f); fwrite(dv, 4, n, f); fclose(f); }
	return 0;
}
