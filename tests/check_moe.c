/* MoE kernels against naive double references: the router's forward
 * (scoring, top-k with bias and ties) and its backward by central finite
 * differences with the selection held fixed; the load-balance loss; sort,
 * gather and combine against plain loops, their backward by finite
 * differences. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/model/model.h"
#include "kernels/kernels.h"

#define FD_H 1e-5

/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static double rng_uniform(double lo, double hi)
{
	return lo + (hi - lo) * (double)(rng_next() >> 11) / 9007199254740992.0;
}

/* Logits with no near-ties: a random permutation of values 0.37 apart,
 * jittered by at most 0.05, so any two differ by at least 0.27. */
static void tie_free_logits(float *l, int N, int E)
{
	int *perm = malloc(sizeof(int) * E);
	for (int n = 0; n < N; n++) {
		for (int e = 0; e < E; e++)
			perm[e] = e;
		for (int e = E - 1; e > 0; e--) {
			int j = (int)(rng_next() % (uint64_t)(e + 1)), t = perm[e];
			perm[e] = perm[j];
			perm[j] = t;
		}
		for (int e = 0; e < E; e++)
			l[(size_t)n * E + e] = (float)((perm[e] - E / 2) * 0.37 + rng_uniform(-0.05, 0.05));
	}
	free(perm);
}

static void fill_uniform(float *x, size_t n, double lo, double hi)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)rng_uniform(lo, hi);
}

static int close_enough(double got, double want, double atol, double rtol)
{
	return fabs(got - want) <= atol + rtol * fabs(want);
}

/* A router without groups (a compound literal the call can point to). */
#define RT(E, k, score, norm, scale) \
	(&(struct moe_routing){ (E), (k), (enum moe_score)(score), (norm), (scale), 0, 0 })

/* ---- naive double references ---- */

static void ref_scores(double *s, const double *l, int E, int score)
{
	if (score == MOE_SOFTMAX) {
		double mx = l[0], sum = 0;
		for (int e = 1; e < E; e++)
			mx = l[e] > mx ? l[e] : mx;
		for (int e = 0; e < E; e++)
			sum += (s[e] = exp(l[e] - mx));
		for (int e = 0; e < E; e++)
			s[e] /= sum;
	} else {
		for (int e = 0; e < E; e++)
			s[e] = 1.0 / (1.0 + exp(-l[e]));
	}
}

/* top-k by s + bias, ties to the lower index: insertion sort of all experts */
static void ref_select(int *idx, const double *s, const double *bias, int E, int k)
{
	int order[64];
	for (int e = 0; e < E; e++) {
		double v = s[e] + (bias ? bias[e] : 0);
		int p = e;
		while (p > 0) {
			int q = order[p - 1];
			double vq = s[q] + (bias ? bias[q] : 0);
			if (vq >= v) /* earlier (lower index) wins ties */
				break;
			order[p] = q;
			p--;
		}
		order[p] = e;
	}
	memcpy(idx, order, sizeof(int) * k);
}

static void ref_weights(double *w, const double *s, const int *idx, int k, int norm, double scale)
{
	double sum = 0;
	for (int j = 0; j < k; j++)
		sum += s[idx[j]];
	for (int j = 0; j < k; j++)
		w[j] = s[idx[j]] * scale / (norm ? sum : 1.0);
}

/* sum_j dw_j w_j(logits) for one token, selection fixed by idx */
static double ref_router_loss(const double *l, const int32_t *idx32, const float *dw, int E, int k,
			      int score, int norm, double scale)
{
	double s[64], w[64];
	int idx[64];
	for (int j = 0; j < k; j++)
		idx[j] = idx32[j];
	ref_scores(s, l, E, score);
	ref_weights(w, s, idx, k, norm, scale);
	double L = 0;
	for (int j = 0; j < k; j++)
		L += dw[j] * w[j];
	return L;
}

/* E/(k N^2) sum_n sum_e counts_e s(n,e)/sum_e s(n,e) */
static double ref_aux(const double *s, const int32_t *counts, int N, int E, int k)
{
	double L = 0;
	for (int n = 0; n < N; n++) {
		double sum = 0;
		for (int e = 0; e < E; e++)
			sum += s[(size_t)n * E + e];
		for (int e = 0; e < E; e++)
			L += counts[e] * s[(size_t)n * E + e] / sum;
	}
	return L * E / ((double)k * N * N);
}

/* ---- router forward ---- */

