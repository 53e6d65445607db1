/* DeepSeek's batch-split schedule (docs/deepseek.md#batch-split), in the
 * order MaxText's deepseek_batchsplit.py gives it: a device's rows are
 * cut in two halves (the model m runs the first, m->other the second,
 * each with its own activations) whose MoE layers run staggered, so the
 * expert all-to-all of one half is in flight while the other computes.
 * Forward of MoE layer l, and what is in flight meanwhile:
 *
 *	attn     h0 l                         comb h1 l-1
 *	finish   h1 l-1 (its residual)
 *	attn     h1 l
 *	route    h0 l   sends disp h0
 *	route    h1 l   sends disp h1         disp h0
 *	experts  h0 l   sends comb h0         disp h1
 *	experts  h1 l   sends comb h1         comb h0
 *	finish   h0 l                         comb h1 (finished in layer l+1)
 *
 * The backward is that list reversed (each exchange's gradient sent
 * where its forward was waited for, waited for where its forward was
 * sent), but for one move: the second half's attention backward, and
 * with it the sending of its comb bwd of layer l-1, comes before the
 * first half's route backward, so that the first half's disp bwd has
 * that compute to fly under, and the comb bwd the first half's route
 * and attention backward:
 *
 *	finish bwd   h0 l     sends comb bwd h0     comb bwd h1 (sent in l+1)
 *	experts bwd  h1 l     sends disp bwd h1     comb bwd h0
 *	experts bwd  h0 l     sends disp bwd h0     disp bwd h1
 *	shared, route bwd h1 l                      disp bwd h0
 *	attn bwd     h1 l
 *	finish bwd   h1 l-1   sends comb bwd h1
 *	shared, route bwd h0 l                      comb bwd h1
 *	attn bwd     h0 l
 *
 * Dense layers run the halves one after the other. Each piece is the
 * list of calls an unsplit layer makes (layer.c, moe.c), on one half;
 * the shared experts run in the route piece (beside the dispatch, as
 * MaxText's shared_expert_and_route) because the second half's finish
 * comes after the window has moved on to the next layer's weights. */
#include <stdio.h>
#include <string.h>

#include "host/model/model_int.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

/* Layer l's input rows of half m (the last layer's output for l = L). */
static float *rows(struct model *m, int l)
{
	return m->resid + (size_t)l * m->N * m->l.C;
}

static size_t nc(const struct model *m)
{
	return (size_t)m->N * m->l.C;
}

/* ---- the pieces, on one half m ---- */

static void dense_fwd(struct model *m, int l)
{
	layer_forward(m, l, rows(m, l + 1), rows(m, l));
}

/* norm, attention, residual, norm: la[l].ln2 is the MoE block's input */
static void attn_fwd(struct model *m, int l)
{
	struct layer_acts *a = &m->la[l];
	float *tmp = m->dln;  /* free during forward */
	norm_forward(m, a->ln1, a->rstd1, rows(m, l), WP(P_ATTN_NORM, l));
	m->attn->forward(m, l, tmp, a->ln1);
	residual_forward(a->xmid, rows(m, l), tmp, (int)nc(m));
	norm_forward(m, a->ln2, a->rstd2, a->xmid, WP(P_MLP_NORM, l));
}

/* the router, the dispatch sent, and the shared experts' output into
 * dresid (free during forward) until finish */
static void route_fwd(struct model *m, int l)
{
	float *X, *Y;
	moe_route_forward(m, l, &X, &Y);
	if (m->l.S)
		layer_shared_forward(m, l, m->dresid, false);
}

static void experts_fwd(struct model *m, int l)
{
	float *X, *Y, *dY, *dX;
	moe_expert_rows(m, l, &X, &Y, &dY, &dX);
	layer_experts_forward(m, l, X, Y);
	moe_return_start(m, l);
}

/* the routed outputs combined, the shared ones added, the residual */
static void finish_fwd(struct model *m, int l)
{
	float *tmp = m->dln;
	moe_return_finish(m, l, tmp);
	if (m->l.S)
		residual_forward(tmp, tmp, m->dresid, (int)nc(m));
	psum(m, m->ax_moe_out, tmp, nc(m));
	residual_forward(rows(m, l + 1), m->la[l].xmid, tmp, (int)nc(m));
}

static void dense_bwd(struct model *m, int l)
{
	layer_backward(m, l, m->dresid, rows(m, l));
}

/* dresid holds dL/d(layer l's output) from here to route_bwd */
static void finish_bwd(struct model *m, int l)
{
	float *X, *dY, *dX;
	moe_return_backward(m, l, m->dresid, &X, &dY, &dX);
}

