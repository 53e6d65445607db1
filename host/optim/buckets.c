/* Gradient buckets (host/optim/optim_int.h): the layout's units in the
 * order the step's table makes them final, cut into buckets of at most
 * grad_bucket_mb (the first of each seg 1 MiB, as PyTorch DDP does),
 * each summed over the mesh in place when its last unit is final: one
 * collective over its runs of adjacent layout floats (a tensor's slices
 * of the bucket's layers). ZeRO-1's buckets are reduce-scattered
 * instead (zero.c); with grad_bucket_mb=0 ZeRO-1's segs have no buckets
 * (optim.c reduce-scatters them after the table). */
#include "host/optim/optim_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int slot_of(const struct optim *o, int key, int seg, bool repl)
{
	return ((key + 2) * o->nseg + seg) * 2 + (repl ? 1 : 0);
}

int unit_of(const struct optim *o, int key, int seg, bool repl)
{
	return o->by_key[slot_of(o, key, seg, repl)];
}

static int seg_of(const struct optim *o, size_t off)
{
	for (int s = 0; s < o->nseg; s++)
		if (off >= o->seg[s].p0 && off < o->seg[s].p0 + o->seg[s].n)
			return s;
	return -1;
}

/* Calls fn for every slice of every tensor: its unit's (key, seg, repl)
 * and its layout floats. */
static void each_slice(struct optim *o, int stages, void (*fn)(struct optim *, int, int, bool, int, size_t, size_t, void *),
		       void *arg)
{
	struct model *m = o->model;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		int s = seg_of(o, p->offset);
		bool repl = stages > 1 && !(p->split & (1u << AX_STAGE));
		if (s < 0)
			continue;
		if (!p->stacked) {
			fn(o, strcmp(p->name, "embed") ? KEY_HEAD : KEY_EMBED, s, repl, i, p->offset, p->numel, arg);
			continue;
		}
		size_t per = p->numel / (size_t)p->shape[0];
		for (int l = 0; l < o->L; l++) {
			int q = model_param_slice(m, i, l);
			if (q >= 0)
				fn(o, l, s, repl, i, p->offset + (size_t)q * per, per, arg);
		}
	}
}

/* Pass 1: make the units, count their pieces (in u->p1). */
static void count_slice(struct optim *o, int key, int s, bool repl, int i, size_t off, size_t n, void *arg)
{
	int *k = &o->by_key[slot_of(o, key, s, repl)];
	const struct plan_param *pp = model_param_plan(o->model, i);
	bool gathered = pp && pp->gather && model_param(o->model, i)->opt != OPT_NONE;
	(void)off, (void)n, (void)arg;
	if (*k < 0) {
		*k = o->nu++;
		o->u[*k] = (struct unit){ .seg = s, .key = key, .repl = repl, .bucket = -1 };
	}
	o->u[*k].p1++;
	o->u[*k].gathered |= gathered;
	o->u[*k].plain |= !gathered;
}

/* Pass 2: the pieces, each unit's together. */
static void put_slice(struct optim *o, int key, int s, bool repl, int i, size_t off, size_t n, void *arg)
{
	int *fill = arg, k = unit_of(o, key, s, repl);
	o->pc[o->u[k].p0 + fill[k]++] = (struct piece){ .param = i, .off = off, .n = n };
}

static size_t unit_floats(const struct optim *o, const struct unit *u)
{
	size_t n = 0;
	for (int j = u->p0; j < u->p1; j++)
		n += o->pc[j].n;
	return n;
}

/* Appends the units of key (every seg) not placed yet to order. */
static void place_key(struct optim *o, int key, bool repl, int *order, int *n, bool *placed)
{
	for (int s = 0; s < o->nseg; s++) {
		int k = unit_of(o, key, s, repl);
		if (k >= 0 && !placed[k]) {
			placed[k] = true;
			order[(*n)++] = k;
		}
	}
}

/* The canonical order (head, the last layer to the first, embedding):
 * the same on every stage, for what no event places. */
static void place_rest(struct optim *o, bool repl, int *order, int *n, bool *placed)
{
	place_key(o, KEY_HEAD, repl, order, n, placed);
	for (int l = o->L - 1; l >= 0; l--)
		place_key(o, l, repl, order, n, placed);
	place_key(o, KEY_EMBED, repl, order, n, placed);
}

