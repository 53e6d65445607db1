/* One decoder layer on this device's rows and shards, forward and
 * backward, as a flat list of kernel calls: RMSNorm, attention (the
 * model's struct attn_ops: attn.c or attn_mla.c), residual, RMSNorm, a
 * SwiGLU MLP or the MoE block (moe.c routes), and residual. Where the plans say, partial sums are all-reduced (psum);
 * weights come from wsel (storage or the FSDP window, whose schedule is
 * the caller's). */
#include <string.h>

#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "kernels/kernels.h"

void norm_forward(struct model *m, float *out, float *rstd, const float *x, const float *w)
{
	if (!m->ax_emb) {
		rmsnorm_forward(out, rstd, x, w, m->N, m->l.C, m->d.eps);
		return;
	}
	rmsnorm_partial_sumsq(m->nstat, x, m->N, m->l.C);
	psum(m, m->ax_emb, m->nstat, (size_t)m->N);
	rmsnorm_forward_split(out, rstd, x, w, m->nstat, m->N, m->l.C, m->d.C, m->d.eps);
}

void norm_backward(struct model *m, float *dx, float *dw, const float *dout, const float *x,
		   const float *w, const float *rstd)
{
	if (!m->ax_emb) {
		rmsnorm_backward(dx, dw, dout, x, w, rstd, m->N, m->l.C);
		return;
	}
	rmsnorm_backward_partial(m->nstat, dout, x, w, m->N, m->l.C);
	psum(m, m->ax_emb, m->nstat, (size_t)m->N);
	rmsnorm_backward_split(dx, dw, dout, x, w, rstd, m->nstat, m->N, m->l.C, m->d.C);
}

/* A layer norm's backward: dx += and its weight's gradient. When that
 * gradient is made now (no split-backward tape) and the rows are whole,
 * one rmsnorm_backward reads dout and x once for both (the same bits:
 * the two never share a buffer); else the gradient goes to wgrad.c. */
static void layer_norm_backward(struct model *m, int id, int l, float *dx, const float *dout,
				const float *x, const float *rstd)
{
	int N = m->N, C = m->l.C;
	if (!m->wg && !m->ax_emb) {
		rmsnorm_backward(dx, GP(id, l), dout, x, WP(id, l), rstd, N, C);
		return;
	}
	norm_backward(m, dx, NULL, dout, x, WP(id, l), rstd);
	wg_norm(m, id, l, dout, wg_keep_act(m, x, (size_t)N * C), wg_keep_act(m, rstd, (size_t)N), N, C);
}

/* Rows of a SwiGLU feed-forward in blocks: block b is rows [start[b],
 * start[b] + rows[b]) and uses matrix w[b] of the weight stacks (the
 * experts; a dense MLP or the shared expert is one block of every row). */
struct ffn_blocks {
	int n;
	const int *start, *rows, *w;
};

/* y (rows, C) = down(swiglu(gate x, up x)) over the blocks, added to y
 * with acc; g, u, h (rows, F) are saved for the backward. gate is the id
 * of the gate weight; up and down follow it. */
static void ffn_forward(struct model *m, int gate, int l, float *y, float *h, float *g, float *u,
			const float *x, const struct ffn_blocks *b, int F, bool acc)
{
	int C = m->l.C;
	float *wg = WP(gate, l), *wu = WP(gate + 1, l), *wd = WP(gate + 2, l);
	size_t wsz = (size_t)F * C, rows = 0;
	for (int i = 0; i < b->n; i++) {
		size_t rf = (size_t)b->start[i] * F, rc = (size_t)b->start[i] * C;
		int ne = b->rows[i], j = b->w[i];
		rows += (size_t)ne;
		if (!ne)
			continue;
		linear_forward(g + rf, x + rc, wg + j * wsz, ne, C, F);
		linear_forward(u + rf, x + rc, wu + j * wsz, ne, C, F);
	}
	psum(m, m->pl[gate].reduce, g, rows * F);
	psum(m, m->pl[gate + 1].reduce, u, rows * F);
	for (int i = 0; i < b->n; i++) {
		size_t rf = (size_t)b->start[i] * F, rc = (size_t)b->start[i] * C;
		int ne = b->rows[i], j = b->w[i];
		if (!ne)
			continue;
		swiglu_forward(h + rf, g + rf, u + rf, ne, F);
		if (acc)
			linear_forward_acc(y + rc, h + rf, wd + j * wsz, ne, F, C);
		else
			linear_forward(y + rc, h + rf, wd + j * wsz, ne, F, C);
	}
}

