/* See host/optim/optim.h. The state is two buffers, m and v, laid out
 * seg by seg like the parameters, except that a seg whose state ZeRO-1
 * splits over `data` keeps only this device's part of it. The buckets
 * the gradients are summed in during the backward: buckets.c; ZeRO-1's
 * reduce-scatters and gathers of them: zero.c. */
#include "host/optim/optim_int.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/util/clock.h"
#include "host/util/mem.h"
#include "kernels/kernels.h"

int optim_check_zero(const struct model *m, bool muon, int ndata, char *err, size_t errlen)
{
	struct model_bucket b[MODEL_MAX_PARAMS];
	if (ndata <= 1 || !muon)
		return 0;
	int nb = model_buckets(m, b, MODEL_MAX_PARAMS);
	for (int i = 0; i < nb; i++) {
		if (!(b[i].axes & (1u << AX_DATA)))
			continue;
		for (int k = 0; k < model_num_params(m); k++) {
			const struct param_info *p = model_param(m, k);
			if (p->opt != OPT_MUON || p->offset < b[i].offset || p->offset >= b[i].offset + b[i].numel)
				continue;
			snprintf(err, errlen, "config: opt_type=muon cannot split its state over data "
				 "(shard_optimizer_over_data cuts '%s' into flat shards, Muon needs "
				 "whole matrices); use opt_type=adamw with it", p->name);
			return -EINVAL;
		}
	}
	return 0;
}

size_t optim_tensor_state(const struct param_info *p, bool muon, int ndata, int *slots, bool *zero)
{
	/* AdamW keeps m and v; Muon keeps one momentum per matrix */
	*slots = p->opt == OPT_NONE ? 0 : (p->opt == OPT_MUON && muon) ? 1 : 2;
	*zero = *slots && ndata > 1 && (p->gsum & (1u << AX_DATA));
	return p->numel * (size_t)*slots / (*zero ? (size_t)ndata : 1);
}

/* Buckets and their optimizer state; ZeRO-1 splits the state of buckets
 * summed over `data`. */

/* Bytes of m (and of v): one float per optimizer float, at least one. */
static size_t opt_bytes(const struct optim *o)
{
	return (o->opt_n ? o->opt_n : 1) * sizeof(float);
}

static int lay_out_state(struct optim *o)
{
	struct model_bucket b[MODEL_MAX_PARAMS];
	int nb = model_buckets(o->model, b, MODEL_MAX_PARAMS);
	o->nseg = nb;
	o->opt_n = 0;
	for (int i = 0; i < nb; i++) {
		struct seg *s = &o->seg[i];
		memset(s, 0, sizeof(*s));
		s->p0 = b[i].offset;
		s->n = b[i].numel;
		s->padded = b[i].padded;
		s->axes = b[i].axes;
		s->zero = o->ndata > 1 && (s->axes & (1u << AX_DATA));
		s->o0 = o->opt_n;
		if (!s->zero) {
			o->opt_n += s->n;
			continue;
		}
		s->shard_n = s->padded / (size_t)o->ndata;
		s->s0 = s->shard_n * (size_t)o->rdata;
		s->len = s->s0 < s->n ? (s->n - s->s0 < s->shard_n ? s->n - s->s0 : s->shard_n) : 0;
		o->opt_n += s->shard_n;
	}
	/* zeroed and populated now (host/util/mem.h), not a fault per page
	 * in the first update */
	o->m = util_big_alloc(opt_bytes(o));
	o->v = util_big_alloc(opt_bytes(o));
	return o->m && o->v ? 0 : -ENOMEM;
}

/* The reduced gradients of ZeRO-1's segs not in buckets (whole-seg
 * reduce-scatter, which may not write over its input): gshard. A seg in
 * buckets keeps them in its part of the gradients (zero_part). */
static int lay_out_gshard(struct optim *o)
{
	bool whole = false;
	for (int i = 0; i < o->nseg; i++)
		whole |= o->seg[i].zero && !o->seg[i].bucketed;
	if (whole && !(o->gshard = calloc(o->opt_n, sizeof(float))))
		return -ENOMEM;
	return 0;
}

