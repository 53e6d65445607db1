/* The MoE block's routing, for layer.c: router and top-k, tokens sorted
 * by expert, the blocks of rows each local expert runs on, and with
 * expert parallelism the exchange of rows with the devices owning the
 * experts (all_to_all over the `exp` axes), forward and backward. The
 * experts' feed-forward itself is layer.c's. In a half of a batch-split
 * model (bsplit.c) with the schedule staggered, each exchange is started
 * in the background and waited by moe_a2a_wait, so the other half
 * computes meanwhile. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "kernels/kernels.h"

/* The router's settings of dims d. */
static void moe_routing_of(struct moe_routing *r, const struct model_dims *d)
{
	*r = (struct moe_routing){
		.E = d->E, .k = d->K, .score = (enum moe_score)d->moe_score, .norm_topk = d->norm_topk,
		.scale = d->routed_scale, .groups = d->groups, .topk_groups = d->topk_groups,
	};
}

int moe_expert_blocks(const struct model *m, int l, int *bs, int *bn, int *bj)
{
	const struct layer_acts *a = &m->la[l];
	int E = m->d.E, nb = 0, r = 0;
	if (m->hook_rc)
		return 0;
	if (m->ep <= 1) {
		for (int e = 0; e < E; e++) {
			bs[nb] = a->offsets[e];
			bn[nb] = a->offsets[e + 1] - a->offsets[e];
			bj[nb++] = e;
		}
		return nb;
	}
	/* sorted by source device, then expert */
	for (int src = 0; src < m->ep; src++)
		for (int j = 0; j < m->El; j++) {
			int n = a->cnt_all[src * E + m->e0 + j];
			bs[nb] = r;
			bn[nb] = n;
			bj[nb++] = j;
			r += n;
		}
	return nb;
}

/* Sends the rows of one exchange of layer l (kind: "disp", "comb", and
 * their backward, for the trace): at once, or in a half of a batch split
 * in the background until moe_a2a_wait. */
static void ep_exchange(struct model *m, int l, const char *kind, void *out, const size_t *recv_b,
			const void *in, const size_t *send_b)
{
	const struct model_comm *c = m->st->comm;
	if (m->hook_rc)
		return;
	if (m->stagger && c->start_all_to_all) {
		char name[24];
		assert(!m->a2a);  /* one exchange of a half in flight at a time */
		snprintf(name, sizeof(name), "%s h%d L%d", kind, m->half, l);
		m->hook_rc = c->start_all_to_all(c->ctx, m->ax_exp, out, recv_b, in, send_b, name, &m->a2a);
		if (m->hook_rc)
			m->a2a = NULL;
		return;
	}
	m->hook_rc = c->all_to_all(c->ctx, m->ax_exp, out, recv_b, in, send_b);
}

void moe_a2a_wait(struct model *m)
{
	if (!m->a2a)
		return;
	const struct model_comm *c = m->st->comm;
	int rc = c->wait(c->ctx, m->a2a);
	m->a2a = NULL;
	if (!m->hook_rc)
		m->hook_rc = rc;
}

void moe_expert_rows(struct model *m, int l, float **X, float **Y, float **dY, float **dX)
{
	struct layer_acts *a = &m->la[l];
	bool ep = m->ep > 1;
	*X = ep ? a->xr : a->xs;
	*Y = ep ? a->yr : a->ey;
	*dY = ep ? m->dyr : m->dey;
	*dX = ep ? m->dxr : m->dxs;
}

/* Expert parallelism: lays the expert-sorted rows out by destination
 * device (the devices of the expert group in rank order, each holding one
 * block of El experts) and gathers them. */
static void ep_prepare(struct model *m, struct layer_acts *a, int C)
{
	int El = m->El, NK = m->N * m->d.K;
	if (m->ep_permute) {
		/* rows in the order of the group's members, not of the blocks */
		int32_t *tmp = (int32_t *)m->dweights; /* free during forward: NK ints */
		size_t r = 0;
		for (int x = 0; x < m->ep; x++) {
			int b = m->ep_blk[x];
			int lo = a->offsets[b * El], hi = a->offsets[(b + 1) * El];
			memcpy(tmp + r, a->order + lo, sizeof(int32_t) * (size_t)(hi - lo));
			r += (size_t)(hi - lo);
		}
		memcpy(a->order, tmp, sizeof(int32_t) * (size_t)NK);
	}
	moe_gather(a->xs, a->ln2, a->order, NK, m->d.K, C);
}