/* Backward of ffn_forward: dx += the input gradient (partial over the
 * hidden's axes: the caller sums it); each weight's gradient goes to
 * wgrad.c with its input and output gradient (now, or kept for W): kdy
 * is dy where the down projection's reads it (wg_keep, or dy written by
 * wg_out). */
static void ffn_backward(struct model *m, int gate, int l, float *dx, const float *dy, const float *kdy,
			 const float *h, const float *g, const float *u, const float *x, const struct ffn_blocks *b,
			 int F)
{
	int C = m->l.C;
	float *wg = WP(gate, l), *wu = WP(gate + 1, l), *wd = WP(gate + 2, l);
	size_t wsz = (size_t)F * C, rows = 0;
	for (int i = 0; i < b->n; i++)
		rows += (size_t)b->rows[i];
	float *dh = m->dbig1, *dg = wg_out(m, m->dbig2, rows * F), *du = wg_out(m, m->dbig3, rows * F);
	const float *kh = wg_keep_act(m, h, rows * F);
	memset(dh, 0, rows * F * sizeof(float));
	for (int i = 0; i < b->n; i++) {
		size_t rf = (size_t)b->start[i] * F, rc = (size_t)b->start[i] * C;
		int ne = b->rows[i], j = b->w[i];
		if (!ne)
			continue;
		linear_backward(dh + rf, NULL, dy + rc, NULL, wd + j * wsz, ne, F, C);
		wg_linear(m, gate + 2, l, j * wsz, kdy + rc, kh + rf, ne, F, C);
	}
	psum(m, m->pl[gate + 2].dx_reduce, dh, rows * F);
	/* each block writes its rows of dg and du (no memset), and only they
	 * are read */
	for (int i = 0; i < b->n; i++) {
		size_t rf = (size_t)b->start[i] * F;
		if (b->rows[i])
			swiglu_backward(dg + rf, du + rf, dh + rf, g + rf, u + rf, b->rows[i], F, 0);
	}
	const float *kx = wg_keep_act(m, x, rows * C);
	for (int i = 0; i < b->n; i++) {
		size_t rf = (size_t)b->start[i] * F, rc = (size_t)b->start[i] * C;
		int ne = b->rows[i], j = b->w[i];
		if (!ne)
			continue;
		linear_backward(dx + rc, NULL, dg + rf, NULL, wg + j * wsz, ne, C, F);
		wg_linear(m, gate, l, j * wsz, dg + rf, kx + rc, ne, C, F);
		linear_backward(dx + rc, NULL, du + rf, NULL, wu + j * wsz, ne, C, F);
		wg_linear(m, gate + 1, l, j * wsz, du + rf, kx + rc, ne, C, F);
	}
}

void layer_experts_forward(struct model *m, int l, const float *X, float *Y)
{
	struct layer_acts *a = &m->la[l];
	int bs[MOE_MAX_BLOCKS], bn[MOE_MAX_BLOCKS], bj[MOE_MAX_BLOCKS];
	struct ffn_blocks eb = { moe_expert_blocks(m, l, bs, bn, bj), bs, bn, bj };
	ffn_forward(m, P_E_GATE, l, Y, a->eh, a->eg, a->eu, X, &eb, m->l.Fe, false);
}

void layer_shared_forward(struct model *m, int l, float *out, bool acc)
{
	struct layer_acts *a = &m->la[l];
	int N = m->N, zero = 0;
	struct ffn_blocks all = { 1, &zero, &N, &zero };
	ffn_forward(m, P_S_GATE, l, out, a->sh, a->sg, a->su, a->ln2, &all, m->SF, acc);
}

