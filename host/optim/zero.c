/* ZeRO-1 in buckets (host/optim/optim_int.h): a zero seg's gradient
 * buckets are reduce-scattered over `data` in the background as the
 * table makes them final, and after the update each bucket's parameters
 * are all-gathered in the background, waited for by the next use of
 * its weights (the executor's weights_needed hook). Data rank r owns the
 * floats [p0 + r shard_n, p0 + (r + 1) shard_n) of the seg, as without
 * buckets (the state, checkpoints and resume do not change). Both
 * collectives work in place on the bucket's list of runs (no packing
 * copy): block r of the list is the bucket's floats inside rank r's
 * part, so each float is summed in the same block r of a reduce-scatter
 * as when the whole seg is reduce-scattered at once (the same bits),
 * and rank r's sum lands in its own floats of the gradients. */
#include "host/optim/optim_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Calls fn(o, x, y, arg) for each run [x, y) of layout floats of bucket
 * b inside rank r's part, in the order of its units; returns their
 * floats. */
static size_t walk(struct optim *o, const struct bucket *b, int r,
		   void (*fn)(struct optim *, size_t, size_t, void *), void *arg)
{
	const struct seg *s = &o->seg[b->seg];
	size_t lo = s->p0 + s->shard_n * (size_t)r, hi = lo + s->shard_n, pos = 0;
	for (int j = b->u0; j < b->u1; j++) {
		const struct unit *u = &o->u[o->ubk[j]];
		for (int q = u->p0; q < u->p1; q++) {
			const struct piece *p = &o->pc[q];
			size_t x = p->off > lo ? p->off : lo, y = p->off + p->n < hi ? p->off + p->n : hi;
			if (x >= y)
				continue;
			fn(o, x, y, arg);
			pos += y - x;
		}
	}
	return pos;
}

/* walk's fn for zero_lay_out: appends [x, y) to the bucket's runs,
 * merged with the one before when adjacent inside one rank's part */
static void add_run(struct optim *o, size_t x, size_t y, void *arg)
{
	struct optim_run *last = o->nrun > *(int *)arg ? &o->run[o->nrun - 1] : NULL;
	if (last && last->off + last->n == x)
		last->n += y - x;
	else
		o->run[o->nrun++] = (struct optim_run){ x, y - x };
}

void zero_lay_out(struct optim *o)
{
	for (int i = 0; i < o->nb; i++) {
		struct bucket *b = &o->b[i];
		if (!b->zero)
			continue;
		b->count = o->zcount + (size_t)i * (size_t)o->ndata;
		b->r0 = o->nrun;
		for (int r = 0; r < o->ndata; r++) {
			int first = o->nrun;   /* no merging across parts */
			if (r == o->rdata)
				b->own0 = first;
			b->count[r] = walk(o, b, r, add_run, &first);
			if (r == o->rdata)
				b->own1 = o->nrun;
		}
		b->r1 = o->nrun;
	}
}

int zero_issue(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	const uint32_t data = 1u << AX_DATA, rest = b->axes & ~data;
	float *G = model_grads(o->model);
	char name[64];
	int rc;
	/* the parameters' gather of the step before has landed (the
	 * forward waited for it) */
	if ((rc = zero_wait_params_of(o, b)))
		return rc;
	b->issued = true;
	b->h = NULL;
	o->stats.buckets++;
	bucket_name(o, b, "zero", name, sizeof(name));
	/* the all-reduce over the other axes is queued behind the
	 * reduce-scatter, so it runs on its result */
	if ((rc = bg->reduce_scatter_v(bg->ctx, data, G, o->run + b->r0, b->r1 - b->r0, b->count, name, &b->h)) ||
	    !rest)
		return rc;
	return bg->all_reduce_v(bg->ctx, rest, G, o->run + b->own0, b->own1 - b->own0, name, &b->h2);
}

int zero_wait(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	void *h = b->h, *h2 = b->h2;
	int rc = 0, r;
	b->h = b->h2 = NULL;
	if (h)
		rc = bg->wait(bg->ctx, h);
	if (h2 && (r = bg->wait(bg->ctx, h2)))
		rc = rc ? rc : r;
	return rc;
}

