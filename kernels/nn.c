/* Transformer building blocks (docs/conventions.md#kernels): embedding, RMSNorm, RoPE, causal
 * GQA attention, SwiGLU, residual, softmax cross-entropy. Products go
 * through sgemm_rm; everything else is elementwise work in loops gcc
 * vectorises, built for each vector instruction set (kernels/isa.h). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/kernels.h"

/* attention rows per sgemm: the causal mask lets block i skip the keys of
 * blocks > i, halving the products for long sequences (bench/attn_blocks.sh
 * builds other sizes: 32 changes the bits, 96-256 keep them) */
#ifndef ATT_BLK
#define ATT_BLK 64
#endif

/* exp(x) within 1.4 ulp on [-87.3, 88.3]; 0 below (no denormals), +inf above.
 * Cephes' polynomial on x - n ln2, scaled by 2^n through the exponent bits.
 * The range is fixed up with integer masks at the end: under gcc's default
 * -ftrapping-math any float operation after a branch stops vectorisation. */
KERNEL_INLINE float exp_fast(float x)
{
	float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
	float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	float y = p * r * r + r + 1.0f;
	uint32_t sb = (uint32_t)((int32_t)n + 127) << 23;
	float s, v;
	memcpy(&s, &sb, sizeof s);
	v = y * s;
	int32_t vb, lo = -(int32_t)(x < -87.33654f), hi = -(int32_t)(x > 88.37626f);
	memcpy(&vb, &v, sizeof vb);
	vb = (vb & ~(lo | hi)) | (hi & 0x7f800000);
	memcpy(&v, &vb, sizeof v);
	return v;
}

KERNEL_INLINE float sigmoid_fast(float x)
{
	return 1.0f / (1.0f + exp_fast(-x));
}

/* Row helpers: NAME_body inlines into a kernel's body (and so runs at its
 * width); NAME is the dispatched call for loops that stay scalar. */
KERNEL_INLINE float max_row_body(const float *x, int n)
{
	// x (n), n >= 1
	float acc[VW], m;
	int i = 0;
	for (int j = 0; j < VW; j++)
		acc[j] = x[0];
	for (; i + VW <= n; i += VW)
		for (int j = 0; j < VW; j++)
			acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
	m = acc[0];
	for (int j = 1; j < VW; j++)
		m = acc[j] > m ? acc[j] : m;
	for (; i < n; i++)
		m = x[i] > m ? x[i] : m;
	return m;
}

/* out (n) = exp(x - m); returns the sum (out may equal x) */
KERNEL_INLINE float exp_sum_row_body(float *out, const float *x, float m, int n)
{
	float acc[VW] = { 0 }, sum = 0.0f;
	int i = 0;
	for (; i + VW <= n; i += VW) {
		float t[VW];
		for (int j = 0; j < VW; j++)
			t[j] = exp_fast(x[i + j] - m);
		for (int j = 0; j < VW; j++) {
			acc[j] += t[j];
			out[i + j] = t[j];
		}
	}
	for (; i < n; i++) {
		out[i] = exp_fast(x[i] - m);
		sum += out[i];
	}
	for (int j = 0; j < VW; j++)
		sum += acc[j];
	return sum;
}

KERNEL_INLINE void scale_row_body(float *x, float s, int n)
{
	int i = 0;
	for (; i + EW <= n; i += EW)
		for (int j = 0; j < EW; j++)
			x[i + j] *= s;
	for (; i < n; i++)
		x[i] *= s;
}

/* y (n) += x */
KERNEL_INLINE void add_row_body(float *y, const float *x, int n)
{
	int i = 0;
	for (; i + EW <= n; i += EW) {
		float t[EW];
		for (int j = 0; j < EW; j++)
			t[j] = y[i + j] + x[i + j];
		for (int j = 0; j < EW; j++)
			y[i + j] = t[j];
	}
	for (; i < n; i++)
		y[i] += x[i];
}