/* _i: bit 0 = sigmoid, bit 1 = norm_topk */
START_TEST(test_router_forward)
{
	int score = _i & 1, norm = (_i >> 1) & 1;
	const int N = 13, E = 8, k = 3;
	const float scale = 2.5f;
	float logits[N * E], scores[N * E], w[N * k];
	int32_t idx[N * k];
	rng_state = 100 + _i;
	tie_free_logits(logits, N, E);
	moe_router_forward(w, idx, scores, logits, NULL, N, RT(E, k, score, norm, scale));
	for (int n = 0; n < N; n++) {
		double l[E], s[E], rw[k];
		int ri[k];
		for (int e = 0; e < E; e++)
			l[e] = logits[n * E + e];
		ref_scores(s, l, E, score);
		ref_select(ri, s, NULL, E, k);
		ref_weights(rw, s, ri, k, norm, scale);
		for (int e = 0; e < E; e++)
			ck_assert_msg(close_enough(scores[n * E + e], s[e], 1e-7, 1e-5),
				      "score n=%d e=%d: %g vs %g", n, e, scores[n * E + e], s[e]);
		double sum = 0;
		for (int j = 0; j < k; j++) {
			ck_assert_msg(idx[n * k + j] == ri[j], "idx n=%d j=%d: %d vs %d", n, j,
				      idx[n * k + j], ri[j]);
			ck_assert_msg(close_enough(w[n * k + j], rw[j], 1e-7, 1e-5),
				      "weight n=%d j=%d: %g vs %g", n, j, w[n * k + j], rw[j]);
			sum += w[n * k + j];
		}
		if (norm)
			ck_assert_msg(fabs(sum - scale) < 1e-5, "weights sum %g, want %g", sum, scale);
		/* best first */
		for (int j = 1; j < k; j++)
			ck_assert(scores[n * E + idx[n * k + j - 1]] > scores[n * E + idx[n * k + j]]);
	}
}
END_TEST

/* ---- router backward vs central differences ---- */

/* _i: bit 0 = sigmoid, bit 1 = norm_topk, bit 2 = scale 0.7 instead of 1 */
START_TEST(test_router_backward)
{
	int score = _i & 1, norm = (_i >> 1) & 1;
	float scale = (_i & 4) ? 0.7f : 1.0f;
	const int N = 5, E = 7, k = 3;
	float logits[N * E], scores[N * E], w[N * k], dw[N * k], dl[N * E];
	int32_t idx[N * k];
	rng_state = 200 + _i;
	tie_free_logits(logits, N, E);
	fill_uniform(dw, N * k, -1, 1);
	moe_router_forward(w, idx, scores, logits, NULL, N, RT(E, k, score, norm, scale));
	for (int i = 0; i < N * E; i++)
		dl[i] = 0.25f; /* backward must accumulate */
	moe_router_backward(dl, dw, scores, idx, N, RT(E, k, score, norm, scale));
	moe_router_backward(NULL, dw, scores, idx, N, RT(E, k, score, norm, scale));

	double maxg = 0;
	for (int n = 0; n < N; n++) {
		for (int e = 0; e < E; e++) {
			double l[E];
			for (int f = 0; f < E; f++)
				l[f] = logits[n * E + f];
			l[e] += FD_H;
			double lp = ref_router_loss(l, idx + n * k, dw + n * k, E, k, score, norm, scale);
			l[e] -= 2 * FD_H;
			double lm = ref_router_loss(l, idx + n * k, dw + n * k, E, k, score, norm, scale);
			double num = (lp - lm) / (2 * FD_H), got = dl[n * E + e] - 0.25;
			ck_assert_msg(close_enough(got, num, 2e-6, 1e-3),
				      "score=%d norm=%d scale=%g dlogits[%d,%d]: %.8g vs fd %.8g",
				      score, norm, scale, n, e, got, num);
			maxg = fmax(maxg, fabs(num));
		}
	}
	ck_assert_msg(maxg > 1e-2, "gradients all ~0 (%g): the test checks nothing", maxg);
}
END_TEST

/* the scoring function's own backward (carries aux-loss gradients) */
START_TEST(test_scores_backward)
{
	int score = _i;
	const int N = 4, E = 6;
	float logits[N * E], scores[N * E], ds[N * E], dl[N * E], w[N];
	int32_t idx[N];
	rng_state = 300 + _i;
	fill_uniform(logits, N * E, -2, 2);
	fill_uniform(ds, N * E, -1, 1);
	moe_router_forward(w, idx, scores, logits, NULL, N, RT(E, 1, score, 1, 1.0f));
	for (int i = 0; i < N * E; i++)
		dl[i] = -1.0f;
	moe_scores_backward(dl, ds, scores, N, E, score);
	moe_scores_backward(NULL, ds, scores, N, E, score);
	for (int n = 0; n < N; n++)
		for (int e = 0; e < E; e++) {
			double l[E], s[E], L[2];
			for (int sgn = 0; sgn < 2; sgn++) {
				for (int f = 0; f < E; f++)
					l[f] = logits[n * E + f];
				l[e] += sgn ? -FD_H : FD_H;
				ref_scores(s, l, E, score);
				L[sgn] = 0;
				for (int f = 0; f < E; f++)
					L[sgn] += ds[n * E + f] * s[f];
			}
			double num = (L[0] - L[1]) / (2 * FD_H), got = dl[n * E + e] + 1.0;
			ck_assert_msg(close_enough(got, num, 2e-6, 1e-3), "score=%d [%d,%d]: %g vs %g",
				      score, n, e, got, num);
		}
}
END_TEST

/* ---- ties, bias, robustness ---- */

