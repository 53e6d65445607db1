/* Multi-head latent attention (attention_type mla, docs/deepseek.md), one
 * of the attention implementations behind struct attn_ops (model_int.h),
 * as Hugging Face's deepseek_v3 computes it:
 *
 *	q   = wq ln, or wq_b rmsnorm(wq_a ln)          per head [nope | rope]
 *	kva = wkv_a ln = [c (Rkv) | kr (Dr)]           kr: one key for all heads
 *	kvb = wkv_b rmsnorm(c)                         per head [k nope | v]
 *	k   = per head [k nope | rope(kr)], q's rope part rotated alike
 *	out = wo attention(q, k, v)
 *
 * The LoRA norms use eps 1e-6 whatever rms_norm_eps says. The latents are
 * whole on every device (their down-projections' partial sums over a
 * split embedding are all-reduced); heads split as the plans say. The
 * backward is a flat list of kernel calls in which each weight's
 * gradient comes from its own linear_backward. */
#include <string.h>

#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "kernels/kernels.h"

#define LORA_EPS 1e-6f

static void mla_forward(struct model *m, int l, float *out, const float *ln)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, H = d->Hq, Dk = d->Dn + d->Dr, QD = H * Dk, VD = H * d->Dv;
	int BD = H * (d->Dn + d->Dv), Rkv = d->Rkv, Dr = d->Dr;
	float *wkv = WP(P_WKV_A, l), *kr = a->kva + (size_t)N * Rkv, *kvb = m->dkvb;

	/* queries, their rope parts rotated */
	if (d->Rq) {
		linear_forward(a->qa, ln, WP(P_WQ_A, l), N, C, d->Rq);
		psum(m, m->pl[P_WQ_A].reduce, a->qa, (size_t)N * d->Rq);
		rmsnorm_forward(a->qn, a->qrstd, a->qa, WP(P_Q_A_NORM, l), N, d->Rq, LORA_EPS);
		linear_forward(a->q, a->qn, WP(P_WQ_B, l), N, d->Rq, QD);
		psum(m, m->pl[P_WQ_B].reduce, a->q, (size_t)N * QD);
	} else {
		linear_forward(a->q, ln, WP(P_WQ, l), N, C, QD);
		psum(m, m->pl[P_WQ].reduce, a->q, (size_t)N * QD);
	}
	rope_adj_forward(a->q, a->q, m->cos_t, m->sin_t, m->B, d->T, H, Dk, d->Dn, Dr);
	/* the kv latent and the shared rotary key: wkv_a's rows [0, Rkv)
	 * and [Rkv, Rkv + Dr), one buffer so one sum covers both */
	linear_forward(a->kva, ln, wkv, N, C, Rkv);
	linear_forward(kr, ln, wkv + (size_t)Rkv * C, N, C, Dr);
	psum(m, m->pl[P_WKV_A].reduce, a->kva, (size_t)N * (Rkv + Dr));
	rmsnorm_forward(a->kvn, a->kvrstd, a->kva, WP(P_KV_A_NORM, l), N, Rkv, LORA_EPS);
	linear_forward(kvb, a->kvn, WP(P_WKV_B, l), N, Rkv, BD);
	psum(m, m->pl[P_WKV_B].reduce, kvb, (size_t)N * BD);
	/* the rotated key is only read through k (its backward needs no input) */
	rope_adj_forward(kr, kr, m->cos_t, m->sin_t, m->B, d->T, 1, Dr, 0, Dr);
	mla_kv_forward(a->k, a->v, kvb, kr, N, H, d->Dn, Dr, d->Dv);
	attention_forward(a->atty, a->att, a->q, a->k, a->v, m->B, d->T, H, H, Dk, d->Dv, m->att_scale);
	linear_forward(out, a->atty, WP(P_WO, l), N, VD, C);
	psum(m, m->pl[P_WO].reduce, out, (size_t)N * C);
}