KERNEL_INLINE float dot_row_body(const float *a, const float *b, int n)
{
	float acc[VW] = { 0 }, s = 0.0f;
	int i = 0;
	for (; i + VW <= n; i += VW)
		for (int j = 0; j < VW; j++)
			acc[j] += a[i + j] * b[i + j];
	for (; i < n; i++)
		s += a[i] * b[i];
	for (int j = 0; j < VW; j++)
		s += acc[j];
	return s;
}

/* x (n) = softmax(x); returns nothing the caller needs */
KERNEL_INLINE void softmax_row_body(float *x, int n)
{
	float sum = exp_sum_row_body(x, x, max_row_body(x, n), n);
	scale_row_body(x, 1.0f / sum, n);
}

/* d (n) = p (d - p.d): the softmax's backward on one row, in place */
KERNEL_INLINE void softmax_row_backward_body(float *d, const float *p, int n)
{
	float pd = dot_row_body(p, d, n);
	int j = 0;
	for (; j + EW <= n; j += EW) {
		float t[EW];
		for (int l = 0; l < EW; l++)
			t[l] = p[j + l] * (d[j + l] - pd);
		for (int l = 0; l < EW; l++)
			d[j + l] = t[l];
	}
	for (; j < n; j++)
		d[j] = p[j] * (d[j] - pd);
}

KERNEL_VARIANTS_RET(float, max_row, (const float *x, int n), (x, n));
KERNEL_VARIANTS(scale_row, (float *x, float s, int n), (x, s, n));
KERNEL_VARIANTS(add_row, (float *y, const float *x, int n), (y, x, n));
KERNEL_VARIANTS_RET(float, dot_row, (const float *a, const float *b, int n), (a, b, n));
KERNEL_VARIANTS(softmax_row, (float *x, int n), (x, n));
KERNEL_VARIANTS(softmax_row_backward, (float *d, const float *p, int n), (d, p, n));

/* ---- embedding ---- */

void embedding_forward(float *out, const int32_t *tokens, const float *wte, int N, int C)
{
	// tokens (N) in [0, V), wte (V,C), out (N,C)
	embedding_forward_range(out, tokens, wte, 0, INT_MAX, N, C);
}

void embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C)
{
	embedding_backward_range(dwte, dout, tokens, 0, INT_MAX, N, C);
}

void embedding_forward_range(float *out, const int32_t *tokens, const float *wte, int v0, int Vl,
			     int N, int C)
{
	// tokens (N), wte (Vl,C) = rows [v0, v0+Vl), out (N,C)
	for (int n = 0; n < N; n++) {
		int t = tokens[n] - v0;
		if (t >= 0 && t < Vl)
			memcpy(out + (size_t)n * C, wte + (size_t)t * C, sizeof(float) * C);
		else
			memset(out + (size_t)n * C, 0, sizeof(float) * C);
	}
}

void embedding_backward_range(float *dwte, const float *dout, const int32_t *tokens, int v0, int Vl,
			      int N, int C)
{
	// dout (N,C), tokens (N), dwte (Vl,C) = rows [v0, v0+Vl)
	if (!dwte)
		return;
	for (int n = 0; n < N; n++) {
		int t = tokens[n] - v0;
		if (t >= 0 && t < Vl)
			KERNEL(add_row)(dwte + (size_t)t * C, dout + (size_t)n * C, C);
	}
}

/* ---- RMSNorm ---- */

KERNEL_INLINE void rmsnorm_forward_body(float *out, float *rstd, const float *inp,
					const float *weight, int N, int C, float eps)
{
	// inp (N,C), weight (C), out (N,C), rstd (N)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C;
		float *o = out + (size_t)n * C;
		float r = 1.0f / sqrtf(dot_row_body(x, x, C) / C + eps);
		int i = 0;
		for (; i + EW <= C; i += EW) {
			float t[EW];
			for (int j = 0; j < EW; j++)
				t[j] = x[i + j] * r * weight[i + j];
			for (int j = 0; j < EW; j++)
				o[i + j] = t[j];
		}
		for (; i < C; i++)
			o[i] = x[i] * r * weight[i];
		rstd[n] = r;
	}
}