/* Muon's scratch: for the largest matrix, NS5's and a gathered copy. */
static size_t muon_scratch(const struct model *m)
{
	size_t big = 0;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		if (p->opt != OPT_MUON)
			continue;
		size_t R = (size_t)p->mat_rows, C = (size_t)p->mat_cols, mx = R > C ? R : C;
		size_t need = 3 * mx * mx + 6 * R * C;
		if (need > big)
			big = need;
	}
	return big;
}

int optim_new(struct optim **out, struct model *m, const struct cfg *c, const struct optim_place *pl,
	      char *err, size_t errlen)
{
	struct optim *o = calloc(1, sizeof(*o));
	size_t asked = sizeof(*o);
	const char *what = "the trainer";
	int rc;
	*out = NULL;
	if (!o)
		goto oom;
	o->cfg = *c;
	o->model = m;
	o->muon = !strcmp(c->opt_type, "muon");
	o->ndata = pl->ndata > 1 ? pl->ndata : 1;
	o->rdata = pl->rdata;
	o->L = model_dims(m)->L;
	o->stages = pl->stages;
	if (!(o->sh = calloc((size_t)model_num_params(m) + 1, sizeof(void *))))
		goto oom;
	if (pl->mesh) {
		o->mesh = pl->mesh;
		o->device = pl->device;
		mesh_coords(o->mesh, o->device, o->coord);
	}
	if ((rc = optim_check_zero(m, o->muon, o->ndata, err, errlen))) {
		optim_free(o);
		return rc;
	}
	if (lay_out_state(o)) {
		asked = sizeof(float) * o->opt_n * 2;
		what = "the optimizer state";
		goto oom;
	}
	size_t big = muon_scratch(m);
	o->scratch = malloc(sizeof(float) * (big ? big : 1));
	if (!o->scratch) {
		asked = sizeof(float) * (big ? big : 1);
		what = "Muon's scratch";
		goto oom;
	}
	bool by_size = strcmp(c->muon_assign, "round_robin");
	if (o->muon && o->mesh && muon_plan_init(&o->mp, m, o->mesh, o->device, by_size)) {
		asked = sizeof(double) * (size_t)o->mesh->num_devices;
		what = "Muon's plan";
		goto oom;
	}
	if (buckets_make(o, pl)) {
		asked = sizeof(float) * model_numel(m);
		what = "the gradient buckets";
		goto oom;
	}
	if (lay_out_gshard(o)) {
		asked = sizeof(float) * o->opt_n;
		what = "ZeRO-1's gradient parts";
		goto oom;
	}
	*out = o;
	return 0;
oom:
	snprintf(err, errlen, "train: out of memory: %zu bytes for %s", asked, what);
	optim_free(o);
	return -ENOMEM;
}

void optim_free(struct optim *o)
{
	if (!o)
		return;
	util_big_free(o->m, opt_bytes(o));
	util_big_free(o->v, opt_bytes(o));
	util_big_free(o->malt, opt_bytes(o));
	util_big_free(o->valt, opt_bytes(o));
	util_big_free(o->pk, model_numel(o->model) * sizeof(float));
	util_big_free(o->gk, model_numel(o->model) * sizeof(float));
	free(o->scratch);
	free(o->gshard);
	free(o->sh);
	buckets_free(o);
	muon_drop(o);
	muon_plan_free(&o->mp);
	for (int k = 0; k < o->ntg; k++)
		mesh_members_free(&o->tg[k]);
	free(o);
}

/* Sum of squares of the trained gradients in [a, b) (g indexed from a),
 * each divided by the number of devices holding the same values
 * (`copies` per whole-layout float), so that summing over every device
 * counts each element of the whole model once. */
static double grad_sumsq(struct optim *o, const float *g, size_t a, size_t b, int extra_split)
{
	struct model *m = o->model;
	double ss = 0;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t x, y;
		param_range(p, a, b, &x, &y);
		if (p->opt == OPT_NONE || x >= y)
			continue;
		double copies = 1;
		if (o->mesh)
			copies = (double)o->mesh->num_devices / mesh_axes_size(o->mesh, p->split) / extra_split;
		ss += sumsq(g + (x - a), y - x) / copies;
	}
	return ss;
}