static void mla_backward(struct model *m, int l, float *dln, const float *dout, const float *ln)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, H = d->Hq, Dk = d->Dn + d->Dr, QD = H * Dk, VD = H * d->Dv;
	int BD = H * (d->Dn + d->Dv), Rkv = d->Rkv, Dr = d->Dr;
	float *wkv = WP(P_WKV_A, l), *gkv = GP(P_WKV_A, l);
	float *dkr = m->dlat + (size_t)N * Rkv, *dkr_rot = m->dkr;

	memset(m->datty, 0, sizeof(float) * (size_t)N * VD);
	linear_backward(m->datty, GP(P_WO, l), dout, a->atty, WP(P_WO, l), N, VD, C);
	psum(m, m->pl[P_WO].dx_reduce, m->datty, (size_t)N * VD);
	memset(m->dq, 0, sizeof(float) * (size_t)N * QD);
	memset(m->dk, 0, sizeof(float) * (size_t)N * QD);
	memset(m->dv, 0, sizeof(float) * (size_t)N * VD);
	attention_backward(m->dq, m->dk, m->dv, m->att_scratch, m->datty, a->q, a->k, a->v, a->att,
			   m->B, d->T, H, H, Dk, d->Dv, m->att_scale);

	/* queries: the rotation undone, then the projections; with heads
	 * split the latent's gradient is partial until summed */
	memset(m->dqr, 0, sizeof(float) * (size_t)N * QD);
	rope_adj_backward(m->dqr, m->dq, m->cos_t, m->sin_t, m->B, d->T, H, Dk, d->Dn, Dr);
	if (d->Rq) {
		memset(m->dqn, 0, sizeof(float) * (size_t)N * d->Rq);
		linear_backward(m->dqn, GP(P_WQ_B, l), m->dqr, a->qn, WP(P_WQ_B, l), N, d->Rq, QD);
		psum(m, m->pl[P_WQ_B].dx_reduce, m->dqn, (size_t)N * d->Rq);
		memset(m->dqa, 0, sizeof(float) * (size_t)N * d->Rq);
		rmsnorm_backward(m->dqa, GP(P_Q_A_NORM, l), m->dqn, a->qa, WP(P_Q_A_NORM, l), a->qrstd,
				 N, d->Rq);
		/* the latent is whole: this dx is complete (dx_reduce none) */
		linear_backward(dln, GP(P_WQ_A, l), m->dqa, ln, WP(P_WQ_A, l), N, C, d->Rq);
	} else {
		linear_backward(dln, GP(P_WQ, l), m->dqr, ln, WP(P_WQ, l), N, C, QD);
		psum(m, m->pl[P_WQ].dx_reduce, dln, (size_t)N * C);
	}

	/* keys and values: back through their assembly and wkv_b into
	 * [normed latent | rotated key], partial over split heads, summed in
	 * one call; then the key's rotation and the latent's norm */
	memset(m->dkvb, 0, sizeof(float) * (size_t)N * BD);
	memset(dkr_rot, 0, sizeof(float) * (size_t)N * Dr);
	mla_kv_backward(m->dkvb, dkr_rot, m->dk, m->dv, N, H, d->Dn, Dr, d->Dv);
	memset(m->dlat, 0, sizeof(float) * (size_t)N * (Rkv + Dr));
	linear_backward(m->dlat, GP(P_WKV_B, l), m->dkvb, a->kvn, WP(P_WKV_B, l), N, Rkv, BD);
	rope_adj_backward(dkr, dkr_rot, m->cos_t, m->sin_t, m->B, d->T, 1, Dr, 0, Dr);
	psum(m, m->pl[P_WKV_B].dx_reduce, m->dlat, (size_t)N * (Rkv + Dr));
	memset(m->dkva, 0, sizeof(float) * (size_t)N * Rkv);
	rmsnorm_backward(m->dkva, GP(P_KV_A_NORM, l), m->dlat, a->kva, WP(P_KV_A_NORM, l), a->kvrstd,
			 N, Rkv);
	/* wkv_a's two row blocks, the latent's and the key's; its output is
	 * whole, so its dx needs no sum (dx_reduce is none) and adds to the
	 * q path's, summed above */
	linear_backward(dln, gkv, m->dkva, ln, wkv, N, C, Rkv);
	linear_backward(dln, gkv + (size_t)Rkv * C, dkr, ln, wkv + (size_t)Rkv * C, N, C, Dr);
}

const struct attn_ops attn_mla = { mla_forward, mla_backward };