KERNEL_DISPATCH(rmsnorm_forward, (float *out, float *rstd, const float *inp,
		const float *weight, int N, int C, float eps),
		(out, rstd, inp, weight, N, C, eps))

KERNEL_INLINE void rmsnorm_backward_body(float *dinp, float *dweight, const float *dout,
					 const float *inp, const float *weight, const float *rstd,
					 int N, int C)
{
	// dout, inp (N,C), weight (C), rstd (N); dinp (N,C), dweight (C)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
		float r = rstd[n];
		if (dweight) {
			int i = 0;
			for (; i + EW <= C; i += EW) {
				float t[EW];
				for (int j = 0; j < EW; j++)
					t[j] = dweight[i + j] + d[i + j] * x[i + j] * r;
				for (int j = 0; j < EW; j++)
					dweight[i + j] = t[j];
			}
			for (; i < C; i++)
				dweight[i] += d[i] * x[i] * r;
		}
		if (dinp) {
			/* dx = r (g - x r^2 mean(g x)),  g = dout * weight */
			float acc[VW] = { 0 }, gx = 0.0f;
			float *dx = dinp + (size_t)n * C;
			int i = 0;
			for (; i + VW <= C; i += VW)
				for (int j = 0; j < VW; j++)
					acc[j] += d[i + j] * weight[i + j] * x[i + j];
			for (; i < C; i++)
				gx += d[i] * weight[i] * x[i];
			for (int j = 0; j < VW; j++)
				gx += acc[j];
			float k = r * r * r * gx / C;
			i = 0;
			for (; i + EW <= C; i += EW) {
				float t[EW];
				for (int j = 0; j < EW; j++)
					t[j] = dx[i + j] + r * d[i + j] * weight[i + j] - k * x[i + j];
				for (int j = 0; j < EW; j++)
					dx[i + j] = t[j];
			}
			for (; i < C; i++)
				dx[i] += r * d[i] * weight[i] - k * x[i];
		}
	}
}

KERNEL_DISPATCH(rmsnorm_backward, (float *dinp, float *dweight, const float *dout,
		const float *inp, const float *weight, const float *rstd, int N, int C),
		(dinp, dweight, dout, inp, weight, rstd, N, C))

/* Split RMSNorm: a row spread over devices (tensor-transpose parallelism
 * splits the embedding); the caller sums the partial statistics over the
 * devices between the two halves of each pass. */
void rmsnorm_partial_sumsq(float *ss, const float *inp, int N, int C)
{
	// inp (N,C) -> ss (N)
	for (int n = 0; n < N; n++)
		ss[n] = KERNEL(dot_row)(inp + (size_t)n * C, inp + (size_t)n * C, C);
}

void rmsnorm_forward_split(float *out, float *rstd, const float *inp, const float *weight,
			   const float *ss, int N, int C, int Cg, float eps)
{
	// inp (N,C) of a row of Cg, ss (N) over all Cg; out (N,C), rstd (N)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C;
		float *o = out + (size_t)n * C;
		float r = 1.0f / sqrtf(ss[n] / Cg + eps);
		for (int i = 0; i < C; i++)
			o[i] = x[i] * r * weight[i];
		rstd[n] = r;
	}
}

void rmsnorm_backward_partial(float *gx, const float *dout, const float *inp, const float *weight,
			      int N, int C)
{
	// dout, inp (N,C), weight (C) -> gx (N) = sum over these C of dout*weight*x
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
		float acc = 0.0f;
		for (int i = 0; i < C; i++)
			acc += d[i] * weight[i] * x[i];
		gx[n] = acc;
	}
}

void rmsnorm_backward_split(float *dinp, float *dweight, const float *dout, const float *inp,
			    const float *weight, const float *rstd, const float *gx, int N, int C,
			    int Cg)
{
	// gx (N) summed over all Cg columns; dinp (N,C) +=, dweight (C) +=
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
		float r = rstd[n], k = r * r * r * gx[n] / Cg;
		if (dweight)
			for (int i = 0; i < C; i++)
				dweight[i] += d[i] * x[i] * r;
		if (dinp) {
			float *dx = dinp + (size_t)n * C;
			for (int i = 0; i < C; i++)
				dx[i] += r * d[i] * weight[i] - k * x[i];
		}
	}
}

