/* The one entry point every linear layer of the model goes through:
 * y (N,OC) = x (N,C) . W(OC,C)^T, a local matmul on this device's shards.
 * What is gathered before it and reduced after it is the planner's
 * decision (host/mesh/plan.h, docs/sharding.md#the-planner), executed by
 * the layer code around these calls. */
#ifndef MESHRUN_LINEAR_H
#define MESHRUN_LINEAR_H

#include <stdbool.h>

void linear_forward(float *out, const float *inp, const float *w, int N, int C, int OC);
/* out += inp . W^T */
void linear_forward_acc(float *out, const float *inp, const float *w, int N, int C, int OC);
/* dinp += dout . W; dw += dout^T . inp (either may be NULL) */
void linear_backward(float *dinp, float *dw, const float *dout, const float *inp,
		     const float *w, int N, int C, int OC);
/* dw (OC,C) = dout^T . inp, += with accumulate: a weight's gradient
 * alone (the bits of linear_backward's into a zeroed dw, but for a
 * zero's sign) */
void linear_wgrad(float *dw, const float *dout, const float *inp, int N, int C, int OC, bool accumulate);

#endif
