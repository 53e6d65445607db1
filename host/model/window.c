/* The FSDP weight window of host/model/window.h: slots, gathers into
 * them, reduce-scatters out of them. A gather of a group goes per gather
 * group (the tensors gathered over the same axes). With the comm's list
 * form it lands in the window where the weights lie: the list of every
 * member's blocks' rows is all-gathered in place, one collective (a
 * segment of it is one message over however many rows it spans), which
 * first copies this device's shards into their blocks itself (the own
 * block's moves: on the communication thread, not the device's). Otherwise (no list
 * form, or the non-layer window held) it sends this device's shards
 * packed, receives every member's packs and places each member's blocks
 * into the compute-shaped window. A layer group's reduce-scatter is the
 * transpose: in place over the same rows of its gradient window, this
 * device's block then added into the gradient shards by the collective
 * (its moves again); the non-layer
 * group's (and every one without the list form) packs. Where blocks and
 * rows lie, and the copies, are window_rows.c's. */
#include "host/model/window.h"
#include "host/model/window_int.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int add_gather_group(struct win *w, uint32_t axes, int dev)
{
	for (int k = 0; k < w->ngg; k++)
		if (w->gg[k].axes == axes)
			return 0;
	if (w->ngg == WIN_MAX_GROUPS)
		return -ENOSPC;
	struct mesh_members *gg = &w->gg[w->ngg];
	int rc = mesh_members_init(w->mesh, dev, axes, gg), me[AX_COUNT];
	if (rc)
		return rc;
	mesh_coords(w->mesh, dev, me);
	for (int r = 0; r < gg->n; r++)
		if (!memcmp(gg->coord[r], me, sizeof(me)))
			w->grank[w->ngg] = r;
	w->ngg++;
	return 0;
}