/* ---- RoPE ---- */

void rope_table(float *cos_t, float *sin_t, int T, int D, float theta)
{
	// cos_t, sin_t (T, D/2); angles in double, positions up to T-1
	int half = D / 2;
	for (int i = 0; i < half; i++) {
		double inv_freq = pow((double)theta, -2.0 * i / D);
		for (int t = 0; t < T; t++) {
			double a = t * inv_freq;
			cos_t[(size_t)t * half + i] = (float)cos(a);
			sin_t[(size_t)t * half + i] = (float)sin(a);
		}
	}
}

/* one head vector: o = R x, pairing i with i + half (o may equal x) */
KERNEL_INLINE void rope_vec(float *o, const float *x, const float *c, const float *s, int half)
{
	int i = 0;
	for (; i + EW <= half; i += EW) {
		float lo[EW], hi[EW];
		for (int j = 0; j < EW; j++) {
			float x1 = x[i + j], x2 = x[i + half + j];
			lo[j] = x1 * c[i + j] - x2 * s[i + j];
			hi[j] = x2 * c[i + j] + x1 * s[i + j];
		}
		for (int j = 0; j < EW; j++) {
			o[i + j] = lo[j];
			o[i + half + j] = hi[j];
		}
	}
	for (; i < half; i++) {
		float x1 = x[i], x2 = x[i + half];
		o[i] = x1 * c[i] - x2 * s[i];
		o[i + half] = x2 * c[i] + x1 * s[i];
	}
}

/* one head vector: o += R^T x, or with acc 0 o = 0.0f + R^T x (the bits
 * of memset(0) then +=) */
KERNEL_INLINE void rope_vec_t(float *o, const float *x, const float *c, const float *s, int half,
			      const int acc)
{
	int i = 0;
	for (; i + EW <= half; i += EW) {
		float lo[EW], hi[EW];
		for (int j = 0; j < EW; j++) {
			float x1 = x[i + j], x2 = x[i + half + j];
			lo[j] = (acc ? o[i + j] : 0.0f) + x1 * c[i + j] + x2 * s[i + j];
			hi[j] = (acc ? o[i + half + j] : 0.0f) + x2 * c[i + j] - x1 * s[i + j];
		}
		for (int j = 0; j < EW; j++) {
			o[i + j] = lo[j];
			o[i + half + j] = hi[j];
		}
	}
	for (; i < half; i++) {
		float x1 = x[i], x2 = x[i + half];
		o[i] = (acc ? o[i] : 0.0f) + x1 * c[i] + x2 * s[i];
		o[i + half] = (acc ? o[i + half] : 0.0f) + x2 * c[i] - x1 * s[i];
	}
}

KERNEL_INLINE void rope_forward_body(float *out, const float *inp, const float *cos_t,
				     const float *sin_t, int B, int T, int H, int D)
{
	// inp, out (B,T,H,D); cos_t, sin_t (T, D/2); out may equal inp
	int half = D / 2;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				size_t off = (((size_t)b * T + t) * H + h) * D;
				rope_vec(out + off, inp + off, cos_t + (size_t)t * half,
					 sin_t + (size_t)t * half, half);
			}
}

KERNEL_DISPATCH(rope_forward, (float *out, const float *inp, const float *cos_t,
		const float *sin_t, int B, int T, int H, int D),
		(out, inp, cos_t, sin_t, B, T, H, D))

KERNEL_INLINE void rope_backward_body(float *dinp, const float *dout, const float *cos_t,
				      const float *sin_t, int B, int T, int H, int D, const int acc)
{
	// dout, dinp (B,T,H,D); cos_t, sin_t (T, D/2)
	int half = D / 2;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				size_t off = (((size_t)b * T + t) * H + h) * D;
				rope_vec_t(dinp + off, dout + off, cos_t + (size_t)t * half,
					   sin_t + (size_t)t * half, half, acc);
			}
}