START_TEST(test_router_ties)
{
	/* softmax of equal logits: every score equal, lowest indices win */
	float l1[6] = { 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f }, s1[6], w1[3];
	int32_t i1[3];
	moe_router_forward(w1, i1, s1, l1, NULL, 1, RT(6, 3, MOE_SOFTMAX, 0, 1.0f));
	for (int j = 0; j < 3; j++) {
		ck_assert_int_eq(i1[j], j);
		ck_assert_float_eq_tol(w1[j], 1.0f / 6, 1e-7f);
	}
	moe_router_forward(w1, i1, s1, l1, NULL, 1, RT(6, 3, MOE_SOFTMAX, 1, 1.0f));
	for (int j = 0; j < 3; j++)
		ck_assert_float_eq_tol(w1[j], 1.0f / 3, 1e-6f);

	/* sigmoid with ties inside the selection and at its border */
	float l2[6] = { 1, 2, 2, 1, 2, 0 }, s2[6], w2[4];
	int32_t i2[4];
	moe_router_forward(w2, i2, s2, l2, NULL, 1, RT(6, 4, MOE_SIGMOID, 1, 1.0f));
	ck_assert_int_eq(i2[0], 1);
	ck_assert_int_eq(i2[1], 2);
	ck_assert_int_eq(i2[2], 4);
	ck_assert_int_eq(i2[3], 0);

	/* a tie created by the bias: keys 0.5+0.25 == 0.75+0 exactly */
	float l3[3] = { 0, 0, 0 }, s3[3], w3[1], b3[3] = { 0, 0.25f, 0.25f };
	int32_t i3[1];
	/* sigmoid(0) = 0.5 for all three; keys 0.5, 0.75, 0.75 -> expert 1 */
	moe_router_forward(w3, i3, s3, l3, b3, 1, RT(3, 1, MOE_SIGMOID, 0, 1.0f));
	ck_assert_int_eq(i3[0], 1);
	ck_assert_float_eq_tol(w3[0], 0.5f, 1e-7f);
}
END_TEST

START_TEST(test_router_bias)
{
	const int N = 6, E = 8, k = 2;
	float logits[N * E], scores[N * E], w0[N * k], wb[N * 3], bias[E];
	int32_t i0[N * k], ib[N * 3]; /* k = 3 below */
	rng_state = 400;
	tie_free_logits(logits, N, E);
	/* a bias of +2 on experts 6 and 7 makes them win for every token
	 * (sigmoid scores lie in (0,1)), ordered by their own scores */
	for (int e = 0; e < E; e++)
		bias[e] = e >= 6 ? 2.0f : 0.0f;
	moe_router_forward(w0, i0, scores, logits, NULL, N, RT(E, k, MOE_SIGMOID, 1, 1.0f));
	moe_router_forward(wb, ib, scores, logits, bias, N, RT(E, k, MOE_SIGMOID, 1, 1.0f));
	int changed = 0;
	for (int n = 0; n < N; n++) {
		const float *s = scores + n * E;
		int hi = s[6] > s[7] ? 6 : 7, lo = 13 - hi;
		ck_assert_int_eq(ib[n * k], hi);
		ck_assert_int_eq(ib[n * k + 1], lo);
		/* weights are the plain scores, renormalised: no bias inside */
		double sum = (double)s[6] + s[7];
		ck_assert_msg(close_enough(wb[n * k], s[hi] / sum, 1e-7, 1e-6), "n=%d: %g vs %g", n,
			      wb[n * k], s[hi] / sum);
		ck_assert(close_enough(wb[n * k + 1], s[lo] / sum, 1e-7, 1e-6));
		changed += i0[n * k] != ib[n * k] || i0[n * k + 1] != ib[n * k + 1];
	}
	ck_assert_msg(changed > 0, "bias changed no selection");

	/* and against the reference with the bias, softmax scoring */
	rng_state = 401;
	fill_uniform(bias, E, -0.3, 0.3);
	moe_router_forward(wb, ib, scores, logits, bias, N, RT(E, 3, MOE_SOFTMAX, 0, 1.5f));
	for (int n = 0; n < N; n++) {
		double s[E], b[E], rw[3];
		int ri[3];
		for (int e = 0; e < E; e++) {
			s[e] = scores[n * E + e];
			b[e] = bias[e];
		}
		ref_select(ri, s, b, E, 3);
		ref_weights(rw, s, ri, 3, 0, 1.5);
		for (int j = 0; j < 3; j++) {
			ck_assert_int_eq(ib[n * 3 + j], ri[j]);
			ck_assert(close_enough(wb[n * 3 + j], rw[j], 1e-7, 1e-6));
		}
	}
}
END_TEST

START_TEST(test_router_nan)
{
	/* garbage logits must still yield k distinct, valid experts */
	float l[2 * 5] = { NAN, 1, 2, 3, 4, 1, NAN, 3, NAN, 0 }, s[10], w[6];
	int32_t idx[6];
	moe_router_forward(w, idx, s, l, NULL, 2, RT(5, 3, MOE_SIGMOID, 1, 1.0f));
	ck_assert_int_eq(idx[0], 4);
	ck_assert_int_eq(idx[1], 3);
	ck_assert_int_eq(idx[2], 2);
	ck_assert_int_eq(idx[3], 2);
	ck_assert_int_eq(idx[4], 0);
	ck_assert_int_eq(idx[5], 4);
	moe_router_forward(w, idx, s, l, NULL, 2, RT(5, 3, MOE_SOFTMAX, 1, 1.0f));
	for (int n = 0; n < 2; n++)
		for (int j = 0; j < 3; j++) {
			ck_assert(idx[n * 3 + j] >= 0 && idx[n * 3 + j] < 5);
			for (int i = 0; i < j; i++)
				ck_assert(idx[n * 3 + i] != idx[n * 3 + j]);
		}
}
END_TEST

