/* The one entry point every linear layer of the model goes through:
 * y (N,OC) = x (N,C) . W(OC,C)^T. Today it is a local matmul; the sharded
 * matmul planner (DESIGN §6) takes it over, deciding what to all-gather and
 * what to reduce from the operands' partition specs. */
#ifndef MESHRUN_LINEAR_H
#define MESHRUN_LINEAR_H

void linear_forward(float *out, const float *inp, const float *w, int N, int C, int OC);
/* out += inp . W^T */
void linear_forward_acc(float *out, const float *inp, const float *w, int N, int C, int OC);
/* dinp += dout . W; dw += dout^T . inp (either may be NULL) */
void linear_backward(float *dinp, float *dw, const float *dout, const float *inp,
		     const float *w, int N, int C, int OC);

#endif
