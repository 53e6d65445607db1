/* Grouped-query attention (attention_type global), one of the attention
 * implementations behind struct attn_ops (model_int.h): q, k, v
 * projections, RoPE with Llama's pairing (i, i + D/2), causal attention,
 * the output projection; forward and backward as flat lists of kernel
 * calls, partial sums reduced where the plans say. */
#include <string.h>

#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "kernels/kernels.h"

static void gqa_forward(struct model *m, int l, float *out, const float *ln)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, QD = d->Hq * d->D, KD = d->Hkv * d->D;

	linear_forward(a->q, ln, WP(P_WQ, l), N, C, QD);
	linear_forward(a->k, ln, WP(P_WK, l), N, C, KD);
	linear_forward(a->v, ln, WP(P_WV, l), N, C, KD);
	psum(m, m->pl[P_WQ].reduce, a->q, (size_t)N * QD);
	psum(m, m->pl[P_WK].reduce, a->k, (size_t)N * KD);
	psum(m, m->pl[P_WV].reduce, a->v, (size_t)N * KD);
	rope_forward(a->q, a->q, m->cos_t, m->sin_t, m->B, d->T, d->Hq, d->D);
	rope_forward(a->k, a->k, m->cos_t, m->sin_t, m->B, d->T, d->Hkv, d->D);
	attention_forward(a->atty, a->att, a->q, a->k, a->v, m->B, d->T, d->Hq, d->Hkv, d->D, d->D,
			  m->att_scale);
	linear_forward(out, a->atty, WP(P_WO, l), N, QD, C);
	psum(m, m->pl[P_WO].reduce, out, (size_t)N * C);
}

static void gqa_backward(struct model *m, int l, float *dln, const float *dout, const float *ln)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, QD = d->Hq * d->D, KD = d->Hkv * d->D;

	memset(m->datty, 0, sizeof(float) * (size_t)N * QD);
	linear_backward(m->datty, GP(P_WO, l), dout, a->atty, WP(P_WO, l), N, QD, C);
	psum(m, m->pl[P_WO].dx_reduce, m->datty, (size_t)N * QD);
	memset(m->dq, 0, sizeof(float) * (size_t)N * QD);
	memset(m->dk, 0, sizeof(float) * (size_t)N * KD);
	memset(m->dv, 0, sizeof(float) * (size_t)N * KD);
	attention_backward(m->dq, m->dk, m->dv, m->att_scratch, m->datty, a->q, a->k, a->v, a->att,
			   m->B, d->T, d->Hq, d->Hkv, d->D, d->D, m->att_scale);
	memset(m->dqr, 0, sizeof(float) * (size_t)N * QD);
	memset(m->dkr, 0, sizeof(float) * (size_t)N * KD);
	rope_backward(m->dqr, m->dq, m->cos_t, m->sin_t, m->B, d->T, d->Hq, d->D);
	rope_backward(m->dkr, m->dk, m->cos_t, m->sin_t, m->B, d->T, d->Hkv, d->D);
	/* q, k and v split their heads alike: one sum of their partial dx */
	linear_backward(dln, GP(P_WQ, l), m->dqr, ln, WP(P_WQ, l), N, C, QD);
	linear_backward(dln, GP(P_WK, l), m->dkr, ln, WP(P_WK, l), N, C, KD);
	linear_backward(dln, GP(P_WV, l), m->dv, ln, WP(P_WV, l), N, C, KD);
	psum(m, m->pl[P_WQ].dx_reduce, dln, (size_t)N * C);
}

const struct attn_ops attn_gqa = { gqa_forward, gqa_backward };