/* ---- the V3 router against brute force ---- */

/* Shapes of group-limited routing: experts, groups, groups allowed, top-k. */
static const struct { int E, G, T, k; } v3_shapes[] = {
	{ 16, 4, 2, 4 }, { 12, 3, 1, 3 }, { 16, 8, 3, 5 }, { 8, 2, 1, 2 },
};

/* The brute-force router for one token, in double: the chosen groups are
 * the size-T subset of groups with the largest total group score (a
 * group's score: its keys sorted, the best two added), the chosen experts
 * the size-k subset of the allowed experts with the largest total key.
 * *mask receives the chosen experts (bit e); with G = 1 every expert is
 * allowed. Returns nothing the kernel computed. */
static void brute_select(uint32_t *mask, const double *key, int E, int G, int T, int k)
{
	int per = E / G;
	double gs[16];
	for (int g = 0; g < G; g++) {
		double v[16];
		for (int i = 0; i < per; i++)
			v[i] = key[g * per + i];
		for (int i = 0; i < per; i++) /* selection sort, descending */
			for (int j = i + 1; j < per; j++)
				if (v[j] > v[i]) {
					double t = v[i];
					v[i] = v[j];
					v[j] = t;
				}
		gs[g] = v[0] + v[1];
	}
	uint32_t gbest = 0;
	double gtot = -INFINITY;
	for (uint32_t gm = 0; gm < (1u << G); gm++) {
		if (__builtin_popcount(gm) != T)
			continue;
		double t = 0;
		for (int g = 0; g < G; g++)
			if (gm >> g & 1)
				t += gs[g];
		if (t > gtot) {
			gtot = t;
			gbest = gm;
		}
	}
	uint32_t allowed = 0;
	for (int e = 0; e < E; e++)
		if (G == 1 || (gbest >> (e / per) & 1))
			allowed |= 1u << e;
	double best = -INFINITY;
	*mask = 0;
	for (uint32_t em = 0; em < (1u << E); em++) {
		if ((em & ~allowed) || __builtin_popcount(em) != k)
			continue;
		double t = 0;
		for (int e = 0; e < E; e++)
			if (em >> e & 1)
				t += key[e];
		if (t > best) {
			best = t;
			*mask = em;
		}
	}
}

/* sigmoid scores, keys = scores + bias, in double */
static void ref_keys(double *s, double *key, const float *l, const float *bias, int E)
{
	for (int e = 0; e < E; e++) {
		s[e] = 1.0 / (1.0 + exp(-(double)l[e]));
		key[e] = s[e] + bias[e];
	}
}

/* _i: shape index * 2 + norm_topk */
START_TEST(test_v3_router_forward)
{
	int sh = _i / 2, norm = _i & 1;
	const int N = 40, E = v3_shapes[sh].E, G = v3_shapes[sh].G, T = v3_shapes[sh].T,
		  k = v3_shapes[sh].k;
	const float scale = 2.5f;
	float logits[N * 16], scores[N * 16], w[N * 16], bias[16];
	int32_t idx[N * 16];
	rng_state = 700 + _i;
	fill_uniform(logits, (size_t)N * E, -3, 3);
	fill_uniform(bias, (size_t)E, -0.4, 0.4);
	struct moe_routing r = { E, k, MOE_SIGMOID, norm, scale, G, T };
	moe_router_forward(w, idx, scores, logits, bias, N, &r);
	int grouped = 0, biased = 0;
	for (int n = 0; n < N; n++) {
		double rs[16], key[16];
		uint32_t want, plain, unbiased, got = 0;
		ref_keys(rs, key, logits + n * E, bias, E);
		brute_select(&want, key, E, G, T, k);
		brute_select(&plain, key, E, 1, 1, k);
		brute_select(&unbiased, rs, E, G, T, k);
		grouped += want != plain;
		biased += want != unbiased;
		double sum = 0;
		for (int j = 0; j < k; j++) {
			int e = idx[n * k + j];
			ck_assert_msg(e >= 0 && e < E && !(got >> e & 1), "n=%d: bad or repeated expert %d", n, e);
			got |= 1u << e;
			sum += rs[e];
			if (j)  /* best first */
				ck_assert(key[idx[n * k + j - 1]] > key[e]);
		}
		ck_assert_msg(got == want, "shape %d n=%d: kernel chose %#x, brute force %#x", sh, n, got, want);
		for (int j = 0; j < k; j++) {
			int e = idx[n * k + j];
			double rw = rs[e] * scale / (norm ? sum + 1e-20 : 1.0);
			ck_assert_msg(close_enough(w[n * k + j], rw, 1e-7, 1e-6), "n=%d j=%d: weight %g vs %g",
				      n, j, w[n * k + j], rw);
			ck_assert(close_enough(scores[n * E + e], rs[e], 1e-7, 1e-6));
		}
	}
	/* the cases the test exists for happened: groups and the bias each
	 * changed some token's experts */
	ck_assert_msg(grouped > 0, "group-limited selection changed nothing (shape %d)", sh);
	ck_assert_msg(biased > 0, "the correction bias changed nothing (shape %d)", sh);
}
END_TEST

