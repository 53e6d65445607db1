/* The FSDP weight window of host/model/window.h: slots, gathers into
 * them, reduce-scatters out of them. A gather sends this device's shards
 * of a group's tensors packed per gather group (the tensors gathered over
 * the same axes), receives every member's packs and places each member's
 * blocks into the compute-shaped window; a reduce-scatter is the
 * transpose. */
#include "host/model/window.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define WIN_MAX_GROUPS 8            /* distinct gather axis sets */

enum slot_state { SLOT_FREE, SLOT_GATHERING, SLOT_READY };

struct win_slot {
	enum slot_state state;
	int l0, l1;                 /* the group it holds */
};

struct win {
	const struct mesh *mesh;
	int n;
	struct win_tensor *t;       /* [n] */
	size_t *woff;               /* [n] a gathered tensor's block in its window (per layer) */
	size_t cnum[2];             /* compute-shaped floats: [0] non-layer, [1] one layer */
	size_t snum[2];             /* this device's shards of them */
	int lcap;                   /* layers a layer group may hold */
	struct mesh_members gg[WIN_MAX_GROUPS];  /* gather groups */
	int ngg;
	/* buffers: per kind the weights' and the gradients' windows; the
	 * packed buffers a gather sends from (part) and lands in (whole), and
	 * a reduce-scatter sends from (whole) and receives in (part) */
	void *mem;
	float *wwin[2], *gwin[2];
	float *gsend, *grecv, *ssend, *srecv;
	void *gh[WIN_MAX_GROUPS], *sh[WIN_MAX_GROUPS];
	float *params, *grads;
	/* state */
	struct win_slot slot[WIN_SLOTS];
	int landing;                /* slot whose gather is in flight, or -1 */
	int ready[2];               /* the READY slot of each kind, or -1 */
	bool scattering;            /* a reduce-scatter is in flight, of */
	int s0, s1;                 /* this group */
	const struct model_comm *comm;
	int *rc;
};

static int kind_of(int l0)
{
	return l0 >= 0;
}

static size_t per_slice(const struct param_info *p)
{
	return p->stacked ? p->numel / (size_t)p->shape[0] : p->numel;
}

static size_t per_cslice(const struct plan_param *pp, const struct param_info *p)
{
	return p->stacked ? pp->cnumel / (size_t)pp->cshape[0] : pp->cnumel;
}

/* Is tensor i gathered over axes and in layer l's part of a group (l < 0:
 * the non-layer tensors)? With grads, only tensors that have gradients. */
static bool in_group(const struct win *w, int i, int l, uint32_t axes, bool grads)
{
	const struct win_tensor *x = &w->t[i];
	if (!x->p || x->pp->gather != axes || (grads && x->p->opt == OPT_NONE))
		return false;
	return l < 0 ? !x->p->stacked : x->p->stacked && l >= x->first && l < x->first + x->count;
}

/* Tensor i's storage slice for layer l in buf (params or grads). */
static float *storage(const struct win *w, float *buf, int i, int l)
{
	const struct param_info *p = w->t[i].p;
	return buf + p->offset + (p->stacked ? per_slice(p) * (size_t)(l - w->t[i].first) : 0);
}

/* Tensor i's compute-shaped block for layer l of a group starting at l0. */
static float *block(const struct win *w, bool grads, int i, int l, int l0)
{
	int k = w->t[i].p->stacked;
	float *base = grads ? w->gwin[k] : w->wwin[k];
	return base + (k ? (size_t)(l - l0) * w->cnum[1] : 0) + w->woff[i];
}

/* Floats group [l0, l1) packs for gather group gg (per member). */
static size_t pack_size(const struct win *w, const struct mesh_members *gg, int l0, int l1, bool grads)
{
	size_t pack = 0;
	for (int l = l0; l < l1; l++)
		for (int i = 0; i < w->n; i++)
			if (in_group(w, i, l, gg->axes, grads))
				pack += per_slice(w->t[i].p);
	return pack;
}

/* Moves member r's blocks of group [l0, l1) between the packed buffer
 * (pack floats per member) and the window. */
static void place_blocks(struct win *w, const struct mesh_members *gg, int l0, int l1, bool grads,
			 float *packed, size_t pack, bool into_window)
{
	for (int r = 0; r < gg->n; r++) {
		size_t off = 0;
		for (int l = l0; l < l1; l++)
			for (int i = 0; i < w->n; i++) {
				if (!in_group(w, i, l, gg->axes, grads))
					continue;
				const struct param_info *p = w->t[i].p;
				const struct plan_param *pp = w->t[i].pp;
				int o[SHARD_MAX_DIMS], k = p->stacked ? 1 : 0;
				plan_block_offsets(pp, w->mesh, gg->axes, gg->coord[r], o);
				plan_copy_block(block(w, grads, i, l, l0), pp->cshape + k,
						packed + (size_t)r * pack + off, p->shape + k, o + k,
						p->ndim - k, into_window);
				off += per_slice(p);
			}
	}
}

