/* Muon in a mesh, once per matrix (host/optim/optim_int.h). A Muon
 * tensor of this device holds nmat matrices (a stack's local layers or
 * experts), each either whole or a block of a matrix split over
 * mat_split. The devices that hold the same local matrices form the
 * tensor's group: those that differ only along mat_split (blocks of one
 * matrix) or along axes the tensor is not split on (identical copies).
 * Matrix j's Newton-Schulz runs on one member, its owner, fixed at start
 * by the plan (muon_plan_init):
 *
 *   1. every member runs the momentum of its own blocks;
 *   2. one all_to_all hands each owner the blocks of its matrices, one
 *      from each mat_split coordinate (from the members that share the
 *      owner's copy coordinates);
 *   3. the owner places them into the whole matrix and orthogonalises it
 *      (the same kernel and bits as on one device);
 *   4. one all_to_all returns each member its block of every result;
 *   5. every member applies its blocks.
 *
 * Steps 2 and 4 run on the device's exchange thread (start_all_to_all),
 * pipelined over the calls: a call does steps 1 and 2 of its tensor,
 * 3 and 4 of the one MUON_AHEAD calls back, 5 of the one before that
 * (advance), so an owner's Newton-Schulz runs while the next tensors'
 * blocks move; muon_flush finishes them all.
 *
 * Stacks split over experts or stages need nothing: the group is over
 * the other axes. The exchanges are Dion's pattern. The owners: longest
 * first, each to its group's least loaded member (muon_assign=size, the
 * default), or Keller Jordan's round robin (muon_assign=round_robin). */
#include "host/optim/optim_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/util/clock.h"
#include "kernels/kernels.h"

static const struct mesh_members *members(struct optim *o, uint32_t axes)
{
	for (int k = 0; k < o->ntg; k++)
		if (o->tg[k].axes == axes)
			return &o->tg[k];
	if (o->ntg == MAX_TGROUPS || mesh_members_init(o->mesh, o->device, axes, &o->tg[o->ntg]))
		return NULL;
	return &o->tg[o->ntg++];
}

uint32_t muon_group_axes(const struct mesh *m, const struct param_info *p)
{
	uint32_t axes = p->mat_split;
	for (int a = 0; a < AX_COUNT; a++)
		if (m->size[a] > 1 && !(p->split & (1u << a)))
			axes |= 1u << a;
	return axes;
}

/* ---- the plan: who orthogonalises what ---- */

struct item {
	int i, j;
	double cost;
};

/* Longest first; ties by tensor, then matrix: the same order everywhere. */
static int longest_first(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	if (x->cost != y->cost)
		return x->cost < y->cost ? 1 : -1;
	if (x->i != y->i)
		return x->i < y->i ? -1 : 1;
	return (x->j > y->j) - (x->j < y->j);
}

/* Tensor p's groups over axes as device lists (ring order), group-major,
 * into grp (num_devices ints); returns this device's group's index. */
static int groups_of(const struct mesh *m, uint32_t axes, int device, int *grp, struct mesh_group *g)
{
	int ng = 0, mine = 0;
	for (int d = 0; d < m->num_devices; d++) {
		mesh_group(m, d, axes, g);
		if (g->devs[0] != d)
			continue;
		for (int r = 0; r < g->n; r++) {
			grp[ng * g->n + r] = g->devs[r];
			mine = g->devs[r] == device ? ng : mine;
		}
		ng++;
	}
	return mine;
}

/* Every device runs the plan of the whole mesh, so the members of a group
 * agree on its owners without a word: the same tensors in the same order
 * (every device's shards have the same shapes), the same arithmetic. */
