/* See host/model/linear.h. */
#include "host/model/linear.h"

#include "kernels/kernels.h"

void linear_forward(float *out, const float *inp, const float *w, int N, int C, int OC)
{
	matmul_forward(out, inp, w, N, C, OC, 0);
}

void linear_forward_acc(float *out, const float *inp, const float *w, int N, int C, int OC)
{
	matmul_forward(out, inp, w, N, C, OC, 1);
}

void linear_backward(float *dinp, float *dw, const float *dout, const float *inp,
		     const float *w, int N, int C, int OC)
{
	matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
}

void linear_wgrad(float *dw, const float *dout, const float *inp, int N, int C, int OC, bool accumulate)
{
	/* as matmul_backward's dweight; beta 0 writes without reading dw */
	sgemm_rm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, accumulate ? 1.0f : 0.0f, dw, C);
}