void optim_step_begin(struct optim *o, const struct optim_comm *oc)
{
	o->have_oc = oc != NULL;
	o->oc = oc ? *oc : (struct optim_comm){ 0 };
	o->armed = o->mesh && oc;
	o->summing = false;
	for (int i = 0; i < model_num_params(o->model); i++)
		o->sh[i] = NULL;
	o->stats = (struct optim_stats){ 0 };
	for (int k = 0; k < o->nu; k++)
		o->u[k].computed = o->u[k].landed = o->u[k].done = false;
	for (int i = 0; i < o->nb; i++) {
		o->b[i].left = o->b[i].u1 - o->b[i].u0;
		o->b[i].issued = false;
		o->b[i].h = o->b[i].h2 = NULL;
	}
}

int optim_hook_weights(void *ctx, int l0, int l1, bool gathered)
{
	struct optim *o = ctx;
	int rc = 0;
	if (l0 < 0)
		l1 = l0 + 1;
	for (int key = l0; key < l1 && !rc; key++)
		rc = zero_wait_params(o, key, gathered);
	return rc;
}

int optim_wait_params(struct optim *o)
{
	return zero_wait_params(o, ZERO_ALL, false);
}

/* Unit k's gradients moved on (computed, or landed): when it is done,
 * its bucket may be complete, and (not deferred) starts its sum. */
static int unit_event(struct optim *o, int k, bool landed)
{
	struct unit *u = &o->u[k];
	if (landed)
		u->landed = true;
	else
		u->computed = true;
	if (u->done || (u->plain && !u->computed) || (u->gathered && !u->landed))
		return 0;
	u->done = true;
	if (u->bucket < 0)
		return 0;
	struct bucket *b = &o->b[u->bucket];
	return --b->left == 0 && !b->deferred && !b->issued ? bucket_issue(o, b) : 0;
}

int optim_hook_grads(void *ctx, int l0, int l1, bool landed)
{
	struct optim *o = ctx;
	int rc;
	if (!o->armed)
		return 0;
	if (l0 < 0)
		l1 = l0 + 1;
	for (int key = l0; key < l1; key++)
		for (int s = 0; s < o->nseg; s++) {
			int k = unit_of(o, key, s, false);
			if (k >= 0 && (rc = unit_event(o, k, landed)))
				return rc;
		}
	return 0;
}

/* Whether bucket b holds a pipeline's stage-wide tensors alone (every
 * unit repl). */
static bool stage_wide(const struct optim *o, const struct bucket *b)
{
	for (int j = b->u0; j < b->u1; j++)
		if (!o->u[o->ubk[j]].repl)
			return false;
	return b->u1 > b->u0;
}

/* The stage sums, then the buckets of stage-wide tensors alone (see
 * optim_hook_stage_sums); after: called after the table. */
static int stage_sums(struct optim *o, bool after)
{
	const struct model_comm *mc = o->have_oc ? o->oc.mc : NULL;
	const struct optim_bg *bg = o->have_oc ? o->oc.bg : NULL;
	const uint32_t stage = 1u << AX_STAGE;
	float *G = model_grads(o->model);
	bool bgs = bg && bg->all_reduce;
	int rc = 0;
	if (o->summing || !mc || o->stages < 2 || (!after && (!o->armed || !bgs)))
		return 0;
	o->summing = true;
	for (int i = 0; i < model_num_params(o->model) && !rc; i++) {
		const struct param_info *p = model_param(o->model, i);
		if (p->split & stage)
			continue;
		rc = bgs ? bg->all_reduce(bg->ctx, stage, G + p->offset, p->numel, "stage sum", &o->sh[i])
			 : mc->all_reduce(mc->ctx, stage, G + p->offset, p->numel);
	}
	for (int i = 0; i < o->nb && !rc; i++)
		if (!o->b[i].issued && !o->b[i].zero && stage_wide(o, &o->b[i])) {
			o->stats.late += after;
			rc = bucket_issue(o, &o->b[i]);
		}
	return rc;
}

int optim_hook_stage_sums(void *ctx)
{
	return stage_sums(ctx, false);
}