int muon_plan_init(struct muon_plan *mp, const struct model *m, const struct mesh *mesh, int device,
		   bool by_size)
{
	int np = model_num_params(m), N = mesh->num_devices, nown = 0, nit = 0, rc = -ENOMEM;
	memset(mp, 0, sizeof(*mp));
	mp->ndev = N;
	mp->first = malloc(sizeof(int) * (size_t)(np ? np : 1));
	mp->load = calloc((size_t)N, sizeof(double));
	int **grp = calloc((size_t)(np ? np : 1), sizeof(int *)), *mine = calloc((size_t)(np ? np : 1), sizeof(int));
	struct mesh_group *g = malloc(sizeof(*g));
	struct item *it = NULL;
	if (!mp->first || !mp->load || !grp || !mine || !g)
		goto out;
	for (int i = 0; i < np; i++) {
		const struct param_info *p = model_param(m, i);
		size_t per = (size_t)p->shape[p->ndim - 2] * p->shape[p->ndim - 1];
		mp->first[i] = -1;
		if (p->opt != OPT_MUON)
			continue;
		int nmat = (int)(p->numel / per);
		if (mesh_axes_size(mesh, muon_group_axes(mesh, p)) > 1) {
			mp->first[i] = nown;
			nown += nmat;
		} else {  /* every device orthogonalises its own */
			for (int d = 0; d < N; d++)
				mp->load[d] += nmat * newton_schulz5_flops(p->mat_rows, p->mat_cols);
		}
	}
	mp->owner = malloc(sizeof(int) * (size_t)(nown ? nown : 1));
	it = malloc(sizeof(*it) * (size_t)(nown ? nown : 1));
	if (!mp->owner || !it)
		goto out;
	uint64_t rr = 0;
	for (int i = 0; i < np; i++) {
		const struct param_info *p = model_param(m, i);
		if (mp->first[i] < 0)
			continue;
		uint32_t axes = muon_group_axes(mesh, p);
		int n = mesh_axes_size(mesh, axes), nmat = (int)(p->numel / ((size_t)p->shape[p->ndim - 2] *
									 p->shape[p->ndim - 1]));
		double cost = newton_schulz5_flops(p->mat_rows, p->mat_cols);
		if (!(grp[i] = malloc(sizeof(int) * (size_t)N)))
			goto out;
		mine[i] = groups_of(mesh, axes, device, grp[i], g);
		for (int j = 0; j < nmat; j++) {
			if (by_size) {
				it[nit++] = (struct item){ .i = i, .j = j, .cost = cost };
				continue;
			}
			int r = (int)((rr + (uint64_t)j) % (uint64_t)n);
			mp->owner[mp->first[i] + j] = r;
			for (int k = 0; k < N / n; k++)
				mp->load[grp[i][k * n + r]] += cost;
		}
		rr += (uint64_t)nmat;
	}
	qsort(it, (size_t)nit, sizeof(*it), longest_first);
	for (int t = 0; t < nit; t++) {
		int i = it[t].i, n = mesh_axes_size(mesh, muon_group_axes(mesh, model_param(m, i)));
		for (int k = 0; k < N / n; k++) {
			const int *devs = grp[i] + k * n;
			int best = 0;
			for (int r = 1; r < n; r++)
				best = mp->load[devs[r]] < mp->load[devs[best]] ? r : best;
			mp->load[devs[best]] += it[t].cost;
			if (k == mine[i])
				mp->owner[mp->first[i] + it[t].j] = best;
		}
	}
	rc = 0;
out:
	for (int i = 0; grp && i < np; i++)
		free(grp[i]);
	free(grp);
	free(mine);
	free(g);
	free(it);
	if (rc)
		muon_plan_free(mp);
	return rc;
}

void muon_plan_free(struct muon_plan *mp)
{
	free(mp->first);
	free(mp->owner);
	free(mp->load);
	memset(mp, 0, sizeof(*mp));
}

void muon_plan_spread(const struct muon_plan *mp, double *max, double *min)
{
	*max = *min = mp->ndev ? mp->load[0] : 0;
	for (int d = 1; d < mp->ndev; d++) {
		*max = mp->load[d] > *max ? mp->load[d] : *max;
		*min = mp->load[d] < *min ? mp->load[d] : *min;
	}
}

/* Do members x and y agree on every axis of mask? */
static bool same_on(const int *x, const int *y, uint32_t mask)
{
	for (int a = 0; a < AX_COUNT; a++)
		if ((mask & (1u << a)) && x[a] != y[a])
			return false;
	return true;
}

/* ---- the exchange ---- */

/* Its layout: for each member r, how many of the matrices (matrix j's
 * owner: own[j]) this device sends it (sendc) and receives from it
 * (recvc), and where they start (sendo, recvo). */
struct xch {
	int n, me, nmat;
	const int *own;
	const struct mesh_members *g;
	size_t *sb, *rb;      /* bytes per member: the all_to_all's counts */
	int *so, *ro;         /* first block per member */
};

static int owner(const struct xch *x, int j)
{
	return x->own[j];
}

/* Counts for step 2 (to the owners: a member sends only to owners that
 * share its copy coordinates) or step 4 (back: every member gets its
 * block of every matrix). */
