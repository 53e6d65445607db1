/* ZeRO-1 in buckets (host/optim/optim_int.h): a zero seg's gradient
 * buckets are reduce-scattered over `data` in the background as the
 * table makes them final, and after the update each bucket's parameters
 * are all-gathered in the background, waited for by the next use of
 * its weights (the executor's weights_needed hook). Data rank r owns the
 * floats [p0 + r shard_n, p0 + (r + 1) shard_n) of the seg, as without
 * buckets (the state, checkpoints and resume do not change); a bucket's
 * chunk r is the bucket's floats inside rank r's part, in layout order,
 * so each float lands in the same block r of a reduce-scatter as when
 * the whole seg is reduce-scattered at once. */
#include "host/optim/optim_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Calls fn(o, x, y, pos, arg) for each run [x, y) of layout floats of
 * bucket b inside rank r's part, pos its place in chunk r; returns the
 * chunk's floats. */
static size_t walk(struct optim *o, const struct bucket *b, int r,
		   void (*fn)(struct optim *, size_t, size_t, size_t, void *), void *arg)
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
			if (fn)
				fn(o, x, y, pos, arg);
			pos += y - x;
		}
	}
	return pos;
}

void zero_lay_out(struct optim *o)
{
	for (int i = 0; i < o->nb; i++) {
		struct bucket *b = &o->b[i];
		b->c = 0;
		for (int r = 0; b->zero && r < o->ndata; r++) {
			size_t c = walk(o, b, r, NULL, NULL);
			b->c = c > b->c ? c : b->c;
		}
		if (b->zero && !b->c)
			b->c = 1;  /* every member sends a chunk, even an empty one */
	}
}

struct move {
	const struct bucket *b;
	float *chunk;              /* chunk r of the buffer */
	float *lay;                /* the layout's floats (gradients, parameters) */
	float *part;               /* zero_part of the seg: from its rank's part's start */
	size_t part0;
	bool to_chunk;
};

static void move_run(struct optim *o, size_t x, size_t y, size_t pos, void *arg)
{
	struct move *mv = arg;
	float *l = mv->lay ? mv->lay + x : mv->part + (x - mv->part0), *k = mv->chunk + pos;
	(void)o;
	memcpy(mv->to_chunk ? k : l, mv->to_chunk ? l : k, (y - x) * sizeof(float));
}

/* Chunk r of bucket b (at chunk) <-> the layout floats lay (or, lay
 * NULL, this rank's zero_part). */
static void move(struct optim *o, const struct bucket *b, int r, float *chunk, float *lay, bool to_chunk)
{
	const struct seg *s = &o->seg[b->seg];
	struct move mv = { .b = b, .chunk = chunk, .lay = lay, .part = zero_part(o, s),
			   .part0 = s->p0 + s->s0, .to_chunk = to_chunk };
	walk(o, b, r, move_run, &mv);
}

int zero_issue(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	const struct model_comm *mc = o->oc.mc;
	const uint32_t data = 1u << AX_DATA, rest = b->axes & ~data;
	float *G = model_grads(o->model);
	char name[64];
	int rc;
	/* the parameters' gather of the step before must have landed */
	if ((rc = zero_wait_params_of(o, b)))
		return rc;
	memset(b->buf, 0, sizeof(float) * b->c * (size_t)o->ndata);
	for (int r = 0; r < o->ndata; r++)
		move(o, b, r, b->buf + b->c * (size_t)r, G, true);
	b->issued = true;
	b->h = NULL;
	o->stats.buckets++;
	if (!bg || !bg->reduce_scatter) {
		rc = mc->reduce_scatter(mc->ctx, data, b->out, b->buf, b->c);
		if (!rc && rest)
			rc = mc->all_reduce(mc->ctx, rest, b->out, b->c);
		if (!rc)
			move(o, b, o->rdata, b->out, NULL, false);
		return rc;
	}
	bucket_name(o, b, "zero", name, sizeof(name));
	/* the all-reduce over the other axes is queued behind the
	 * reduce-scatter, so it runs on its result */
	if ((rc = bg->reduce_scatter(bg->ctx, data, b->out, b->buf, b->c, name, &b->h)) || !rest)
		return rc;
	return bg->all_reduce(bg->ctx, rest, b->out, b->c, name, &b->h2);
}

int zero_wait(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	void *h = b->h, *h2 = b->h2;
	int rc = 0, r;
	b->h = b->h2 = NULL;
	if (!h && !h2)
		return 0;  /* synchronous: unpacked already */
	if (h)
		rc = bg->wait(bg->ctx, h);
	if (h2 && (r = bg->wait(bg->ctx, h2)))
		rc = rc ? rc : r;
	if (!rc)
		move(o, b, o->rdata, b->out, NULL, false);
	return rc;
}

/* ---- the update and the parameters' gathers ---- */

struct upd {
	int64_t step;
	float lr;
	const struct seg *s;
	int rc;
};

static void update_run(struct optim *o, size_t x, size_t y, size_t pos, void *arg)
{
	struct upd *u = arg;
	size_t in = x - (u->s->p0 + u->s->s0), at = u->s->o0 + in;
	(void)pos;
	if (!u->rc)
		u->rc = optim_update_range(o, u->step, u->lr, zero_part(o, u->s) + in, o->m + at, o->v + at, x, y);
}

/* Starts bucket b's parameters' all-gather over `data`: this rank's
 * chunk, updated, packed in place. */
static int gather_start(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	const struct model_comm *mc = o->oc.mc;
	const uint32_t data = 1u << AX_DATA;
	float *P = model_params(o->model), *own = b->buf + b->c * (size_t)o->rdata;
	size_t bytes = b->c * sizeof(float);
	char name[64];
	memset(own, 0, bytes);
	move(o, b, o->rdata, own, P, true);
	int rc;
	if (!bg || !bg->all_gather) {
		rc = mc->all_gather(mc->ctx, data, b->buf, own, bytes);
		b->gsync = !rc;
	} else {
		bucket_name(o, b, "params", name, sizeof(name));
		rc = bg->all_gather(bg->ctx, data, b->buf, own, bytes, name, &b->gh);
	}
	o->gpending += b->gh || b->gsync;
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
	rc = o->prefetch(o->prefetch_ctx);
	for (int k = 0; k < 2 * o->nb && !rc; k++) {
		struct bucket *b = nth(o, k);
		if (b && !first_read(o, b))
			rc = gather_start(o, b);
	}
	return rc;
}

/* Bucket b's gather landed (waited for when in flight): every rank's
 * chunk into the parameters. */
int zero_wait_params_of(struct optim *o, struct bucket *b)
{
	const struct optim_bg *bg = o->oc.bg;
	float *P = model_params(o->model);
	int rc = 0;
	if (!b->gh && !b->gsync)
		return 0;
	if (b->gh)
		rc = bg->wait(bg->ctx, b->gh);
	b->gh = NULL;
	b->gsync = false;
	o->gpending--;
	for (int r = 0; !rc && r < o->ndata; r++)
		if (r != o->rdata)
			move(o, b, r, b->buf + b->c * (size_t)r, P, false);
	return rc;
}

int zero_wait_params(struct optim *o, int key, bool gathered)
{
	int rc = 0;
	for (int i = 0; i < o->nb && !rc && o->gpending; i++) {
		struct bucket *b = &o->b[i];
		if (!b->zero || (!b->gh && !b->gsync))
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