/* sum_j dw_j w_j(logits) for one token with the experts fixed, in double */
static double v3_loss(const double *l, const int32_t *idx, const float *dw, int k, int norm,
		      double scale)
{
	double sum = 0, L = 0;
	for (int j = 0; j < k; j++)
		sum += 1.0 / (1.0 + exp(-l[idx[j]]));
	for (int j = 0; j < k; j++)
		L += dw[j] * (1.0 / (1.0 + exp(-l[idx[j]]))) * scale / (norm ? sum + 1e-20 : 1.0);
	return L;
}

/* The gradient flows through the chosen experts' unbiased scores only:
 * against central differences with the selection held (the logits are
 * far enough from any tie that it does not change), and zero elsewhere. */
START_TEST(test_v3_router_backward)
{
	int sh = _i / 2, norm = _i & 1;
	const int N = 12, E = v3_shapes[sh].E, G = v3_shapes[sh].G, T = v3_shapes[sh].T,
		  k = v3_shapes[sh].k;
	const double scale = 2.5;
	float logits[N * 16], scores[N * 16], w[N * 16], dw[N * 16], dl[N * 16], bias[16];
	int32_t idx[N * 16];
	rng_state = 800 + _i;
	tie_free_logits(logits, N, E);
	fill_uniform(bias, (size_t)E, -0.3, 0.3);
	fill_uniform(dw, (size_t)N * k, -1, 1);
	struct moe_routing r = { E, k, MOE_SIGMOID, norm, (float)scale, G, T };
	moe_router_forward(w, idx, scores, logits, bias, N, &r);
	for (int i = 0; i < N * E; i++)
		dl[i] = 0.25f;
	moe_router_backward(dl, dw, scores, idx, N, &r);
	double maxg = 0;
	for (int n = 0; n < N; n++)
		for (int e = 0; e < E; e++) {
			double l[16];
			bool chosen = false;
			for (int f = 0; f < E; f++)
				l[f] = logits[n * E + f];
			for (int j = 0; j < k; j++)
				chosen |= idx[n * k + j] == e;
			l[e] += FD_H;
			double lp = v3_loss(l, idx + n * k, dw + n * k, k, norm, scale);
			l[e] -= 2 * FD_H;
			double lm = v3_loss(l, idx + n * k, dw + n * k, k, norm, scale);
			double num = (lp - lm) / (2 * FD_H), got = dl[n * E + e] - 0.25;
			ck_assert_msg(close_enough(got, num, 2e-6, 1e-3), "shape %d norm=%d [%d,%d]: %.8g vs fd %.8g",
				      sh, norm, n, e, got, num);
			if (!chosen)
				ck_assert_msg(got == 0.0, "[%d,%d] not chosen but has gradient %g", n, e, got);
			maxg = fmax(maxg, fabs(num));
		}
	ck_assert_msg(maxg > 1e-2, "gradients all ~0 (%g): the test checks nothing", maxg);
}
END_TEST

/* A DeepSeek-V3-sized router (256 experts, 8 groups, 4 allowed, top 8):
 * every chosen expert lies in one of the 4 groups with the best top-two
 * sums, and no allowed expert outside the choice has a better key. */
START_TEST(test_v3_router_full_size)
{
	enum { N = 64, E = 256, G = 8, T = 4, K = 8, per = E / G };
	static float logits[N * E], scores[N * E], bias[E], w[N * K];
	static int32_t idx[N * K];
	rng_state = 900;
	fill_uniform(logits, (size_t)N * E, -4, 4);
	fill_uniform(bias, E, -0.5, 0.5);
	struct moe_routing r = { E, K, MOE_SIGMOID, 1, 2.5f, G, T };
	moe_router_forward(w, idx, scores, logits, bias, N, &r);
	for (int n = 0; n < N; n++) {
		double s[E], key[E], gs[G];
		ref_keys(s, key, logits + n * E, bias, E);
		for (int g = 0; g < G; g++) {
			double m1 = -INFINITY, m2 = -INFINITY;
			for (int e = g * per; e < (g + 1) * per; e++)
				if (key[e] > m1) {
					m2 = m1;
					m1 = key[e];
				} else if (key[e] > m2) {
					m2 = key[e];
				}
			gs[g] = m1 + m2;
		}
		bool allowed[G];
		for (int g = 0; g < G; g++) { /* allowed iff fewer than T groups beat it */
			int better = 0;
			for (int h = 0; h < G; h++)
				better += gs[h] > gs[g];
			allowed[g] = better < T;
		}
		double worst = INFINITY, wsum = 0;
		bool chosen[E] = { false };
		for (int j = 0; j < K; j++) {
			int e = idx[n * K + j];
			ck_assert_msg(allowed[e / per], "n=%d: expert %d of a group not allowed", n, e);
			chosen[e] = true;
			worst = fmin(worst, key[e]);
			wsum += w[n * K + j];
		}
		for (int e = 0; e < E; e++)
			ck_assert_msg(chosen[e] || !allowed[e / per] || key[e] < worst,
				      "n=%d: allowed expert %d beats a chosen one", n, e);
		ck_assert(fabs(wsum - 2.5) < 1e-5);
	}
}
END_TEST

/* ---- load-balance loss ---- */