KERNEL_INLINE void rope_backward_add_body(float *dinp, const float *dout, const float *cos_t,
					  const float *sin_t, int B, int T, int H, int D)
{
	rope_backward_body(dinp, dout, cos_t, sin_t, B, T, H, D, 1);
}

KERNEL_INLINE void rope_backward_set_body(float *dinp, const float *dout, const float *cos_t,
					  const float *sin_t, int B, int T, int H, int D)
{
	rope_backward_body(dinp, dout, cos_t, sin_t, B, T, H, D, 0);
}

KERNEL_VARIANTS(rope_backward_add, (float *dinp, const float *dout, const float *cos_t,
		const float *sin_t, int B, int T, int H, int D),
		(dinp, dout, cos_t, sin_t, B, T, H, D));
KERNEL_VARIANTS(rope_backward_set, (float *dinp, const float *dout, const float *cos_t,
		const float *sin_t, int B, int T, int H, int D),
		(dinp, dout, cos_t, sin_t, B, T, H, D));

void rope_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t,
		   int B, int T, int H, int D, int accumulate)
{
	if (!dinp)
		return;
	if (accumulate)
		KERNEL(rope_backward_add)(dinp, dout, cos_t, sin_t, B, T, H, D);
	else
		KERNEL(rope_backward_set)(dinp, dout, cos_t, sin_t, B, T, H, D);
}

/* ---- causal attention ---- */

void attention_forward(float *out, float *att, const float *q, const float *k,
		       const float *v, int B, int T, int Hq, int Hkv, int Dk, int Dv, float scale)
{
	// q (B,T,Hq,Dk), k (B,T,Hkv,Dk), v (B,T,Hkv,Dv), att (B,Hq,T,T), out (B,T,Hq,Dv)
	int group = Hq / Hkv, ldq = Hq * Dk, ldk = Hkv * Dk, ldv = Hkv * Dv, ldo = Hq * Dv;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++) {
			const float *qh = q + (size_t)b * T * ldq + (size_t)h * Dk;
			const float *kh = k + (size_t)b * T * ldk + (size_t)(h / group) * Dk;
			const float *vh = v + (size_t)b * T * ldv + (size_t)(h / group) * Dv;
			float *oh = out + (size_t)b * T * ldo + (size_t)h * Dv;
			float *ah = att + ((size_t)b * Hq + h) * T * T;
			for (int i0 = 0; i0 < T; i0 += ATT_BLK) {
				int i1 = i0 + ATT_BLK < T ? i0 + ATT_BLK : T;
				/* scores of rows i0..i1 against keys 0..i1 */
				sgemm_rm(0, 1, i1 - i0, i1, Dk, scale, qh + (size_t)i0 * ldq, ldq,
					 kh, ldk, 0.0f, ah + (size_t)i0 * T, T);
				for (int i = i0; i < i1; i++) {
					float *row = ah + (size_t)i * T;
					KERNEL(softmax_row)(row, i + 1);
					memset(row + i + 1, 0, sizeof(float) * (T - i - 1));
				}
				sgemm_rm(0, 0, i1 - i0, Dv, i1, 1.0f, ah + (size_t)i0 * T, T, vh, ldv,
					 0.0f, oh + (size_t)i0 * ldo, ldo);
			}
		}
}

