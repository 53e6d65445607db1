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
 * gradient is its own call, handed to wgrad.c (now, or kept for the
 * split backward's W). */
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
	int BD = H * (d->Dn + d->Dv), Rkv = d->Rkv, Dr = d->Dr, Rq = d->Rq;
	float *wkv = WP(P_WKV_A, l), *dkr_rot = m->dkr;
	const float *kln = wg_keep_act(m, ln, (size_t)N * C);
	/* the output gradients weight gradients read, where they read them */
	float *dqr = wg_out(m, m->dqr, (size_t)N * QD), *dkvb = wg_out(m, m->dkvb, (size_t)N * BD);
	float *dlat = wg_out(m, m->dlat, (size_t)N * (Rkv + Dr)), *dkva = wg_out(m, m->dkva, (size_t)N * Rkv);
	float *dqn = Rq ? wg_out(m, m->dqn, (size_t)N * Rq) : NULL, *dqa = Rq ? wg_out(m, m->dqa, (size_t)N * Rq) : NULL;
	float *dkr = dlat + (size_t)N * Rkv;

	memset(m->datty, 0, sizeof(float) * (size_t)N * VD);
	linear_backward(m->datty, NULL, dout, NULL, WP(P_WO, l), N, VD, C);
	wg_linear(m, P_WO, l, 0, wg_keep(m, dout, (size_t)N * C), wg_keep_act(m, a->atty, (size_t)N * VD),
		  N, VD, C);
	psum(m, m->pl[P_WO].dx_reduce, m->datty, (size_t)N * VD);
	attention_backward(m->dq, m->dk, m->dv, m->att_scratch, m->datty, a->q, a->k, a->v, a->att,
			   m->B, d->T, H, H, Dk, d->Dv, m->att_scale, 0);

	/* queries: the rotation undone, then the projections; with heads
	 * split the latent's gradient is partial until summed */
	memset(dqr, 0, sizeof(float) * (size_t)N * QD);
	rope_adj_backward(dqr, m->dq, m->cos_t, m->sin_t, m->B, d->T, H, Dk, d->Dn, Dr);
	if (Rq) {
		memset(dqn, 0, sizeof(float) * (size_t)N * Rq);
		linear_backward(dqn, NULL, dqr, NULL, WP(P_WQ_B, l), N, Rq, QD);
		wg_linear(m, P_WQ_B, l, 0, dqr, wg_keep_act(m, a->qn, (size_t)N * Rq), N, Rq, QD);
		psum(m, m->pl[P_WQ_B].dx_reduce, dqn, (size_t)N * Rq);
		memset(dqa, 0, sizeof(float) * (size_t)N * Rq);
		rmsnorm_backward(dqa, NULL, dqn, a->qa, WP(P_Q_A_NORM, l), a->qrstd, N, Rq);
		wg_norm(m, P_Q_A_NORM, l, dqn, wg_keep_act(m, a->qa, (size_t)N * Rq), wg_keep_act(m, a->qrstd, (size_t)N),
			N, Rq);
		/* the latent is whole: this dx is complete (dx_reduce none) */
		linear_backward(dln, NULL, dqa, NULL, WP(P_WQ_A, l), N, C, Rq);
		wg_linear(m, P_WQ_A, l, 0, dqa, kln, N, C, Rq);
	} else {
		linear_backward(dln, NULL, dqr, NULL, WP(P_WQ, l), N, C, QD);
		wg_linear(m, P_WQ, l, 0, dqr, kln, N, C, QD);
		psum(m, m->pl[P_WQ].dx_reduce, dln, (size_t)N * C);
	}

	/* keys and values: back through their assembly and wkv_b into
	 * [normed latent | rotated key], partial over split heads, summed in
	 * one call; then the key's rotation and the latent's norm */
	memset(dkvb, 0, sizeof(float) * (size_t)N * BD);
	memset(dkr_rot, 0, sizeof(float) * (size_t)N * Dr);
	mla_kv_backward(dkvb, dkr_rot, m->dk, m->dv, N, H, d->Dn, Dr, d->Dv);
	memset(dlat, 0, sizeof(float) * (size_t)N * (Rkv + Dr));
	linear_backward(dlat, NULL, dkvb, NULL, WP(P_WKV_B, l), N, Rkv, BD);
	wg_linear(m, P_WKV_B, l, 0, dkvb, wg_keep_act(m, a->kvn, (size_t)N * Rkv), N, Rkv, BD);
	rope_adj_backward(dkr, dkr_rot, m->cos_t, m->sin_t, m->B, d->T, 1, Dr, 0, Dr);
	psum(m, m->pl[P_WKV_B].dx_reduce, dlat, (size_t)N * (Rkv + Dr));
	memset(dkva, 0, sizeof(float) * (size_t)N * Rkv);
	rmsnorm_backward(dkva, NULL, dlat, a->kva, WP(P_KV_A_NORM, l), a->kvrstd, N, Rkv);
	wg_norm(m, P_KV_A_NORM, l, dlat, wg_keep_act(m, a->kva, (size_t)N * Rkv), wg_keep_act(m, a->kvrstd, (size_t)N),
		N, Rkv);
	/* wkv_a's two row blocks, the latent's and the key's; its output is
	 * whole, so its dx needs no sum (dx_reduce is none) and adds to the
	 * q path's, summed above */
	linear_backward(dln, NULL, dkva, NULL, wkv, N, C, Rkv);
	wg_linear(m, P_WKV_A, l, 0, dkva, kln, N, C, Rkv);
	linear_backward(dln, NULL, dkr, NULL, wkv + (size_t)Rkv * C, N, C, Dr);
	wg_linear(m, P_WKV_A, l, (size_t)Rkv * C, dkr, kln, N, C, Dr);
}

const struct attn_ops attn_mla = { mla_forward, mla_backward };
