/* DeepSeek's batch split (docs/deepseek.md#batch-split): a device's rows
 * are cut in two halves (batch_split_factor 2: the model m runs the
 * first, m->other the second, each with its own activations), and every
 * layer is a list of pieces, each a list of the calls an unsplit layer
 * makes, on one half. The halves fix the math: which rows go into each
 * product (a row's bits in an OpenBLAS product depend on where it sits
 * in it, and a weight gradient is the sum of the halves' two products).
 * The schedule (use_batch_split_schedule) only fixes when the pieces
 * run: staggered, or one half's layer after the other's. Both orders run
 * the same pieces and add each weight's gradients in the same order
 * (the second half's first, in every layer), so they give the same
 * bits; check_bsplit asserts it.
 *
 * Staggered, in the order MaxText's deepseek_batchsplit.py gives it, the
 * MoE layers run so that the expert all-to-all of one half is in flight
 * while the other computes. Forward of MoE layer l, and what is in
 * flight meanwhile:
 *
 *	attn     h0 l                         comb h1 l-1
 *	route    h0 l                         comb h1 l-1
 *	finish   h1 l-1 (its residual)
 *	attn     h1 l
 *	route    h1 l
 *	counts      l   (both halves' expert counts, one all_gather)
 *	dispatch h0 l   sends disp h0
 *	dispatch h1 l   sends disp h1         (queued behind disp h0)
 *	shared   h0 l                         disp h0
 *	shared   h1 l                         disp h0, then disp h1
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
 * list of calls an unsplit layer makes (layer.c, moe.c), on one half.
 * The step driver (the executor, host/pipeline/exec.h) calls one layer a
 * call without a pipeline, between the window's gathers and releases, so
 * the staggering crosses calls: the second half's finish of layer l runs
 * in layer l+1's forward call (or at the start of whatever call comes
 * next), and its comb bwd of layer l-1 is sent from layer l's backward
 * call; half 0's struct model remembers both between calls. Neither
 * piece reads a weight of its layer (the window has moved on by then),
 * which is why the shared experts run beside the dispatch, as MaxText's
 * shared_expert_and_route does. Both halves' routers run before either
 * dispatch, so that one all_gather tells every device how many rows
 * both bring: the unsplit layer's one synchronizing round trip, not
 * two. */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "host/model/model_int.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

/* What a piece of layer l reads and writes on one half: its rows of the
 * layer's input x, of its output y (forward), of the gradient d
 * (backward: dL/dy on entry, dL/dx once the layer's backward is done). */
struct rows {
	const float *x;
	float *y, *d;
};

static size_t nc(const struct model *m)
{
	return (size_t)m->N * m->l.C;
}

/* ---- the pieces, on one half m ---- */

static void dense_fwd(struct model *m, int l, const struct rows *r)
{
	layer_forward(m, l, r->y, r->x);
}

/* norm, attention, residual, norm: la[l].ln2 is the MoE block's input */
static void attn_fwd(struct model *m, int l, const struct rows *r)
{
	struct layer_acts *a = &m->la[l];
	float *tmp = m->dln;  /* free during forward */
	norm_forward(m, a->ln1, a->rstd1, r->x, WP(P_ATTN_NORM, l));
	m->attn->forward(m, l, tmp, a->ln1);
	residual_forward(a->xmid, r->x, tmp, (int)nc(m));
	norm_forward(m, a->ln2, a->rstd2, a->xmid, WP(P_MLP_NORM, l));
}

/* the router, the rows sorted by expert and gathered */
static void route_fwd(struct model *m, int l, const struct rows *r)
{
	(void)r;
	moe_route_prepare(m, l);
}

/* On half 0, for both: every device's expert counts of both halves in
 * one all_gather (how many rows each dispatch brings), where the
 * unsplit layer gathers its one set: one synchronizing round trip a
 * layer, not two. */
