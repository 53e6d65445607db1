/* MoE routing kernels (DeepSeek-style; docs/training-step.md#the-v3-router): router scoring,
 * top-k selection (with DeepSeek-V3's correction bias and group-limited
 * selection), the load-balance loss, and the sort / gather / combine steps
 * that move tokens to their experts and back. Experts themselves are plain
 * SwiGLU MLPs run by the caller on each expert's run of sorted rows. */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

/* Keeps the top-k renormalisation finite when every selected sigmoid score
 * underflows to 0 (DeepSeek-V3 adds the same 1e-20). */
#define MOE_NORM_EPS 1e-20

/* Selection key: NaN ranks below everything so idx stays a valid,
 * duplicate-free set of experts even for garbage logits. */
static float sel_key(const float *s, const float *bias, int e)
{
	float v = bias ? s[e] + bias[e] : s[e];
	return isnan(v) ? -INFINITY : v;
}

/* a = (va, ea) ranks before b = (vb, eb): larger value, then lower index */
static int ranks_before(float va, int ea, float vb, int eb)
{
	return va > vb || (va == vb && ea < eb);
}

/* scores s (E) of one token from its logits l (E) */
static void router_scores(float *s, const float *l, int E, enum moe_score score)
{
	if (score == MOE_SOFTMAX) {
		float mx = -INFINITY;
		for (int e = 0; e < E; e++)
			mx = l[e] > mx ? l[e] : mx;
		double sum = 0;
		for (int e = 0; e < E; e++) {
			s[e] = expf(l[e] - mx);
			sum += s[e];
		}
		float inv = (float)(1.0 / sum);
		for (int e = 0; e < E; e++)
			s[e] *= inv;
	} else {
		for (int e = 0; e < E; e++)
			s[e] = 1.0f / (1.0f + expf(-l[e]));
	}
}

/* Group-limited selection: allowed[e] = 1 for the experts of the
 * topk_groups best groups, a group's score being the sum of its two best
 * keys (DeepSeek-V3's; a NaN sum ranks last). */
static void router_groups(unsigned char *allowed, const float *key, const struct moe_routing *r)
{
	int G = r->groups, per = r->E / G;
	float gs[MOE_MAX_EXPERTS];
	for (int g = 0; g < G; g++) {
		float m1 = -INFINITY, m2 = -INFINITY;
		for (int e = g * per; e < (g + 1) * per; e++) {
			if (key[e] > m1) {
				m2 = m1;
				m1 = key[e];
			} else if (key[e] > m2) {
				m2 = key[e];
			}
		}
		float v = m1 + m2;
		gs[g] = isnan(v) ? -INFINITY : v;
	}
	memset(allowed, 0, (size_t)r->E);
	float prev_v = INFINITY;
	int prev_g = -1;
	for (int j = 0; j < r->topk_groups; j++) {
		int best = -1;
		for (int g = 0; g < G; g++)
			if (ranks_before(prev_v, prev_g, gs[g], g) &&
			    (best < 0 || ranks_before(gs[g], g, gs[best], best)))
				best = g;
		memset(allowed + (size_t)best * per, 1, (size_t)per);
		prev_v = gs[best];
		prev_g = best;
	}
}

// logits (N,E) -> scores (N,E); weights, idx (N,k); bias (E) or NULL
void moe_router_forward(float *weights, int32_t *idx, float *scores, const float *logits,
			const float *bias, int N, const struct moe_routing *r)
{
	int E = r->E, k = r->k;
	float key[MOE_MAX_EXPERTS];
	unsigned char allowed[MOE_MAX_EXPERTS];
	for (int n = 0; n < N; n++) {
		float *s = scores + (size_t)n * E;
		float *w = weights + (size_t)n * k;
		int32_t *ix = idx + (size_t)n * k;

		router_scores(s, logits + (size_t)n * E, E, r->score);
		for (int e = 0; e < E; e++)
			key[e] = sel_key(s, bias, e);
		if (r->groups > 1)
			router_groups(allowed, key, r);
		else
			memset(allowed, 1, (size_t)E);

		/* k passes of selection: pass j takes the best allowed expert
		 * that ranks after the one pass j-1 took, so no "taken" marks
		 * are needed. */
		float prev_v = INFINITY;
		int prev_e = -1;
		for (int j = 0; j < k; j++) {
			int best = -1;
			float best_v = -INFINITY;
			for (int e = 0; e < E; e++) {
				float v = key[e];
				if (!allowed[e] || !ranks_before(prev_v, prev_e, v, e))
					continue;
				if (best < 0 || ranks_before(v, e, best_v, best)) {
					best = e;
					best_v = v;
				}
			}
			ix[j] = best;
			prev_v = best_v;
			prev_e = best;
		}

		double denom = 0;
		for (int j = 0; j < k; j++)
			denom += s[ix[j]];
		float f = r->norm_topk ? (float)(r->scale / (denom + MOE_NORM_EPS)) : r->scale;
		for (int j = 0; j < k; j++)
			w[j] = s[ix[j]] * f;
	}
}