void attention_backward(float *dq, float *dk, float *dv, float *scratch,
			const float *dout, const float *q, const float *k, const float *v,
			const float *att, int B, int T, int Hq, int Hkv, int Dk, int Dv,
			float scale, int accumulate)
{
	// q, dq (B,T,Hq,Dk); k, dk (B,T,Hkv,Dk); v, dv (B,T,Hkv,Dv); dout (B,T,Hq,Dv);
	// att (B,Hq,T,T); scratch (T,T)
	int group = Hq / Hkv, ldq = Hq * Dk, ldk = Hkv * Dk, ldv = Hkv * Dv, ldo = Hq * Dv;
	float *ds = scratch; /* dL/dscores of one head, lower triangle */
	/* Without accumulate each product writes (beta 0) where it is the
	 * first to touch its block: every dq block once, dk and dv by a kv
	 * head's first query head. OpenBLAS zeroes C for beta 0 and then
	 * adds, as beta 1 does onto a zeroed C; its small-matrix kernels
	 * store alpha acc against alpha acc + 1 * 0, the same bits since
	 * acc, summed from +0, is never -0 (and alpha > 0). */
	float bq = accumulate ? 1.0f : 0.0f;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++) {
			float bkv = accumulate || h % group ? 1.0f : 0.0f;
			size_t qo = (size_t)b * T * ldq + (size_t)h * Dk;
			size_t ko = (size_t)b * T * ldk + (size_t)(h / group) * Dk;
			size_t vo = (size_t)b * T * ldv + (size_t)(h / group) * Dv;
			size_t oo = (size_t)b * T * ldo + (size_t)h * Dv;
			const float *ah = att + ((size_t)b * Hq + h) * T * T;
			if (dq || dk)
				for (int i0 = 0; i0 < T; i0 += ATT_BLK) {
					int i1 = i0 + ATT_BLK < T ? i0 + ATT_BLK : T;
					/* dP = dout V^T, then dS = P (dP - rowsum(P dP)) */
					sgemm_rm(0, 1, i1 - i0, i1, Dv, 1.0f, dout + oo + (size_t)i0 * ldo,
						 ldo, v + vo, ldv, 0.0f, ds + (size_t)i0 * T, T);
					for (int i = i0; i < i1; i++) {
						const float *p = ah + (size_t)i * T;
						float *d = ds + (size_t)i * T;
						KERNEL(softmax_row_backward)(d, p, i + 1);
						/* the dK product below reads this block's upper part */
						memset(d + i + 1, 0, sizeof(float) * (i1 - i - 1));
					}
					if (dq)
						sgemm_rm(0, 0, i1 - i0, Dk, i1, scale, ds + (size_t)i0 * T, T,
							 k + ko, ldk, bq, dq + qo + (size_t)i0 * ldq, ldq);
				}
			/* key block j0..j1 is seen by query rows j0..T-1 */
			for (int j0 = 0; j0 < T; j0 += ATT_BLK) {
				int j1 = j0 + ATT_BLK < T ? j0 + ATT_BLK : T;
				if (dv)
					sgemm_rm(1, 0, j1 - j0, Dv, T - j0, 1.0f, ah + (size_t)j0 * T + j0, T,
						 dout + oo + (size_t)j0 * ldo, ldo, bkv,
						 dv + vo + (size_t)j0 * ldv, ldv);
				if (dk)
					sgemm_rm(1, 0, j1 - j0, Dk, T - j0, scale, ds + (size_t)j0 * T + j0, T,
						 q + qo + (size_t)j0 * ldq, ldq, bkv,
						 dk + ko + (size_t)j0 * ldk, ldk);
			}
		}
}

/* ---- SwiGLU ---- */

KERNEL_INLINE void swiglu_forward_body(float *out, const float *gate, const float *up, int N, int H)
{
	// gate, up, out (N,H)
	size_t n = (size_t)N * H, i = 0;
	for (; i + EW <= n; i += EW) {
		float t[EW];
		for (int j = 0; j < EW; j++)
			t[j] = gate[i + j] * sigmoid_fast(gate[i + j]) * up[i + j];
		for (int j = 0; j < EW; j++)
			out[i + j] = t[j];
	}
	for (; i < n; i++)
		out[i] = gate[i] * sigmoid_fast(gate[i]) * up[i];
}

KERNEL_DISPATCH(swiglu_forward, (float *out, const float *gate, const float *up, int N, int H),
		(out, gate, up, N, H))

/* acc (a constant where it is inlined): += into the d-buffers, else =
 * with the same bits memset(0) and += would give (0.0f + x, as a -0.0f
 * must become +0.0f) */
