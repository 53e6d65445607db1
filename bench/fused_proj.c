/* bench/fused_proj.sh: llama-bench's q,k,v and gate,up products as separate
 * calls against one fused call (the same sums per element for the forward
 * and weight gradients), best of 7, on THREADS OpenBLAS threads. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kernels/kernels.h"
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static float *A, *B, *C;
/* time of `cnt` products of shape (ta,tb,M,N,K) (separate) */
static double run(int ta, int tb, int M, int N, int K, int cnt, float beta)
{
	double t0 = now_s();
	for (int i = 0; i < cnt; i++)
		sgemm_rm(ta, tb, M, N, K, 1.0f, A + (size_t)i * 4096, ta ? M : K, B + (size_t)i * 8192, tb ? K : N, beta, C, N);
	return now_s() - t0;
}
int main(int argc, char **argv)
{
	int th = argc > 1 ? atoi(argv[1]) : 1;
	blas_set_threads(th);
	size_t n = 16u << 20;
	A = malloc(n * 4); B = malloc(n * 4); C = malloc(n * 4);
	for (size_t i = 0; i < n; i++) { A[i] = (i % 97) * 0.01f; B[i] = (i % 89) * 0.01f; C[i] = 0; }
	/* name, ta, tb, M, N, K of one part, parts, which dim fuses (1 N, 2 K, 0 M) */
	struct { const char *nm; int ta, tb, M, N, K, parts, fdim; float beta; } s[] = {
		{ "qkv fwd", 0, 1, 2048, 512, 512, 3, 1, 0 },
		{ "qkv dW", 1, 0, 512, 512, 2048, 3, 0, 1 },
		{ "qkv dx", 0, 0, 2048, 512, 512, 3, 2, 1 },
		{ "gu fwd", 0, 1, 2048, 1408, 512, 2, 1, 0 },
		{ "gu dW", 1, 0, 1408, 512, 2048, 2, 0, 1 },
		{ "gu dx", 0, 0, 2048, 512, 1408, 2, 2, 1 },
	};
	for (int k = 0; k < 6; k++) {
		double bs = 1e9, bf = 1e9;
		for (int r = 0; r < 7; r++) {
			double t = run(s[k].ta, s[k].tb, s[k].M, s[k].N, s[k].K, s[k].parts, s[k].beta);
			if (t < bs) bs = t;
			int M = s[k].M, N = s[k].N, K = s[k].K, p = s[k].parts;
			if (s[k].fdim == 0) M *= p; else if (s[k].fdim == 1) N *= p; else K *= p;
			t = run(s[k].ta, s[k].tb, M, N, K, 1, s[k].beta);
			if (t < bf) bf = t;
		}
		printf("%-8s threads %d: %d separate %.2f ms, fused %.2f ms, saves %.2f ms a layer (%.1f%%)\n", s[k].nm, th, s[k].parts, bs * 1e3, bf * 1e3, (bs - bf) * 1e3, 100 * (bs - bf) / bs);
	}
	return 0;
}