static void counts(struct xch *x, bool back, uint32_t copy, size_t per)
{
	int at_s = 0, at_r = 0;
	for (int r = 0; r < x->n; r++) {
		int s = 0, q = 0;
		bool peer = back || same_on(x->g->coord[r], x->g->coord[x->me], copy);
		for (int j = 0; j < x->nmat; j++) {
			s += peer && owner(x, j) == r;          /* to owner r */
			q += peer && owner(x, j) == x->me;      /* r's block of mine */
		}
		if (back) {  /* step 4 reverses step 2's direction for all */
			int t = s;
			s = q;
			q = t;
		}
		x->so[r] = at_s;
		x->ro[r] = at_r;
		x->sb[r] = (size_t)s * per * sizeof(float);
		x->rb[r] = (size_t)q * per * sizeof(float);
		at_s += s;
		at_r += q;
	}
}

/* Bytes the exchange sends to other members. */
static int64_t sent(const struct xch *x)
{
	int64_t b = 0;
	for (int r = 0; r < x->n; r++)
		b += r == x->me ? 0 : (int64_t)x->sb[r];
	return b;
}

/* Block r (its coordinates) of the whole matrix w: into w from blk
 * (into) or out of it. */
static void block(struct optim *o, const struct param_info *p, const struct plan_param *pp, const int *coord,
		  float *w, float *blk, bool into)
{
	int nd = p->ndim, off[SHARD_MAX_DIMS];
	int bshape[2] = { p->shape[nd - 2], p->shape[nd - 1] }, wshape[2] = { p->mat_rows, p->mat_cols };
	if (!p->mat_split) {  /* a whole matrix */
		memcpy(into ? w : blk, into ? blk : w, sizeof(float) * (size_t)bshape[0] * bshape[1]);
		return;
	}
	plan_block_offsets(pp, o->mesh, p->mat_split, coord, off);
	plan_copy_block(w, wshape, blk, bshape, off + nd - 2, 2, into);
}

/* One call of muon_dist in flight (o->mq, oldest first). Its state only
 * moves forward: SENT (step 2's all_to_all started) -> BACK (the owned
 * matrices orthogonalised, step 4's started) -> applied and freed. */
enum { MJ_SENT, MJ_BACK };

/* How many newer tensors' blocks leave before one is orthogonalised,
 * and how many results stay in flight before one is applied. */
#define MUON_AHEAD 2

struct muon_job {
	struct muon_job *next;
	int state, i;
	uint32_t axes, copy;
	size_t per, nmat, mine;
	float *P, lr, wd;
	struct xch x;         /* step 2's counts, then step 4's */
	float *ob, *snd, *rcv, *outb, *res;   /* views of mem */
	void *h;              /* the exchange in flight, or NULL */
	/* kept across calls (o->mfree): fresh pages for every call's
	 * buffers cost a third more page faults a step (bench/README.md) */
	float *mem;
	size_t cap;           /* floats at mem */
	int ncap;             /* members x.sb, x.so have room for */
};

static void job_free(struct muon_job *jb)
{
	free(jb->mem);
	free(jb->x.sb);
	free(jb->x.so);
	free(jb);
}

/* A job from the pool (or new) with room for floats and n members;
 * NULL when out of memory. */
static struct muon_job *job_get(struct optim *o, size_t floats, int n)
{
	struct muon_job *jb = o->mfree;
	if (jb)
		o->mfree = jb->next;
	else if (!(jb = calloc(1, sizeof(*jb))))
		return NULL;
	struct muon_job keep = *jb;
	*jb = (struct muon_job){ .mem = keep.mem, .cap = keep.cap, .ncap = keep.ncap,
				 .x = { .sb = keep.x.sb, .so = keep.x.so } };
	if (jb->cap < floats) {
		free(jb->mem);
		jb->cap = (jb->mem = malloc(sizeof(float) * floats)) ? floats : 0;
	}
	if (jb->ncap < n) {
		free(jb->x.sb);
		free(jb->x.so);
		jb->x.sb = malloc(sizeof(size_t) * (size_t)n * 2);
		jb->x.so = malloc(sizeof(int) * (size_t)n * 2);
		jb->ncap = jb->x.sb && jb->x.so ? n : 0;
	}
	if (!jb->cap || !jb->ncap) {
		job_free(jb);
		return NULL;
	}
	return jb;
}