static int add_gather_group(struct win *w, uint32_t axes, int dev)
{
	for (int k = 0; k < w->ngg; k++)
		if (w->gg[k].axes == axes)
			return 0;
	if (w->ngg == WIN_MAX_GROUPS)
		return -ENOSPC;
	int rc = mesh_members_init(w->mesh, dev, axes, &w->gg[w->ngg]);
	if (!rc)
		w->ngg++;
	return rc;
}

struct win *win_new(const struct mesh *ms, int device, const struct win_tensor *t, int n, int lcap)
{
	struct win *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->mesh = ms;
	w->n = n;
	w->lcap = lcap;
	w->landing = w->ready[0] = w->ready[1] = -1;
	w->t = malloc(sizeof(*w->t) * (size_t)n);
	w->woff = calloc((size_t)n, sizeof(*w->woff));
	if (!w->t || !w->woff)
		goto fail;
	memcpy(w->t, t, sizeof(*w->t) * (size_t)n);
	/* the non-layer tensors, then one slice of every stacked one */
	for (int i = 0; i < n; i++) {
		const struct param_info *p = t[i].p;
		if (!p || !t[i].pp->gather)
			continue;
		w->woff[i] = w->cnum[p->stacked];
		w->cnum[p->stacked] += per_cslice(t[i].pp, p);
		w->snum[p->stacked] += per_slice(p);
		if (add_gather_group(w, t[i].pp->gather, device))
			goto fail;
	}
	return w;
fail:
	win_free(w);
	return NULL;
}

void win_free(struct win *w)
{
	if (!w)
		return;
	for (int k = 0; k < w->ngg; k++)
		mesh_members_free(&w->gg[k]);
	free(w->mem);
	free(w->woff);
	free(w->t);
	free(w);
}

/* The largest packed group (whole: what a gather receives and a
 * reduce-scatter sends) and the largest shard of one (part). */
static void packed_sizes(const struct win *w, size_t *whole, size_t *part)
{
	size_t lw = (size_t)w->lcap * w->cnum[1], lp = (size_t)w->lcap * w->snum[1];
	*whole = w->cnum[0] > lw ? w->cnum[0] : lw;
	*part = w->snum[0] > lp ? w->snum[0] : lp;
}

size_t win_numel(const struct win *w)
{
	size_t whole, part;
	packed_sizes(w, &whole, &part);
	return 2 * (w->cnum[0] + (size_t)w->lcap * w->cnum[1]) + 2 * whole + 2 * part;
}

static float *take(char *base, size_t *used, size_t n)
{
	float *p = base ? (float *)(base + *used) : NULL;
	*used += (n * sizeof(float) + 63) & ~(size_t)63;
	return p;
}

/* Cuts the buffers out of base (NULL: only counts); returns the bytes. */
static size_t lay_out(struct win *w, char *base)
{
	size_t used = 0, whole, part, nl = w->cnum[0], lay = (size_t)w->lcap * w->cnum[1];
	packed_sizes(w, &whole, &part);
	w->wwin[0] = take(base, &used, nl);
	w->wwin[1] = take(base, &used, lay);
	w->gwin[0] = take(base, &used, nl);
	w->gwin[1] = take(base, &used, lay);
	w->gsend = take(base, &used, part);
	w->grecv = take(base, &used, whole);
	w->ssend = take(base, &used, whole);
	w->srecv = take(base, &used, part);
	return used;
}

int win_alloc(struct win *w, float *params, float *grads)
{
	size_t bytes = lay_out(w, NULL);
	w->params = params;
	w->grads = grads;
	w->mem = aligned_alloc(64, bytes ? bytes : 64);
	if (!w->mem)
		return -ENOMEM;
	memset(w->mem, 0, bytes);
	lay_out(w, w->mem);
	return 0;
}

void win_begin(struct win *w, const struct model_comm *comm, int *rc)
{
	w->comm = comm;
	w->rc = rc;
}

/* A collective that finished (or failed): the first failure is kept. */
static void wait_handle(struct win *w, void **h)
{
	if (!*h)
		return;
	int rc = w->comm->wait(w->comm->ctx, *h);
	*h = NULL;
	if (!*w->rc)
		*w->rc = rc;
}

static void check_group(const struct win *w, int l0, int l1)
{
	assert(l0 == WIN_NONLAYER ? l1 == 0 : l0 >= 0 && l1 > l0 && l1 - l0 <= w->lcap);
	(void)w, (void)l0, (void)l1;
}

