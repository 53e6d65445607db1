/* The FSDP window's rows (host/model/window_int.h): where each tensor's
 * block lies, the lists of every member's rows a collective moves in
 * place, packs, the copies between the shards and the window (own
 * shards in, reduced gradients added out) and the deferred-zero marks.
 * It knows a slot only as where its group lies, and calls nothing of
 * window.c. */
#include "host/model/window_int.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

void rows_pend_clear(struct win *w, int gwin)  /* gwin changes hands */
{
	if (gwin >= 0)
		memset(pend_at(w, gwin, 0, 0, 0), 0, (size_t)w->lo.lcap * (size_t)w->n);
}

/* Zeroes tensor i's gradient block of layer l in READY slot k. */
void rows_zero_block(struct win *w, int i, int l, int k)
{
	size_t n = per_cslice(w->t[i].pp, w->t[i].p);
	memset(block(w, true, i, l, k), 0, n * sizeof(float));
	w->zeroed += n;
}

/* Whether tensor i's block of layer l in READY layer slot k was marked
 * (its zeroing deferred); it is not any more. */
bool rows_unmark(struct win *w, int i, int l, int k)
{
	unsigned char *p = pend_at(w, w->slot[k].gwin, i, l, w->slot[k].l0), was = *p;
	*p = 0;
	return was;
}

/* Zeroes the marked blocks of READY slot k's parts of mask (before a
 * reduce-scatter reads them). */
void rows_pend_flush(struct win *w, int k, unsigned mask)
{
	const struct win_slot *s = &w->slot[k];
	for (int l = s->l0; l < s->l1 && s->l0 != WIN_NONLAYER; l++)
		for (int i = 0; i < w->n; i++)
			if (in_part(w, i, l, true, mask) && rows_unmark(w, i, l, k))
				rows_zero_block(w, i, l, k);
}

/* Floats group [l0, l1) packs for gather group gg (per member). */
size_t rows_pack_part(const struct win *w, const struct mesh_members *gg, int l0, int l1, bool grads,
			unsigned part)
{
	size_t pack = 0;
	for (int l = l0; l < l1; l++)
		for (int i = 0; i < w->n; i++)
			if (in_group(w, i, l, gg->axes, grads) && in_part(w, i, l, grads, part))
				pack += param_slice_numel(w->t[i].p);
	return pack;
}

size_t rows_pack_size(const struct win *w, const struct mesh_members *gg, int l0, int l1, bool grads)
{
	return rows_pack_part(w, gg, l0, l1, grads, ALL_PARTS);
}

/* Moves member r's blocks of group [l0, l1) between the packed buffer
 * (pack floats per member) and the window. */
void rows_place_blocks(struct win *w, const struct mesh_members *gg, int ks, bool grads,
			 float *packed, size_t pack, bool into_window)
{
	int l0 = w->slot[ks].l0, l1 = w->slot[ks].l1;
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
				plan_copy_block(block(w, grads, i, l, ks), pp->cshape + k,
						packed + (size_t)r * pack + off, p->shape + k, o + k,
						p->ndim - k, into_window);
				off += param_slice_numel(p);
			}
	}
	w->copied += pack * (size_t)gg->n;
}

/* Appends a run to list *v (cap *cap, *nrun long), merged into the last
 * when merge and it continues it; false when out of memory. */
static bool add_run(struct model_run **v, int *cap, int *nrun, float *buf, size_t n, bool merge)
{
	struct model_run *last = *nrun ? &(*v)[*nrun - 1] : NULL;
	if (merge && last && last->buf + last->n == buf) {
		last->n += n;
		return true;
	}
	if (*nrun == *cap) {
		int c = *cap ? 2 * *cap : 256;
		struct model_run *r = realloc(*v, sizeof(*r) * (size_t)c);
		if (!r)
			return false;
		*v = r;
		*cap = c;
	}
	(*v)[(*nrun)++] = (struct model_run){ buf, n };
	return true;
}

/* Appends the rows of member r's block of tensor i's layer l, whose
 * compute-shaped tensor is at tensor, to list *v (cap *cap, *nrun long;
 * rows of the innermost dimension, as plan_copy_block walks them;
 * adjacent ones merged). */
static bool block_runs(struct win *w, const struct mesh_members *gg, int r, int i, float *tensor,
		       struct model_run **v, int *cap, int *nrun)
{
	const struct param_info *p = w->t[i].p;
	const struct plan_param *pp = w->t[i].pp;
	int o[SHARD_MAX_DIMS], idx[SHARD_MAX_DIMS] = { 0 }, s0 = p->stacked ? 1 : 0, nd = p->ndim - s0;
	const int *ts = pp->cshape + s0, *bs = p->shape + s0, *off = o + s0;
	size_t run = nd ? (size_t)bs[nd - 1] : 1, nrows = 1;
	plan_block_offsets(pp, w->mesh, gg->axes, gg->coord[r], o);
	for (int d = 0; d < nd; d++)
		if (bs[d] == 0)
			return true;
	for (int d = 0; d + 1 < nd; d++)
		nrows *= (size_t)bs[d];
	for (size_t row = 0; row < nrows; row++) {
		size_t t = 0;
		for (int d = 0; d < nd; d++)
			t = t * (size_t)ts[d] + (size_t)(off[d] + (d + 1 < nd ? idx[d] : 0));
		if (!add_run(v, cap, nrun, tensor + t, run, true))
			return false;
		for (int d = nd - 2; d >= 0; d--) {
			if (++idx[d] < bs[d])
				break;
			idx[d] = 0;
		}
	}
	return true;
}

