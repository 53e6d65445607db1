/* Kernel suite: every float kernel against a naive double-precision
 * reference written here, every backward against central differences of
 * that reference, BLAS paths at odd sizes with accumulate semantics, and the
 * optimizers against hand-computed or independently computed values. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* Float32 kernels against double references: the worst round-off seen in
 * these small ops is ~2e-6 (relative, floored at a tenth of the tensor's
 * largest value), so 1e-4 keeps a 50x margin while an indexing or formula
 * slip shows up as O(1). Central differences in double with h = 1e-5 are
 * accurate to ~1e-9, far below it. */
#define TOL 1e-4
#define FD_H 1e-5

/* ---- helpers ---- */

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;

static void rng_seed(uint64_t s)
{
	rng_s = s * 0x9e3779b97f4a7c15ull + 1;
}

/* uniform in [-1, 1) (splitmix64) */
static double rng_unif(void)
{
	uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static float *frand(size_t n, double amp)
{
	float *x = malloc(sizeof(float) * (n ? n : 1));
	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(amp * rng_unif());
	return x;
}

static float *fzero(size_t n)
{
	float *x = calloc(n ? n : 1, sizeof(float));
	ck_assert_ptr_nonnull(x);
	return x;
}

static float *fcopy(const float *x, size_t n)
{
	float *y = malloc(sizeof(float) * (n ? n : 1));
	ck_assert_ptr_nonnull(y);
	memcpy(y, x, sizeof(float) * n);
	return y;
}

static double *dcopy(const float *x, size_t n)
{
	double *y = malloc(sizeof(double) * (n ? n : 1));
	ck_assert_ptr_nonnull(y);
	for (size_t i = 0; i < n; i++)
		y[i] = x[i];
	return y;
}

static double *dzero(size_t n)
{
	double *x = calloc(n ? n : 1, sizeof(double));
	ck_assert_ptr_nonnull(x);
	return x;
}

/* got[i] == want[i] within tol relative to max(|want[i]|, 0.1 max|want|):
 * relative where values matter, scale-relative near zero. */
static void expect_close(const char *what, const float *got, const double *want, size_t n,
			 double tol)
{
	double mx = 0.0;
	for (size_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(want[i]));
	for (size_t i = 0; i < n; i++) {
		double lim = tol * fmax(fabs(want[i]), 0.1 * mx) + 1e-30;
		ck_assert_msg(isfinite(got[i]) && fabs(got[i] - want[i]) <= lim,
			      "%s[%zu]: got %.9g, want %.9g (max |want| %.3g)", what, i, got[i],
			      want[i], mx);
	}
}

typedef double (*loss_fn)(void *ctx);

/* grad[k] = dL/dx[i] by central differences for `count` indices i spread
 * over x (all of them when count >= n); idx[k] = i. */
static size_t fd_grad(double *grad, size_t *idx, double *x, size_t n, size_t count,
		      loss_fn f, void *ctx)
{
	size_t m = count < n ? count : n;
	for (size_t k = 0; k < m; k++) {
		size_t i = m == n ? k : (k * 7919 + 13) % n;
		double save = x[i], lp, lm;
		x[i] = save + FD_H;
		lp = f(ctx);
		x[i] = save - FD_H;
		lm = f(ctx);
		x[i] = save;
		grad[k] = (lp - lm) / (2 * FD_H);
		idx[k] = i;
	}
	return m;
}

/* got - base == mult * dL/dx on the sampled indices (base NULL: zeros);
 * also asserts the gradient is not identically zero. */
static void check_grad(const char *what, const float *got, const float *base, double mult,
		       double *x, size_t n, size_t count, loss_fn f, void *ctx)
{
	double *g = dzero(n);
	size_t *idx = malloc(sizeof(size_t) * n);
	float *delta = fzero(n);
	double mx = 0.0;
	ck_assert_ptr_nonnull(idx);
	size_t m = fd_grad(g, idx, x, n, count, f, ctx);
	for (size_t k = 0; k < m; k++) {
		g[k] *= mult;
		delta[k] = got[idx[k]] - (base ? base[idx[k]] : 0.0f);
		mx = fmax(mx, fabs(g[k]));
	}
	ck_assert_msg(mx > 0.0, "%s: gradient is zero, test says nothing", what);
	expect_close(what, delta, g, m, TOL);
	free(g);
	free(idx);
	free(delta);
}

static double dot_d(const double *a, const float *r, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += a[i] * r[i];
	return s;
}

static void setup(void)
{
	blas_set_threads(1);
	rng_seed(1);
}

/* ---- double references ---- */

static void matmul_d(double *out, const double *inp, const double *w, int N, int C, int OC)
{
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double s = 0.0;
			for (int c = 0; c < C; c++)
				s += inp[n * C + c] * w[o * C + c];
			out[n * OC + o] = s;
		}
}

static void rmsnorm_d(double *out, double *rstd, const double *x, const double *w, int N,
		      int C, double eps)
{
	for (int n = 0; n < N; n++) {
		double ss = 0.0;
		for (int c = 0; c < C; c++)
			ss += x[n * C + c] * x[n * C + c];
		double r = 1.0 / sqrt(ss / C + eps);
		for (int c = 0; c < C; c++)
			out[n * C + c] = x[n * C + c] * r * w[c];
		if (rstd)
			rstd[n] = r;
	}
}

/* Hugging Face Llama: out = x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1) */
static void rope_d(double *out, const double *x, int B, int T, int H, int D, double theta)
{
	int half = D / 2;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				const double *xv = x + ((b * T + t) * H + h) * D;
				double *ov = out + ((b * T + t) * H + h) * D;
				for (int i = 0; i < D; i++) {
					int fi = i % half;
					double a = t * pow(theta, -2.0 * fi / D);
					double rot = i < half ? -xv[i + half] : xv[i - half];
					ov[i] = xv[i] * cos(a) + rot * sin(a);
				}
			}
}

static void attention_d(double *out, double *att, const double *q, const double *k,
			const double *v, int B, int T, int Hq, int Hkv, int Dk, int Dv, double scale)
{
	int g = Hq / Hkv;
	double *p = malloc(sizeof(double) * T);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < Hq; h++)
			for (int i = 0; i < T; i++) {
				const double *qi = q + ((b * T + i) * Hq + h) * Dk;
				double m = -INFINITY, sum = 0.0;
				for (int j = 0; j <= i; j++) {
					const double *kj = k + ((b * T + j) * Hkv + h / g) * Dk;
					double s = 0.0;
					for (int d = 0; d < Dk; d++)
						s += qi[d] * kj[d];
					p[j] = s * scale;
					m = fmax(m, p[j]);
				}
				for (int j = 0; j <= i; j++) {
					p[j] = exp(p[j] - m);
					sum += p[j];
				}
				double *oi = out + ((b * T + i) * Hq + h) * Dv;
				for (int d = 0; d < Dv; d++)
					oi[d] = 0.0;
				for (int j = 0; j < T; j++) {
					double pj = j <= i ? p[j] / sum : 0.0;
					if (att)
						att[((b * Hq + h) * T + i) * T + j] = pj;
					if (j > i)
						continue;
					const double *vj = v + ((b * T + j) * Hkv + h / g) * Dv;
					for (int d = 0; d < Dv; d++)
						oi[d] += pj * vj[d];
				}
			}
	free(p);
}