void moe_dispatch_start(struct model *m, int l)
{
	struct layer_acts *a = &m->la[l];
	int E = m->d.E, El = m->El;
	size_t C = (size_t)m->l.C;
	if (m->ep <= 1 || m->hook_rc)
		return;
	/* each device gets the rows of its experts; la[l].cnt_all says how
	 * many come from each */
	for (int x = 0; x < m->ep; x++) {
		size_t sr = 0, rr = 0;
		for (int j = 0; j < El; j++) {
			sr += (size_t)a->counts[m->ep_blk[x] * El + j];
			rr += (size_t)a->cnt_all[x * E + m->e0 + j];
		}
		a->send_b[x] = sr * C * sizeof(float);
		a->recv_b[x] = rr * C * sizeof(float);
	}
	ep_exchange(m, l, "disp", a->xr, a->recv_b, a->xs, a->send_b);
}

void moe_route_prepare(struct model *m, int l)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, E = d->E, K = d->K;
	float *logits = m->dlogits_r; /* scratch in forward */

	linear_forward(logits, a->ln2, WP(P_ROUTER, l), N, C, E);
	psum(m, m->pl[P_ROUTER].reduce, logits, (size_t)N * E);
	struct moe_routing r;
	moe_routing_of(&r, d);
	moe_router_forward(a->weights, a->idx, a->scores, logits, WP(P_ROUTER_BIAS, l), N, &r);
	moe_sort(a->order, a->offsets, a->idx, N, E, K);
	for (int e = 0; e < E; e++)
		a->counts[e] = a->offsets[e + 1] - a->offsets[e];
	/* expert parallelism: rows travel to the device owning their expert */
	if (m->ep > 1)
		ep_prepare(m, a, C);
	else
		moe_gather(a->xs, a->ln2, a->order, N * K, K, C);
}

void moe_route_forward(struct model *m, int l, float **X, float **Y)
{
	struct layer_acts *a = &m->la[l];
	moe_route_prepare(m, l);
	if (m->ep > 1) {
		/* every device's per-expert counts: how many rows come */
		const struct model_comm *c = m->st->comm;
		if (!m->hook_rc)
			m->hook_rc = c->all_gather(c->ctx, m->ax_exp, a->cnt_all, a->counts,
						   sizeof(int32_t) * m->d.E);
		moe_dispatch_start(m, l);
		*X = a->xr;
		*Y = a->yr;
	} else {
		*X = a->xs;
		*Y = a->ey;
	}
}

void moe_return_start(struct model *m, int l)
{
	struct layer_acts *a = &m->la[l];
	if (m->ep > 1)  /* the outputs come back */
		ep_exchange(m, l, "comb", a->ey, a->send_b, a->yr, a->recv_b);
}

void moe_return_forward(struct model *m, int l, float *out)
{
	moe_return_start(m, l);
	moe_return_finish(m, l, out);
}

void moe_return_finish(struct model *m, int l, float *out)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, E = d->E, K = d->K;

	int32_t *cnt = m->counts_all + (size_t)(l - d->L_dense) * E;
	if (m->counts_how == MODEL_COUNTS_SET)
		memcpy(cnt, a->counts, sizeof(int32_t) * E);
	for (int e = 0; m->counts_how == MODEL_COUNTS_ADD && e < E; e++)
		cnt[e] += a->counts[e];
	memset(out, 0, sizeof(float) * (size_t)N * d->C);
	moe_combine(out, a->ey, a->weights, a->order, N * K, K, d->C);
}

void moe_return_backward(struct model *m, int l, const float *dout, float **X, float **dY, float **dX)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int K = d->K, C = d->C, NK = m->N * K;

	/* the experts' output gradients, where their weight gradients read
	 * them: here, or on the experts' devices after the exchange */
	float *dey = m->ep > 1 ? m->dey : wg_out(m, m->dey, (size_t)NK * C);
	memset(dey, 0, sizeof(float) * (size_t)NK * C);
	memset(m->dweights, 0, sizeof(float) * (size_t)NK);
	moe_combine_backward(dey, m->dweights, dout, a->ey, a->weights, a->order, NK, K, C);
	/* the expert outputs were partial over the hidden's axes and split
	 * over the embedding's: so are the weights' gradients */
	psum(m, m->ax_moe_out | m->ax_emb, m->dweights, (size_t)NK);
	*X = a->xs;
	*dY = dey;
	*dX = m->dxs;
	if (m->ep > 1) {
		/* output gradients go to the experts' devices, input gradients
		 * come back: the forward exchange reversed */
		*dY = wg_out(m, m->dyr, m->rmax * (size_t)C);
		ep_exchange(m, l, "comb bwd", *dY, a->recv_b, dey, a->send_b);
		*X = a->xr;
		*dX = m->dxr;
	}
	memset(*dX, 0, sizeof(float) * (m->ep > 1 ? m->rmax : (size_t)NK) * C);
}