KERNEL_INLINE void swiglu_backward_body(float *dgate, float *dup, const float *dout,
					const float *gate, const float *up, int N, int H,
					const int acc)
{
	// dout, gate, up, dgate, dup (N,H)
	/* silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g) */
	size_t n = (size_t)N * H, i = 0;
	if (dgate && dup) {
		for (; i + EW <= n; i += EW) {
			float tg[EW], tu[EW];
			for (int j = 0; j < EW; j++) {
				float g = gate[i + j], s = sigmoid_fast(g), d = dout[i + j];
				tg[j] = (acc ? dgate[i + j] : 0.0f) +
					d * up[i + j] * s * (1.0f + g * (1.0f - s));
				tu[j] = (acc ? dup[i + j] : 0.0f) + d * g * s;
			}
			for (int j = 0; j < EW; j++) {
				dgate[i + j] = tg[j];
				dup[i + j] = tu[j];
			}
		}
	} else if (dgate) {
		for (; i + EW <= n; i += EW) {
			float tg[EW];
			for (int j = 0; j < EW; j++) {
				float g = gate[i + j], s = sigmoid_fast(g);
				tg[j] = (acc ? dgate[i + j] : 0.0f) +
					dout[i + j] * up[i + j] * s * (1.0f + g * (1.0f - s));
			}
			for (int j = 0; j < EW; j++)
				dgate[i + j] = tg[j];
		}
	} else if (dup) {
		for (; i + EW <= n; i += EW) {
			float tu[EW];
			for (int j = 0; j < EW; j++)
				tu[j] = (acc ? dup[i + j] : 0.0f) +
					dout[i + j] * gate[i + j] * sigmoid_fast(gate[i + j]);
			for (int j = 0; j < EW; j++)
				dup[i + j] = tu[j];
		}
	}
	for (; i < n; i++) {
		float g = gate[i], s = sigmoid_fast(g), d = dout[i];
		if (dgate)
			dgate[i] = (acc ? dgate[i] : 0.0f) +
				   d * up[i] * s * (1.0f + g * (1.0f - s));
		if (dup)
			dup[i] = (acc ? dup[i] : 0.0f) + d * g * s;
	}
}

KERNEL_INLINE void swiglu_backward_add_body(float *dgate, float *dup, const float *dout,
					    const float *gate, const float *up, int N, int H)
{
	swiglu_backward_body(dgate, dup, dout, gate, up, N, H, 1);
}

KERNEL_INLINE void swiglu_backward_set_body(float *dgate, float *dup, const float *dout,
					    const float *gate, const float *up, int N, int H)
{
	swiglu_backward_body(dgate, dup, dout, gate, up, N, H, 0);
}

KERNEL_VARIANTS(swiglu_backward_add, (float *dgate, float *dup, const float *dout,
		const float *gate, const float *up, int N, int H),
		(dgate, dup, dout, gate, up, N, H));
KERNEL_VARIANTS(swiglu_backward_set, (float *dgate, float *dup, const float *dout,
		const float *gate, const float *up, int N, int H),
		(dgate, dup, dout, gate, up, N, H));

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
		     const float *up, int N, int H, int accumulate)
{
	if (accumulate)
		KERNEL(swiglu_backward_add)(dgate, dup, dout, gate, up, N, H);
	else
		KERNEL(swiglu_backward_set)(dgate, dup, dout, gate, up, N, H);
}

/* ---- residual ---- */

KERNEL_INLINE void residual_forward_body(float *out, const float *a, const float *b, int n)
{
	// a, b, out (n); out may equal a or b
	int i = 0;
	for (; i + EW <= n; i += EW) {
		float t[EW];
		for (int j = 0; j < EW; j++)
			t[j] = a[i + j] + b[i + j];
		for (int j = 0; j < EW; j++)
			out[i + j] = t[j];
	}
	for (; i < n; i++)
		out[i] = a[i] + b[i];
}

KERNEL_DISPATCH(residual_forward, (float *out, const float *a, const float *b, int n),
		(out, a, b, n))