START_TEST(test_aux_uniform)
{
	/* uniform scores, perfectly balanced selection: L = 1 exactly */
	enum { N = 4, E = 4, k = 2 };
	float s[N * E];
	int32_t idx[N * k] = { 0, 1, 2, 3, 0, 1, 2, 3 }, counts[E];
	for (int i = 0; i < N * E; i++)
		s[i] = 0.25f;
	double L = moe_aux_loss_forward(counts, s, idx, N, E, k);
	ck_assert_double_eq_tol(L, 1.0, 1e-12);
	for (int e = 0; e < E; e++)
		ck_assert_int_eq(counts[e], 2);
	/* all tokens on expert 0 with p(0) = 1: L = E */
	int32_t idx1[4] = { 0, 0, 0, 0 };
	float s1[4 * 4] = { 0 };
	for (int n = 0; n < 4; n++)
		s1[n * 4] = 1.0f;
	L = moe_aux_loss_forward(counts, s1, idx1, 4, 4, 1);
	ck_assert_double_eq_tol(L, 4.0, 1e-12);
	ck_assert_int_eq(counts[0], 4);
	ck_assert_int_eq(counts[3], 0);
}
END_TEST

/* _i: 0 = softmax scores, 1 = sigmoid scores (not summing to 1) */
START_TEST(test_aux_backward)
{
	const int N = 9, E = 6, k = 2;
	const float dL = 1.7f;
	float logits[N * E], scores[N * E], w[N * k], ds[N * E];
	int32_t idx[N * k], counts[E];
	rng_state = 500 + _i;
	tie_free_logits(logits, N, E);
	moe_router_forward(w, idx, scores, logits, NULL, N, RT(E, k, _i, 1, 1.0f));
	double L = moe_aux_loss_forward(counts, scores, idx, N, E, k);

	double *s = malloc(sizeof(double) * N * E);
	for (int i = 0; i < N * E; i++)
		s[i] = scores[i];
	int total = 0;
	for (int e = 0; e < E; e++)
		total += counts[e];
	ck_assert_int_eq(total, N * k);
	ck_assert_msg(close_enough(L, ref_aux(s, counts, N, E, k), 1e-9, 1e-6), "L %g vs %g", L,
		      ref_aux(s, counts, N, E, k));

	for (int i = 0; i < N * E; i++)
		ds[i] = 0.5f;
	moe_aux_loss_backward(ds, scores, counts, dL, N, E, k);
	moe_aux_loss_backward(NULL, scores, counts, dL, N, E, k);
	for (int i = 0; i < N * E; i++) {
		double keep = s[i];
		s[i] = keep + FD_H;
		double lp = ref_aux(s, counts, N, E, k);
		s[i] = keep - FD_H;
		double lm = ref_aux(s, counts, N, E, k);
		s[i] = keep;
		double num = dL * (lp - lm) / (2 * FD_H), got = ds[i] - 0.5;
		ck_assert_msg(close_enough(got, num, 1e-6, 1e-3), "dscores[%d]: %g vs fd %g", i, got,
			      num);
	}
	free(s);
}
END_TEST

/* ---- sort / gather / combine ---- */

/* random top-k assignments: k distinct experts per token */
static void random_idx(int32_t *idx, int N, int E, int k)
{
	for (int n = 0; n < N; n++)
		for (int j = 0; j < k; j++) {
			int32_t e;
			int dup;
			do {
				e = (int32_t)(rng_next() % (uint64_t)E);
				dup = 0;
				for (int i = 0; i < j; i++)
					dup |= idx[n * k + i] == e;
			} while (dup);
			idx[n * k + j] = e;
		}
}

static const int sort_shapes[][3] = { /* N, E, k */
	{ 0, 4, 2 }, { 1, 1, 1 }, { 1, 8, 3 }, { 7, 4, 2 }, { 16, 16, 1 }, { 33, 64, 4 }, { 50, 5, 5 },
};

START_TEST(test_sort)
{
	int N = sort_shapes[_i][0], E = sort_shapes[_i][1], k = sort_shapes[_i][2], Nk = N * k;
	int32_t *idx = malloc(sizeof(int32_t) * (Nk + 1)), *order = malloc(sizeof(int32_t) * (Nk + 1));
	int32_t *offsets = malloc(sizeof(int32_t) * (E + 1));
	rng_state = 600 + _i;
	random_idx(idx, N, E, k);
	moe_sort(order, offsets, idx, N, E, k);
	int r = 0;
	for (int e = 0; e < E; e++) {
		ck_assert_int_eq(offsets[e], r);
		for (int a = 0; a < Nk; a++)
			if (idx[a] == e) {
				ck_assert_msg(order[r] == a, "N=%d E=%d k=%d order[%d] = %d, want %d", N, E,
					      k, r, order[r], a);
				r++;
			}
	}
	ck_assert_int_eq(offsets[E], Nk);
	ck_assert_int_eq(r, Nk);
	free(idx);
	free(order);
	free(offsets);
}
END_TEST