static void counts_fwd(struct model *m, int l, const struct rows *r)
{
	struct model *h[2] = { m, m->other };
	const struct model_comm *c = m->st->comm;
	int E = m->d.E, ep = m->ep;
	int32_t *all = m->cnt2 + 2 * E;
	(void)r;
	if (ep <= 1 || m->hook_rc)
		return;
	for (int k = 0; k < 2; k++)
		memcpy(m->cnt2 + k * E, h[k]->la[l].counts, sizeof(int32_t) * E);
	m->hook_rc = c->all_gather(c->ctx, m->ax_exp, all, m->cnt2, sizeof(int32_t) * 2 * E);
	for (int x = 0; !m->hook_rc && x < ep; x++)
		for (int k = 0; k < 2; k++)
			memcpy(h[k]->la[l].cnt_all + (size_t)x * E, all + ((size_t)x * 2 + k) * E,
			       sizeof(int32_t) * E);
}

static void dispatch_fwd(struct model *m, int l, const struct rows *r)
{
	(void)r;
	moe_dispatch_start(m, l);
}

/* the shared experts' output into dresid (free during forward) until
 * finish */
static void shared_fwd(struct model *m, int l, const struct rows *r)
{
	(void)r;
	if (m->l.S)
		layer_shared_forward(m, l, m->dresid, false);
}

static void experts_fwd(struct model *m, int l, const struct rows *r)
{
	float *X, *Y, *dY, *dX;
	(void)r;
	moe_expert_rows(m, l, &X, &Y, &dY, &dX);
	layer_experts_forward(m, l, X, Y);
	moe_return_start(m, l);
}

/* the routed outputs combined, the shared ones added, the residual:
 * reads no weight of layer l (the window may have moved on) */
static void finish_fwd(struct model *m, int l, const struct rows *r)
{
	float *tmp = m->dln;
	moe_return_finish(m, l, tmp);
	if (m->l.S)
		residual_forward(tmp, tmp, m->dresid, (int)nc(m));
	psum(m, m->ax_moe_out, tmp, nc(m));
	residual_forward(r->y, m->la[l].xmid, tmp, (int)nc(m));
}

static void dense_bwd(struct model *m, int l, const struct rows *r)
{
	layer_backward(m, l, r->d, r->x);
}

/* reads no weight of layer l either */
static void finish_bwd(struct model *m, int l, const struct rows *r)
{
	float *X, *dY, *dX;
	moe_return_backward(m, l, r->d, &X, &dY, &dX);
}

static void experts_bwd(struct model *m, int l, const struct rows *r)
{
	float *X, *Y, *dY, *dX;
	(void)r;
	moe_expert_rows(m, l, &X, &Y, &dY, &dX);
	layer_experts_backward(m, l, X, dY, dX);
	moe_route_backward_start(m, l);
}

static void shared_bwd(struct model *m, int l, const struct rows *r)
{
	memset(m->dln, 0, sizeof(float) * nc(m));
	if (m->l.S)
		layer_shared_backward(m, l, m->dln, r->d);
}

/* d becomes dL/d(xmid) */
static void route_bwd(struct model *m, int l, const struct rows *r)
{
	struct layer_acts *a = &m->la[l];
	moe_route_backward_finish(m, l, m->dln);
	norm_backward(m, r->d, GP(P_MLP_NORM, l), m->dln, a->xmid, WP(P_MLP_NORM, l), a->rstd2);
}

/* d becomes dL/d(layer l's input) */
static void attn_bwd(struct model *m, int l, const struct rows *r)
{
	struct layer_acts *a = &m->la[l];
	memset(m->dln, 0, sizeof(float) * nc(m));
	m->attn->backward(m, l, m->dln, r->d, a->ln1);
	norm_backward(m, r->d, GP(P_ATTN_NORM, l), m->dln, r->x, WP(P_ATTN_NORM, l), a->rstd1);
}

/* ---- the schedule ---- */

typedef void piece_fn(struct model *m, int l, const struct rows *r);

static struct model *half(struct model *m, int h)
{
	return h ? m->other : m;
}