static void job_put(struct optim *o, struct muon_job *jb)
{
	jb->next = o->mfree;
	o->mfree = jb;
}

/* Starts (mc->start_all_to_all) or runs one of a job's exchanges; name
 * it "muon <tensor> <what>" on the trace. */
static int exchange(struct optim *o, struct muon_job *jb, void *out, const void *in, const char *what)
{
	const struct model_comm *mc = o->oc.mc;
	char name[96];
	int rc;
	jb->h = NULL;
	if (!mc->start_all_to_all)
		rc = mc->all_to_all(mc->ctx, jb->axes, out, jb->x.rb, in, jb->x.sb);
	else {
		snprintf(name, sizeof(name), "muon %s %s", model_param(o->model, jb->i)->name, what);
		rc = mc->start_all_to_all(mc->ctx, jb->axes, out, jb->x.rb, in, jb->x.sb, name, &jb->h);
	}
	if (!rc)
		o->stats.muon_bytes += sent(&jb->x);
	return rc;
}

static int exchange_wait(struct optim *o, struct muon_job *jb)
{
	const struct model_comm *mc = o->oc.mc;
	void *h = jb->h;
	jb->h = NULL;
	return h ? mc->wait(mc->ctx, h) : 0;
}

/* Steps 1 and 2: the momentum of this device's blocks, each block to its
 * matrix's owner. */
static int job_send(struct optim *o, struct muon_job *jb, const float *g, float *buf)
{
	struct xch *x = &jb->x;
	size_t per = jb->per;
	int *fill = calloc((size_t)x->n, sizeof(int));
	if (!fill)
		return -ENOMEM;
	for (size_t j = 0; j < jb->nmat; j++)
		muon_momentum(jb->ob + j * per, buf + j * per, g + j * per, per, (float)o->cfg.muon_momentum);
	counts(x, false, jb->copy, per);
	for (int r = 0; r < x->n; r++)
		for (int j = 0; j < x->nmat && x->sb[r]; j++)
			if (owner(x, j) == r)
				memcpy(jb->snd + (size_t)(x->so[r] + fill[r]++) * per, jb->ob + (size_t)j * per,
				       per * sizeof(float));
	free(fill);
	jb->state = MJ_SENT;
	return exchange(o, jb, jb->rcv, jb->snd, "to owners");
}

/* Steps 3 and 4: each owned matrix whole from its senders' blocks,
 * orthogonalised, every member's block of it into outb ([member][owned
 * matrix]), and those sent back. */
static int job_orthogonalise(struct optim *o, struct muon_job *jb)
{
	const struct param_info *p = model_param(o->model, jb->i);
	const struct plan_param *pp = model_param_plan(o->model, jb->i);
	const struct model_comm *mc = o->oc.mc;
	struct xch *x = &jb->x;
	int R = p->mat_rows, C = p->mat_cols, rc;
	size_t per = jb->per;
	if ((rc = exchange_wait(o, jb)))
		return rc;
	float *w = o->scratch, *ns = w + (size_t)R * C;
	double t0 = util_now_s();
	for (size_t j = 0, k = 0; j < jb->nmat; j++) {
		if (owner(x, (int)j) != x->me)
			continue;
		for (int r = 0; r < x->n; r++)
			if (x->rb[r])
				block(o, p, pp, x->g->coord[r], w, jb->rcv + ((size_t)x->ro[r] + k) * per, true);
		newton_schulz5(w, w, ns, R, C);
		o->stats.ns_matrices++;
		o->stats.ns_flops += newton_schulz5_flops(R, C);
		for (int r = 0; r < x->n; r++)
			block(o, p, pp, x->g->coord[r], w, jb->outb + ((size_t)r * jb->mine + k) * per, false);
		k++;
	}
	if (mc->span && jb->mine) {
		char name[96];
		snprintf(name, sizeof(name), "newton-schulz %s", p->name);
		mc->span(mc->ctx, name, t0, util_now_s());
	}
	counts(x, true, jb->copy, per);
	jb->state = MJ_BACK;
	return exchange(o, jb, jb->res, jb->outb, "back");
}