START_TEST(test_gather_combine)
{
	const int N = 11, E = 5, k = 2, C = 6, Nk = N * k;
	int32_t idx[Nk], order[Nk], offsets[E + 1];
	float x[N * C], xs[Nk * C], ys[Nk * C], w[Nk], out[N * C];
	rng_state = 700;
	random_idx(idx, N, E, k);
	moe_sort(order, offsets, idx, N, E, k);
	fill_uniform(x, N * C, -1, 1);
	fill_uniform(ys, Nk * C, -1, 1);
	fill_uniform(w, Nk, 0, 1);

	moe_gather(xs, x, order, Nk, k, C);
	for (int r = 0; r < Nk; r++)
		for (int c = 0; c < C; c++)
			ck_assert(xs[r * C + c] == x[(order[r] / k) * C + c]);

	for (int i = 0; i < N * C; i++)
		out[i] = 3.0f; /* combine accumulates */
	moe_combine(out, ys, w, order, Nk, k, C);
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			double want = 3.0;
			for (int j = 0; j < k; j++) /* find the row of assignment n*k+j */
				for (int r = 0; r < Nk; r++)
					if (order[r] == n * k + j)
						want += (double)w[n * k + j] * ys[r * C + c];
			ck_assert_msg(close_enough(out[n * C + c], want, 1e-6, 1e-6), "out[%d,%d]", n, c);
		}
}
END_TEST

/* L = sum G . gather(x) */
static double gather_loss(const double *x, const float *G, const int32_t *order, int Nk, int k, int C)
{
	double L = 0;
	for (int r = 0; r < Nk; r++)
		for (int c = 0; c < C; c++)
			L += G[r * C + c] * x[(order[r] / k) * C + c];
	return L;
}

/* L = sum D . combine(ys, w) */
static double combine_loss(const double *ys, const double *w, const float *D, const int32_t *order,
			   int Nk, int k, int C)
{
	double L = 0;
	for (int r = 0; r < Nk; r++)
		for (int c = 0; c < C; c++)
			L += D[(order[r] / k) * C + c] * w[order[r]] * ys[r * C + c];
	return L;
}

START_TEST(test_gather_combine_backward)
{
	const int N = 7, E = 4, k = 2, C = 5, Nk = N * k;
	int32_t idx[Nk], order[Nk], offsets[E + 1];
	float x[N * C], G[Nk * C], dx[N * C], ys[Nk * C], w[Nk], D[N * C], dys[Nk * C], dw[Nk];
	double xd[N * C], ysd[Nk * C], wd[Nk];
	rng_state = 800;
	random_idx(idx, N, E, k);
	moe_sort(order, offsets, idx, N, E, k);
	fill_uniform(x, N * C, -1, 1);
	fill_uniform(G, Nk * C, -1, 1);
	fill_uniform(ys, Nk * C, -1, 1);
	fill_uniform(w, Nk, 0, 1);
	fill_uniform(D, N * C, -1, 1);
	for (int i = 0; i < N * C; i++)
		xd[i] = x[i];
	for (int i = 0; i < Nk * C; i++)
		ysd[i] = ys[i];
	for (int i = 0; i < Nk; i++)
		wd[i] = w[i];

	for (int i = 0; i < N * C; i++)
		dx[i] = 1.0f;
	moe_gather_backward(dx, G, order, Nk, k, C);
	moe_gather_backward(NULL, G, order, Nk, k, C);
	for (int i = 0; i < N * C; i++) {
		double keep = xd[i];
		xd[i] = keep + FD_H;
		double lp = gather_loss(xd, G, order, Nk, k, C);
		xd[i] = keep - FD_H;
		double lm = gather_loss(xd, G, order, Nk, k, C);
		xd[i] = keep;
		ck_assert_msg(close_enough(dx[i] - 1.0, (lp - lm) / (2 * FD_H), 1e-6, 1e-5),
			      "dx[%d]: %g vs %g", i, dx[i] - 1.0, (lp - lm) / (2 * FD_H));
	}

	for (int i = 0; i < Nk * C; i++)
		dys[i] = -2.0f;
	for (int i = 0; i < Nk; i++)
		dw[i] = 0.5f;
	moe_combine_backward(dys, dw, D, ys, w, order, Nk, k, C);
	moe_combine_backward(NULL, NULL, D, ys, w, order, Nk, k, C);
	for (int i = 0; i < Nk * C; i++) {
		double keep = ysd[i];
		ysd[i] = keep + FD_H;
		double lp = combine_loss(ysd, wd, D, order, Nk, k, C);
		ysd[i] = keep - FD_H;
		double lm = combine_loss(ysd, wd, D, order, Nk, k, C);
		ysd[i] = keep;
		ck_assert_msg(close_enough(dys[i] + 2.0, (lp - lm) / (2 * FD_H), 1e-6, 1e-5),
			      "dys[%d]", i);
	}
	for (int i = 0; i < Nk; i++) {
		double keep = wd[i];
		wd[i] = keep + FD_H;
		double lp = combine_loss(ysd, wd, D, order, Nk, k, C);
		wd[i] = keep - FD_H;
		double lm = combine_loss(ysd, wd, D, order, Nk, k, C);
		wd[i] = keep;
		ck_assert_msg(close_enough(dw[i] - 0.5, (lp - lm) / (2 * FD_H), 1e-6, 1e-5),
			      "dweights[%d]: %g vs %g", i, dw[i] - 0.5, (lp - lm) / (2 * FD_H));
	}
}
END_TEST