static void swiglu_d(double *out, const double *g, const double *u, size_t n)
{
	for (size_t i = 0; i < n; i++)
		out[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
}

static double xent_d(double *losses, double *probs, const double *x, const int32_t *tg,
		     int N, int V)
{
	double total = 0.0;
	for (int n = 0; n < N; n++) {
		double m = -INFINITY, sum = 0.0;
		for (int v = 0; v < V; v++)
			m = fmax(m, x[n * V + v]);
		for (int v = 0; v < V; v++)
			sum += exp(x[n * V + v] - m);
		for (int v = 0; v < V && probs; v++)
			probs[n * V + v] = exp(x[n * V + v] - m) / sum;
		double l = tg[n] < 0 ? 0 : log(sum) + m - x[n * V + tg[n]];  /* < 0: masked */
		if (losses)
			losses[n] = l;
		total += l;
	}
	return total / N;
}

/* ---- matmul and sgemm ---- */

START_TEST(test_matmul_ref_hand)
{
	/* [[1,2],[3,4]] . [[1,0],[0,1],[1,1]]^T = [[1,2,3],[3,4,7]] */
	const float inp[] = { 1, 2, 3, 4 }, w[] = { 1, 0, 0, 1, 1, 1 };
	const float want[] = { 1, 2, 3, 3, 4, 7 };
	float out[6], out2[6];
	matmul_forward_ref(out, inp, w, 2, 2, 3);
	matmul_forward(out2, inp, w, 2, 2, 3, 0);
	for (int i = 0; i < 6; i++) {
		ck_assert_float_eq(out[i], want[i]);
		ck_assert_float_eq(out2[i], want[i]);
	}
}
END_TEST

static const int mm_sizes[][3] = { { 5, 7, 11 }, { 1, 1, 1 }, { 67, 45, 33 }, { 130, 257, 65 } };

START_TEST(test_matmul_forward)
{
	const int N = mm_sizes[_i][0], C = mm_sizes[_i][1], OC = mm_sizes[_i][2];
	size_t no = (size_t)N * OC;
	float *inp = frand((size_t)N * C, 1), *w = frand((size_t)OC * C, 1);
	float *ref = fzero(no), *out = frand(no, 1), *z0 = frand(no, 1), *z = fcopy(z0, no);
	double *inpd = dcopy(inp, (size_t)N * C), *wd = dcopy(w, (size_t)OC * C);
	double *want = dzero(no);

	matmul_d(want, inpd, wd, N, C, OC);
	matmul_forward_ref(ref, inp, w, N, C, OC);
	expect_close("matmul_forward_ref", ref, want, no, 1e-6);
	matmul_forward(out, inp, w, N, C, OC, 0); /* overwrites the random fill */
	expect_close("matmul_forward", out, want, no, 1e-5);
	/* accumulate adds onto what was there */
	matmul_forward(z, inp, w, N, C, OC, 1);
	for (size_t i = 0; i < no; i++)
		want[i] += z0[i];
	expect_close("matmul_forward accumulate", z, want, no, 1e-5);
	free(inp), free(w), free(ref), free(out), free(z0), free(z), free(inpd), free(wd), free(want);
}
END_TEST

START_TEST(test_matmul_backward)
{
	const int N = mm_sizes[_i][0], C = mm_sizes[_i][1], OC = mm_sizes[_i][2];
	size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	float *inp = frand(ni, 1), *w = frand(nw, 1), *dout = frand(no, 1);
	float *dinp0 = frand(ni, 1), *dw0 = frand(nw, 1);
	float *dinp = fcopy(dinp0, ni), *dw = fcopy(dw0, nw);
	double *wantdi = dzero(ni), *wantdw = dzero(nw);

	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			double s = 0.0;
			for (int o = 0; o < OC; o++)
				s += (double)dout[n * OC + o] * w[o * C + c];
			wantdi[n * C + c] = dinp0[n * C + c] + 2 * s;
		}
	for (int o = 0; o < OC; o++)
		for (int c = 0; c < C; c++) {
			double s = 0.0;
			for (int n = 0; n < N; n++)
				s += (double)dout[n * OC + o] * inp[n * C + c];
			wantdw[o * C + c] = dw0[o * C + c] + 2 * s;
		}
	/* twice: backward accumulates onto what is there */
	matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
	matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
	expect_close("matmul dinp", dinp, wantdi, ni, 1e-5);
	expect_close("matmul dweight", dw, wantdw, nw, 1e-5);
	/* a NULL d-buffer is skipped, the other still computed */
	memcpy(dinp, dinp0, sizeof(float) * ni);
	memcpy(dw, dw0, sizeof(float) * nw);
	matmul_backward(NULL, dw, dout, inp, w, N, C, OC);
	matmul_backward(dinp, NULL, dout, inp, w, N, C, OC);
	matmul_backward(dinp, NULL, dout, inp, w, N, C, OC);
	matmul_backward(NULL, dw, dout, inp, w, N, C, OC);
	expect_close("matmul dinp (NULL dweight)", dinp, wantdi, ni, 1e-5);
	expect_close("matmul dweight (NULL dinp)", dw, wantdw, nw, 1e-5);
	free(inp), free(w), free(dout), free(dinp0), free(dw0), free(dinp), free(dw);
	free(wantdi), free(wantdw);
}
END_TEST

struct mm_ctx {
	double *inp, *w, *out;
	const float *r;
	int N, C, OC;
};

static double mm_loss(void *p)
{
	struct mm_ctx *c = p;
	matmul_d(c->out, c->inp, c->w, c->N, c->C, c->OC);
	return dot_d(c->out, c->r, (size_t)c->N * c->OC);
}

START_TEST(test_matmul_fd)
{
	const int N = 5, C = 7, OC = 11;
	float *inp = frand(N * C, 1), *w = frand(OC * C, 1), *r = frand(N * OC, 1);
	float *dinp = fzero(N * C), *dw = fzero(OC * C);
	struct mm_ctx c = { dcopy(inp, N * C), dcopy(w, OC * C), dzero(N * OC), r, N, C, OC };
	matmul_backward(dinp, dw, r, inp, w, N, C, OC);
	check_grad("matmul fd dinp", dinp, NULL, 1, c.inp, N * C, SIZE_MAX, mm_loss, &c);
	check_grad("matmul fd dweight", dw, NULL, 1, c.w, OC * C, SIZE_MAX, mm_loss, &c);
	free(inp), free(w), free(r), free(dinp), free(dw), free(c.inp), free(c.w), free(c.out);
}
END_TEST

START_TEST(test_sgemm_strided)
{
	/* every transpose combination with padded leading dimensions */
	const int M = 13, N = 9, K = 17, pad = 5;
	const float alpha = 0.7f, beta = 0.3f;
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
			int ra = ta ? K : M, rb = tb ? N : K;
			float *A = frand((size_t)ra * lda, 1), *Bm = frand((size_t)rb * ldb, 1);
			float *Cm = frand((size_t)M * ldc, 1), *C0 = fcopy(Cm, (size_t)M * ldc);
			double *want = dzero((size_t)M * ldc);
			for (int i = 0; i < M; i++)
				for (int j = 0; j < ldc; j++) {
					if (j >= N) { /* padding stays untouched */
						want[i * ldc + j] = C0[i * ldc + j];
						continue;
					}
					double s = 0.0;
					for (int l = 0; l < K; l++) {
						double a = ta ? A[l * lda + i] : A[i * lda + l];
						double b = tb ? Bm[j * ldb + l] : Bm[l * ldb + j];
						s += a * b;
					}
					want[i * ldc + j] = alpha * s + beta * (double)C0[i * ldc + j];
				}
			sgemm_rm(ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
			expect_close("sgemm_rm", Cm, want, (size_t)M * ldc, 1e-5);
			free(A), free(Bm), free(Cm), free(C0), free(want);
		}
}
END_TEST

START_TEST(test_sgemm_empty)
{
	/* K = 0: C = beta C; beta = 0 clears even NaN */
	float c[6] = { 1, 2, 3, 4, 5, 6 }, a = 1, b = 1;
	sgemm_rm(0, 0, 2, 3, 0, 1.0f, &a, 1, &b, 3, 0.5f, c, 3);
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(c[i], 0.5f * (i + 1));
	for (int i = 0; i < 6; i++)
		c[i] = NAN;
	sgemm_rm(0, 0, 2, 3, 0, 1.0f, &a, 1, &b, 3, 0.0f, c, 3);
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(c[i], 0.0f);
	/* M = 0 touches nothing */
	sgemm_rm(0, 0, 0, 3, 2, 1.0f, &a, 2, &b, 3, 0.0f, c, 3);
}
END_TEST

/* ---- embedding ---- */

START_TEST(test_embedding)
{
	const int N = 7, C = 13, V = 5;
	const int32_t tok[] = { 3, 0, 3, 4, 1, 3, 0 };
	float *wte = frand(V * C, 1), *out = fzero(N * C), *dout = frand(N * C, 1);
	float *dw0 = frand(V * C, 1), *dw = fcopy(dw0, V * C);
	double *want = dzero(V * C);
	embedding_forward(out, tok, wte, N, C);
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			ck_assert_float_eq(out[n * C + c], wte[tok[n] * C + c]);
	for (int i = 0; i < V * C; i++)
		want[i] = dw0[i];
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			want[tok[n] * C + c] += 2.0 * dout[n * C + c];
	embedding_backward(dw, dout, tok, N, C);
	embedding_backward(dw, dout, tok, N, C);
	embedding_backward(NULL, dout, tok, N, C);
	expect_close("embedding dwte", dw, want, V * C, 1e-6);
	/* token 2 never appears: its row is untouched */
	for (int c = 0; c < C; c++)
		ck_assert_float_eq(dw[2 * C + c], dw0[2 * C + c]);
	free(wte), free(out), free(dout), free(dw0), free(dw), free(want);
}
END_TEST

/* ---- RMSNorm ---- */

struct rms_ctx {
	double *x, *w, *out;
	const float *r;
	int N, C;
	double eps;
};

static double rms_loss(void *p)
{
	struct rms_ctx *c = p;
	rmsnorm_d(c->out, NULL, c->x, c->w, c->N, c->C, c->eps);
	return dot_d(c->out, c->r, (size_t)c->N * c->C);
}

