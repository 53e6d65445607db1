/* Grouped-query attention (attention_type global), one of the attention
 * implementations behind struct attn_ops (model_int.h): q, k, v
 * projections, RoPE with Llama's pairing (i, i + D/2), causal attention,
 * the output projection; forward and backward as flat lists of kernel
 * calls, partial sums reduced where the plans say, each weight gradient
 * handed to wgrad.c (now, or kept for the split backward's W). */
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
	linear_backward(m->datty, NULL, dout, NULL, WP(P_WO, l), N, QD, C);
	wg_linear(m, P_WO, l, 0, wg_keep(m, dout, (size_t)N * C), wg_keep_act(m, a->atty, (size_t)N * QD),
		  N, QD, C);
	psum(m, m->pl[P_WO].dx_reduce, m->datty, (size_t)N * QD);
	/* the projections' output gradients, where their weight gradients
	 * read them */
	float *dv = wg_out(m, m->dv, (size_t)N * KD), *dqr = wg_out(m, m->dqr, (size_t)N * QD);
	float *dkr = wg_out(m, m->dkr, (size_t)N * KD);
	attention_backward(m->dq, m->dk, dv, m->att_scratch, m->datty, a->q, a->k, a->v, a->att,
			   m->B, d->T, d->Hq, d->Hkv, d->D, d->D, m->att_scale, 0);
	rope_backward(dqr, m->dq, m->cos_t, m->sin_t, m->B, d->T, d->Hq, d->D, 0);
	rope_backward(dkr, m->dk, m->cos_t, m->sin_t, m->B, d->T, d->Hkv, d->D, 0);
	/* q, k and v split their heads alike: one sum of their partial dx */
	const float *kln = wg_keep_act(m, ln, (size_t)N * C);
	linear_backward(dln, NULL, dqr, NULL, WP(P_WQ, l), N, C, QD);
	wg_linear(m, P_WQ, l, 0, dqr, kln, N, C, QD);
	linear_backward(dln, NULL, dkr, NULL, WP(P_WK, l), N, C, KD);
	wg_linear(m, P_WK, l, 0, dkr, kln, N, C, KD);
	model_mid(m, l, true, model_fine_grads(m, l) ? m->part_att : 0);  /* wo's, wq's and wk's are written */
	linear_backward(dln, NULL, dv, NULL, WP(P_WV, l), N, C, KD);
	wg_linear(m, P_WV, l, 0, dv, kln, N, C, KD);
	psum(m, m->pl[P_WQ].dx_reduce, dln, (size_t)N * C);
}

const struct attn_ops attn_gqa = { gqa_forward, gqa_backward };