int optim_sum_grads(struct optim *o, double *ss_out)
{
	float *G = model_grads(o->model);
	const uint32_t data = 1u << AX_DATA;
	const struct model_comm *mc = o->have_oc ? o->oc.mc : NULL;
	double ss = 0;
	int rc = stage_sums(o, true);
	o->armed = false;
	/* what the table did not complete, in bucket order (the same on
	 * every device); then every sum in flight lands */
	for (int i = 0; i < model_num_params(o->model); i++) {
		void *h = o->sh[i];
		o->sh[i] = NULL;
		int r = h ? o->oc.bg->wait(o->oc.bg->ctx, h) : 0;
		rc = rc ? rc : r;
	}
	for (int i = 0; i < o->nb && !rc && mc; i++)
		if (!o->b[i].issued) {
			o->stats.late++;
			rc = bucket_issue(o, &o->b[i]);
		}
	for (int i = 0; i < o->nb; i++) {
		int r = bucket_wait(o, &o->b[i]);
		rc = rc ? rc : r;
	}
	if (rc)
		return rc;
	for (int i = 0; i < o->nseg; i++) {
		struct seg *s = &o->seg[i];
		if (!s->zero) {
			ss += grad_sumsq(o, G + s->p0, s->p0, s->p0 + s->n, 1);
			continue;
		}
		/* the seg's padding is zero: the grads were zeroed whole */
		uint32_t rest = s->axes & ~data;
		float *gs = zero_part(o, s);
		if (!s->bucketed && ((rc = mc->reduce_scatter(mc->ctx, data, gs, G + s->p0, s->shard_n)) ||
				     (rest && (rc = mc->all_reduce(mc->ctx, rest, gs, s->shard_n)))))
			return rc;
		ss += grad_sumsq(o, gs, s->p0 + s->s0, s->p0 + s->s0 + s->len, o->ndata);
	}
	*ss_out = ss;
	return 0;
}

void optim_get_stats(const struct optim *o, struct optim_stats *st)
{
	*st = o->stats;
}

float optim_lr(const struct optim *o, int64_t step)
{
	const struct cfg *c = &o->cfg;
	int total = c->learning_rate_schedule_steps > 0 ? (int)c->learning_rate_schedule_steps : (int)c->steps;
	int warmup = (int)(c->warmup_steps_fraction * total);
	return lr_schedule((int)step, (float)c->learning_rate, warmup, total,
			   (float)c->cosine_learning_rate_final_fraction);
}

/* DeepSeek-V3's auxiliary-loss-free balancing: nudge each expert's
 * selection bias toward the mean load (counts summed over all replicas, so
 * every device makes the same update to the part it holds). */
static void update_router_bias(struct optim *o, const struct param_info *p)
{
	const struct model_dims *d = model_dims(o->model);
	const int32_t *counts = model_expert_counts(o->model);
	float rate = (float)o->cfg.routed_bias_update_rate;
	float *b = model_params(o->model) + p->offset;
	int E = d->E, El = p->shape[1], e0 = p->goff[1];
	if (!d->L_moe || rate == 0.0f)
		return;
	/* storage index q holds MoE layer model_stack_layer(q) (a pipeline's order) */
	for (int l = 0; l < p->shape[0]; l++) {
		int q = model_stack_layer(o->model, l + p->goff[0], p->global_shape[0]);
		moe_bias_update(b + (size_t)l * El, counts + (size_t)q * E, E, e0, El, rate);
	}
}

/* Unit k is read by leading gather g: its early is the first such, + 1. */
static void mark_early(struct optim *o, int k, int g)
{
	if (k >= 0 && o->u[k].gathered && (!o->u[k].early || o->u[k].early > g + 1))
		o->u[k].early = g + 1;
}

void optim_set_prefetch(struct optim *o, int (*fn)(void *ctx, int upto), void *ctx, const int *l0, const int *l1,
			const int *by, int n)
{
	o->prefetch = fn;
	o->prefetch_ctx = ctx;
	o->nfirst = 0;
	for (int i = 0; i < n; i++) {
		/* Muon: one stage (a tensor's first layers in one exchange) */
		int g = by && !o->muon ? by[i] : 0;
		o->nfirst = o->nfirst > g + 1 ? o->nfirst : g + 1;
		for (int key = l0[i]; key < (l0[i] < 0 ? l0[i] + 1 : l1[i]); key++)
			for (int s = 0; s < o->nseg; s++) {
				mark_early(o, unit_of(o, key, s, false), g);
				mark_early(o, unit_of(o, key, s, true), g);
			}
	}
}