void moe_route_backward_start(struct model *m, int l)
{
	struct layer_acts *a = &m->la[l];
	if (m->ep > 1)  /* the input gradients come back */
		ep_exchange(m, l, "disp bwd", m->dxs, a->send_b, m->dxr, a->recv_b);
}

void moe_route_backward(struct model *m, int l, float *dln)
{
	moe_route_backward_start(m, l);
	moe_route_backward_finish(m, l, dln);
}

/* MESHRUN_EXPERT_LOAD=FILE (a debugging aid, docs/deepseek.md#router):
 * device 0 appends, at each MoE layer's backward, the layer's expert
 * counts of the step's whole batch (summed over the mesh: what the
 * selection bias's update reads) as "L<l> c0 c1 .. c<E-1>". One thread
 * writes (device 0's first half), so the file needs no lock. */
static void expert_load_dump(const struct model *m, int l, const int32_t *cnt)
{
	static FILE *f;
	static bool tried;
	if (m->device != 0 || m->half != 0)
		return;
	if (!tried) {
		const char *path = getenv("MESHRUN_EXPERT_LOAD");
		tried = true;
		f = path && *path ? fopen(path, "a") : NULL;
		if (path && *path && !f)
			fprintf(stderr, "meshrun: MESHRUN_EXPERT_LOAD: unable to open '%s'\n", path);
	}
	if (!f)
		return;
	fprintf(f, "L%d", l);
	for (int e = 0; e < m->d.E; e++)
		fprintf(f, " %d", cnt[e]);
	fputc('\n', f);
	fflush(f);
}

void moe_route_backward_finish(struct model *m, int l, float *dln)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	struct model_step *st = m->st;
	int N = m->N, C = d->C, E = d->E, K = d->K, NK = N * K;

	moe_gather_backward(dln, m->dxs, a->order, NK, K, C);
	/* experts and shared experts gave partial sums over their hidden's
	 * axes; the router below adds its whole gradient once */
	psum(m, m->pl[P_E_GATE].dx_reduce, dln, (size_t)N * C);
	/* router: through the top-k weights and the load-balance loss, its
	 * logits' gradient where its weight gradient reads it */
	float *dlr = wg_out(m, m->dlogits_r, (size_t)N * E);
	memset(dlr, 0, sizeof(float) * (size_t)N * E);
	struct moe_routing r;
	moe_routing_of(&r, d);
	moe_router_backward(dlr, m->dweights, a->scores, a->idx, N, &r);
	/* load-balance loss of the global batch of Ng tokens, with the counts
	 * summed over replicas: L = E/(k Ng^2) sum_n sum_e C_e p(n,e); the
	 * kernels normalise by the local N, hence (N/Ng)^2 */
	const int32_t *cnt = m->counts_all + (size_t)(l - d->L_dense) * E;
	expert_load_dump(m, l, cnt);
	double ng = st->global_tokens, r2 = ((double)N / ng) * ((double)N / ng);
	st->aux += (double)E / ((double)K * ng * ng) * moe_aux_loss_dot(a->scores, cnt, N, E);
	if (st->lb_weight != 0.0f) {
		memset(m->dscores, 0, sizeof(float) * (size_t)N * E);
		moe_aux_loss_backward(m->dscores, a->scores, cnt, (float)(st->lb_weight * r2), N, E, K);
		moe_scores_backward(dlr, m->dscores, a->scores, N, E, (enum moe_score)d->moe_score);
	}
	linear_backward(dln, NULL, dlr, NULL, WP(P_ROUTER, l), N, C, E);
	wg_linear(m, P_ROUTER, l, 0, dlr, wg_keep_act(m, a->ln2, (size_t)N * C), N, C, E);
}