int win_gather_start(struct win *w, int k, int l0, int l1)
{
	const struct model_comm *c = w->comm;
	size_t soff = 0, roff = 0;
	assert(k >= 0 && k < WIN_SLOTS && w->slot[k].state == SLOT_FREE && w->landing < 0);
	check_group(w, l0, l1);
	w->slot[k] = (struct win_slot){ SLOT_GATHERING, l0, l1 };
	w->landing = k;
	for (int g = 0; g < w->ngg && !*w->rc; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = 0;
		float *send = w->gsend + soff, *recv = w->grecv + roff;
		for (int l = l0; l < l1; l++)
			for (int i = 0; i < w->n; i++) {
				if (!in_group(w, i, l, gg->axes, false))
					continue;
				size_t n = per_slice(w->t[i].p);
				memcpy(send + pack, storage(w, w->params, i, l), n * sizeof(float));
				pack += n;
			}
		if (!pack)
			continue;
		if (c->start_all_gather)
			*w->rc = c->start_all_gather(c->ctx, gg->axes, recv, send, pack * sizeof(float), &w->gh[g]);
		else
			*w->rc = c->all_gather(c->ctx, gg->axes, recv, send, pack * sizeof(float));
		soff += pack;
		roff += pack * (size_t)gg->n;
	}
	return *w->rc;
}

int win_wait(struct win *w, int k)
{
	struct win_slot *s = &w->slot[k];
	size_t roff = 0;
	assert(k >= 0 && k < WIN_SLOTS && s->state == SLOT_GATHERING && w->landing == k);
	assert(w->ready[kind_of(s->l0)] < 0);
	w->landing = -1;
	for (int g = 0; g < w->ngg; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = pack_size(w, gg, s->l0, s->l1, false);
		wait_handle(w, &w->gh[g]);
		if (!pack || *w->rc)
			continue;
		place_blocks(w, gg, s->l0, s->l1, false, w->grecv + roff, pack, true);
		roff += pack * (size_t)gg->n;
	}
	s->state = SLOT_READY;
	w->ready[kind_of(s->l0)] = k;
	return *w->rc;
}

void win_release(struct win *w, int k)
{
	assert(k >= 0 && k < WIN_SLOTS && w->slot[k].state == SLOT_READY);
	w->ready[kind_of(w->slot[k].l0)] = -1;
	w->slot[k].state = SLOT_FREE;
}

void win_zero_grads(struct win *w, int k)
{
	const struct win_slot *s = &w->slot[k];
	assert(k >= 0 && k < WIN_SLOTS && s->state == SLOT_READY);
	for (int l = s->l0; l < s->l1; l++)
		for (int i = 0; i < w->n; i++)
			if (w->t[i].p && w->t[i].pp->gather && in_group(w, i, l, w->t[i].pp->gather, true))
				memset(block(w, true, i, l, s->l0), 0,
				       per_cslice(w->t[i].pp, w->t[i].p) * sizeof(float));
}

int win_scatter_finish(struct win *w)
{
	size_t roff = 0;
	if (!w->scattering)
		return *w->rc;
	w->scattering = false;
	for (int g = 0; g < w->ngg; g++) {
		const struct mesh_members *gg = &w->gg[g];
		wait_handle(w, &w->sh[g]);
		for (int l = w->s0; l < w->s1; l++)
			for (int i = 0; i < w->n && !*w->rc; i++) {
				if (!in_group(w, i, l, gg->axes, true))
					continue;
				size_t n = per_slice(w->t[i].p);
				float *dst = storage(w, w->grads, i, l);
				for (size_t j = 0; j < n; j++)
					dst[j] += w->srecv[roff + j];
				roff += n;
			}
	}
	return *w->rc;
}

int win_scatter_start(struct win *w, int k)
{
	const struct model_comm *c = w->comm;
	const struct win_slot *s = &w->slot[k];
	size_t soff = 0, roff = 0;
	assert(k >= 0 && k < WIN_SLOTS && s->state == SLOT_READY);
	win_scatter_finish(w);
	for (int g = 0; g < w->ngg && !*w->rc; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = pack_size(w, gg, s->l0, s->l1, true);
		if (!pack)
			continue;
		float *send = w->ssend + soff, *recv = w->srecv + roff;
		place_blocks(w, gg, s->l0, s->l1, true, send, pack, false);
		if (c->start_reduce_scatter)
			*w->rc = c->start_reduce_scatter(c->ctx, gg->axes, recv, send, pack, &w->sh[g]);
		else
			*w->rc = c->reduce_scatter(c->ctx, gg->axes, recv, send, pack);
		soff += pack * (size_t)gg->n;
		roff += pack;
	}
	w->scattering = true;
	w->s0 = s->l0;
	w->s1 = s->l1;
	return *w->rc;
}

int win_end(struct win *w)
{
	for (int g = 0; g < w->ngg; g++) {
		wait_handle(w, &w->gh[g]);
		wait_handle(w, &w->sh[g]);
	}
	w->scattering = false;
	w->landing = w->ready[0] = w->ready[1] = -1;
	for (int k = 0; k < WIN_SLOTS; k++)
		w->slot[k].state = SLOT_FREE;
	return *w->rc;
}

float *win_block(struct win *w, bool grads, int i, int l)
{
	int kind = w->t[i].p->stacked;
	int k = w->ready[kind];
	assert(k >= 0 && (!kind || (l >= w->slot[k].l0 && l < w->slot[k].l1)));
	return block(w, grads, i, l, w->slot[k].l0);
}