/* The units in the order the table completes them (pl's), what it does
 * not complete and a pipeline's stage-wide tensors after, in the
 * canonical order; their buckets wait for the end of the table. */
static int order_units(struct optim *o, const struct optim_place *pl, bool *deferred)
{
	int *order = malloc(sizeof(int) * (size_t)(o->nu + 1)), n = 0;
	bool *placed = calloc((size_t)o->nu + 1, sizeof(bool));
	struct unit *u = malloc(sizeof(*u) * (size_t)(o->nu + 1));
	if (!order || !placed || !u) {
		free(order);
		free(placed);
		free(u);
		return -ENOMEM;
	}
	for (int g = 0; g < pl->norder; g++) {
		int l0 = pl->order_l0[g], l1 = pl->order_l1[g];
		if (l0 < 0)
			place_key(o, l0, false, order, &n, placed);
		for (int l = l1 - 1; l0 >= 0 && l >= l0; l--)
			place_key(o, l, false, order, &n, placed);
	}
	int timed = n;
	place_rest(o, false, order, &n, placed);
	place_rest(o, true, order, &n, placed);
	for (int k = 0; k < n; k++) {
		u[k] = o->u[order[k]];
		deferred[k] = k >= timed;
	}
	memcpy(o->u, u, sizeof(*u) * (size_t)n);
	for (int k = 0; k < n; k++)
		o->by_key[slot_of(o, o->u[k].key, o->u[k].seg, o->u[k].repl)] = k;
	free(order);
	free(placed);
	free(u);
	return 0;
}

/* Whether seg s's units hold every float of its tensors (ZeRO-1's
 * buckets then cover the seg's whole part on every rank). */
static bool covered(const struct optim *o, int s)
{
	size_t units = 0, tensors = 0;
	for (int k = 0; k < o->nu; k++)
		if (o->u[k].seg == s)
			units += unit_floats(o, &o->u[k]);
	for (int i = 0; i < model_num_params(o->model); i++) {
		const struct param_info *p = model_param(o->model, i);
		if (p->offset >= o->seg[s].p0 && p->offset < o->seg[s].p0 + o->seg[s].n)
			tensors += p->numel;
	}
	return units == tensors;
}

/* Cuts each seg's units (summed over some axes) into buckets, in unit
 * order, those the table completes apart from those summed after it: a
 * bucket takes units while they fit under its cap (the first of each
 * 1 MiB, the rest grad_bucket_mb), and at least one. The last layer
 * unit the table completes (layer 0's without a pipeline) starts a
 * bucket: its sum is the one the step waits for after the backward, so
 * the units final before it are not held back to go out with it. */
static int cut_buckets(struct optim *o, const bool *deferred)
{
	/* 0: one bucket per seg, summed after the table */
	bool after = o->cfg.grad_bucket_mb == 0;
	size_t cap = after ? SIZE_MAX : (size_t)(o->cfg.grad_bucket_mb * 1048576.0 / sizeof(float));
	cap = cap ? cap : 1;
	size_t first = cap < 262144 ? cap : 262144;
	first = after ? SIZE_MAX : first;
	/* per st (seg, deferred): its open bucket and its last layer unit */
	int *open = malloc(sizeof(int) * (size_t)o->nseg * 4), *tail;
	bool *later = calloc((size_t)o->nseg * 2, sizeof(bool));
	o->b = calloc((size_t)o->nu + 1, sizeof(*o->b));
	if (!open || !later || !o->b) {
		free(open);
		free(later);
		return -ENOMEM;
	}
	tail = open + o->nseg * 2;
	for (int k = 0; k < o->nseg * 4; k++)
		open[k] = -1;
	for (int s = 0; s < o->nseg; s++)
		o->seg[s].bucketed = o->seg[s].zero && !after && covered(o, s);
	for (int k = 0; k < o->nu; k++)
		if (o->u[k].key >= 0)
			tail[o->u[k].seg * 2 + (deferred[k] && !after ? 1 : 0)] = k;
	for (int k = 0; k < o->nu; k++) {
		struct unit *u = &o->u[k];
		const struct seg *s = &o->seg[u->seg];
		if (!s->axes || (s->zero && !s->bucketed))
			continue;
		int st = u->seg * 2 + (deferred[k] && !after ? 1 : 0);
		size_t n = unit_floats(o, u);
		struct bucket *b = open[st] >= 0 ? &o->b[open[st]] : NULL;
		if (b && (b->n + n > (later[st] ? cap : first) || (k == tail[st] && !after && st % 2 == 0))) {
			later[st] = true;
			b = NULL;
		}
		if (!b) {
			open[st] = o->nb++;
			b = &o->b[open[st]];
			*b = (struct bucket){ .seg = u->seg, .axes = s->axes, .deferred = deferred[k] || after,
					      .zero = s->zero };
		}
		u->bucket = (int)(b - o->b);
		b->n += n;
		b->u1++;   /* its count of units until lay_out_buckets */
	}
	free(open);
	free(later);
	return 0;
}