/* Step 5: the blocks in matrix order, applied. */
static int job_apply(struct optim *o, struct muon_job *jb)
{
	const struct param_info *p = model_param(o->model, jb->i);
	struct xch *x = &jb->x;
	size_t per = jb->per;
	int rc = exchange_wait(o, jb);
	if (rc)
		return rc;
	for (int q = 0, k = 0; q < x->n; q++, k = 0)
		for (int j = 0; j < x->nmat; j++)
			if (owner(x, j) == q)
				memcpy(jb->ob + (size_t)j * per, jb->res + (size_t)(x->ro[q] + k++) * per,
				       per * sizeof(float));
	float scale = muon_scale(p->mat_rows, p->mat_cols);
	for (size_t j = 0; j < jb->nmat; j++)
		muon_apply(jb->P + j * per, jb->ob + j * per, per, jb->lr, scale, jb->wd);
	return 0;
}

/* Moves the oldest jobs on until at most `sent` wait in SENT and `back`
 * in BACK, oldest first (the same calls in the same order on every
 * member). */
static int advance(struct optim *o, int sent_max, int back_max)
{
	int nsent = 0, nback = 0, rc;
	for (struct muon_job *jb = o->mq; jb; jb = jb->next) {
		nsent += jb->state == MJ_SENT;
		nback += jb->state == MJ_BACK;
	}
	for (struct muon_job *jb = o->mq; jb && nsent > sent_max; jb = jb->next)
		if (jb->state == MJ_SENT) {
			if ((rc = job_orthogonalise(o, jb)))
				return rc;
			nsent--;
			nback++;
		}
	while (o->mq && o->mq->state == MJ_BACK && nback > back_max) {
		struct muon_job *jb = o->mq;
		if ((rc = job_apply(o, jb)))
			return rc;
		o->mq = jb->next;
		job_put(o, jb);
		nback--;
	}
	return 0;
}

int muon_dist(struct optim *o, int i, int j0, int j1, float *P, const float *g, float *buf, float lr, float wd)
{
	const struct param_info *p = model_param(o->model, i);
	uint32_t axes = muon_group_axes(o->mesh, p);
	const struct mesh_members *mm = members(o, axes);
	size_t per = (size_t)p->shape[p->ndim - 2] * p->shape[p->ndim - 1], nmat = (size_t)(j1 - j0), mine = 0;
	const int *own_of = o->mp.owner + o->mp.first[i] + j0;
	int me = 0, rc;
	if (!mm)
		return -ENOMEM;
	while (me < mm->n && !same_on(mm->coord[me], o->coord, axes))
		me++;
	for (size_t j = 0; j < nmat; j++)
		mine += own_of[j] == me;
	/* ob: this device's blocks (momentum, then results); snd, rcv: step
	 * 2's; outb, res: step 4's */
	size_t nf = nmat * per, own = mine * per * (size_t)mm->n + 1;
	struct muon_job *jb = job_get(o, nf * 3 + own * 2, mm->n);
	if (!jb)
		return -ENOMEM;
	jb->i = i;
	jb->axes = axes;
	jb->copy = axes & ~p->mat_split;
	jb->per = per;
	jb->nmat = nmat;
	jb->mine = mine;
	jb->P = P;
	jb->lr = lr;
	jb->wd = wd;
	struct xch *x = &jb->x;
	x->n = mm->n;
	x->me = me;
	x->nmat = (int)nmat;
	x->own = own_of;
	x->g = mm;
	jb->ob = jb->mem;
	jb->snd = jb->ob + nf;
	jb->res = jb->snd + nf;
	jb->rcv = jb->res + nf;
	jb->outb = jb->rcv + own;
	x->rb = x->sb + x->n;
	x->ro = x->so + x->n;
	/* queued last: every job before it is older */
	struct muon_job **tail = &o->mq;
	while (*tail)
		tail = &(*tail)->next;
	*tail = jb;
	if ((rc = job_send(o, jb, g, buf)))
		return rc;       /* muon_drop frees it */
	/* without background exchanges, each call does all five steps, as
	 * before; with them, this tensor's blocks travel while the one before
	 * is orthogonalised, and that one's results while the next is */
	return o->oc.mc->start_all_to_all ? advance(o, MUON_AHEAD, MUON_AHEAD) : advance(o, 0, 0);
}

int muon_flush(struct optim *o)
{
	return advance(o, 0, 0);
}

void muon_drop(struct optim *o)
{
	while (o->mq) {
		struct muon_job *jb = o->mq;
		exchange_wait(o, jb);  /* its buffers may be written until then */
		o->mq = jb->next;
		job_free(jb);
	}
	while (o->mfree) {
		struct muon_job *jb = o->mfree;
		o->mfree = jb->next;
		job_free(jb);
	}
}