START_TEST(test_rmsnorm)
{
	const int N = 5, C = _i ? 21 : 7; /* 21: vector blocks and a tail */
	const float eps = 1e-5f;
	size_t n = (size_t)N * C;
	float *x = frand(n, 2), *w = frand(C, 1), *out = fzero(n), *rstd = fzero(N);
	float *r = frand(n, 1), *dx0 = frand(n, 1), *dw0 = frand(C, 1);
	float *dx = fcopy(dx0, n), *dw = fcopy(dw0, C);
	struct rms_ctx c = { dcopy(x, n), dcopy(w, C), dzero(n), r, N, C, eps };
	double *rstdd = dzero(N);

	rmsnorm_forward(out, rstd, x, w, N, C, eps);
	rmsnorm_d(c.out, rstdd, c.x, c.w, N, C, eps);
	expect_close("rmsnorm out", out, c.out, n, TOL);
	expect_close("rmsnorm rstd", rstd, rstdd, N, TOL);
	rmsnorm_backward(dx, dw, r, x, w, rstd, N, C);
	check_grad("rmsnorm dinp", dx, dx0, 1, c.x, n, SIZE_MAX, rms_loss, &c);
	check_grad("rmsnorm dweight", dw, dw0, 1, c.w, C, SIZE_MAX, rms_loss, &c);
	/* NULL d-buffers are skipped */
	memcpy(dx, dx0, sizeof(float) * n);
	memcpy(dw, dw0, sizeof(float) * C);
	rmsnorm_backward(dx, NULL, r, x, w, rstd, N, C);
	rmsnorm_backward(NULL, dw, r, x, w, rstd, N, C);
	check_grad("rmsnorm dinp (NULL dweight)", dx, dx0, 1, c.x, n, SIZE_MAX, rms_loss, &c);
	check_grad("rmsnorm dweight (NULL dinp)", dw, dw0, 1, c.w, C, SIZE_MAX, rms_loss, &c);
	free(x), free(w), free(out), free(rstd), free(r), free(dx0), free(dw0), free(dx), free(dw);
	free(c.x), free(c.w), free(c.out), free(rstdd);
}
END_TEST

/* ---- RoPE ---- */

START_TEST(test_rope_hand)
{
	/* D = 4, theta = 1e4: inv_freq = (1, 0.01); position 3 rotates pair
	 * (x0, x2) by 3 rad and (x1, x3) by 0.03 rad:
	 *   x0 cos3 - x2 sin3, x1 cos.03 - x3 sin.03, x2 cos3 + x0 sin3, x3 cos.03 + x1 sin.03 */
	float cs[4 * 2], sn[4 * 2], x[4 * 4] = { 0 }, out[4 * 4];
	const float want[4] = { -1.41335252f, 1.87911807f, -2.82885748f, 4.05819114f };
	rope_table(cs, sn, 4, 4, 10000.0f);
	ck_assert_float_eq_tol(cs[3 * 2 + 0], -0.98999250f, 1e-7f);
	ck_assert_float_eq_tol(sn[3 * 2 + 0], 0.14112001f, 1e-7f);
	ck_assert_float_eq_tol(cs[3 * 2 + 1], 0.99955003f, 1e-7f);
	ck_assert_float_eq_tol(sn[3 * 2 + 1], 0.02999550f, 1e-7f);
	ck_assert_float_eq(cs[0], 1.0f);
	ck_assert_float_eq(sn[1], 0.0f);
	for (int i = 0; i < 4; i++)
		x[3 * 4 + i] = (float)(i + 1); /* (B,T,H,D) = (1,4,1,4), position 3 */
	rope_forward(out, x, cs, sn, 1, 4, 1, 4);
	for (int i = 0; i < 4; i++)
		ck_assert_float_eq_tol(out[3 * 4 + i], want[i], 2e-6f);
}
END_TEST

struct rope_ctx {
	double *x, *out;
	const float *r;
	int B, T, H, D;
};

static double rope_loss(void *p)
{
	struct rope_ctx *c = p;
	rope_d(c->out, c->x, c->B, c->T, c->H, c->D, 10000.0);
	return dot_d(c->out, c->r, (size_t)c->B * c->T * c->H * c->D);
}

START_TEST(test_rope)
{
	const int B = 2, T = 5, H = 3, D = _i ? 22 : 6; /* half = 3, 11 */
	size_t n = (size_t)B * T * H * D, nt = (size_t)T * D / 2;
	float *cs = fzero(nt), *sn = fzero(nt), *x = frand(n, 1), *out = fzero(n);
	float *r = frand(n, 1), *d0 = frand(n, 1), *dx = fcopy(d0, n), *back = fzero(n);
	struct rope_ctx c = { dcopy(x, n), dzero(n), r, B, T, H, D };

	rope_table(cs, sn, T, D, 10000.0f);
	rope_forward(out, x, cs, sn, B, T, H, D);
	rope_loss(&c);
	expect_close("rope forward", out, c.out, n, TOL);
	/* in place gives the same */
	float *inplace = fcopy(x, n);
	rope_forward(inplace, inplace, cs, sn, B, T, H, D);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq(inplace[i], out[i]);
	/* R is orthogonal: R^T R x = x */
	rope_backward(back, out, cs, sn, B, T, H, D, 1);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq_tol(back[i], x[i], 1e-6f);
	rope_backward(dx, r, cs, sn, B, T, H, D, 1);
	check_grad("rope dinp", dx, d0, 1, c.x, n, SIZE_MAX, rope_loss, &c);
	free(cs), free(sn), free(x), free(out), free(r), free(d0), free(dx), free(back);
	free(inplace), free(c.x), free(c.out);
}
END_TEST

/* ---- attention ---- */

struct att_ctx {
	double *q, *k, *v, *out;
	const float *r;
	int B, T, Hq, Hkv, Dk, Dv;
	double scale;
};

static double att_loss(void *p)
{
	struct att_ctx *c = p;
	attention_d(c->out, NULL, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->Dk, c->Dv, c->scale);
	return dot_d(c->out, c->r, (size_t)c->B * c->T * c->Hq * c->Dv);
}

/* shapes (B, T, Hq, Hkv, Dk, Dv): the odd small case, one long enough for
 * several row blocks, and latent attention's q/k head wider than v's
 * (and narrower), at a scale other than 1/sqrt(Dk) */
static const int att_shapes[][6] = {
	{ 2, 5, 4, 2, 6, 6 }, { 1, 150, 2, 1, 16, 16 }, { 2, 7, 3, 3, 5, 5 },
	{ 2, 70, 3, 3, 12, 8 }, { 1, 9, 2, 1, 6, 11 },
};

static double att_scale_of(int i)
{
	return att_shapes[i][4] == att_shapes[i][5] ? 1.0 / sqrt((double)att_shapes[i][4]) : 0.37;
}

START_TEST(test_attention_forward)
{
	const int B = att_shapes[_i][0], T = att_shapes[_i][1], Hq = att_shapes[_i][2];
	const int Hkv = att_shapes[_i][3], Dk = att_shapes[_i][4], Dv = att_shapes[_i][5];
	const double scale = att_scale_of(_i);
	size_t nq = (size_t)B * T * Hq * Dk, nk = (size_t)B * T * Hkv * Dk;
	size_t nv = (size_t)B * T * Hkv * Dv, no = (size_t)B * T * Hq * Dv;
	size_t na = (size_t)B * Hq * T * T;
	float *q = frand(nq, 2), *k = frand(nk, 2), *v = frand(nv, 1);
	float *out = frand(no, 1), *att = frand(na, 1);
	double *outd = dzero(no), *attd = dzero(na);
	double *qd = dcopy(q, nq), *kd = dcopy(k, nk), *vd = dcopy(v, nv);

	attention_forward(out, att, q, k, v, B, T, Hq, Hkv, Dk, Dv, (float)scale);
	attention_d(outd, attd, qd, kd, vd, B, T, Hq, Hkv, Dk, Dv, scale);
	expect_close("attention out", out, outd, no, TOL);
	expect_close("attention att", att, attd, na, TOL);
	for (int bh = 0; bh < B * Hq; bh++)
		for (int i = 0; i < T; i++) {
			double s = 0.0;
			for (int j = 0; j < T; j++) {
				if (j > i)
					ck_assert_float_eq(att[((size_t)bh * T + i) * T + j], 0.0f);
				s += att[((size_t)bh * T + i) * T + j];
			}
			ck_assert_double_eq_tol(s, 1.0, 1e-5);
		}
	free(q), free(k), free(v), free(out), free(att), free(outd), free(attd);
	free(qd), free(kd), free(vd);
}
END_TEST