static int by_off(const void *a, const void *b)
{
	size_t x = ((const struct piece *)a)->off, y = ((const struct piece *)b)->off;
	return x < y ? -1 : x > y;
}

/* Sorts n pieces by layout offset and merges each run of adjacent ones
 * with the same .at (their seg) into one; their count. */
static int merge_runs(struct piece *v, int n)
{
	int m = 0;
	qsort(v, (size_t)n, sizeof(*v), by_off);
	for (int j = 0; j < n; j++) {
		if (m && v[m - 1].at == v[j].at && v[m - 1].off + v[m - 1].n == v[j].off)
			v[m - 1].n += v[j].n;
		else
			v[m++] = v[j];
	}
	return m;
}

/* Bucket b's runs (not ZeRO-1's): its pieces in layout order, adjacent
 * ones merged (tmp: room for them), from o->run[o->nrun] on. */
static void lay_out_runs(struct optim *o, struct bucket *b, struct piece *tmp)
{
	int n = 0;
	for (int j = b->u0; j < b->u1; j++) {
		const struct unit *u = &o->u[o->ubk[j]];
		for (int q = u->p0; q < u->p1; q++) {
			tmp[n] = o->pc[q];
			tmp[n++].at = (size_t)b->seg;
		}
	}
	n = merge_runs(tmp, n);
	b->r0 = o->nrun;
	for (int j = 0; j < n; j++)
		o->run[o->nrun++] = (struct optim_run){ tmp[j].off, tmp[j].n };
	b->r1 = o->nrun;
}

/* The buckets' units in order (ubk) and their runs. */
static int lay_out_buckets(struct optim *o)
{
	int at = 0;
	o->ubk = malloc(sizeof(int) * (size_t)(o->nu + 1));
	if (!o->ubk)
		return -ENOMEM;
	for (int i = 0; i < o->nb; i++) {
		struct bucket *b = &o->b[i];
		int cnt = b->u1;
		b->u0 = b->u1 = at;
		at += cnt;
	}
	for (int k = 0; k < o->nu; k++) {
		struct unit *u = &o->u[k];
		if (u->bucket < 0)
			continue;
		struct bucket *b = &o->b[u->bucket];
		o->ubk[b->u1++] = k;
	}
	/* a piece is one run, or (ZeRO-1) one per data rank's part */
	size_t cap = (size_t)o->npc * (size_t)(o->ndata > 1 ? o->ndata : 1) + 1;
	struct piece *tmp = malloc(sizeof(*tmp) * (size_t)(o->npc + 1));
	o->run = malloc(sizeof(*o->run) * cap);
	o->zcount = calloc((size_t)o->nb * (size_t)(o->ndata > 1 ? o->ndata : 1) + 1, sizeof(size_t));
	if (!tmp || !o->run || !o->zcount) {
		free(tmp);
		return -ENOMEM;
	}
	for (int i = 0; i < o->nb; i++)
		if (!o->b[i].zero)
			lay_out_runs(o, &o->b[i], tmp);
	free(tmp);
	zero_lay_out(o);
	return 0;
}