/* The list of gather group g's blocks of group [l0, l1) in layer window
 * base (weights, or gradients with grads): every member's rows in rank
 * order into w->run, each member's count into w->counts. The runs, or
 * -1 when out of memory. */
int rows_list_make(struct win *w, int g, float *base, bool grads, int l0, int l1, unsigned part)
{
	const struct mesh_members *gg = &w->gg[g];
	int nrun = 0;
	for (int r = 0; r < gg->n; r++) {
		int first = nrun;
		size_t before = 0;
		for (int j = 0; j < first; j++)
			before += w->run[j].n;
		for (int l = l0; l < l1; l++)
			for (int i = 0; i < w->n; i++)
				if (in_group(w, i, l, gg->axes, grads) && in_part(w, i, l, grads, part) &&
				    !block_runs(w, gg, r, i, block_in(w, base, grads, i, l, l0), &w->run, &w->runcap,
						&nrun))
					return -1;
		size_t all = 0;
		for (int j = 0; j < nrun; j++)
			all += w->run[j].n;
		w->counts[r] = all - before;
	}
	return nrun;
}

/* Appends a move to w->mv (*nmv long), merged into the last when both
 * its ends continue it; false when out of memory. */
static bool add_move(struct win *w, int *nmv, float *dst, const float *src, size_t n)
{
	struct model_move *last = *nmv ? &w->mv[*nmv - 1] : NULL;
	if (last && last->dst + last->n == dst && last->src + last->n == src) {
		last->n += n;
		return true;
	}
	if (*nmv == w->mvcap) {
		int c = w->mvcap ? 2 * w->mvcap : 256;
		struct model_move *m = realloc(w->mv, sizeof(*m) * (size_t)c);
		if (!m)
			return false;
		w->mv = m;
		w->mvcap = c;
	}
	w->mv[(*nmv)++] = (struct model_move){ dst, src, n };
	return true;
}

/* This device's blocks of gather group g's tensors of group [l0, l1)
 * (of part) in layer window base: a gather's moves from its weight
 * shards into them, or (grads) a reduce-scatter's out of them, added
 * into its gradient shards (storage order, as the packed path adds its
 * received part), into w->mv, tensor by tensor; the moves, or -1 when
 * out of memory. Counted as copied here: the collective moves them. */
int rows_own_moves(struct win *w, int g, float *base, bool grads, int l0, int l1, unsigned part)
{
	const struct mesh_members *gg = &w->gg[g];
	int nmv = 0;
	for (int l = l0; l < l1; l++)
		for (int i = 0; i < w->n; i++) {
			int nrow = 0;
			if (!in_group(w, i, l, gg->axes, grads) || !in_part(w, i, l, grads, part))
				continue;
			if (!block_runs(w, gg, w->grank[g], i, block_in(w, base, grads, i, l, l0), &w->orow,
					&w->orowcap, &nrow))
				return -1;
			float *sh = storage(w, grads ? w->grads : w->params, i, l);
			for (int r = 0; r < nrow; r++) {
				float *row = w->orow[r].buf;
				size_t n = w->orow[r].n;
				if (!add_move(w, &nmv, grads ? sh : row, grads ? row : sh, n))
					return -1;
				sh += n;
				w->copied += n;
			}
		}
	return nmv;
}

/* A list of a collective's rows (a "gather" or "reduce-scatter")
 * could not be made: the step's error, said in the comm's err. */
void rows_list_oom(struct win *w, const char *what)
{
	if (w->comm->err)
		snprintf(w->comm->err, w->comm->errlen, "FSDP window: out of memory for the list of a %s's rows", what);
	*w->rc = -ENOMEM;
}

/* Adds group gg's received parts of layer l (packed in recv from roff
 * on, tensor by tensor: those of part, or all when part < 0) into the
 * gradient shards; returns the offset after them. */
size_t rows_add_parts(struct win *w, const struct mesh_members *gg, int l, int part, const float *recv,
			size_t roff)
{
	for (int i = 0; i < w->n && !*w->rc; i++) {
		if (!in_group(w, i, l, gg->axes, true) || !in_part(w, i, l, true, part))
			continue;
		size_t n = param_slice_numel(w->t[i].p);
		float *dst = storage(w, w->grads, i, l);
		const float *src = recv + roff;
		for (size_t j = 0; j < n; j++)
			dst[j] += src[j];
		roff += n;
		w->copied += n;
	}
	return roff;
}
