/* The FSDP window's inside (host/model/window.h), shared by its two
 * rooms: window.c (its life, slots, gathers and reduce-scatters: when
 * things move) and window_rows.c (where blocks and rows lie, packs, the
 * copies between the shards and the window, the deferred-zero marks).
 * window.c calls window_rows.c, never the other way. Private to them. */
#ifndef MESHRUN_WINDOW_INT_H
#define MESHRUN_WINDOW_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/mesh/mesh.h"
#include "host/mesh/plan.h"
#include "host/model/param.h"

#define WIN_MAX_GROUPS 8            /* distinct gather axis sets */
#define ALL_PARTS (~0u)             /* a parts mask: every tensor */
#define WIN_SCATTERS 4              /* reduce-scatters in flight at most */

enum slot_state { SLOT_FREE, SLOT_GATHERING, SLOT_READY };

struct win_slot {
	enum slot_state state;
	int l0, l1;                 /* the group it holds */
	int win;                    /* its weight window (layer groups, from the
				     * moment its gather goes out), else -1 */
	int gwin;                   /* READY: its gradient window (layer groups), else -1 */
	/* its gather in flight: each gather group's handle, whether it went
	 * as a list (in place), where its pack lands (packed) */
	void *gh[WIN_MAX_PARTS][WIN_MAX_GROUPS];  /* [0] the whole, or each part's */
	bool listed[WIN_MAX_GROUPS];
	bool split;                 /* its gather went in parts (win_set_parts) */
	bool whole;                 /* its layer was gathered before in the step:
				     * whole, for a backward that waits for all */
	int got;                    /* GATHERING: parts [0, got) landed (win_wait_part) */
	unsigned sent;              /* READY: the parts whose reduce-scatter went out */
	size_t sbase[WIN_MAX_GROUPS];
};

struct win {
	const struct mesh *mesh;
	int n;
	struct win_tensor *t;       /* [n] */
	struct win_layout lo;
	size_t *woff;               /* [n] a gathered tensor's block in its window (per layer) */
	size_t cnum[2];             /* compute-shaped floats: [0] non-layer, [1] one layer */
	size_t snum[2];             /* this device's shards of them */
	struct mesh_members gg[WIN_MAX_GROUPS];  /* gather groups */
	int grank[WIN_MAX_GROUPS];  /* this device's rank in each */
	int ngg;
	/* buffers: the non-layer group's weights and gradients, each layer
	 * window's; the packed buffers a gather sends from (part) and lands
	 * in (whole), and a reduce-scatter sends from (whole) and receives in
	 * (part): pk[0] the non-layer group's, pk[1] a layer group's (only
	 * without the comm's list forms, allocated then: lmem) */
	void *mem, *lmem;
	float *wnl, *gnl;
	float **wl, **gl;           /* [lo.windows + 1] each, lcap layers each:
				     * one weight window more for the gather in
				     * flight to land in, one gradient window
				     * more for the reduce-scatter in flight */
	struct packs {
		float *gsend, *grecv, *ssend, *srecv;
	} pk[2];
	float *params, *grads;
	/* state */
	int nslots;                 /* lo.windows + 2 */
	struct win_slot *slot;      /* [nslots] */
	int *owner;                 /* [lo.windows + 1] the slot (READY, or its gather
				     * in flight) in each layer weight window, or -1 */
	int *gowner;                /* [lo.windows + 1] the READY slot in each
				     * gradient window, or -1 (GW_SCATTER: the
				     * reduce-scatter in flight's) */
	/* a list collective's runs (every member's rows, members in rank
	 * order, adjacent ones merged; grown on demand) and each member's
	 * count; which gather groups of the gather in flight went as lists,
	 * and of the reduce-scatter in flight; where the packed ones land */
	struct model_run *run;
	int runcap;
	size_t counts[MESH_MAX_DEVICES];
	/* the own block's moves a list collective does itself (a gather's
	 * shards in, a reduce-scatter's sums out), and the rows they are
	 * cut from (grown on demand) */
	struct model_move *mv;
	int mvcap;
	struct model_run *orow;
	int orowcap;
	size_t copied;              /* floats the window copied (packs, places, sums),
				     * or handed to a list collective to move
				     * (counted when it starts) */
	int nl_ready;               /* the READY non-layer slot, or -1 */
	int *queue, qn;             /* GATHERING slots, oldest first: the first nfly
				     * in flight (started), the others not yet */
	int nfly;
	bool packing;               /* a packed gather is in flight (its buffers are
				     * the one set: one at a time) */
	int gathers;                /* layer-group gathers since win_end */
	uint64_t seen[4];           /* layers < 256 gathered since win_end */
	/* the reduce-scatters in flight, oldest first (up to WIN_SCATTERS:
	 * parts sent ahead beside those in flight, win_scatter_parts, and
	 * a slot's rest beside its parts, win_scatter_follows): each one's
	 * group, gradient window (in place) or -1, whether each gather group
	 * went as a list, its handles, its parts (a mask) and whether it
	 * keeps the slot's gradient window (parts sent ahead: the slot
	 * still writes the other parts' rows of it) */
	struct scat {
		int s0, s1, sgwin;
		bool slisted[WIN_MAX_GROUPS], skeep;
		void *sh[WIN_MAX_GROUPS];
		unsigned spart;
	} sc[WIN_SCATTERS];
	int nsc;
	/* the non-layer group's reduce-scatter, gone out beside a layer
	 * group's in flight (packed, pk[0]): its handles */
	bool nscattering;
	void *nsh[WIN_MAX_GROUPS];
	const struct model_comm *comm;
	int *rc;
	/* win_set_parts: each tensor's part (0 .. nparts - 1), or NULL:
	 * whole, and in layer 0 (part0); win_set_fine: the gradients (not
	 * the weights) of layer 0 and of layer fine_l (-1: none) take
	 * partw (NULL: as before) */
	signed char *part, *part0, *partw;
	int nparts, fine_l;
	/* deferred zeroing (win_zero_grads): [gradient window][layer of its
	 * group][tensor], 1 while the block holds stale gradients that its
	 * first write overwrites (win_grad_write) or anything else zeroes
	 * first; floats zeroed since the window was made */
	unsigned char *pend;
	size_t zeroed;
};