// dweights (N,k), scores (N,E), idx (N,k) -> dlogits (N,E)
void moe_router_backward(float *dlogits, const float *dweights, const float *scores,
			 const int32_t *idx, int N, const struct moe_routing *r)
{
	int E = r->E, k = r->k, norm_topk = r->norm_topk;
	double scale = r->scale;
	if (!dlogits)
		return;
	for (int n = 0; n < N; n++) {
		const float *s = scores + (size_t)n * E;
		const float *dw = dweights + (size_t)n * k;
		const int32_t *ix = idx + (size_t)n * k;
		float *dl = dlogits + (size_t)n * E;

		/* g_j = dL/d(scores[ix[j]]); with renormalisation
		 * w_j = scale s_j / S, so g_j = scale/S (dw_j - sum_i dw_i s_i / S) */
		double S = 0, dws = 0;
		for (int j = 0; j < k; j++) {
			S += s[ix[j]];
			dws += (double)dw[j] * s[ix[j]];
		}
		S += MOE_NORM_EPS;

		if (r->score == MOE_SOFTMAX) {
			/* dl_e = s_e (ds_e - sum_i ds_i s_i); ds is non-zero only
			 * on the selected experts */
			double dot = 0;
			for (int j = 0; j < k; j++) {
				double g = norm_topk ? scale / S * (dw[j] - dws / S) : scale * dw[j];
				dot += g * s[ix[j]];
			}
			for (int e = 0; e < E; e++)
				dl[e] -= (float)(s[e] * dot);
			for (int j = 0; j < k; j++) {
				double g = norm_topk ? scale / S * (dw[j] - dws / S) : scale * dw[j];
				dl[ix[j]] += (float)(s[ix[j]] * g);
			}
		} else {
			for (int j = 0; j < k; j++) {
				double g = norm_topk ? scale / S * (dw[j] - dws / S) : scale * dw[j];
				float se = s[ix[j]];
				dl[ix[j]] += (float)(g * se * (1.0f - se));
			}
		}
	}
}

// dscores (N,E), scores (N,E) -> dlogits (N,E): the scoring function's backward
void moe_scores_backward(float *dlogits, const float *dscores, const float *scores,
			 int N, int E, enum moe_score score)
{
	if (!dlogits)
		return;
	for (int n = 0; n < N; n++) {
		const float *s = scores + (size_t)n * E, *ds = dscores + (size_t)n * E;
		float *dl = dlogits + (size_t)n * E;
		if (score == MOE_SOFTMAX) {
			double dot = 0;
			for (int e = 0; e < E; e++)
				dot += (double)s[e] * ds[e];
			for (int e = 0; e < E; e++)
				dl[e] += (float)(s[e] * (ds[e] - dot));
		} else {
			for (int e = 0; e < E; e++)
				dl[e] += ds[e] * s[e] * (1.0f - s[e]);
		}
	}
}

// scores (N,E), idx (N,k) -> counts (E); returns the load-balance loss
double moe_aux_loss_forward(int32_t *counts, const float *scores, const int32_t *idx,
			    int N, int E, int k)
{
	memset(counts, 0, sizeof(*counts) * (size_t)E);
	for (size_t a = 0; a < (size_t)N * k; a++)
		counts[idx[a]]++;
	if (N == 0 || k == 0)
		return 0.0;
	/* L = E/(k N^2) sum_n sum_e counts_e p(n,e) */
	double L = moe_aux_loss_dot(scores, counts, N, E);
	return L * E / ((double)k * N * N);
}

// scores (N,E), counts (E) -> sum over these N tokens of sum_e counts_e p(n,e)
double moe_aux_loss_dot(const float *scores, const int32_t *counts, int N, int E)
{
	double L = 0;
	for (int n = 0; n < N; n++) {
		const float *s = scores + (size_t)n * E;
		double sum = 0, dot = 0;
		for (int e = 0; e < E; e++) {
			sum += s[e];
			dot += (double)counts[e] * s[e];
		}
		if (sum > 0)
			L += dot / sum;
	}
	return L;
}

