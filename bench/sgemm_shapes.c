/* LD_PRELOAD shim for bench/sgemm_shapes.sh: times every cblas_sgemm call
 * by (transA, transB, M, N, K) and, at exit, writes one line per shape
 * to $SGEMM_SHAPES_OUT: "ta tb M N K calls seconds". Wall time of the
 * calling thread (OpenBLAS's own threads included in the wall). Build:
 * cc -O2 -shared -fPIC -o sgemm_shapes.so bench/sgemm_shapes.c -ldl -pthread */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cblas.h>

#define NSHAPE 8192
static struct shape { int ta, tb, m, n, k; long calls; double s; } tab[NSHAPE];
static int nshape;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
			 blasint, blasint, float, const float *, blasint, const float *, blasint,
			 float, float *, blasint);
static sgemm_fn real;

static void dump(void)
{
	const char *p = getenv("SGEMM_SHAPES_OUT");
	FILE *f = p ? fopen(p, "w") : NULL;
	if (!f)
		return;
	for (int i = 0; i < nshape; i++)
		fprintf(f, "%d %d %d %d %d %ld %.6f\n", tab[i].ta, tab[i].tb, tab[i].m, tab[i].n,
			tab[i].k, tab[i].calls, tab[i].s);
	fclose(f);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

void cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint m,
		 blasint n, blasint k, float alpha, const float *a, blasint lda, const float *b,
		 blasint ldb, float beta, float *c, blasint ldc)
{
	if (!real) {
		pthread_mutex_lock(&mu);
		if (!real) {
			real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
			atexit(dump);
		}
		pthread_mutex_unlock(&mu);
	}
	double t0 = now();
	real(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
	double dt = now() - t0;
	int x = ta == CblasTrans, y = tb == CblasTrans, i;
	pthread_mutex_lock(&mu);
	for (i = 0; i < nshape; i++)
		if (tab[i].ta == x && tab[i].tb == y && tab[i].m == m && tab[i].n == n && tab[i].k == k)
			break;
	if (i == nshape && nshape < NSHAPE)
		tab[nshape++] = (struct shape){ x, y, m, n, k, 0, 0 };
	if (i < NSHAPE) {
		tab[i].calls++;
		tab[i].s += dt;
	}
	pthread_mutex_unlock(&mu);
}