struct win *win_new(const struct mesh *ms, int device, const struct win_tensor *t, int n,
		    const struct win_layout *lo)
{
	struct win *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	assert(lo->lcap >= 1 && lo->windows >= 1 && lo->slice);
	w->mesh = ms;
	w->n = n;
	w->lo = *lo;
	w->nslots = lo->windows + 2;
	w->nl_ready = -1;
	w->nparts = 1;
	w->fine_l = -1;
	w->t = malloc(sizeof(*w->t) * (size_t)n);
	w->woff = calloc((size_t)n, sizeof(*w->woff));
	w->wl = calloc((size_t)lo->windows + 1, sizeof(*w->wl));
	w->gl = calloc((size_t)lo->windows + 1, sizeof(*w->gl));
	w->owner = malloc(sizeof(*w->owner) * ((size_t)lo->windows + 1));
	w->gowner = malloc(sizeof(*w->gowner) * ((size_t)lo->windows + 1));
	w->slot = calloc((size_t)w->nslots, sizeof(*w->slot));
	w->queue = malloc(sizeof(*w->queue) * (size_t)w->nslots);
	w->pend = calloc(((size_t)lo->windows + 1) * (size_t)lo->lcap * (size_t)(n ? n : 1), 1);
	if (!w->t || !w->woff || !w->wl || !w->gl || !w->owner || !w->gowner || !w->slot || !w->queue ||
	    !w->pend)
		goto fail;
	for (int j = 0; j <= lo->windows; j++)
		w->owner[j] = w->gowner[j] = -1;
	for (int k = 0; k < w->nslots; k++)
		w->slot[k].win = w->slot[k].gwin = -1;
	memcpy(w->t, t, sizeof(*w->t) * (size_t)n);
	/* the non-layer tensors, then one slice of every stacked one */
	for (int i = 0; i < n; i++) {
		const struct param_info *p = t[i].p;
		if (!p || !t[i].pp->gather)
			continue;
		w->woff[i] = w->cnum[p->stacked];
		w->cnum[p->stacked] += per_cslice(t[i].pp, p);
		w->snum[p->stacked] += param_slice_numel(p);
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
	free(w->lmem);
	free(w->woff);
	free(w->t);
	free(w->wl);
	free(w->gl);
	free(w->owner);
	free(w->gowner);
	free(w->run);
	free(w->mv);
	free(w->orow);
	free(w->slot);
	free(w->queue);
	free(w->part);
	free(w->pend);
	free(w);
}

/* A packed group (whole: what a gather receives and a reduce-scatter
 * sends) and its shard (part): the non-layer group's, or a layer
 * group's. */
static void packed_sizes(const struct win *w, bool layer, size_t *whole, size_t *part)
{
	*whole = layer ? (size_t)w->lo.lcap * w->cnum[1] : w->cnum[0];
	*part = layer ? (size_t)w->lo.lcap * w->snum[1] : w->snum[0];
}

size_t win_numel(const struct win *w)
{
	size_t whole, part;
	packed_sizes(w, false, &whole, &part);
	return 2 * w->cnum[0] + (2 * (size_t)w->lo.windows + 2) * w->lo.lcap * w->cnum[1] +
	       2 * (whole + part);
}

size_t win_packed_numel(const struct win *w)
{
	size_t whole, part;
	packed_sizes(w, true, &whole, &part);
	return 2 * (whole + part);
}

static float *take(char *base, size_t *used, size_t n)
{
	float *p = base ? (float *)(base + *used) : NULL;
	*used += (n * sizeof(float) + 63) & ~(size_t)63;
	return p;
}

/* Cuts a group's packed buffers out of base at *used. */
static void lay_packs(struct win *w, bool layer, char *base, size_t *used)
{
	size_t whole, part;
	packed_sizes(w, layer, &whole, &part);
	w->pk[layer].gsend = take(base, used, part);
	w->pk[layer].grecv = take(base, used, whole);
	w->pk[layer].ssend = take(base, used, whole);
	w->pk[layer].srecv = take(base, used, part);
}

/* Cuts the buffers out of base (NULL: only counts); returns the bytes. */
static size_t lay_out(struct win *w, char *base)
{
	size_t used = 0, nl = w->cnum[0], lay = (size_t)w->lo.lcap * w->cnum[1];
	w->wnl = take(base, &used, nl);
	w->gnl = take(base, &used, nl);
	for (int j = 0; j <= w->lo.windows; j++) {
		w->wl[j] = take(base, &used, lay);
		w->gl[j] = take(base, &used, lay);
	}
	lay_packs(w, false, base, &used);
	return used;
}

/* A layer group's packed buffers, the first time one packs (the comm
 * has no list form); 0, or -ENOMEM with a message in the comm's err. */
static int layer_packs(struct win *w)
{
	size_t used = 0;
	if (w->lmem)
		return 0;
	lay_packs(w, true, NULL, &used);
	if (!(w->lmem = aligned_alloc(64, used))) {
		if (w->comm->err)
			snprintf(w->comm->err, w->comm->errlen,
				 "FSDP window: out of memory: %zu bytes for a layer group's packed "
				 "gather and reduce-scatter buffers", used);
		return -ENOMEM;
	}
	used = 0;
	lay_packs(w, true, w->lmem, &used);
	return 0;
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

int win_gathers(const struct win *w) { return w->gathers; }

size_t win_copied(const struct win *w) { return w->copied; }

int win_slots(const struct win *w) { return w->nslots; }

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

static void check_slot(const struct win *w, int k)
{
	assert(k >= 0 && k < w->nslots);
	(void)w, (void)k;
}

static void check_group(const struct win *w, int l0, int l1)
{
	assert(l0 == WIN_NONLAYER ? l1 == 0 : l0 >= 0 && l1 > l0 && l1 - l0 <= w->lo.lcap);
	(void)w, (void)l0, (void)l1;
}

/* A free weight window for layer slot k, or -1: there are windows + 1
 * and at most windows READY slots, so with no gather in flight there is
 * one. */
static int free_window(const struct win *w, int k)
{
	int free = -1;
	for (int j = 0; j <= w->lo.windows; j++) {
		int o = w->owner[j];
		if (o < 0 && free < 0)
			free = j;
		/* READY layer groups never overlap: win_block finds one by layer */
		assert(o < 0 || w->slot[o].state != SLOT_READY || w->slot[o].l1 <= w->slot[k].l0 ||
		       w->slot[o].l0 >= w->slot[k].l1 || k == o);
	}
	return free;
}

/* Whether slot k's gather goes in place, every gather group as a list
 * (no packed buffer): the comm has the list form, and for the non-layer
 * group no READY slot holds its window. */
static bool in_place(const struct win *w, int k)
{
	return w->comm && w->comm->start_all_gather_v && (w->slot[k].l0 != WIN_NONLAYER || w->nl_ready < 0);
}

/* Sends layer slot k's gather in place in parts (win_set_parts), part
 * 0's gather groups, then part 1's, ...: a collective a part and gather
 * group. */
static void send_split(struct win *w, int k, int win)
{
	const struct model_comm *c = w->comm;
	struct win_slot *s = &w->slot[k];
	s->split = true;
	for (int p = 0; p < w->nparts; p++)
		for (int g = 0; g < w->ngg && !*w->rc; g++) {
			size_t pack = rows_pack_part(w, &w->gg[g], s->l0, s->l1, false, 1u << p);
			int nrun, nmv;
			if (!pack)
				continue;
			s->listed[g] = true;
			if ((nrun = rows_list_make(w, g, w->wl[win], false, s->l0, s->l1, 1u << p)) < 0 ||
			    (nmv = rows_own_moves(w, g, w->wl[win], false, s->l0, s->l1, 1u << p)) < 0) {
				rows_list_oom(w, "gather");
				return;
			}
			*w->rc = c->start_all_gather_v(c->ctx, w->gg[g].axes, w->run, nrun, w->counts, w->mv, nmv,
						       &s->gh[p][g]);
		}
}

/* Sends slot k's gather, into weight window win (a layer group's): as a
 * list in place where it can (in two parts with win_set_parts), else
 * packed. */
static void send_gather(struct win *w, int k, int win)
{
	const struct model_comm *c = w->comm;
	struct win_slot *s = &w->slot[k];
	size_t soff = 0, roff = 0;
	int l0 = s->l0, l1 = s->l1;
	bool layer = l0 != WIN_NONLAYER, busy = w->packing;
	if (layer) {
		s->win = win;
		w->owner[win] = k;
		if (w->part && in_place(w, k) && !s->whole) {
			send_split(w, k, win);
			return;
		}
	}
	for (int g = 0; g < w->ngg && !*w->rc; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = rows_pack_size(w, gg, l0, l1, false);
		int nrun, nmv;
		float *base = layer ? w->wl[win] : NULL;
		s->listed[g] = false;
		if (!pack)
			continue;
		if (in_place(w, k) && (nrun = rows_list_make(w, g, base, false, l0, l1, ALL_PARTS)) >= 0 &&
		    (nmv = rows_own_moves(w, g, base, false, l0, l1, ALL_PARTS)) >= 0) {
			s->listed[g] = true;
			*w->rc = c->start_all_gather_v(c->ctx, gg->axes, w->run, nrun, w->counts, w->mv, nmv,
						       &s->gh[0][g]);
			continue;
		}
		/* the packed buffers are one set: a gather beside one in
		 * flight goes in place only (start_next), unless its list
		 * could not be made */
		if (busy) {
			rows_list_oom(w, "gather");
			break;
		}
		if (layer && (*w->rc = layer_packs(w)))
			break;
		w->packing = true;
		s->sbase[g] = roff;  /* where its packs land */
		float *send = w->pk[layer].gsend + soff, *recv = w->pk[layer].grecv + roff;
		pack = 0;
		for (int l = l0; l < l1; l++)
			for (int i = 0; i < w->n; i++) {
				if (!in_group(w, i, l, gg->axes, false))
					continue;
				size_t n = param_slice_numel(w->t[i].p);
				memcpy(send + pack, storage(w, w->params, i, l), n * sizeof(float));
				pack += n;
			}
		w->copied += pack;
		if (c->start_all_gather)
			*w->rc = c->start_all_gather(c->ctx, gg->axes, recv, send, pack * sizeof(float), &s->gh[0][g]);
		else
			*w->rc = c->all_gather(c->ctx, gg->axes, recv, send, pack * sizeof(float));
		soff += pack;
		roff += pack * (size_t)gg->n;
	}
}

/* Sends the queued gathers, oldest first, while they can go: the oldest
 * when none is in flight; beside gathers in flight, one that goes in
 * place into a free weight window (a packed one waits until none is in
 * flight). So gathers started ahead (the next step's first ones, from
 * the update) are all on the communication thread at once, back to
 * back, none waiting for the device to wait for the one before it. */
static void start_next(struct win *w)
{
	while (w->nfly < w->qn) {
		int k = w->queue[w->nfly];
		bool layer = w->slot[k].l0 != WIN_NONLAYER;
		int win = layer ? free_window(w, k) : -1;
		if (w->nfly && (!in_place(w, k) || (layer && win < 0)))
			return;
		assert(!layer || win >= 0);
		w->nfly++;
		send_gather(w, k, win);
	}
}

bool win_moves(const struct win *w, bool layer)
{
	return w && w->cnum[layer ? 1 : 0] > 0;
}

int win_gather_start(struct win *w, int k, int l0, int l1)
{
	check_slot(w, k);
	assert(w->slot[k].state == SLOT_FREE);
	check_group(w, l0, l1);
	w->slot[k] = (struct win_slot){ .state = SLOT_GATHERING, .l0 = l0, .l1 = l1, .win = -1, .gwin = -1 };
	w->gathers += l0 >= 0 && w->cnum[1] > 0;  /* one that moves weights */
	/* a layer's second gather in a step (the backward's, waited for
	 * whole) goes whole: one collective a gather group, not one a part */
	if (l0 >= 0 && l0 < 256) {
		w->slot[k].whole = w->seen[l0 / 64] >> (l0 % 64) & 1;
		w->seen[l0 / 64] |= 1ull << (l0 % 64);
	}
	w->queue[w->qn++] = k;
	start_next(w);
	return *w->rc;
}

/* A free gradient window: there are windows + 1, at most windows READY
 * layer slots hold one each and the reduce-scatter in flight one. */
static int free_gwindow(const struct win *w)
{
	for (int j = 0; j <= w->lo.windows; j++)
		if (w->gowner[j] == -1)
			return j;
	assert(!"no free gradient window");
	return -1;
}

/* Waits for the oldest gather in flight, places it into its window
 * (READY) and sends what may go next. */
static void finish_landing(struct win *w)
{
	int k = w->queue[0];
	struct win_slot *s = &w->slot[k];
	bool packed = false;
	assert(w->nfly > 0);
	memmove(w->queue, w->queue + 1, sizeof(*w->queue) * (size_t)--w->qn);
	w->nfly--;
	if (s->l0 == WIN_NONLAYER) {
		assert(w->nl_ready < 0);
		w->nl_ready = k;
	} else {
		s->gwin = free_gwindow(w);
		w->gowner[s->gwin] = k;
		rows_pend_clear(w, s->gwin);
	}
	for (int g = 0; g < w->ngg; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = rows_pack_size(w, gg, s->l0, s->l1, false);
		for (int p = 0; p < WIN_MAX_PARTS; p++)
			wait_handle(w, &s->gh[p][g]);
		packed |= pack && !s->listed[g];
		if (!pack || *w->rc || s->listed[g])
			continue;
		rows_place_blocks(w, gg, k, false, w->pk[s->l0 != WIN_NONLAYER].grecv + s->sbase[g], pack,
			     true);
	}
	if (packed)
		w->packing = false;
	s->state = SLOT_READY;
	s->got = 0;
	start_next(w);
}

int win_wait(struct win *w, int k)
{
	check_slot(w, k);
	assert(w->slot[k].state != SLOT_FREE);
	while (w->slot[k].state != SLOT_READY) {
		start_next(w);
		finish_landing(w);
	}
	return *w->rc;
}

int win_wait_part(struct win *w, int k, int p)
{
	struct win_slot *s = &w->slot[k];
	check_slot(w, k);
	assert(s->state != SLOT_FREE);
	while (s->state != SLOT_READY && s->got <= p) {
		start_next(w);
		/* parts before the last: their own handles (the last lands
		 * the slot, READY) */
		if (w->queue[0] == k && s->split && p + 1 < w->nparts) {
			for (; s->got <= p; s->got++)
				for (int g = 0; g < w->ngg; g++)
					wait_handle(w, &s->gh[s->got][g]);
			break;
		}
		finish_landing(w);
	}
	return *w->rc;
}

int win_wait_first(struct win *w, int k)
{
	return win_wait_part(w, k, 0);
}

void win_release(struct win *w, int k)
{
	struct win_slot *s = &w->slot[k];
	check_slot(w, k);
	assert(s->state == SLOT_READY);
	if (s->l0 == WIN_NONLAYER) {
		w->nl_ready = -1;
	} else {
		w->owner[s->win] = -1;
		w->gowner[s->gwin] = -1;
		rows_pend_clear(w, s->gwin);
	}
	s->state = SLOT_FREE;
	s->win = s->gwin = -1;
	/* a gather queued for want of a window may go now */
	start_next(w);
}

void win_zero_grads(struct win *w, int k)
{
	const struct win_slot *s = &w->slot[k];
	check_slot(w, k);
	assert(s->state == SLOT_READY);
	for (int l = s->l0; l < s->l1; l++)
		for (int i = 0; i < w->n; i++) {
			if (!w->t[i].p || !w->t[i].pp->gather || !in_group(w, i, l, w->t[i].pp->gather, true))
				continue;
			if (s->l0 == WIN_NONLAYER)
				rows_zero_block(w, i, l, k);
			else
				*pend_at(w, s->gwin, i, l, s->l0) = 1;
		}
}

void win_grads_written(struct win *w, int k)
{
	const struct win_slot *s = &w->slot[k];
	check_slot(w, k);
	assert(s->state == SLOT_READY);
	if (s->l0 != WIN_NONLAYER)
		rows_pend_clear(w, s->gwin);
}

size_t win_zeroed(const struct win *w) { return w->zeroed; }

bool win_scatter_beside(const struct win *w, int k)
{
	check_slot(w, k);
	return w->comm && w->comm->start_reduce_scatter && w->nsc && w->sc[w->nsc - 1].s0 != WIN_NONLAYER &&
	       !w->nscattering &&
	       w->slot[k].state == SLOT_READY && w->slot[k].l0 == WIN_NONLAYER;
}

/* Non-layer slot k's reduce-scatter beside the layer group's in flight:
 * packed from its gradient window into pk[0] (the layer group's uses
 * its own gradient window or pk[1]), its own handles. */
static void scatter_nl_start(struct win *w, int k)
{
	const struct model_comm *c = w->comm;
	size_t soff = 0, roff = 0;
	for (int g = 0; g < w->ngg && !*w->rc; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = rows_pack_size(w, gg, WIN_NONLAYER, 0, true);
		if (!pack)
			continue;
		float *send = w->pk[0].ssend + soff, *recv = w->pk[0].srecv + roff;
		rows_place_blocks(w, gg, k, true, send, pack, false);
		*w->rc = c->start_reduce_scatter(c->ctx, gg->axes, recv, send, pack, &w->nsh[g]);
		soff += pack * (size_t)gg->n;
		roff += pack;
	}
	w->nscattering = true;
}

/* Waits for the non-layer reduce-scatter gone out beside, and adds its
 * parts into the gradient shards (the tensors no layer group holds). */
static void scatter_nl_finish(struct win *w)
{
	size_t roff = 0;
	if (!w->nscattering)
		return;
	w->nscattering = false;
	for (int g = 0; g < w->ngg; g++) {
		wait_handle(w, &w->nsh[g]);
		roff = rows_add_parts(w, &w->gg[g], WIN_NONLAYER, -1, w->pk[0].srecv, roff);
	}
}

/* Waits for reduce-scatter c in flight and adds it in (a list's own
 * block the collective added). */
static void scatter_land(struct win *w, struct scat *c)
{
	size_t roff = 0;
	bool layer = c->s0 != WIN_NONLAYER;
	for (int g = 0; g < w->ngg; g++) {
		const struct mesh_members *gg = &w->gg[g];
		wait_handle(w, &c->sh[g]);
		for (int l = c->s0; l < c->s1 && !c->slisted[g]; l++)
			roff = rows_add_parts(w, gg, l, c->spart, w->pk[layer].srecv, roff);
	}
	if (c->sgwin >= 0 && !c->skeep)
		w->gowner[c->sgwin] = -1;
}

int win_scatter_finish(struct win *w)
{
	for (int j = 0; j < w->nsc; j++)
		scatter_land(w, &w->sc[j]);
	w->nsc = 0;
	/* the non-layer one beside went out after them */
	scatter_nl_finish(w);
	return *w->rc;
}

/* Starts gather group g's reduce-scatter of slot s's part (< 0: the
 * whole group) in place over the rows of the slot's gradient window;
 * false, and nothing started, when the list cannot be made. */
static bool scatter_listed(struct win *w, int g, const struct win_slot *s, unsigned part)
{
	const struct model_comm *c = w->comm;
	struct scat *x = &w->sc[w->nsc];
	int nrun = rows_list_make(w, g, w->gl[s->gwin], true, s->l0, s->l1, part), nmv;
	if (nrun < 0 || (nmv = rows_own_moves(w, g, w->gl[s->gwin], true, s->l0, s->l1, part)) < 0)
		return false;
	x->slisted[g] = true;
	*w->rc = c->start_reduce_scatter_v(c->ctx, w->gg[g].axes, w->run, nrun, w->counts, w->mv, nmv, &x->sh[g]);
	return true;
}

int win_scatter_start(struct win *w, int k)
{
	const struct model_comm *c = w->comm;
	struct win_slot *s = &w->slot[k];
	size_t soff = 0, roff = 0;
	bool layer = s->l0 != WIN_NONLAYER, inplace = false;
	check_slot(w, k);
	assert(s->state == SLOT_READY);
	if (win_scatter_beside(w, k)) {
		scatter_nl_start(w, k);
		return *w->rc;
	}
	if (!win_scatter_follows(w, k))
		win_scatter_finish(w);
	rows_pend_flush(w, k, ~s->sent);
	struct scat *x = &w->sc[w->nsc];
	*x = (struct scat){ .s0 = s->l0, .s1 = s->l1, .sgwin = -1, .spart = ~s->sent };
	for (int g = 0; g < w->ngg && !*w->rc; g++) {
		const struct mesh_members *gg = &w->gg[g];
		size_t pack = rows_pack_part(w, gg, s->l0, s->l1, true, ~s->sent);
		if (!pack)
			continue;
		if (layer && c->start_reduce_scatter_v && scatter_listed(w, g, s, ~s->sent)) {
			inplace = true;
			continue;
		}
		if (s->sent) {  /* parts went out: only a list leaves them out */
			rows_list_oom(w, "reduce-scatter");
			break;
		}
		if (layer && (*w->rc = layer_packs(w)))
			break;
		float *send = w->pk[layer].ssend + soff, *recv = w->pk[layer].srecv + roff;
		rows_place_blocks(w, gg, k, true, send, pack, false);
		if (c->start_reduce_scatter)
			*w->rc = c->start_reduce_scatter(c->ctx, gg->axes, recv, send, pack, &x->sh[g]);
		else
			*w->rc = c->reduce_scatter(c->ctx, gg->axes, recv, send, pack);
		soff += pack * (size_t)gg->n;
		roff += pack;
	}
	if (inplace) {
		/* the reduce-scatter keeps the gradient window; the slot takes
		 * a free one (the caller zeroes it before writing) */
		x->sgwin = s->gwin;
		w->gowner[s->gwin] = GW_SCATTER;
		s->gwin = free_gwindow(w);
		w->gowner[s->gwin] = k;
		rows_pend_clear(w, s->gwin);
	}
	w->nsc++;
	s->sent = 0;
	return *w->rc;
}

bool win_scatter_follows(const struct win *w, int k)
{
	const struct win_slot *s = &w->slot[k];
	bool rest = false;
	check_slot(w, k);
	if (!w->nsc || w->nsc == WIN_SCATTERS || w->nscattering || s->state != SLOT_READY || !s->sent)
		return false;
	for (int j = 0; j < w->nsc; j++)
		if (!w->sc[j].skeep || w->sc[j].s0 != s->l0)
			return false;
	/* a rest to send (in place, as the parts went): else the slot keeps
	 * the gradient window they still read */
	for (int g = 0; g < w->ngg && !rest; g++)
		rest = rows_pack_part(w, &w->gg[g], s->l0, s->l1, true, ~s->sent) > 0;
	return rest;
}

int win_scatter_first(struct win *w, int k)
{
	return win_scatter_parts(w, k, w->part ? 1u << (w->nparts - 1) : 0);
}

int win_scatter_parts(struct win *w, int k, unsigned parts)
{
	const struct model_comm *c = w->comm;
	struct win_slot *s = &w->slot[k];
	bool any = false;
	check_slot(w, k);
	assert(s->state == SLOT_READY);
	parts &= ~s->sent;
	if (!w->part || !parts || s->l0 == WIN_NONLAYER || !c || !c->start_reduce_scatter_v)
		return *w->rc;
	/* one more in flight beside those before (the slot's parts before:
	 * the same gradient window, other rows; another layer group's:
	 * its own), the same choice on every member: a rule of the calls
	 * alone; the in-flight ones land first only when they fill the
	 * queue or the non-layer group's went beside them */
	if (w->nsc == WIN_SCATTERS || w->nscattering)
		win_scatter_finish(w);
	rows_pend_flush(w, k, parts);
	struct scat *x = &w->sc[w->nsc];
	*x = (struct scat){ .s0 = s->l0, .s1 = s->l1, .sgwin = s->gwin, .spart = parts, .skeep = true };
	for (int g = 0; g < w->ngg && !*w->rc; g++) {
		if (!rows_pack_part(w, &w->gg[g], s->l0, s->l1, true, parts))
			continue;
		if (!scatter_listed(w, g, s, parts)) {
			rows_list_oom(w, "reduce-scatter");
			break;
		}
		any = true;
	}
	if (!any)
		return *w->rc;
	/* in place over those parts' rows of the slot's gradient window,
	 * which the slot keeps (the other parts' rows are still being
	 * written) */
	s->sent |= parts;
	w->nsc++;
	return *w->rc;
}

int win_set_parts(struct win *w, const signed char *part, const signed char *part0)
{
	free(w->part);
	w->part = w->part0 = w->partw = NULL;
	w->nparts = 1;
	if (!part)
		return 0;
	if (!(w->part = malloc(3 * (size_t)w->n)))
		return -ENOMEM;
	w->part0 = w->part + w->n;
	memcpy(w->part, part, (size_t)w->n);
	memcpy(w->part0, part0 ? part0 : part, (size_t)w->n);
	w->fine_l = -1;
	for (int i = 0; i < 2 * w->n; i++) {
		assert(w->part[i] >= 0 && w->part[i] < WIN_MAX_PARTS);
		w->nparts = w->part[i] + 1 > w->nparts ? w->part[i] + 1 : w->nparts;
	}
	return 0;
}

void win_set_fine(struct win *w, int l, const signed char *partw)
{
	w->fine_l = l;
	w->partw = NULL;
	if (!w->part || !partw)
		return;
	w->partw = w->part + 2 * (size_t)w->n;
	memcpy(w->partw, partw, (size_t)w->n);
	for (int i = 0; i < w->n; i++)
		assert(w->partw[i] >= 0 && w->partw[i] < WIN_MAX_PARTS);
}

int win_end(struct win *w)
{
	for (int g = 0; g < w->ngg; g++) {
		for (int k = 0; k < w->nslots; k++)
			for (int p = 0; p < WIN_MAX_PARTS; p++)
				wait_handle(w, &w->slot[k].gh[p][g]);
		for (int j = 0; j < w->nsc; j++)
			wait_handle(w, &w->sc[j].sh[g]);
		wait_handle(w, &w->nsh[g]);
	}
	w->nsc = 0;
	w->packing = w->nscattering = false;
	w->gathers = 0;
	memset(w->seen, 0, sizeof(w->seen));
	w->nl_ready = -1;
	w->qn = w->nfly = 0;
	for (int j = 0; j <= w->lo.windows; j++) {
		w->owner[j] = w->gowner[j] = -1;
		rows_pend_clear(w, j);
	}
	for (int k = 0; k < w->nslots; k++)
		w->slot[k] = (struct win_slot){ .state = SLOT_FREE, .win = -1, .gwin = -1 };
	return *w->rc;
}

void win_poison(struct win *w)
{
	size_t lay = (size_t)w->lo.lcap * w->cnum[1];
	/* only the windows no slot holds: a gather started before the step
	 * (the next step's first layers, from the optimizer) lands in place
	 * in its weight window, which is not idle */
	for (int j = 0; j <= w->lo.windows && w->mem; j++)
		for (size_t k = 0; k < lay; k++) {
			if (w->owner[j] < 0)
				w->wl[j][k] = NAN;
			if (w->gowner[j] < 0)
				w->gl[j][k] = NAN;
		}
}

/* The slot whose weights of tensor i, layer l (stacked) can be read
 * (READY, or the part holding it landed), or -1. */
static int slot_holding(struct win *w, bool grads, int i, int l)
{
	for (int j = 0; j <= w->lo.windows; j++) {
		int k = w->owner[j];
		if (k < 0 || l < w->slot[k].l0 || l >= w->slot[k].l1)
			continue;
		/* a part after those landed (win_wait_part): the caller reads
		 * it before waiting for it (the model's forward, tensor by
		 * tensor); wait now */
		if (w->slot[k].got && (grads || part_of(w, i, l, false) >= w->slot[k].got))
			win_wait_part(w, k, grads ? w->nparts - 1 : part_of(w, i, l, false));
		if (w->slot[k].state == SLOT_READY || w->slot[k].got)
			return k;
	}
	return -1;
}

bool win_grad_write(struct win *w, int i, int l, size_t n)
{
	if (!w->t[i].p->stacked)
		return false;
	int k = slot_holding(w, true, i, l);
	assert(k >= 0 && w->slot[k].state == SLOT_READY);
	if (!rows_unmark(w, i, l, k))
		return false;
	if (n == per_cslice(w->t[i].pp, w->t[i].p))
		return true;
	rows_zero_block(w, i, l, k);
	return false;
}

float *win_block(struct win *w, bool grads, int i, int l)
{
	if (!w->t[i].p->stacked) {
		assert(w->nl_ready >= 0);
		return block(w, grads, i, l, w->nl_ready);
	}
	int k = slot_holding(w, grads, i, l);
	assert(k >= 0 && "no READY slot holds the layer");
	if (grads && rows_unmark(w, i, l, k))  /* read or added to: zeroed first */
		rows_zero_block(w, i, l, k);
	return block(w, grads, i, l, k);
}
