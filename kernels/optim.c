/* Optimizer arithmetic on flat parameter shards: AdamW, Muon (Newton-Schulz
 * orthogonalisation through sgemm_rm), global-norm helpers and the learning
 * rate schedule. The caller owns the state buffers and their sharding. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/kernels.h"

/* one pass over p, g, m, v; sqrtf vectorises (kernels/ are built with
 * -fno-math-errno) and is correctly rounded at every width. m and v are
 * read from m, v and written to mo, vo (the same buffers in place); with
 * keep, the old p and g are copied to pk, gk on the way (keep is a
 * constant in each caller: the copies cost nothing where it is false) */
KERNEL_INLINE void adamw_body(float *p, const float *g, const float *m, const float *v, float *mo, float *vo,
			      float *pk, float *gk, size_t n, float lr, float b1, float b2, float eps, float wd,
			      float bc1, float bc2, bool keep)
{
	// p, g, m, v, mo, vo, pk, gk (n)
	size_t i = 0;
	for (; i + EW <= n; i += EW) {
		float tm[EW], tv[EW], tp[EW], tpk[EW], tgk[EW];
		for (int j = 0; j < EW; j++) {
			float gi = g[i + j], pi = p[i + j];
			tm[j] = b1 * m[i + j] + (1.0f - b1) * gi;
			tv[j] = b2 * v[i + j] + (1.0f - b2) * gi * gi;
			tp[j] = pi - lr * ((tm[j] / bc1) / (sqrtf(tv[j] / bc2) + eps) + wd * pi);
			tpk[j] = pi;
			tgk[j] = gi;
		}
		for (int j = 0; j < EW; j++) {
			mo[i + j] = tm[j];
			vo[i + j] = tv[j];
			p[i + j] = tp[j];
		}
		for (int j = 0; keep && j < EW; j++) {
			pk[i + j] = tpk[j];
			gk[i + j] = tgk[j];
		}
	}
	for (; i < n; i++) {
		float mi = b1 * m[i] + (1.0f - b1) * g[i];
		float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
		if (keep) {
			pk[i] = p[i];
			gk[i] = g[i];
		}
		mo[i] = mi;
		vo[i] = vi;
		p[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i]);
	}
}

KERNEL_INLINE void adamw_step_body(float *p, const float *g, float *m, float *v, size_t n, float lr,
				   float b1, float b2, float eps, float wd, float bc1, float bc2)
{
	adamw_body(p, g, m, v, m, v, NULL, NULL, n, lr, b1, b2, eps, wd, bc1, bc2, false);
}

KERNEL_VARIANTS(adamw_step, (float *p, const float *g, float *m, float *v, size_t n, float lr,
			     float b1, float b2, float eps, float wd, float bc1, float bc2),
		(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2));

KERNEL_INLINE void adamw_keep_body(float *p, const float *g, const float *m, const float *v, float *mo, float *vo,
				   float *pk, float *gk, size_t n, float lr, float b1, float b2, float eps, float wd,
				   float bc1, float bc2)
{
	adamw_body(p, g, m, v, mo, vo, pk, gk, n, lr, b1, b2, eps, wd, bc1, bc2, true);
}

KERNEL_VARIANTS(adamw_keep, (float *p, const float *g, const float *m, const float *v, float *mo, float *vo,
			     float *pk, float *gk, size_t n, float lr, float b1, float b2, float eps, float wd,
			     float bc1, float bc2),
		(p, g, m, v, mo, vo, pk, gk, n, lr, b1, b2, eps, wd, bc1, bc2));

void adamw_update_keep(float *p, const float *g, const float *m, const float *v, float *mo, float *vo, float *pk,
		       float *gk, size_t n, float lr, float b1, float b2, float eps, float wd, int t)
{
	// p, g, m, v, mo, vo, pk, gk (n)
	float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
	KERNEL(adamw_keep)(p, g, m, v, mo, vo, pk, gk, n, lr, b1, b2, eps, wd, bc1, bc2);
}

void adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
		  float b1, float b2, float eps, float wd, int t)
{
	// p, g, m, v (n)
	float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
	KERNEL(adamw_step)(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
}

KERNEL_INLINE double sumsq_body(const float *x, size_t n)
{
	// x (n)
	double acc[VW] = { 0 }, s = 0.0;
	size_t i = 0;
	for (; i + VW <= n; i += VW)
		for (int j = 0; j < VW; j++)
			acc[j] += (double)x[i + j] * x[i + j];
	for (; i < n; i++)
		s += (double)x[i] * x[i];
	for (int j = 0; j < VW; j++)
		s += acc[j];
	return s;
}

KERNEL_DISPATCH_RET(double, sumsq, (const float *x, size_t n), (x, n))

KERNEL_INLINE void scale_inplace_body(float *x, size_t n, float s)
{
	// x (n)
	size_t i = 0;
	for (; i + EW <= n; i += EW)
		for (int j = 0; j < EW; j++)
			x[i + j] *= s;
	for (; i < n; i++)
		x[i] *= s;
}

KERNEL_DISPATCH(scale_inplace, (float *x, size_t n, float s), (x, n, s))

/* y (n) = a x + y */
KERNEL_INLINE void axpy_body(float *y, float a, const float *x, size_t n)
{
	size_t i = 0;
	for (; i + EW <= n; i += EW) {
		float t[EW];
		for (int j = 0; j < EW; j++)
			t[j] = y[i + j] + a * x[i + j];
		for (int j = 0; j < EW; j++)
			y[i + j] = t[j];
	}
	for (; i < n; i++)
		y[i] += a * x[i];
}

KERNEL_VARIANTS(axpy, (float *y, float a, const float *x, size_t n), (y, a, x, n));

/* newton_schulz5's parts: X (r,c) = G (R,C) / (||G|| + 1e-7), wide
 * side last; one step into Y (A, Bm: r x r scratch); out = X back in
 * G's orientation. */
static void ns_start(float *X, const float *G, int R, int C)
{
	size_t rc = (size_t)R * C;
	float s = (float)(1.0 / (sqrt(sumsq(G, rc)) + 1e-7));
	if (R > C) {
		for (int i = 0; i < R; i++)
			for (int j = 0; j < C; j++)
				X[(size_t)j * R + i] = G[(size_t)i * C + j] * s;
	} else {
		for (size_t i = 0; i < rc; i++)
			X[i] = G[i] * s;
	}
}

static void ns_step(float *Y, const float *X, float *A, float *Bm, int r, int c)
{
	/* Y = a X + (b A + c A A) X,  A = X X^T */
	const float a = 3.4445f, b = -4.7750f, c2 = 2.0315f;
	sgemm_rm(0, 1, r, r, c, 1.0f, X, c, X, c, 0.0f, A, r);
	sgemm_rm(0, 0, r, r, r, c2, A, r, A, r, 0.0f, Bm, r);
	KERNEL(axpy)(Bm, b, A, (size_t)r * r);
	memcpy(Y, X, sizeof(float) * (size_t)r * c);
	sgemm_rm(0, 0, r, c, r, 1.0f, Bm, r, X, c, a, Y, c);
}

static void ns_end(float *out, const float *X, int R, int C)
{
	if (R > C) {
		for (int i = 0; i < R; i++)
			for (int j = 0; j < C; j++)
				out[(size_t)i * C + j] = X[(size_t)j * R + i];
	} else {
		memcpy(out, X, sizeof(float) * (size_t)R * C);
	}
}

void newton_schulz5(float *out, const float *G, float *scratch, int R, int C)
{
	// G, out (R,C); works on X (r,c) with r = min(R,C) <= c = max(R,C); out may equal G
	int r = R > C ? C : R, c = R > C ? R : C;
	size_t rc = (size_t)r * c;
	float *X = scratch, *Y = X + rc, *A = Y + rc, *Bm = A + (size_t)r * r;
	ns_start(X, G, R, C);
	for (int step = 0; step < 5; step++) {
		ns_step(Y, X, A, Bm, r, c);
		float *t = X;
		X = Y;
		Y = t;
	}
	ns_end(out, X, R, C);
}

void newton_schulz5_batch(float *const *out, const float *const *G, float *scratch, int k, int R, int C)
{
	// G[i], out[i] (R,C) for i < k; step-major: every matrix's step s before any's step s+1
	int r = R > C ? C : R, c = R > C ? R : C;
	size_t rc = (size_t)r * c;
	float *A = scratch, *Bm = A + (size_t)r * r, *XY = Bm + (size_t)r * r;
	for (int i = 0; i < k; i++)
		ns_start(XY + 2 * rc * (size_t)i, G[i], R, C);
	for (int step = 0; step < 5; step++)
		for (int i = 0; i < k; i++) {
			float *xy = XY + 2 * rc * (size_t)i;
			ns_step(xy + !(step & 1) * rc, xy + (step & 1) * rc, A, Bm, r, c);
		}
	for (int i = 0; i < k; i++)  /* five steps: the last landed in the second half */
		ns_end(out[i], XY + 2 * rc * (size_t)i + rc, R, C);
}

double newton_schulz5_flops(int R, int C)
{
	double r = R < C ? R : C, c = R < C ? C : R;
	return 10.0 * r * r * (2.0 * c + r);
}

KERNEL_INLINE void muon_momentum_body(float *o, float *buf, const float *g, size_t n, float mu)
{
	// o, buf, g (n)
	size_t i = 0;
	for (; i + EW <= n; i += EW) {
		float tb[EW], to[EW];
		for (int j = 0; j < EW; j++) {
			tb[j] = mu * buf[i + j] + g[i + j];
			to[j] = g[i + j] + mu * tb[j];
		}
		for (int j = 0; j < EW; j++) {
			buf[i + j] = tb[j];
			o[i + j] = to[j];
		}
	}
	for (; i < n; i++) {
		buf[i] = mu * buf[i] + g[i];
		o[i] = g[i] + mu * buf[i];
	}
}

KERNEL_DISPATCH(muon_momentum, (float *o, float *buf, const float *g, size_t n, float mu),
		(o, buf, g, n, mu))

KERNEL_INLINE void muon_apply_body(float *p, const float *o, size_t n, float lr, float k, float wd)
{
	// p, o (n)
	size_t i = 0;
	for (; i + EW <= n; i += EW) {
		float t[EW];
		for (int j = 0; j < EW; j++)
			t[j] = p[i + j] - lr * (o[i + j] * k + wd * p[i + j]);
		for (int j = 0; j < EW; j++)
			p[i + j] = t[j];
	}
	for (; i < n; i++)
		p[i] -= lr * (o[i] * k + wd * p[i]);
}

KERNEL_DISPATCH(muon_apply, (float *p, const float *o, size_t n, float lr, float k, float wd),
		(p, o, n, lr, k, wd))

float muon_scale(int R, int C)
{
	return sqrtf(R > C ? (float)R / (float)C : 1.0f);
}

void muon_update(float *p, const float *g, float *buf, float *scratch, int R, int C,
		 float lr, float mu, float wd)
{
	// p, g, buf (R,C); scratch as newton_schulz5's (3 max(R,C)^2 + 2 R C floats)
	size_t n = (size_t)R * C;
	float *o = scratch, *ns = scratch + n;
	muon_momentum(o, buf, g, n, mu);
	newton_schulz5(o, o, ns, R, C);
	muon_apply(p, o, n, lr, muon_scale(R, C), wd);
}

float lr_schedule(int step, float lr, int warmup, int total, float final_fraction)
{
	if (step < warmup)
		return lr * (float)step / (float)warmup;
	if (step >= total)
		return lr * final_fraction;
	double progress = (double)(step - warmup) / (double)(total - warmup);
	double cosine = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
	return (float)(lr * (final_fraction + (1.0 - final_fraction) * cosine));
}