/* ---- softmax cross-entropy ---- */

KERNEL_INLINE double softmax_xent_forward_body(float *losses, float *probs, const float *logits,
					       const int32_t *targets, int N, int V)
{
	// logits, probs (N,V), targets (N), losses (N)
	double total = 0.0;
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * V;
		float *p = probs + (size_t)n * V;
		float m = max_row_body(x, V);
		float sum = exp_sum_row_body(p, x, m, V);
		scale_row_body(p, 1.0f / sum, V);
		if (targets[n] < 0) {  /* masked: no loss, no gradient */
			losses[n] = 0;
			continue;
		}
		/* -log p_t = log(sum exp(x - m)) - (x_t - m), exact even when p_t underflows */
		double loss = log((double)sum) - ((double)x[targets[n]] - m);
		losses[n] = (float)loss;
		total += loss;
	}
	return N > 0 ? total / N : 0.0;
}

KERNEL_DISPATCH_RET(double, softmax_xent_forward, (float *losses, float *probs,
		const float *logits, const int32_t *targets, int N, int V),
		    (losses, probs, logits, targets, N, V))

void softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
			   float scale, int N, int V)
{
	xent_split_backward(dlogits, probs, targets, 0, scale, N, V);
}

void xent_split_max(float *mx, const float *logits, int N, int Vl)
{
	// logits (N,Vl), mx (N)
	for (int n = 0; n < N; n++)
		mx[n] = Vl > 0 ? KERNEL(max_row)(logits + (size_t)n * Vl, Vl) : -INFINITY;
}

void xent_split_sums(float *st, float *probs, const float *logits, const float *mx,
		     const int32_t *targets, int v0, int N, int Vl)
{
	// logits, probs (N,Vl), mx (N), targets (N), st (2N)
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * Vl;
		float *p = probs + (size_t)n * Vl;
		double s = 0.0;
		for (int i = 0; i < Vl; i++) {
			p[i] = expf(x[i] - mx[n]);
			s += p[i];
		}
		int t = targets[n] - v0;
		st[n] = (float)s;
		st[N + n] = t >= 0 && t < Vl ? x[t] : 0.0f;
	}
}

double xent_split_finish(float *losses, float *probs, const float *mx, const float *st,
			 const int32_t *targets, int N, int Vl)
{
	// probs (N,Vl) in: exp(x - mx) from xent_split_sums; out: softmax
	double total = 0.0;
	for (int n = 0; n < N; n++) {
		KERNEL(scale_row)(probs + (size_t)n * Vl, 1.0f / st[n], Vl);
		if (targets[n] < 0) {
			losses[n] = 0;
			continue;
		}
		double loss = log((double)st[n]) - ((double)st[N + n] - mx[n]);
		losses[n] = (float)loss;
		total += loss;
	}
	return total;
}

KERNEL_INLINE void xent_split_backward_body(float *dlogits, const float *probs,
					    const int32_t *targets, int v0, float scale, int N,
					    int Vl)
{
	// probs, dlogits (N,Vl), targets (N); the whole vocabulary when v0 = 0, Vl = V
	if (!dlogits)
		return;
	for (int n = 0; n < N; n++) {
		if (targets[n] < 0)
			continue;
		const float *p = probs + (size_t)n * Vl;
		float *d = dlogits + (size_t)n * Vl;
		int i = 0;
		for (; i + EW <= Vl; i += EW) {
			float t[EW];
			for (int j = 0; j < EW; j++)
				t[j] = d[i + j] + p[i + j] * scale;
			for (int j = 0; j < EW; j++)
				d[i + j] = t[j];
		}
		for (; i < Vl; i++)
			d[i] += p[i] * scale;
		int t = targets[n] - v0;
		if (t >= 0 && t < Vl)
			d[t] -= scale;
	}
}

KERNEL_DISPATCH(xent_split_backward, (float *dlogits, const float *probs,
		const int32_t *targets, int v0, float scale, int N, int Vl),
		(dlogits, probs, targets, v0, scale, N, Vl))