/* Runs piece fn of layer l on half h, recorded as a span "what hH LL". */
static void piece(struct model *m, int h, piece_fn *fn, int l, const struct rows *r, const char *what)
{
	struct model *x = half(m, h);
	const struct model_comm *c = m->st->comm;
	double t0 = c && c->span ? util_now_s() : 0;
	half_enter(m, x);
	fn(x, l, r);
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
	struct model *x = half(m, h);
	half_enter(m, x);
	moe_a2a_wait(x);
	half_leave(m, x);
}

/* Half h's rows of layer l's input in a call of layers [l0, ...) on x
 * (the whole device's rows): the call's x for its first layer, else the
 * half's slot for it (as model.c's layer_input). */
static float *in_rows(struct model *m, int h, int l, int l0, const float *x)
{
	struct model *hm = half(m, h);
	if (l == l0)
		return (float *)x + (size_t)h * nc(m);
	return hm->resid + (size_t)(l - l0 - 1) * nc(m);
}

/* Finishes the second half's forward of the layer left to finish. */
static void finish_left(struct model *m)
{
	struct model *h = m->other;
	enum model_counts how = h->counts_how;
	struct rows r = { .y = m->fwd_left_y };
	await(m, 1);
	h->counts_how = m->fwd_left_how;  /* as when its forward was called */
	piece(m, 1, finish_fwd, m->fwd_left, &r, "finish");
	h->counts_how = how;
	m->fwd_left = -1;
}

void bsplit_flush(struct model *m)
{
	if (m->fwd_left >= 0)
		finish_left(m);
}

/* Unstaggered: a MoE layer's pieces one half after the other, the
 * exchanges waited for where they are made. Both routers run before the
 * counts are gathered, as staggered: one all_gather a layer. */
static void layer_fwd_seq(struct model *m, int l, const struct rows *r0, const struct rows *r1)
{
	const struct rows *r[2] = { r0, r1 };
	for (int h = 0; h < 2; h++) {
		piece(m, h, attn_fwd, l, r[h], "attn");
		piece(m, h, route_fwd, l, r[h], "route");
	}
	piece(m, 0, counts_fwd, l, r0, "counts");
	for (int h = 0; h < 2; h++) {
		piece(m, h, dispatch_fwd, l, r[h], "dispatch");
		piece(m, h, shared_fwd, l, r[h], "shared");
		piece(m, h, experts_fwd, l, r[h], "experts");
		piece(m, h, finish_fwd, l, r[h], "finish");
	}
}

/* The backward of layer_fwd_seq: the second half's layer, then the
 * first's, so each weight's gradient adds the halves in the staggered
 * order (h1's product, then h0's). */
static void layer_bwd_seq(struct model *m, int l, const struct rows *r0, const struct rows *r1)
{
	const struct rows *r[2] = { r0, r1 };
	for (int h = 1; h >= 0; h--) {
		piece(m, h, finish_bwd, l, r[h], "finish bwd");
		piece(m, h, experts_bwd, l, r[h], "experts bwd");
		piece(m, h, shared_bwd, l, r[h], "shared bwd");
		piece(m, h, route_bwd, l, r[h], "route bwd");
		piece(m, h, attn_bwd, l, r[h], "attn bwd");
	}
}