/* ---- the update and the parameters' gathers ---- */

struct upd {
	int64_t step;
	float lr;
	const struct seg *s;
	int rc;
};

static void update_run(struct optim *o, size_t x, size_t y, void *arg)
{
	struct upd *u = arg;
	size_t in = x - (u->s->p0 + u->s->s0), at = u->s->o0 + in;
	if (!u->rc)
		u->rc = optim_update_range(o, u->step, u->lr, zero_part(o, u->s) + in, o->m + at, o->v + at, x, y);
}

/* Starts bucket b's parameters' all-gather over `data`, in place: this
 * rank's part is updated. */
static int gather_start(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	char name[64];
	bucket_name(o, b, "params", name, sizeof(name));
	int rc = bg->all_gather_v(bg->ctx, 1u << AX_DATA, model_params(o->model), o->run + b->r0, b->r1 - b->r0,
				  b->count, name, &b->gh);
	o->gpending += b->gh != NULL;
	return rc;
}

/* Whether bucket b holds tensors of the head or the embedding that the
 * FSDP window gathers (at the start of the step, before any layer). */
static bool early(const struct optim *o, const struct bucket *b)
{
	for (int j = b->u0; j < b->u1; j++) {
		const struct unit *u = &o->u[o->ubk[j]];
		if (u->key < 0 && u->gathered)
			return true;
	}
	return false;
}

/* Whether bucket b holds units the next step's first gathers read
 * (optim_set_prefetch). */
static bool first_read(const struct optim *o, const struct bucket *b)
{
	for (int j = b->u0; j < b->u1; j++)
		if (o->u[o->ubk[j]].early)
			return true;
	return false;
}

/* The zero buckets in the order the next step reads them: the buckets
 * complete last layer first, the forward wants the embedding's first;
 * the FSDP window's non-layer gather, which opens the step, before all.
 * The k-th of them (k < 2 nb), or NULL. */
static struct bucket *nth(struct optim *o, int k)
{
	struct bucket *b = &o->b[o->nb - 1 - k % o->nb];
	return b->zero && early(o, b) == (k < o->nb) ? b : NULL;
}

int zero_update_gather(struct optim *o, int64_t step, float lr, bool prefetch)
{
	int rc = 0;
	for (int k = 0; k < 2 * o->nb && !rc; k++) {
		struct bucket *b = nth(o, k);
		if (!b)
			continue;
		struct upd u = { .step = step, .lr = lr, .s = &o->seg[b->seg] };
		walk(o, b, o->rdata, update_run, &u);
		rc = u.rc ? u.rc : prefetch && !first_read(o, b) ? 0 : gather_start(o, b);
	}
	if (!prefetch || rc)
		return rc;
	/* the first FSDP gathers, queued behind the ZeRO-1 gathers they wait
	 * for and ahead of the others */
	rc = o->prefetch(o->prefetch_ctx, o->nfirst);
	for (int k = 0; k < 2 * o->nb && !rc; k++) {
		struct bucket *b = nth(o, k);
		if (b && !first_read(o, b))
			rc = gather_start(o, b);
	}
	return rc;
}

/* Bucket b's gather landed (waited for when in flight). */
int zero_wait_params_of(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	void *h = b->gh;
	if (!h)
		return 0;
	b->gh = NULL;
	o->gpending--;
	return bg->wait(bg->ctx, h);
}

int zero_wait_params(struct optim *o, int key, bool gathered)
{
	int rc = 0;
	for (int i = 0; i < o->nb && !rc && o->gpending; i++) {
		struct bucket *b = &o->b[i];
		if (!b->zero || !b->gh)
			continue;
		bool has = key == ZERO_ALL;
		for (int j = b->u0; j < b->u1 && !has; j++) {
			const struct unit *u = &o->u[o->ubk[j]];
			has = u->key == key && (u->gathered || !gathered);
		}
		if (has)
			rc = zero_wait_params_of(o, b);
	}
	return rc;
}