int buckets_make(struct optim *o, const struct optim_place *pl)
{
	int slots = (o->L + 2) * o->nseg * 2, rc;
	o->by_key = malloc(sizeof(int) * (size_t)slots);
	o->u = calloc((size_t)slots + 1, sizeof(*o->u));
	bool *deferred = calloc((size_t)slots + 1, sizeof(bool));
	if (!o->by_key || !o->u || !deferred) {
		free(deferred);
		return -ENOMEM;
	}
	for (int k = 0; k < slots; k++)
		o->by_key[k] = -1;
	each_slice(o, pl->stages, count_slice, NULL);
	for (int k = 0, n = 0; k < o->nu; k++) {
		o->u[k].p0 = n;
		n += o->u[k].p1;
		o->u[k].p1 = o->u[k].p0;
		o->npc = n;
	}
	o->pc = malloc(sizeof(*o->pc) * (size_t)(o->npc + 1));
	int *fill = calloc((size_t)o->nu + 1, sizeof(int));
	if (!o->pc || !fill) {
		free(fill);
		free(deferred);
		return -ENOMEM;
	}
	each_slice(o, pl->stages, put_slice, fill);
	for (int k = 0; k < o->nu; k++)
		o->u[k].p1 = o->u[k].p0 + fill[k];
	free(fill);
	rc = order_units(o, pl, deferred);
	if (!rc && o->mesh)
		rc = cut_buckets(o, deferred);
	if (!rc && o->mesh)
		rc = lay_out_buckets(o);
	free(deferred);
	return rc;
}

void buckets_free(struct optim *o)
{
	free(o->by_key);
	free(o->u);
	free(o->pc);
	free(o->b);
	free(o->ubk);
	free(o->run);
	free(o->zcount);
}

int bucket_issue(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	char name[64];
	if (b->zero)
		return zero_issue(o, b);
	bucket_name(o, b, "grads", name, sizeof(name));
	b->issued = true;
	o->stats.buckets++;
	/* nothing writes a final unit's gradients again in the step: the
	 * runs are summed where they lie, by one collective */
	return bg->all_reduce_v(bg->ctx, b->axes, model_grads(o->model), o->run + b->r0, b->r1 - b->r0, name,
				&b->h);
}

int bucket_wait(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	void *h = b->h;
	if (b->zero)
		return zero_wait(o, b);
	b->h = NULL;
	return h ? bg->wait(bg->ctx, h) : 0;
}

/* ---- the next step's first gathers (optim_set_prefetch) ---- */

/* Layout floats [x, y) of seg s (not ZeRO-1's) updated. */
static int update_floats(struct optim *o, const struct seg *s, int64_t step, float lr, size_t x, size_t y)
{
	size_t at = s->o0 + (x - s->p0);
	return x < y ? optim_update_range(o, step, lr, model_grads(o->model) + x, o->m + at, o->v + at, x, y) : 0;
}

/* The early units' pieces of seg s (every seg: -1; not ZeRO-1's, which
 * zero.c updates bucket by bucket) whose early is `first` (0: any) into
 * out, in layout order, each run of adjacent ones of one seg merged into
 * one piece (a Muon tensor's early layers then take one exchange); their
 * count. */
static int early_runs(const struct optim *o, int s, int first, struct piece *out)
{
	int n = 0;
	for (int k = 0; k < o->nu; k++)
		for (int q = o->u[k].p0; o->u[k].early && (!first || o->u[k].early == first) &&
		     !o->seg[o->u[k].seg].zero && (s < 0 || o->u[k].seg == s) && q < o->u[k].p1; q++) {
			out[n] = o->pc[q];
			out[n++].at = (size_t)o->u[k].seg;  /* its seg, for the merge */
		}
	return merge_runs(out, n);
}

int units_update_early(struct optim *o, int64_t step, float lr, int first)
{
	struct piece *run = malloc(sizeof(*run) * (size_t)(o->npc + 1));
	int rc = 0;
	if (!run)
		return -ENOMEM;
	for (int j = 0, n = early_runs(o, -1, first, run); j < n && !rc; j++)
		rc = update_floats(o, &o->seg[run[j].at], step, lr, run[j].off, run[j].off + run[j].n);
	free(run);
	return rc;
}

int seg_update_rest(struct optim *o, int s, int64_t step, float lr)
{
	const struct seg *sg = &o->seg[s];
	struct piece *skip = malloc(sizeof(*skip) * (size_t)(o->npc + 1));
	int rc = 0;
	if (!skip)
		return -ENOMEM;
	int n = early_runs(o, s, 0, skip);
	size_t at = sg->p0;
	for (int j = 0; j < n && !rc; j++) {
		rc = update_floats(o, sg, step, lr, at, skip[j].off);
		at = skip[j].off + skip[j].n;
	}
	if (!rc)
		rc = update_floats(o, sg, step, lr, at, sg->p0 + sg->n);
	free(skip);
	return rc;
}