/* The early update, one leading gather at a time: the shards the first
 * reads first (and no others), then that gather starts and travels while
 * the shards of the next are updated, and so on; under Muon (one stage)
 * all of them, then every exchange in flight lands, then the gathers.
 * A trace span "update first G" for each. */
static int update_early(struct optim *o, int64_t step, float lr)
{
	const struct model_comm *mc = o->oc.mc;
	int rc = 0;
	for (int g = 1; g <= o->nfirst && !rc; g++) {
		double t0 = util_now_s();
		rc = units_update_early(o, step, lr, g);
		if (!rc && g == o->nfirst)
			rc = muon_flush(o);
		if (mc->span) {
			char name[32];
			snprintf(name, sizeof(name), "update first %d", g - 1);
			mc->span(mc->ctx, name, t0, util_now_s());
		}
		if (!rc)
			rc = o->prefetch(o->prefetch_ctx, g == o->nfirst ? INT_MAX : g);
	}
	return rc;
}

/* Whether Muon may take unit k's matrices ahead of the others: its
 * exchanges are collectives over each tensor's group, so every member
 * must take the same matrices first. Members share the step's table
 * (and so its first gathers) unless the group spans pipeline stages. */
static bool muon_early_ok(const struct optim *o, int k)
{
	const struct unit *u = &o->u[k];
	for (int q = u->p0; o->muon && o->mesh && q < u->p1; q++) {
		const struct param_info *p = model_param(o->model, o->pc[q].param);
		if (p->opt == OPT_MUON && (muon_group_axes(o->mesh, p) & (1u << AX_STAGE)) &&
		    o->mesh->size[AX_STAGE] > 1)
			return false;
	}
	return true;
}

/* Whether this update starts the next step's first gathers early:
 * buckets on (grad_bucket_mb=0: the order before); beside ZeRO-1 every
 * zero seg in buckets (zero_update_gather then starts them once the
 * ZeRO-1 gathers of their groups are queued); under Muon every member
 * of a tensor's group taking the same matrices first. AdamW is
 * element-wise and Muon's result per matrix does not depend on which
 * call carries it, so the order changes no bits. */
static bool prefetching(const struct optim *o)
{
	bool any = false;
	if (!o->prefetch || o->cfg.grad_bucket_mb == 0 || !o->have_oc)
		return false;
	for (int s = 0; s < o->nseg; s++)
		if (o->seg[s].zero && !o->seg[s].bucketed)
			return false;
	for (int k = 0; k < o->nu; k++) {
		if (o->u[k].early && !muon_early_ok(o, k))
			return false;
		any |= o->u[k].early;
	}
	return any;
}

/* After a kept update: its m and v are current. */
static void keep_swap(struct optim *o)
{
	float *m = o->m, *v = o->v;
	o->m = o->malt;
	o->v = o->valt;
	o->malt = m;
	o->valt = v;
}