void layer_experts_backward(struct model *m, int l, const float *X, const float *dY, float *dX)
{
	struct layer_acts *a = &m->la[l];
	int bs[MOE_MAX_BLOCKS], bn[MOE_MAX_BLOCKS], bj[MOE_MAX_BLOCKS];
	struct ffn_blocks eb = { moe_expert_blocks(m, l, bs, bn, bj), bs, bn, bj };
	/* dY is where the split backward's W reads it already (wg_out) */
	ffn_backward(m, P_E_GATE, l, dX, dY, dY, a->eh, a->eg, a->eu, X, &eb, m->l.Fe);
}

void layer_shared_backward(struct model *m, int l, float *dln, const float *dres)
{
	struct layer_acts *a = &m->la[l];
	int N = m->N, zero = 0;
	struct ffn_blocks all = { 1, &zero, &N, &zero };
	ffn_backward(m, P_S_GATE, l, dln, dres, wg_keep(m, dres, (size_t)N * m->l.C), a->sh, a->sg,
		     a->su, a->ln2, &all, m->SF);
}

void layer_forward(struct model *m, int l, float *y, const float *x)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, zero = 0;
	struct ffn_blocks all = { 1, &zero, &N, &zero };
	float *tmp = m->dln; /* dln is free during forward */

	norm_forward(m, a->ln1, a->rstd1, x, WP(P_ATTN_NORM, l));
	m->attn->forward(m, l, tmp, a->ln1);
	residual_forward(a->xmid, x, tmp, N * C);
	model_mid(m, l, false, m->part_ffn);
	norm_forward(m, a->ln2, a->rstd2, a->xmid, WP(P_MLP_NORM, l));

	if (l < d->L_dense) {
		ffn_forward(m, P_W_GATE, l, tmp, a->h, a->g, a->u, a->ln2, &all, d->F, false);
		psum(m, m->pl[P_W_DOWN].reduce, tmp, (size_t)N * C);
	} else {
		/* MoE: route, run each expert on its rows, combine, add the
		 * shared experts; all partial over the hidden's axes */
		float *X, *Y;
		moe_route_forward(m, l, &X, &Y);
		layer_experts_forward(m, l, X, Y);
		moe_return_forward(m, l, tmp);
		if (d->S)
			layer_shared_forward(m, l, tmp, true);
		psum(m, m->ax_moe_out, tmp, (size_t)N * C);
	}
	residual_forward(y, a->xmid, tmp, N * C);
}

void layer_backward(struct model *m, int l, float *dres, const float *x)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, zero = 0;
	struct ffn_blocks all = { 1, &zero, &N, &zero };
	/* the MLP norm's output gradient, where its weight gradient reads it */
	float *dln = wg_out(m, m->dln, (size_t)N * C);

	memset(dln, 0, sizeof(float) * (size_t)N * C);
	if (l < d->L_dense) {
		ffn_backward(m, P_W_GATE, l, dln, dres, wg_keep(m, dres, (size_t)N * C), a->h, a->g, a->u, a->ln2,
			     &all, d->F);
		psum(m, m->pl[P_W_GATE].dx_reduce, dln, (size_t)N * C);
	} else {
		float *X, *dY, *dX;
		if (d->S)
			layer_shared_backward(m, l, dln, dres);
		moe_return_backward(m, l, dres, &X, &dY, &dX);
		layer_experts_backward(m, l, X, dY, dX);
		moe_route_backward(m, l, dln);
	}
	layer_norm_backward(m, P_MLP_NORM, l, dres, dln, a->xmid, a->rstd2);
	model_mid(m, l, true, m->part_ffn);

	/* attention block: dres now holds dL/d(xmid) */
	dln = wg_out(m, m->dln, (size_t)N * C);
	memset(dln, 0, sizeof(float) * (size_t)N * C);
	m->attn->backward(m, l, dln, dres, a->ln1);
	layer_norm_backward(m, P_ATTN_NORM, l, dres, dln, x, a->rstd1);
}