START_TEST(test_bias_update)
{
	float bias[4] = { 0, 0.5f, -0.5f, 1 };
	int32_t counts[4] = { 1, 3, 2, 2 }; /* mean 2 */
	moe_bias_update(bias, counts, 4, 0, 4, 0.125f);
	ck_assert_float_eq(bias[0], 0.125f);
	ck_assert_float_eq(bias[1], 0.375f);
	ck_assert_float_eq(bias[2], -0.5f);
	ck_assert_float_eq(bias[3], 1.0f);
	/* a device's slice, experts 1 and 2: the mean is still over all 4 */
	float part[2] = { 0, 0 };
	moe_bias_update(part, counts, 4, 1, 2, 0.125f);
	ck_assert_float_eq(part[0], -0.125f);
	ck_assert_float_eq(part[1], 0.0f);
}
END_TEST

/* ---- the router's keys ---- */

/* model_dims_from_cfg on the defaults plus a MoE of 8 experts, top-2,
 * and the overrides in kv (space separated): its return, err in *msg. */
static int dims_of(struct model_dims *d, const char *kv, char *msg, size_t len)
{
	static struct cfg c;
	char buf[512], *save = NULL;
	cfg_defaults(&c);
	snprintf(buf, sizeof(buf), "num_experts=8 num_experts_per_tok=2 base_num_decoder_layers=3 %s", kv);
	for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
		ck_assert_int_eq(cfg_override(&c, w, msg, len), 0);
	msg[0] = 0;
	return model_dims_from_cfg(d, &c, msg, len);
}

START_TEST(test_routing_keys)
{
	struct model_dims d;
	char msg[512];
	ck_assert_int_eq(dims_of(&d, "", msg, sizeof(msg)), 0);
	ck_assert_int_eq(d.groups, 0);
	ck_assert_int_eq(dims_of(&d, "n_routing_groups=4 topk_routing_group=2", msg, sizeof(msg)), 0);
	ck_assert_int_eq(d.groups, 4);
	ck_assert_int_eq(d.topk_groups, 2);
	ck_assert_int_eq(dims_of(&d, "n_routing_groups=4", msg, sizeof(msg)), 0);
	ck_assert_int_eq(d.topk_groups, 4); /* -1: every group */

	/* each inconsistency: one line naming the key */
	static const struct { const char *kv, *key; } bad[] = {
		{ "n_routing_groups=3", "'n_routing_groups' (3) must divide 'num_experts' (8)" },
		{ "n_routing_groups=8", "'n_routing_groups' (8) leaves 1 expert per group" },
		{ "n_routing_groups=0", "'n_routing_groups' (0) must divide" },
		{ "n_routing_groups=4 topk_routing_group=5", "'topk_routing_group' must be in [1, n_routing_groups=4]" },
		{ "n_routing_groups=4 topk_routing_group=0", "'topk_routing_group' must be in [1, n_routing_groups=4]" },
		{ "topk_routing_group=2", "'topk_routing_group' (2) needs 'n_routing_groups'" },
		{ "n_routing_groups=4 topk_routing_group=1 num_experts_per_tok=3",
		  "'num_experts_per_tok' (3) is more than the 2 experts of the 'topk_routing_group'=1 groups" },
		{ "num_experts=1 n_routing_groups=2", "they need num_experts > 1" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(dims_of(&d, bad[i].kv, msg, sizeof(msg)), -EINVAL);
		ck_assert_msg(strstr(msg, bad[i].key), "%s: got '%s'", bad[i].kv, msg);
		ck_assert_msg(!strchr(msg, '\n') && !strncmp(msg, "config: ", 8), "not one config line: %s", msg);
	}
}
END_TEST

static Suite *moe_suite(void)
{
	Suite *s = suite_create("moe");
	TCase *tc;

	tc = tcase_create("router_forward");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_router_forward, 0, 4);
	suite_add_tcase(s, tc);

	tc = tcase_create("router_backward");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_router_backward, 0, 8);
	tcase_add_loop_test(tc, test_scores_backward, 0, 2);
	suite_add_tcase(s, tc);

	tc = tcase_create("selection");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_router_ties);
	tcase_add_test(tc, test_router_bias);
	tcase_add_test(tc, test_router_nan);
	tcase_add_test(tc, test_bias_update);
	suite_add_tcase(s, tc);

	tc = tcase_create("v3_router");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_v3_router_forward, 0, 2 * (int)(sizeof(v3_shapes) / sizeof(v3_shapes[0])));
	tcase_add_loop_test(tc, test_v3_router_backward, 0, 2 * (int)(sizeof(v3_shapes) / sizeof(v3_shapes[0])));
	tcase_add_test(tc, test_v3_router_full_size);
	suite_add_tcase(s, tc);

	tc = tcase_create("routing_keys");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_routing_keys);
	suite_add_tcase(s, tc);

	tc = tcase_create("aux_loss");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_aux_uniform);
	tcase_add_loop_test(tc, test_aux_backward, 0, 2);
	suite_add_tcase(s, tc);

	tc = tcase_create("dispatch");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_sort, 0, (int)(sizeof(sort_shapes) / sizeof(sort_shapes[0])));
	tcase_add_test(tc, test_gather_combine);
	tcase_add_test(tc, test_gather_combine_backward);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(moe_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