START_TEST(test_attention_backward)
{
	const int B = att_shapes[_i][0], T = att_shapes[_i][1], Hq = att_shapes[_i][2];
	const int Hkv = att_shapes[_i][3], Dk = att_shapes[_i][4], Dv = att_shapes[_i][5];
	const double scale = att_scale_of(_i);
	size_t nq = (size_t)B * T * Hq * Dk, nk = (size_t)B * T * Hkv * Dk;
	size_t nv = (size_t)B * T * Hkv * Dv, no = (size_t)B * T * Hq * Dv;
	size_t na = (size_t)B * Hq * T * T;
	/* differences cost O(T^2) each: sample the long cases */
	size_t count = T > 64 ? 60 : SIZE_MAX;
	float *q = frand(nq, 2), *k = frand(nk, 2), *v = frand(nv, 1), *r = frand(no, 1);
	float *out = fzero(no), *att = fzero(na), *scratch = frand((size_t)T * T, 1);
	float *dq0 = frand(nq, 1), *dk0 = frand(nk, 1), *dv0 = frand(nv, 1);
	float *dq = fcopy(dq0, nq), *dk = fcopy(dk0, nk), *dv = fcopy(dv0, nv);
	struct att_ctx c = { dcopy(q, nq), dcopy(k, nk), dcopy(v, nv), dzero(no), r, B, T, Hq, Hkv,
			     Dk, Dv, scale };
	float sc = (float)scale;

	attention_forward(out, att, q, k, v, B, T, Hq, Hkv, Dk, Dv, sc);
	/* twice: gradients accumulate onto the random fill */
	attention_backward(dq, dk, dv, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 1);
	attention_backward(dq, dk, dv, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 1);
	check_grad("attention dq", dq, dq0, 2, c.q, nq, count, att_loss, &c);
	check_grad("attention dk", dk, dk0, 2, c.k, nk, count, att_loss, &c);
	check_grad("attention dv", dv, dv0, 2, c.v, nv, count, att_loss, &c);
	/* each NULL combination leaves the others right */
	memcpy(dq, dq0, sizeof(float) * nq);
	memcpy(dk, dk0, sizeof(float) * nk);
	memcpy(dv, dv0, sizeof(float) * nv);
	attention_backward(dq, NULL, NULL, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 1);
	attention_backward(NULL, dk, NULL, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 1);
	attention_backward(NULL, NULL, dv, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 1);
	check_grad("attention dq alone", dq, dq0, 1, c.q, nq, count, att_loss, &c);
	check_grad("attention dk alone", dk, dk0, 1, c.k, nk, count, att_loss, &c);
	check_grad("attention dv alone", dv, dv0, 1, c.v, nv, count, att_loss, &c);
	/* accumulate 0 over garbage gives zeroed buffers' += bit for bit
	 * (the grouped shapes: dk, dv written by a kv head's first query head) */
	memset(dq0, 0, sizeof(float) * nq);
	memset(dk0, 0, sizeof(float) * nk);
	memset(dv0, 0, sizeof(float) * nv);
	memset(dq, 0xff, sizeof(float) * nq);
	memset(dk, 0xff, sizeof(float) * nk);
	memset(dv, 0xff, sizeof(float) * nv);
	attention_backward(dq0, dk0, dv0, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 1);
	attention_backward(dq, dk, dv, scratch, r, q, k, v, att, B, T, Hq, Hkv, Dk, Dv, sc, 0);
	ck_assert_int_eq(memcmp(dq, dq0, sizeof(float) * nq), 0);
	ck_assert_int_eq(memcmp(dk, dk0, sizeof(float) * nk), 0);
	ck_assert_int_eq(memcmp(dv, dv0, sizeof(float) * nv), 0);
	free(q), free(k), free(v), free(r), free(out), free(att), free(scratch);
	free(dq0), free(dk0), free(dv0), free(dq), free(dk), free(dv);
	free(c.q), free(c.k), free(c.v), free(c.out);
}
END_TEST

/* ---- latent attention's pieces (kernels/mla.c) ---- */

/* Hugging Face DeepSeek-V3 with rope_interleave, on dims [off, off + Dr)
 * of each head: the slice is de-interleaved (x0, x2, .., x1, x3, ..),
 * rotated Llama's way with cos/sin = cat(freqs, freqs) and the result
 * kept in de-interleaved order; here it is written back interleaved,
 * out[off + 2i] = y[i], out[off + 2i + 1] = y[half + i], which leaves
 * every q.k product as Hugging Face's. Other dims pass through. */
static void rope_adj_d(double *out, const double *x, int B, int T, int H, int D, int off, int Dr,
		       const double *inv_freq, double mult)
{
	int half = Dr / 2;
	double *xd = malloc(sizeof(double) * Dr);
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				const double *xv = x + ((b * T + t) * H + h) * D;
				double *ov = out + ((b * T + t) * H + h) * D;
				for (int i = 0; i < D; i++)
					ov[i] = xv[i];
				for (int i = 0; i < half; i++) {
					xd[i] = xv[off + 2 * i];
					xd[half + i] = xv[off + 2 * i + 1];
				}
				for (int i = 0; i < Dr; i++) {
					double a = t * inv_freq[i % half];
					double rot = i < half ? -xd[i + half] : xd[i - half];
					double y = (xd[i] * cos(a) + rot * sin(a)) * mult;
					ov[off + (i < half ? 2 * i : 2 * (i - half) + 1)] = y;
				}
			}
	free(xd);
}

struct rope_adj_ctx {
	double *x, *out, *inv_freq;
	const float *r;
	int B, T, H, D, off, Dr;
};

static double rope_adj_loss(void *p)
{
	struct rope_adj_ctx *c = p;
	rope_adj_d(c->out, c->x, c->B, c->T, c->H, c->D, c->off, c->Dr, c->inv_freq, 1.0);
	return dot_d(c->out, c->r, (size_t)c->B * c->T * c->H * c->D);
}

/* a query head [nope 5 | rope 6], a key [latent 7 | rope 6] with one
 * head, and a head that is all rope */
static const int rope_adj_shapes[][4] = { { 3, 11, 5, 6 }, { 1, 13, 7, 6 }, { 2, 8, 0, 8 } };

START_TEST(test_rope_adj)
{
	const int B = 2, T = 5, H = rope_adj_shapes[_i][0], D = rope_adj_shapes[_i][1];
	const int off = rope_adj_shapes[_i][2], Dr = rope_adj_shapes[_i][3];
	size_t n = (size_t)B * T * H * D, nt = (size_t)T * Dr / 2;
	float *cs = fzero(nt), *sn = fzero(nt), *x = frand(n, 1), *out = fzero(n);
	float *r = frand(n, 1), *d0 = frand(n, 1), *dx = fcopy(d0, n), *back = fzero(n);
	double *inv = dzero((size_t)Dr / 2);
	for (int i = 0; i < Dr / 2; i++)
		inv[i] = pow(10000.0, -2.0 * i / Dr);
	struct rope_adj_ctx c = { dcopy(x, n), dzero(n), inv, r, B, T, H, D, off, Dr };

	rope_table(cs, sn, T, Dr, 10000.0f);
	rope_adj_forward(out, x, cs, sn, B, T, H, D, off, Dr);
	rope_adj_loss(&c);
	expect_close("rope_adj forward", out, c.out, n, TOL);
	/* the dims outside the slice are copied exactly */
	for (size_t e = 0; e < n; e++) {
		int i = (int)(e % (size_t)D);
		if (i < off || i >= off + Dr)
			ck_assert_float_eq(out[e], x[e]);
	}
	float *inplace = fcopy(x, n);
	rope_adj_forward(inplace, inplace, cs, sn, B, T, H, D, off, Dr);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq(inplace[i], out[i]);
	/* orthogonal: J^T J x = x */
	rope_adj_backward(back, out, cs, sn, B, T, H, D, off, Dr);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq_tol(back[i], x[i], 1e-6f);
	rope_adj_backward(dx, r, cs, sn, B, T, H, D, off, Dr);
	check_grad("rope_adj dinp", dx, d0, 1, c.x, n, SIZE_MAX, rope_adj_loss, &c);
	free(cs), free(sn), free(x), free(out), free(r), free(d0), free(dx), free(back);
	free(inplace), free(inv), free(c.x), free(c.out);
}
END_TEST

/* YaRN's inverse frequencies, from Hugging Face's _compute_yarn_parameters
 * (truncate on) */
static void yarn_inv_freq_d(double *inv, int D, double theta, double factor, int orig, double bf,
			    double bs)
{
	double low = floor(D * log(orig / (bf * 2 * M_PI)) / (2 * log(theta)));
	double high = ceil(D * log(orig / (bs * 2 * M_PI)) / (2 * log(theta)));
	low = fmax(low, 0);
	high = fmin(high, D - 1);
	if (low == high)
		high += 0.001;
	for (int i = 0; i < D / 2; i++) {
		double pos = pow(theta, 2.0 * i / D);
		double ext = 1.0 - fmin(fmax((i - low) / (high - low), 0), 1);
		inv[i] = 1.0 / (factor * pos) * (1 - ext) + 1.0 / pos * ext;
	}
}