static inline size_t per_cslice(const struct plan_param *pp, const struct param_info *p)
{
	return p->stacked ? pp->cnumel / (size_t)pp->cshape[0] : pp->cnumel;
}

/* The storage slice of layer l of stacked tensor i here, or -1. */
static inline int slice_of(const struct win *w, int i, int l)
{
	int q = w->lo.slice(w->lo.ctx, i, l);
	return q >= 0 && q < w->t[i].p->shape[0] ? q : -1;
}

/* Is tensor i gathered over axes and in layer l's part of a group (l < 0:
 * the non-layer tensors)? With grads, only tensors that have gradients. */
static inline bool in_group(const struct win *w, int i, int l, uint32_t axes, bool grads)
{
	const struct win_tensor *x = &w->t[i];
	if (!x->p || x->pp->gather != axes || (grads && x->p->opt == OPT_NONE))
		return false;
	return l < 0 ? !x->p->stacked : x->p->stacked && slice_of(w, i, l) >= 0;
}

/* Tensor i's part in layer l, of its gradients (grads) or weights
 * (win_set_parts: layer 0's may differ; win_set_fine: layer 0's and
 * fine_l's gradients'). */
static inline int part_of(const struct win *w, int i, int l, bool grads)
{
	if (grads && w->partw && (l == 0 || l == w->fine_l))
		return w->partw[i];
	return (l == 0 ? w->part0 : w->part)[i];
}

/* Is tensor i of layer l in one of the parts of mask (of its gradients
 * or weights)? */
static inline bool in_part(const struct win *w, int i, int l, bool grads, unsigned mask)
{
	return !w->part || (mask >> part_of(w, i, l, grads) & 1u);
}

/* Tensor i's storage slice for layer l in buf (params or grads). */
static inline float *storage(const struct win *w, float *buf, int i, int l)
{
	const struct param_info *p = w->t[i].p;
	return buf + p->offset + (p->stacked ? param_slice_numel(p) * (size_t)slice_of(w, i, l) : 0);
}

#define GW_SCATTER (-2)

/* Tensor i's compute-shaped block for layer l in layer window base
 * (holding layers from l0), or the non-layer window's (grads or not). */
static inline float *block_in(const struct win *w, float *base, bool grads, int i, int l, int l0)
{
	if (!w->t[i].p->stacked)
		return (grads ? w->gnl : w->wnl) + w->woff[i];
	return base + (size_t)(l - l0) * w->cnum[1] + w->woff[i];
}

/* Tensor i's compute-shaped block for layer l of the group in READY slot k. */
static inline float *block(const struct win *w, bool grads, int i, int l, int k)
{
	const struct win_slot *s = &w->slot[k];
	float *base = !w->t[i].p->stacked ? NULL : grads ? w->gl[s->gwin] : w->wl[s->win];
	return block_in(w, base, grads, i, l, s->l0);
}

/* The deferred-zero mark of tensor i's block of layer l in gradient
 * window gwin, which holds the layers of a group from l0. */
static inline unsigned char *pend_at(const struct win *w, int gwin, int i, int l, int l0)
{
	return &w->pend[((size_t)gwin * (size_t)w->lo.lcap + (size_t)(l - l0)) * (size_t)w->n + (size_t)i];
}

/* window_rows.c. The deferred-zero marks of a gradient window: gwin
 * changes hands (cleared); a block zeroed; a mark taken (whether it was
 * set); slot k's parts' marked blocks zeroed (before a reduce-scatter
 * reads them). */
void rows_pend_clear(struct win *w, int gwin);
void rows_zero_block(struct win *w, int i, int l, int k);
bool rows_unmark(struct win *w, int i, int l, int k);
void rows_pend_flush(struct win *w, int k, unsigned mask);
/* Packs: floats a group packs per member (of some parts, or all); the
 * copies between the packs and the window. */
size_t rows_pack_part(const struct win *w, const struct mesh_members *gg, int l0, int l1, bool grads,
			unsigned part);
size_t rows_pack_size(const struct win *w, const struct mesh_members *gg, int l0, int l1, bool grads);
void rows_place_blocks(struct win *w, const struct mesh_members *gg, int ks, bool grads,
			 float *packed, size_t pack, bool into_window);
/* Lists of rows (in place): every member's blocks into w->run and
 * w->counts (the runs, or -1); this device's blocks' moves into w->mv
 * (the moves, or -1): from its shards into them (a gather's input) or
 * (grads) out of them added into its gradient shards (a reduce-scatter's
 * sums), which the collective does, on its thread; a list that could
 * not be made (the step's -ENOMEM, said in the comm's err). */
int rows_list_make(struct win *w, int g, float *base, bool grads, int l0, int l1, unsigned part);
int rows_own_moves(struct win *w, int g, float *base, bool grads, int l0, int l1, unsigned part);
void rows_list_oom(struct win *w, const char *what);
/* A packed reduce-scatter landed: its received parts added into the
 * gradient shards (the offset after them). */
size_t rows_add_parts(struct win *w, const struct mesh_members *gg, int l, int part, const float *recv,
			size_t roff);

#endif