static void experts_bwd(struct model *m, int l)
{
	float *X, *Y, *dY, *dX;
	moe_expert_rows(m, l, &X, &Y, &dY, &dX);
	layer_experts_backward(m, l, X, dY, dX);
	moe_route_backward_start(m, l);
}

static void shared_bwd(struct model *m, int l)
{
	memset(m->dln, 0, sizeof(float) * nc(m));
	if (m->l.S)
		layer_shared_backward(m, l, m->dln, m->dresid);
}

/* dresid becomes dL/d(xmid) */
static void route_bwd(struct model *m, int l)
{
	struct layer_acts *a = &m->la[l];
	moe_route_backward_finish(m, l, m->dln);
	norm_backward(m, m->dresid, GP(P_MLP_NORM, l), m->dln, a->xmid, WP(P_MLP_NORM, l), a->rstd2);
}

/* dresid becomes dL/d(layer l's input) */
static void attn_bwd(struct model *m, int l)
{
	struct layer_acts *a = &m->la[l];
	memset(m->dln, 0, sizeof(float) * nc(m));
	m->attn->backward(m, l, m->dln, m->dresid, a->ln1);
	norm_backward(m, m->dresid, GP(P_ATTN_NORM, l), m->dln, rows(m, l), WP(P_ATTN_NORM, l), a->rstd1);
}

/* ---- the schedule ---- */

typedef void piece_fn(struct model *m, int l);

/* Runs piece fn of layer l on half h, recorded as a span "what hH LL". */
static void piece(struct model *m, int h, piece_fn *fn, int l, const char *what)
{
	struct model *x = h ? m->other : m;
	const struct model_comm *c = m->st->comm;
	double t0 = c && c->span ? util_now_s() : 0;
	half_enter(m, x);
	fn(x, l);
	half_leave(m, x);
	if (c && c->span) {
		char name[24];
		snprintf(name, sizeof(name), "%s h%d L%d", what, h, l);
		c->span(c->ctx, name, t0, util_now_s());
	}
}

/* Waits for half h's exchange in flight (the comm's wait records it). */
static void await(struct model *m, int h)
{
	struct model *x = h ? m->other : m;
	half_enter(m, x);
	moe_a2a_wait(x);
	half_leave(m, x);
}

void bsplit_layer_forward(struct model *m, int l)
{
	if (l < m->d.L_dense) {
		piece(m, 0, dense_fwd, l, "dense");
		piece(m, 1, dense_fwd, l, "dense");
		return;
	}
	piece(m, 0, attn_fwd, l, "attn");
	if (l > m->d.L_dense) {
		await(m, 1);
		piece(m, 1, finish_fwd, l - 1, "finish");
	}
	piece(m, 1, attn_fwd, l, "attn");
	piece(m, 0, route_fwd, l, "route");
	piece(m, 1, route_fwd, l, "route");
	await(m, 0);
	piece(m, 0, experts_fwd, l, "experts");
	await(m, 1);
	piece(m, 1, experts_fwd, l, "experts");
	await(m, 0);
	piece(m, 0, finish_fwd, l, "finish");
}

/* The last layer is a MoE layer (they follow the dense ones). */
void bsplit_forward_end(struct model *m)
{
	await(m, 1);
	piece(m, 1, finish_fwd, m->d.L - 1, "finish");
}

void bsplit_backward_begin(struct model *m)
{
	piece(m, 1, finish_bwd, m->d.L - 1, "finish bwd");
}

void bsplit_layer_backward(struct model *m, int l)
{
	if (l < m->d.L_dense) {
		piece(m, 1, dense_bwd, l, "dense bwd");
		piece(m, 0, dense_bwd, l, "dense bwd");
		return;
	}
	piece(m, 0, finish_bwd, l, "finish bwd");
	await(m, 1);
	piece(m, 1, experts_bwd, l, "experts bwd");
	await(m, 0);
	piece(m, 0, experts_bwd, l, "experts bwd");
	piece(m, 1, shared_bwd, l, "shared bwd");
	await(m, 1);
	piece(m, 1, route_bwd, l, "route bwd");
	piece(m, 1, attn_bwd, l, "attn bwd");
	if (l > m->d.L_dense)
		piece(m, 1, finish_bwd, l - 1, "finish bwd");
	piece(m, 0, shared_bwd, l, "shared bwd");
	await(m, 0);
	piece(m, 0, route_bwd, l, "route bwd");
	piece(m, 0, attn_bwd, l, "attn bwd");
}