START_TEST(test_rope_yarn)
{
	/* D = 8, theta 1e4, factor 40, 4096 original positions, betas 32, 1:
	 * dim(32) = 8 ln(4096 / 64 pi) / (2 ln 1e4) = 1.309 -> 1, dim(1) =
	 * 2.81 -> 3, so the ramp over i = 0..3 is (0, 0, 1/2, 1): the two
	 * fastest frequencies kept, the slowest divided by 40, pair 2 halfway */
	const int T = 7, D = 8;
	float cs[7 * 4], sn[7 * 4];
	double want[4] = { 1.0, 0.1, 0.5 * 0.01 + 0.5 * 0.01 / 40, 0.001 / 40 }, inv[4];
	rope_table_yarn(cs, sn, T, D, 10000.0f, 40.0f, 4096, 32.0f, 1.0f, 1.25f);
	yarn_inv_freq_d(inv, D, 10000.0, 40.0, 4096, 32.0, 1.0);
	for (int i = 0; i < 4; i++) {
		ck_assert_double_eq_tol(inv[i], want[i], 1e-12);
		for (int t = 0; t < T; t++) {
			ck_assert_float_eq_tol(cs[t * 4 + i], (float)(1.25 * cos(t * want[i])), 2e-7f);
			ck_assert_float_eq_tol(sn[t * 4 + i], (float)(1.25 * sin(t * want[i])), 2e-7f);
		}
	}
	/* a wider head, other betas, a ramp of one step (low == high: the
	 * +0.001 guard) and factor 1 (nothing interpolated) */
	static const struct { int D, orig; double factor, bf, bs; } cases[] = {
		{ 64, 4096, 40, 32, 1 }, { 16, 2048, 8, 4, 2 }, { 32, 512, 1, 32, 1 }, { 16, 64, 4, 2, 1.9 },
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		int Dk = cases[k].D;
		float *c2 = fzero((size_t)T * Dk / 2), *s2 = fzero((size_t)T * Dk / 2);
		double *iv = dzero((size_t)Dk / 2);
		rope_table_yarn(c2, s2, T, Dk, 10000.0f, (float)cases[k].factor, cases[k].orig,
				(float)cases[k].bf, (float)cases[k].bs, 1.0f);
		yarn_inv_freq_d(iv, Dk, 10000.0, cases[k].factor, cases[k].orig, cases[k].bf, cases[k].bs);
		for (int t = 0; t < T; t++)
			for (int i = 0; i < Dk / 2; i++) {
				ck_assert_float_eq_tol(c2[t * Dk / 2 + i], (float)cos(t * iv[i]), 2e-7f);
				ck_assert_float_eq_tol(s2[t * Dk / 2 + i], (float)sin(t * iv[i]), 2e-7f);
			}
		free(c2), free(s2), free(iv);
	}
	/* mscale(f, m) = 0.1 m ln f + 1, 1 for f <= 1 */
	ck_assert_float_eq_tol(rope_yarn_mscale(40.0f, 1.0f), (float)(0.1 * log(40.0) + 1), 1e-6f);
	ck_assert_float_eq_tol(rope_yarn_mscale(40.0f, 0.707f), (float)(0.0707 * log(40.0) + 1), 1e-6f);
	ck_assert_float_eq(rope_yarn_mscale(1.0f, 3.0f), 1.0f);
	ck_assert_float_eq(rope_yarn_mscale(0.5f, 3.0f), 1.0f);
}
END_TEST

START_TEST(test_mla_kv)
{
	const int N = 6, H = 3, Dn = 4, Dr = 2, Dv = 5;
	size_t nb = (size_t)N * H * (Dn + Dv), nr = (size_t)N * Dr;
	size_t nk = (size_t)N * H * (Dn + Dr), nv = (size_t)N * H * Dv;
	float *kvb = frand(nb, 1), *kr = frand(nr, 1), *k = frand(nk, 1), *v = frand(nv, 1);
	mla_kv_forward(k, v, kvb, kr, N, H, Dn, Dr, Dv);
	for (int n = 0; n < N; n++)
		for (int h = 0; h < H; h++) {
			for (int i = 0; i < Dn; i++)
				ck_assert_float_eq(k[(n * H + h) * (Dn + Dr) + i], kvb[(n * H + h) * (Dn + Dv) + i]);
			for (int i = 0; i < Dr; i++)
				ck_assert_float_eq(k[(n * H + h) * (Dn + Dr) + Dn + i], kr[n * Dr + i]);
			for (int i = 0; i < Dv; i++)
				ck_assert_float_eq(v[(n * H + h) * Dv + i], kvb[(n * H + h) * (Dn + Dv) + Dn + i]);
		}
	/* the backward is the adjoint: <dk, k(x)> + <dv, v(x)> = <J^T (dk, dv), x>,
	 * accumulated onto what the buffers held */
	float *dk = frand(nk, 1), *dv = frand(nv, 1), *g0 = frand(nb, 1), *r0 = frand(nr, 1);
	float *g = fcopy(g0, nb), *gr = fcopy(r0, nr);
	mla_kv_backward(g, gr, dk, dv, N, H, Dn, Dr, Dv);
	double lhs = 0, rhs = 0;
	for (size_t i = 0; i < nk; i++)
		lhs += (double)dk[i] * k[i];
	for (size_t i = 0; i < nv; i++)
		lhs += (double)dv[i] * v[i];
	for (size_t i = 0; i < nb; i++)
		rhs += (double)(g[i] - g0[i]) * kvb[i];
	for (size_t i = 0; i < nr; i++)
		rhs += (double)(gr[i] - r0[i]) * kr[i];
	ck_assert_double_eq_tol(lhs, rhs, 1e-5 * fabs(lhs) + 1e-6);
	/* the shared key's gradient is the sum over the heads */
	for (int n = 0; n < N; n++)
		for (int i = 0; i < Dr; i++) {
			double s = r0[n * Dr + i];
			for (int h = 0; h < H; h++)
				s += dk[(n * H + h) * (Dn + Dr) + Dn + i];
			ck_assert_float_eq_tol(gr[n * Dr + i], (float)s, 1e-6f);
		}
	/* NULL outputs are skipped */
	mla_kv_backward(NULL, gr, dk, dv, N, H, Dn, Dr, Dv);
	mla_kv_backward(g, NULL, dk, dv, N, H, Dn, Dr, Dv);
	free(kvb), free(kr), free(k), free(v), free(dk), free(dv), free(g0), free(r0), free(g), free(gr);
}
END_TEST

/* ---- SwiGLU ---- */

struct swi_ctx {
	double *g, *u, *out;
	const float *r;
	size_t n;
};

static double swi_loss(void *p)
{
	struct swi_ctx *c = p;
	swiglu_d(c->out, c->g, c->u, c->n);
	return dot_d(c->out, c->r, c->n);
}

START_TEST(test_swiglu)
{
	const int N = 5, H = 7;
	size_t n = (size_t)N * H;
	float *g = frand(n, 4), *u = frand(n, 1), *out = fzero(n), *r = frand(n, 1);
	float *dg0 = frand(n, 1), *du0 = frand(n, 1), *dg = fcopy(dg0, n), *du = fcopy(du0, n);
	/* the tails of the exponential: large |g| must stay finite and exact */
	g[0] = 30.0f, g[1] = -30.0f, g[2] = 95.0f, g[3] = -95.0f, g[9] = -200.0f, g[10] = 0.0f;
	struct swi_ctx c = { dcopy(g, n), dcopy(u, n), dzero(n), r, n };

	swiglu_forward(out, g, u, N, H);
	swi_loss(&c);
	expect_close("swiglu out", out, c.out, n, TOL);
	swiglu_backward(dg, du, r, g, u, N, H, 1);
	check_grad("swiglu dgate", dg, dg0, 1, c.g, n, SIZE_MAX, swi_loss, &c);
	check_grad("swiglu dup", du, du0, 1, c.u, n, SIZE_MAX, swi_loss, &c);
	memcpy(dg, dg0, sizeof(float) * n);
	memcpy(du, du0, sizeof(float) * n);
	swiglu_backward(dg, NULL, r, g, u, N, H, 1);
	swiglu_backward(NULL, du, r, g, u, N, H, 1);
	check_grad("swiglu dgate alone", dg, dg0, 1, c.g, n, SIZE_MAX, swi_loss, &c);
	check_grad("swiglu dup alone", du, du0, 1, c.u, n, SIZE_MAX, swi_loss, &c);
	free(g), free(u), free(out), free(r), free(dg0), free(du0), free(dg), free(du);
	free(c.g), free(c.u), free(c.out);
}
END_TEST

/* accumulate = 0 writes what memset(0) and += would: every bit, a -0.0f
 * result included (0.0f + -0.0f is +0.0f), over a buffer of garbage */
START_TEST(test_backward_write)
{
	const int N = 3, H = 19, B = 1, T = 3, Hh = 2, D = 2 * H;
	size_t n = (size_t)N * H, nr = (size_t)B * T * Hh * D, nt = (size_t)T * H;
	float *g = frand(n, 4), *u = frand(n, 1), *d = frand(n, 1);
	float *dg0 = fzero(n), *du0 = fzero(n), *dg = malloc(n * sizeof(float));
	float *du = malloc(n * sizeof(float));
	float *cs = frand(nt, 1), *sn = frand(nt, 1), *r = frand(nr, 1), *dx0 = fzero(nr);
	float *dx = malloc(nr * sizeof(float));
	ck_assert_ptr_nonnull(dg);
	ck_assert_ptr_nonnull(du);
	ck_assert_ptr_nonnull(dx);
	d[0] = -0.0f, u[0] = 1.0f, g[0] = 1.0f;  /* dgate and dup products of -0 */
	r[0] = -0.0f, r[H] = -0.0f, cs[0] = 1.0f, sn[0] = 1.0f; /* -0 c + -0 s is -0 */
	memset(dg, 0xff, n * sizeof(float)), memset(du, 0xff, n * sizeof(float));
	memset(dx, 0xff, nr * sizeof(float));
	swiglu_backward(dg0, du0, d, g, u, N, H, 1);
	swiglu_backward(dg, du, d, g, u, N, H, 0);
	ck_assert_int_eq(memcmp(dg, dg0, n * sizeof(float)), 0);
	ck_assert_int_eq(memcmp(du, du0, n * sizeof(float)), 0);
	ck_assert(dg[0] == 0.0f && !signbit(dg[0]) && !signbit(du[0]));
	rope_backward(dx0, r, cs, sn, B, T, Hh, D, 1);
	rope_backward(dx, r, cs, sn, B, T, Hh, D, 0);
	ck_assert_int_eq(memcmp(dx, dx0, nr * sizeof(float)), 0);
	ck_assert(dx[0] == 0.0f && !signbit(dx[0]));
	free(g), free(u), free(d), free(dg0), free(du0), free(dg), free(du);
	free(cs), free(sn), free(r), free(dx0), free(dx);
}
END_TEST