int optim_update(struct optim *o, int64_t step, float lr, float clip)
{
	struct model *m = o->model;
	float *G = model_grads(m), *P = model_params(m);
	const struct model_comm *mc = o->have_oc ? o->oc.mc : NULL;
	int rc;
	bool pre = prefetching(o);
	o->stats.ns_matrices = o->stats.muon_bytes = 0;
	o->stats.ns_flops = 0;
	if (o->mp.load)
		muon_plan_spread(&o->mp, &o->stats.ns_plan_max, &o->stats.ns_plan_min);
	for (int i = 0; i < o->nseg && clip != 1.0f; i++) {
		struct seg *s = &o->seg[i];
		scale_inplace(s->zero ? zero_part(o, s) : G + s->p0, s->zero ? s->len : s->n, clip);
	}
	/* before any gather packs the parameters (every rank makes the same
	 * update to the whole bias; the other tensors do not read it) */
	for (int i = 0; i < model_num_params(m); i++)
		if (model_param(m, i)->opt == OPT_NONE)
			update_router_bias(o, model_param(m, i));
	/* the next step's first gathers leave once their shards are updated
	 * (beside ZeRO-1: once its gathers of their groups are queued, in
	 * zero_update_gather) */
	bool zpre = false;
	for (int i = 0; pre && i < o->nseg; i++)
		zpre |= o->seg[i].zero;
	if (pre && (zpre ? (rc = units_update_early(o, step, lr, 0)) || (rc = muon_flush(o))
			 : (rc = update_early(o, step, lr))))
		goto fail;
	for (int i = 0; i < o->nseg; i++) {
		struct seg *s = &o->seg[i];
		float *g = s->zero ? zero_part(o, s) : G + s->p0;
		size_t a = s->p0 + s->s0, len = s->zero ? s->len : s->n;
		if (pre && !s->zero)
			rc = seg_update_rest(o, i, step, lr);
		else if (!s->bucketed)
			rc = optim_update_range(o, step, lr, g, o->m + s->o0, o->v + s->o0, a, a + len);
		if (rc)
			goto fail;
	}
	/* Muon's last exchanges land before any gather reads the parameters */
	if ((rc = muon_flush(o)))
		goto fail;
	if (o->keeping) {
		o->keeping = false;
		keep_swap(o);
	}
	/* ZeRO-1 in buckets: each bucket updated, then its gather started,
	 * waited for by the next use of its weights (optim_hook_weights) */
	if ((rc = zero_update_gather(o, step, lr, zpre)))
		return rc;
	/* ZeRO-1 without: every data rank takes the others' updated parts */
	for (int i = 0; i < o->nseg; i++) {
		struct seg *s = &o->seg[i];
		if (!s->zero || s->bucketed)
			continue;
		/* in place: this rank's part already sits in the bucket */
		if ((rc = mc->all_gather(mc->ctx, 1u << AX_DATA, P + s->p0, P + s->p0 + s->s0,
					 s->shard_n * sizeof(float))))
			return rc;
	}
	return 0;
fail:
	muon_drop(o);
	return rc;
}

int optim_keep(struct optim *o)
{
	size_t np = model_numel(o->model) * sizeof(float);
	if (!o->pk) {  /* what no update writes stays as it is in both */
		o->malt = util_big_alloc(opt_bytes(o));
		o->valt = util_big_alloc(opt_bytes(o));
		o->pk = util_big_alloc(np);
		o->gk = util_big_alloc(np);
		if (!o->malt || !o->valt || !o->pk || !o->gk)
			return -ENOMEM;
		memcpy(o->malt, o->m, opt_bytes(o));
		memcpy(o->valt, o->v, opt_bytes(o));
		memcpy(o->pk, model_params(o->model), np);
	}
	o->keeping = true;
	return 0;
}

int optim_restore(struct optim *o)
{
	size_t np = model_numel(o->model) * sizeof(float);
	int rc = optim_wait_params(o);  /* nothing in flight writes them */
	keep_swap(o);
	memcpy(model_params(o->model), o->pk, np);
	memcpy(model_grads(o->model), o->gk, np);
	return rc;
}

float *optim_state(struct optim *o, int which)
{
	return which ? o->v : o->m;
}

int optim_state_to_layout(struct optim *o, const struct optim_comm *oc, int which, float *loc)
{
	const float *st = optim_state(o, which);
	for (int i = 0; i < o->nseg; i++) {
		struct seg *s = &o->seg[i];
		if (!s->zero) {
			memcpy(loc + s->p0, st + s->o0, s->n * sizeof(float));
			continue;
		}
		/* loc has the bucket's padding too: gather straight into it */
		int rc = oc->mc->all_gather(oc->mc->ctx, 1u << AX_DATA, loc + s->p0, st + s->o0,
					    s->shard_n * sizeof(float));
		if (rc)
			return rc;
	}
	return 0;
}

void optim_layout_to_state(struct optim *o, int which, const float *loc)
{
	float *st = optim_state(o, which);
	for (int i = 0; i < o->nseg; i++) {
		struct seg *s = &o->seg[i];
		memcpy(st + s->o0, loc + s->p0 + s->s0, (s->zero ? s->len : s->n) * sizeof(float));
	}
}

int optim_state_nranges(const struct optim *o)
{
	return o->nseg;
}

void optim_state_range(const struct optim *o, int i, size_t *lo, size_t *hi)
{
	const struct seg *s = &o->seg[i];
	*lo = s->p0 + s->s0;
	*hi = *lo + (s->zero ? s->len : s->n);
}
