/* Matrix products: the one module that talks to OpenBLAS. Everything else
 * (attention, Newton-Schulz) reaches BLAS through sgemm_rm, so swapping the
 * BLAS or its threading policy touches only this file. */
#include <cblas.h>

#include "kernels/kernels.h"

void sgemm_rm(int transA, int transB, int M, int N, int K, float alpha,
	      const float *A, int lda, const float *B, int ldb, float beta,
	      float *C, int ldc)
{
	// C (M,N) with row stride ldc; op(A) (M,K), op(B) (K,N)
	if (M <= 0 || N <= 0)
		return;
	if (K <= 0) {
		/* BLAS rejects lda = 0; the product is empty, so C = beta C */
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++)
				C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
		return;
	}
	cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
		    transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
		    beta, C, ldc);
}

void matmul_forward(float *out, const float *inp, const float *weight,
		    int N, int C, int OC, int accumulate)
{
	// inp (N,C), weight (OC,C), out (N,OC)
	sgemm_rm(0, 1, N, OC, C, 1.0f, inp, C, weight, C, accumulate ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(float *dinp, float *dweight, const float *dout,
		     const float *inp, const float *weight, int N, int C, int OC)
{
	// dout (N,OC), inp (N,C), weight (OC,C); dinp (N,C), dweight (OC,C)
	if (dinp)
		sgemm_rm(0, 0, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
	if (dweight)
		sgemm_rm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}

void matmul_forward_ref(float *out, const float *inp, const float *weight,
			int N, int C, int OC)
{
	// inp (N,C), weight (OC,C), out (N,OC); double accumulation
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double s = 0.0;
			for (int c = 0; c < C; c++)
				s += (double)inp[(size_t)n * C + c] * weight[(size_t)o * C + c];
			out[(size_t)n * OC + o] = (float)s;
		}
}

void blas_set_threads(int n)
{
	if (n > 0)
		openblas_set_num_threads(n);
}

int blas_get_threads(void)
{
	return openblas_get_num_threads();
}

const char *blas_core_name(void)
{
	return openblas_get_corename();
}