START_TEST(test_residual)
{
	const int n = 29;
	float *a = frand(n, 1), *b = frand(n, 1), *out = fzero(n), *a2 = fcopy(a, n);
	residual_forward(out, a, b, n);
	for (int i = 0; i < n; i++)
		ck_assert_float_eq(out[i], a[i] + b[i]);
	residual_forward(a2, a2, b, n); /* in place, x += f(x) */
	for (int i = 0; i < n; i++)
		ck_assert_float_eq(a2[i], out[i]);
	free(a), free(b), free(out), free(a2);
}
END_TEST

/* ---- softmax cross-entropy ---- */

struct xent_ctx {
	double *x;
	const int32_t *tg;
	int N, V;
	double scale;
};

static double xent_loss(void *p)
{
	struct xent_ctx *c = p;
	return c->scale * c->N * xent_d(NULL, NULL, c->x, c->tg, c->N, c->V);
}

/* _i: 0, 1 two vocabularies; 2, 3 the same with targets 1 and 3 masked */
START_TEST(test_xent)
{
	const int N = 5, V = _i & 1 ? 37 : 11;
	size_t n = (size_t)N * V;
	int32_t tg[5];
	float *x = frand(n, 3), *probs = fzero(n), *losses = fzero(N);
	float *d0 = frand(n, 0.1), *d = fcopy(d0, n);
	double *probsd = dzero(n), *lossesd = dzero(N);
	struct xent_ctx c = { dcopy(x, n), tg, N, V, 1.0 / N };
	for (int i = 0; i < N; i++)
		tg[i] = (i * 5 + 3) % V;
	if (_i >= 2)
		tg[1] = tg[3] = -1;

	double mean = softmax_xent_forward(losses, probs, x, tg, N, V);
	double meand = xent_d(lossesd, probsd, c.x, tg, N, V);
	ck_assert_double_eq_tol(mean, meand, 1e-6 * meand);
	expect_close("xent losses", losses, lossesd, N, 1e-5);
	expect_close("xent probs", probs, probsd, n, 1e-5);
	softmax_xent_backward(d, probs, tg, (float)c.scale, N, V);
	softmax_xent_backward(d, probs, tg, (float)c.scale, N, V);
	softmax_xent_backward(NULL, probs, tg, (float)c.scale, N, V);
	check_grad("xent dlogits", d, d0, 2, c.x, n, SIZE_MAX, xent_loss, &c);
	if (_i >= 2) {  /* a masked row: no loss, its gradient row untouched */
		ck_assert_float_eq(losses[1], 0.0f);
		ck_assert_float_eq(losses[3], 0.0f);
		ck_assert_float_gt(losses[0], 0.0f);
		ck_assert(!memcmp(d + V, d0 + V, sizeof(float) * V));
		ck_assert(memcmp(d, d0, sizeof(float) * V));
	}
	free(x), free(probs), free(losses), free(d0), free(d), free(probsd), free(lossesd), free(c.x);
}
END_TEST

START_TEST(test_xent_split)
{
	/* the vocabulary cut into uneven parts (as devices would hold it), the
	 * statistics combined as the caller does, gives the whole-row losses,
	 * probabilities and gradients; so do the range embeddings */
	const int N = 6, V = 29, cuts[] = { 0, 7, 8, 29 }, nparts = 3, C = 5;
	size_t n = (size_t)N * V;
	int32_t tg[6];
	float *x = frand(n, 4), *probs = fzero(n), *losses = fzero(N), *d = fzero(n);
	for (int i = 0; i < N; i++)
		tg[i] = (i * 11 + 2) % V;
	tg[4] = -1;  /* masked: the parts must agree that it has no loss */
	softmax_xent_forward(losses, probs, x, tg, N, V);
	softmax_xent_backward(d, probs, tg, 0.25f, N, V);
	ck_assert_float_eq(losses[4], 0.0f);

	float mx[6], gmx[6], st[12], gst[12] = { 0 }, pl[6], part_loss = 0;
	float *xs[3], *ps[3], *ds[3];
	for (int i = 0; i < N; i++)
		gmx[i] = -INFINITY;
	for (int k = 0; k < nparts; k++) {
		int v0 = cuts[k], vl = cuts[k + 1] - v0;
		xs[k] = fzero((size_t)N * vl);
		ps[k] = fzero((size_t)N * vl);
		ds[k] = fzero((size_t)N * vl);
		for (int r = 0; r < N; r++)
			memcpy(xs[k] + (size_t)r * vl, x + (size_t)r * V + v0, sizeof(float) * vl);
		xent_split_max(mx, xs[k], N, vl);
		for (int r = 0; r < N; r++)
			gmx[r] = fmaxf(gmx[r], mx[r]);
	}
	for (int k = 0; k < nparts; k++) {
		xent_split_sums(st, ps[k], xs[k], gmx, tg, cuts[k], N, cuts[k + 1] - cuts[k]);
		for (int r = 0; r < 2 * N; r++)
			gst[r] += st[r];
	}
	for (int k = 0; k < nparts; k++) {
		int v0 = cuts[k], vl = cuts[k + 1] - v0;
		double tot = xent_split_finish(pl, ps[k], gmx, gst, tg, N, vl);
		xent_split_backward(ds[k], ps[k], tg, v0, 0.25f, N, vl);
		for (int r = 0; r < N; r++) {
			ck_assert_float_eq_tol(pl[r], losses[r], 1e-5f);
			for (int i = 0; i < vl; i++) {
				ck_assert_float_eq_tol(ps[k][(size_t)r * vl + i], probs[(size_t)r * V + v0 + i], 1e-6f);
				ck_assert_float_eq_tol(ds[k][(size_t)r * vl + i], d[(size_t)r * V + v0 + i], 1e-6f);
			}
		}
		part_loss = (float)tot;
	}
	double whole = 0;
	for (int r = 0; r < N; r++)
		whole += losses[r];
	ck_assert_double_eq_tol(part_loss, whole, 1e-4);

	/* embedding rows: the parts' outputs sum to the whole lookup */
	float *w = frand((size_t)V * C, 1), *e = fzero((size_t)N * C), *es = fzero((size_t)N * C);
	float *part = fzero((size_t)N * C), *dw = fzero((size_t)V * C), *dws = fzero((size_t)V * C);
	float *dout = frand((size_t)N * C, 1);
	embedding_forward(e, tg, w, N, C);
	embedding_backward(dw, dout, tg, N, C);
	for (int k = 0; k < nparts; k++) {
		int v0 = cuts[k], vl = cuts[k + 1] - v0;
		embedding_forward_range(part, tg, w + (size_t)v0 * C, v0, vl, N, C);
		for (int i = 0; i < N * C; i++)
			es[i] += part[i];
		embedding_backward_range(dws + (size_t)v0 * C, dout, tg, v0, vl, N, C);
	}
	for (int i = 0; i < N * C; i++)
		ck_assert_float_eq(es[i], e[i]);
	for (int i = 0; i < V * C; i++)
		ck_assert_float_eq(dws[i], dw[i]);
	for (int k = 0; k < nparts; k++)
		free(xs[k]), free(ps[k]), free(ds[k]);
	free(x), free(probs), free(losses), free(d), free(w), free(e), free(es), free(part), free(dw),
		free(dws), free(dout);
}
END_TEST

START_TEST(test_xent_stable)
{
	/* logits shifted by +-1000 or with huge gaps give the same losses,
	 * finite, and a target probability that underflows still has a loss */
	const int V = 13;
	float x[2 * 13], probs[2 * 13], losses[2], l0[2], p0[2 * 13];
	int32_t tg[2] = { 4, 12 };
	for (int i = 0; i < 2 * V; i++)
		x[i] = (float)(0.5 * rng_unif());
	softmax_xent_forward(l0, p0, x, tg, 2, V);
	for (int shift = -1000; shift <= 1000; shift += 2000) {
		float xs[2 * 13];
		for (int i = 0; i < 2 * V; i++)
			xs[i] = x[i] + (float)shift;
		softmax_xent_forward(losses, probs, xs, tg, 2, V);
		for (int i = 0; i < 2; i++)
			ck_assert_float_eq_tol(losses[i], l0[i], 1e-3f);
		for (int i = 0; i < 2 * V; i++)
			ck_assert_float_eq_tol(probs[i], p0[i], 1e-4f);
	}
	x[12] = -500.0f; /* p of target 12 in row 0 is exp(-500): 0 in float */
	tg[0] = 12;
	softmax_xent_forward(losses, probs, x, tg, 1, V);
	ck_assert(isfinite(losses[0]));
	ck_assert_float_gt(losses[0], 499.0f);
	ck_assert_float_lt(losses[0], 503.0f);
}
END_TEST