// scores (N,E), counts (E) -> dscores (N,E)
void moe_aux_loss_backward(float *dscores, const float *scores, const int32_t *counts,
			   float dL, int N, int E, int k)
{
	if (!dscores || N == 0 || k == 0)
		return;
	/* c_e = dL/dp(n,e) = dL E counts_e / (k N^2); p = s / sum(s), so
	 * dL/ds(n,e) = (c_e - sum_j c_j p(n,j)) / sum(s) */
	double c0 = (double)dL * E / ((double)k * N * N);
	for (int n = 0; n < N; n++) {
		const float *s = scores + (size_t)n * E;
		float *ds = dscores + (size_t)n * E;
		double sum = 0, dot = 0;
		for (int e = 0; e < E; e++) {
			sum += s[e];
			dot += (double)counts[e] * s[e];
		}
		if (!(sum > 0))
			continue;
		double mean = dot / sum;
		for (int e = 0; e < E; e++)
			ds[e] += (float)(c0 * (counts[e] - mean) / sum);
	}
}

// idx (N,k) -> order (N*k), offsets (E+1): counting sort by expert, stable
void moe_sort(int32_t *order, int32_t *offsets, const int32_t *idx, int N, int E, int k)
{
	int32_t Nk = (int32_t)((size_t)N * k);
	memset(offsets, 0, sizeof(*offsets) * ((size_t)E + 1));
	for (int32_t a = 0; a < Nk; a++)
		offsets[idx[a] + 1]++;
	for (int e = 0; e < E; e++)
		offsets[e + 1] += offsets[e];
	/* offsets[e] serves as expert e's write cursor, which leaves it at
	 * the start of e+1; shift back afterwards */
	for (int32_t a = 0; a < Nk; a++)
		order[offsets[idx[a]]++] = a;
	for (int e = E; e > 0; e--)
		offsets[e] = offsets[e - 1];
	offsets[0] = 0;
}

// x (N,C), order (Nk) -> xs (Nk,C)
void moe_gather(float *xs, const float *x, const int32_t *order, int Nk, int k, int C)
{
	for (int r = 0; r < Nk; r++)
		memcpy(xs + (size_t)r * C, x + (size_t)(order[r] / k) * C, sizeof(float) * (size_t)C);
}

// dxs (Nk,C) -> dx (N,C)
void moe_gather_backward(float *dx, const float *dxs, const int32_t *order, int Nk, int k, int C)
{
	if (!dx)
		return;
	for (int r = 0; r < Nk; r++) {
		float *d = dx + (size_t)(order[r] / k) * C;
		const float *g = dxs + (size_t)r * C;
		for (int c = 0; c < C; c++)
			d[c] += g[c];
	}
}

// ys (Nk,C), weights (N*k), order (Nk) -> out (N,C) +=
void moe_combine(float *out, const float *ys, const float *weights, const int32_t *order,
		 int Nk, int k, int C)
{
	for (int r = 0; r < Nk; r++) {
		int32_t a = order[r];
		float w = weights[a], *o = out + (size_t)(a / k) * C;
		const float *y = ys + (size_t)r * C;
		for (int c = 0; c < C; c++)
			o[c] += w * y[c];
	}
}

// dout (N,C), ys (Nk,C), weights (N*k) -> dys (Nk,C), dweights (N*k)
void moe_combine_backward(float *dys, float *dweights, const float *dout, const float *ys,
			  const float *weights, const int32_t *order, int Nk, int k, int C)
{
	for (int r = 0; r < Nk; r++) {
		int32_t a = order[r];
		const float *g = dout + (size_t)(a / k) * C;
		if (dys) {
			float w = weights[a], *dy = dys + (size_t)r * C;
			for (int c = 0; c < C; c++)
				dy[c] += w * g[c];
		}
		if (dweights) {
			const float *y = ys + (size_t)r * C;
			double dot = 0;
			for (int c = 0; c < C; c++)
				dot += (double)g[c] * y[c];
			dweights[a] += (float)dot;
		}
	}
}

// counts (E) global token counts -> bias (E) nudged toward balance
void moe_bias_update(float *bias, const int32_t *counts, int E, int e0, int n, float rate)
{
	double mean = 0;
	for (int e = 0; e < E; e++)
		mean += counts[e];
	mean /= E > 0 ? E : 1;
	for (int j = 0; j < n; j++) {
		int32_t c = counts[e0 + j];
		bias[j] += c < mean ? rate : c > mean ? -rate : 0.0f;
	}
}