static void layer_fwd(struct model *m, int l, const struct rows *r0, const struct rows *r1)
{
	if (l >= m->d.L_dense && !m->stagger) {
		layer_fwd_seq(m, l, r0, r1);
		return;
	}
	if (l < m->d.L_dense) {
		bsplit_flush(m);
		piece(m, 0, dense_fwd, l, r0, "dense");
		piece(m, 1, dense_fwd, l, r1, "dense");
		return;
	}
	/* the second half's combine of the layer below flies under the first
	 * half's attention when its output is this layer's input */
	bool chained = m->fwd_left >= 0 && m->fwd_left_y == r1->x;
	if (!chained)
		bsplit_flush(m);
	piece(m, 0, attn_fwd, l, r0, "attn");
	/* half 0's router needs nothing of half 1: it flies under as well */
	piece(m, 0, route_fwd, l, r0, "route");
	if (chained)
		finish_left(m);
	piece(m, 1, attn_fwd, l, r1, "attn");
	piece(m, 1, route_fwd, l, r1, "route");
	piece(m, 0, counts_fwd, l, r0, "counts");
	piece(m, 0, dispatch_fwd, l, r0, "dispatch");
	piece(m, 1, dispatch_fwd, l, r1, "dispatch");
	piece(m, 0, shared_fwd, l, r0, "shared");
	piece(m, 1, shared_fwd, l, r1, "shared");
	await(m, 0);
	piece(m, 0, experts_fwd, l, r0, "experts");
	await(m, 1);
	piece(m, 1, experts_fwd, l, r1, "experts");
	await(m, 0);
	piece(m, 0, finish_fwd, l, r0, "finish");
	m->fwd_left = l;
	m->fwd_left_y = r1->y;
	m->fwd_left_how = m->other->counts_how;
}

int bsplit_layers_forward(struct model *m, int l0, int l1, float *y, const float *x)
{
	for (int l = l0; l < l1; l++) {
		bool last = l + 1 == l1;
		struct rows r0 = { in_rows(m, 0, l, l0, x), last ? y : in_rows(m, 0, l + 1, l0, x), NULL };
		struct rows r1 = { in_rows(m, 1, l, l0, x), last ? y + nc(m) : in_rows(m, 1, l + 1, l0, x), NULL };
		layer_fwd(m, l, &r0, &r1);
	}
	return m->hook_rc;
}

static void layer_bwd(struct model *m, int l, const struct rows *r0, const struct rows *r1)
{
	if (l >= m->d.L_dense && !m->stagger) {
		layer_bwd_seq(m, l, r0, r1);
		return;
	}
	if (l < m->d.L_dense) {
		assert(m->bwd_early < 0);
		piece(m, 1, dense_bwd, l, r1, "dense bwd");
		piece(m, 0, dense_bwd, l, r0, "dense bwd");
		return;
	}
	if (m->bwd_early == l)  /* started by the layer above's backward */
		assert(m->bwd_early_d == r1->d);
	else
		piece(m, 1, finish_bwd, l, r1, "finish bwd");
	m->bwd_early = -1;
	piece(m, 0, finish_bwd, l, r0, "finish bwd");
	await(m, 1);
	piece(m, 1, experts_bwd, l, r1, "experts bwd");
	await(m, 0);
	piece(m, 0, experts_bwd, l, r0, "experts bwd");
	piece(m, 1, shared_bwd, l, r1, "shared bwd");
	await(m, 1);
	piece(m, 1, route_bwd, l, r1, "route bwd");
	piece(m, 1, attn_bwd, l, r1, "attn bwd");
	/* the second half's gradient of the layer below is complete: its
	 * combine backward flies under the first half's route and attention
	 * backward */
	if (l - 1 >= m->d.L_dense) {
		piece(m, 1, finish_bwd, l - 1, r1, "finish bwd");
		m->bwd_early = l - 1;
		m->bwd_early_d = r1->d;
	}
	piece(m, 0, shared_bwd, l, r0, "shared bwd");
	await(m, 0);
	piece(m, 0, route_bwd, l, r0, "route bwd");
	piece(m, 0, attn_bwd, l, r0, "attn bwd");
}

int bsplit_layers_backward(struct model *m, int l0, int l1, float *d, const float *x)
{
	bsplit_flush(m);
	for (int l = l1 - 1; l >= l0; l--) {
		struct rows r0 = { in_rows(m, 0, l, l0, x), NULL, d };
		struct rows r1 = { in_rows(m, 1, l, l0, x), NULL, d + nc(m) };
		layer_bwd(m, l, &r0, &r1);
	}
	return m->hook_rc;
}

void bsplit_step_begin(struct model *m)
{
	m->fwd_left = m->bwd_early = -1;
}

void bsplit_step_end(struct model *m)
{
	for (int h = 0; h < 2; h++)
		await(m, h);
	bsplit_step_begin(m);
}