/* ---- optimizers ---- */

START_TEST(test_adamw)
{
	/* lr 0.1, b1 0.9, b2 0.99, eps 1e-8, wd 0.01; p = (1, -2, 0.5).
	 * t=1, g = (0.1, -0.2, 0.3): m = 0.1 g, v = 0.01 g^2; mhat = g, vhat = g^2;
	 *   p -= 0.1 (g/(|g|+1e-8) + 0.01 p)
	 *   p1 = 1 - 0.1 (0.9999999 + 0.01)          = 0.89900001
	 *        -2 - 0.1 (-0.99999995 - 0.02)       = -1.898000005
	 *        0.5 - 0.1 (0.9999999667 + 0.005)    = 0.3995000033
	 * t=2, g = (0.2, 0.1, -0.3): m = 0.9 m + 0.1 g = (0.029, -0.008, -0.003),
	 *   mhat = m / 0.19 = (0.1526315789, -0.0421052632, -0.0157894737);
	 *   v = 0.99 v + 0.01 g^2 = (4.99e-4, 4.96e-4, 1.791e-3),
	 *   sqrt(vhat) = sqrt(v / 0.0199) = (0.1583520662, 0.1578753404, 0.3);
	 *   u = mhat / (sqrt(vhat) + eps) = (0.9638748197, -0.2666994122, -0.0526315772)
	 *   p2 = p1 - 0.1 (u + 0.01 p1) = (0.8017135280, -1.8694320638, 0.4043636610) */
	float p[3] = { 1.0f, -2.0f, 0.5f }, m[3] = { 0 }, v[3] = { 0 };
	const float g1[3] = { 0.1f, -0.2f, 0.3f }, g2[3] = { 0.2f, 0.1f, -0.3f };
	const double p1[3] = { 0.89900001, -1.898000005, 0.3995000033 };
	const double m2[3] = { 0.029, -0.008, -0.003 }, v2[3] = { 4.99e-4, 4.96e-4, 1.791e-3 };
	const double p2[3] = { 0.8017135280, -1.8694320638, 0.4043636610 };
	adamw_update(p, g1, m, v, 3, 0.1f, 0.9f, 0.99f, 1e-8f, 0.01f, 1);
	for (int i = 0; i < 3; i++)
		ck_assert_double_eq_tol(p[i], p1[i], 1e-6);
	adamw_update(p, g2, m, v, 3, 0.1f, 0.9f, 0.99f, 1e-8f, 0.01f, 2);
	for (int i = 0; i < 3; i++) {
		ck_assert_double_eq_tol(m[i], m2[i], 1e-7);
		ck_assert_double_eq_tol(v[i], v2[i], 1e-8);
		ck_assert_double_eq_tol(p[i], p2[i], 2e-6);
	}
}
END_TEST

/* eigenvalues of the symmetric n x n matrix a (destroyed) by cyclic Jacobi */
static void jacobi_eig(double *a, int n, double *eig)
{
	for (int sweep = 0; sweep < 100; sweep++) {
		double off = 0.0;
		for (int i = 0; i < n; i++)
			for (int j = i + 1; j < n; j++)
				off += a[i * n + j] * a[i * n + j];
		if (off < 1e-22)
			break;
		for (int p = 0; p < n; p++)
			for (int q = p + 1; q < n; q++) {
				double apq = a[p * n + q];
				if (fabs(apq) < 1e-300)
					continue;
				double th = (a[q * n + q] - a[p * n + p]) / (2 * apq);
				double t = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1));
				double cs = 1 / sqrt(t * t + 1), sn = t * cs;
				for (int k = 0; k < n; k++) { /* columns p, q */
					double akp = a[k * n + p], akq = a[k * n + q];
					a[k * n + p] = cs * akp - sn * akq;
					a[k * n + q] = sn * akp + cs * akq;
				}
				for (int k = 0; k < n; k++) { /* rows p, q */
					double apk = a[p * n + k], aqk = a[q * n + k];
					a[p * n + k] = cs * apk - sn * aqk;
					a[q * n + k] = sn * apk + cs * aqk;
				}
			}
	}
	for (int i = 0; i < n; i++)
		eig[i] = a[i * n + i];
}

/* singular values of O (R,C) via eigenvalues of O O^T or O^T O (the smaller) */
static void singular_values(const float *o, int R, int C, double *sv)
{
	int r = R < C ? R : C;
	double *a = dzero((size_t)r * r);
	for (int i = 0; i < r; i++)
		for (int j = 0; j < r; j++) {
			double s = 0.0;
			if (R <= C)
				for (int k = 0; k < C; k++)
					s += (double)o[i * C + k] * o[j * C + k];
			else
				for (int k = 0; k < R; k++)
					s += (double)o[k * C + i] * o[k * C + j];
			a[i * r + j] = s;
		}
	jacobi_eig(a, r, sv);
	for (int i = 0; i < r; i++)
		sv[i] = sqrt(fmax(sv[i], 0.0));
	free(a);
}

/* double Newton-Schulz on the wide orientation, for comparison */
static void ns5_d(double *out, const float *G, int R, int C)
{
	int tr = R > C, r = tr ? C : R, c = tr ? R : C;
	double *X = dzero((size_t)r * c), *A = dzero((size_t)r * r), *Bm = dzero((size_t)r * r);
	double *Y = dzero((size_t)r * c), nrm = 0.0;
	for (int i = 0; i < R * C; i++)
		nrm += (double)G[i] * G[i];
	nrm = sqrt(nrm) + 1e-7;
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++)
			X[tr ? j * R + i : i * C + j] = G[i * C + j] / nrm;
	for (int step = 0; step < 5; step++) {
		for (int i = 0; i < r; i++)
			for (int j = 0; j < r; j++) {
				double s = 0.0;
				for (int k = 0; k < c; k++)
					s += X[i * c + k] * X[j * c + k];
				A[i * r + j] = s;
			}
		for (int i = 0; i < r; i++)
			for (int j = 0; j < r; j++) {
				double s = 0.0;
				for (int k = 0; k < r; k++)
					s += A[i * r + k] * A[k * r + j];
				Bm[i * r + j] = -4.7750 * A[i * r + j] + 2.0315 * s;
			}
		for (int i = 0; i < r; i++)
			for (int j = 0; j < c; j++) {
				double s = 0.0;
				for (int k = 0; k < r; k++)
					s += Bm[i * r + k] * X[k * c + j];
				Y[i * c + j] = 3.4445 * X[i * c + j] + s;
			}
		memcpy(X, Y, sizeof(double) * r * c);
	}
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++)
			out[i * C + j] = X[tr ? j * R + i : i * C + j];
	free(X), free(A), free(Bm), free(Y);
}

static const int ns_shapes[][2] = { { 24, 40 }, { 40, 24 }, { 17, 17 } };

START_TEST(test_newton_schulz)
{
	const int R = ns_shapes[_i][0], C = ns_shapes[_i][1], M = R > C ? R : C;
	float *G = frand((size_t)R * C, 1), *out = fzero((size_t)R * C);
	float *scratch = frand((size_t)3 * M * M + (size_t)2 * R * C, 1);
	double *want = dzero((size_t)R * C), sv[40];

	newton_schulz5(out, G, scratch, R, C);
	ns5_d(want, G, R, C);
	expect_close("newton_schulz5", out, want, (size_t)R * C, 1e-3);
	singular_values(out, R, C, sv);
	for (int i = 0; i < (R < C ? R : C); i++)
		ck_assert_msg(sv[i] >= 0.6 && sv[i] <= 1.3, "singular value %d = %g", i, sv[i]);
	/* in place (out == G) is allowed and gives the same */
	float *g2 = fcopy(G, (size_t)R * C);
	newton_schulz5(g2, g2, scratch, R, C);
	for (int i = 0; i < R * C; i++)
		ck_assert_float_eq(g2[i], out[i]);
	/* the transposed problem gives the transposed answer */
	float *gt = fzero((size_t)R * C), *ot = fzero((size_t)R * C);
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++)
			gt[j * R + i] = G[i * C + j];
	newton_schulz5(ot, gt, scratch, C, R);
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++)
			ck_assert_float_eq_tol(ot[j * R + i], out[i * C + j], 1e-5f);
	/* step-major over three matrices (G, 2G, -G): each one's bits as alone */
	float *g3 = fzero((size_t)3 * R * C), *o3 = fzero((size_t)3 * R * C);
	float *sb = fzero((size_t)2 * M * M + (size_t)6 * R * C);
	for (int i = 0; i < R * C; i++)
		g3[i] = G[i], g3[R * C + i] = 2 * G[i], g3[2 * R * C + i] = -G[i];
	float *const outs[3] = { o3, o3 + R * C, o3 + 2 * R * C };
	const float *const gs[3] = { g3, g3 + R * C, g3 + 2 * R * C };
	newton_schulz5_batch(outs, gs, sb, 3, R, C);
	for (int k = 0; k < 3; k++) {
		newton_schulz5(g2, gs[k], scratch, R, C);
		ck_assert_msg(!memcmp(g2, outs[k], sizeof(float) * R * C), "%dx%d: batched matrix %d differs", R, C, k);
	}
	free(G), free(out), free(scratch), free(want), free(g2), free(gt), free(ot), free(g3), free(o3), free(sb);
}
END_TEST

START_TEST(test_muon)
{
	const int R = ns_shapes[_i][0], C = ns_shapes[_i][1], M = R > C ? R : C;
	size_t n = (size_t)R * C;
	const float lr = 0.02f, mu = 0.9f;
	float *p0 = frand(n, 1), *p = fcopy(p0, n), *g = frand(n, 1), *buf = fzero(n);
	float *scratch = fzero((size_t)3 * M * M + 2 * n), *o = fzero(n);
	double k = sqrt(R > C ? (double)R / C : 1.0), along = 0.0;

	/* from zero momentum: buf = g, g' = (1 + mu) g, NS5 is scale-free */
	muon_update(p, g, buf, scratch, R, C, lr, mu, 0.0f);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq(buf[i], g[i]);
	newton_schulz5(o, g, scratch, R, C);
	for (size_t i = 0; i < n; i++) {
		double step = (double)p0[i] - p[i];
		ck_assert_double_eq_tol(step, lr * k * o[i], 1e-4 * lr * k);
		along += step * g[i];
	}
	ck_assert_double_gt(along, 0.0); /* a descent direction */
	/* second step: buf = mu g + g = 1.9 g, g' = g + 0.9 * 1.9 g */
	memcpy(p0, p, sizeof(float) * n);
	muon_update(p, g, buf, scratch, R, C, lr, mu, 0.0f);
	for (size_t i = 0; i < n; i++) {
		ck_assert_float_eq_tol(buf[i], 1.9f * g[i], 1e-6f);
		ck_assert_double_eq_tol((double)p0[i] - p[i], lr * k * o[i], 1e-4 * lr * k);
	}
	/* zero gradient: only decoupled weight decay acts */
	memset(g, 0, sizeof(float) * n);
	memset(buf, 0, sizeof(float) * n);
	memcpy(p0, p, sizeof(float) * n);
	muon_update(p, g, buf, scratch, R, C, lr, mu, 0.1f);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq_tol(p[i], p0[i] * (1.0f - lr * 0.1f), 1e-6f);
	free(p0), free(p), free(g), free(buf), free(scratch), free(o);
}
END_TEST

START_TEST(test_sumsq_scale)
{
	const size_t n = 1001;
	float *x = fzero(n);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(i + 1);
	/* sum of squares 1..n = n (n+1) (2n+1) / 6, exact in double */
	ck_assert_double_eq(sumsq(x, n), 1001.0 * 1002.0 * 2003.0 / 6.0);
	ck_assert_double_eq(sumsq(x, 0), 0.0);
	scale_inplace(x, n, 0.5f);
	for (size_t i = 0; i < n; i++)
		ck_assert_float_eq(x[i], 0.5f * (i + 1));
	free(x);
}
END_TEST

START_TEST(test_lr_schedule)
{
	const float lr = 3e-3f, ff = 0.1f;
	const int warmup = 10, total = 110;
	ck_assert_float_eq(lr_schedule(0, lr, warmup, total, ff), 0.0f);
	ck_assert_float_eq_tol(lr_schedule(5, lr, warmup, total, ff), lr * 0.5f, 1e-9f);
	ck_assert_float_eq_tol(lr_schedule(warmup, lr, warmup, total, ff), lr, 1e-9f);
	/* halfway through the cosine: final + (1 - final) / 2 */
	ck_assert_float_eq_tol(lr_schedule(60, lr, warmup, total, ff), lr * (ff + (1 - ff) * 0.5f),
			       1e-9f);
	ck_assert_float_eq_tol(lr_schedule(total, lr, warmup, total, ff), lr * ff, 1e-9f);
	ck_assert_float_eq_tol(lr_schedule(total + 50, lr, warmup, total, ff), lr * ff, 1e-9f);
	float prev = lr_schedule(warmup, lr, warmup, total, ff);
	for (int s = warmup + 1; s <= total; s++) {
		float cur = lr_schedule(s, lr, warmup, total, ff);
		ck_assert_float_le(cur, prev);
		prev = cur;
	}
	/* no warmup starts at the peak */
	ck_assert_float_eq_tol(lr_schedule(0, lr, 0, total, ff), lr, 1e-9f);
}
END_TEST

/* ---- threads: device threads call sgemm concurrently ---- */

struct gemm_job {
	const float *a, *b;
	float *c;
	int reps;
};

#define TG_M 96
#define TG_N 80
#define TG_K 200

static void *gemm_thread(void *p)
{
	struct gemm_job *j = p;
	for (int r = 0; r < j->reps; r++)
		matmul_forward(j->c + (size_t)r * TG_M * TG_N, j->a, j->b + (size_t)r * TG_N * TG_K,
			       TG_M, TG_K, TG_N, 0);
	return NULL;
}

START_TEST(test_concurrent_sgemm)
{
	const int reps = 20;
	size_t nc = (size_t)reps * TG_M * TG_N;
	float *a[2], *b[2], *serial[2], *conc[2];
	struct gemm_job jobs[2];
	pthread_t th[2];

	blas_set_threads(1);
	ck_assert_int_eq(blas_get_threads(), 1);
	for (int t = 0; t < 2; t++) {
		a[t] = frand((size_t)TG_M * TG_K, 1);
		b[t] = frand((size_t)reps * TG_N * TG_K, 1);
		serial[t] = fzero(nc);
		conc[t] = fzero(nc);
		jobs[t] = (struct gemm_job){ a[t], b[t], serial[t], reps };
		gemm_thread(&jobs[t]);
		jobs[t].c = conc[t];
	}
	for (int t = 0; t < 2; t++)
		ck_assert_int_eq(pthread_create(&th[t], NULL, gemm_thread, &jobs[t]), 0);
	for (int t = 0; t < 2; t++)
		ck_assert_int_eq(pthread_join(th[t], NULL), 0);
	for (int t = 0; t < 2; t++) {
		ck_assert_int_eq(memcmp(serial[t], conc[t], sizeof(float) * nc), 0);
		free(a[t]), free(b[t]), free(serial[t]), free(conc[t]);
	}
}
END_TEST

START_TEST(test_blas_info)
{
	const char *core = blas_core_name();
	ck_assert_ptr_nonnull(core);
	ck_assert_int_gt((int)strlen(core), 0);
	blas_set_threads(0); /* 0 leaves it */
	ck_assert_int_eq(blas_get_threads(), 1);
}
END_TEST

static Suite *kernels_suite(void)
{
	Suite *s = suite_create("kernels");
	struct {
		const char *name;
		const TTest *tests[4];
		int loop;
	} cases[] = {
		{ "matmul", { test_matmul_ref_hand, test_matmul_fd, test_sgemm_strided, test_sgemm_empty }, 0 },
		{ "matmul sizes", { test_matmul_forward, test_matmul_backward }, 4 },
		{ "embedding", { test_embedding }, 0 },
		{ "rmsnorm", { test_rmsnorm }, 2 },
		{ "rope hand", { test_rope_hand }, 0 },
		{ "rope", { test_rope }, 2 },
		{ "attention", { test_attention_forward, test_attention_backward }, 5 },
		{ "rope adjacent pairs", { test_rope_adj }, 3 },
		{ "yarn latent kv", { test_rope_yarn, test_mla_kv }, 0 },
		{ "swiglu residual", { test_swiglu, test_residual, test_backward_write }, 0 },
		{ "xent", { test_xent }, 4 },
		{ "xent stable", { test_xent_stable, test_xent_split }, 0 },
		{ "adamw", { test_adamw }, 0 },
		{ "newton-schulz muon", { test_newton_schulz, test_muon }, 3 },
		{ "norms schedule", { test_sumsq_scale, test_lr_schedule }, 0 },
		{ "threads", { test_concurrent_sgemm, test_blas_info }, 0 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, NULL);
		tcase_set_timeout(tc, 30);
		for (int t = 0; t < 4 && cases[i].tests[t]; t++) {
			if (cases[i].loop)
				tcase_add_loop_test(tc, cases[i].tests[t], 0, cases[i].loop);
			else
				tcase_add_test(tc, cases[i].tests[t]);
		}
		suite_add_tcase(s, tc);
	}
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(kernels_suite());
	int failed;
	blas_set_threads(1);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
