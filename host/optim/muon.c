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
 * Stacks split over experts or stages need nothing: the group is over
 * the other axes. The exchanges are Dion's pattern. The owners: longest
 * first, each to its group's least loaded member (muon_assign=size, the
 * default), or Keller Jordan's round robin (muon_assign=round_robin). */
#include "host/optim/optim_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

int muon_dist(struct optim *o, int i, int j0, int j1, float *P, const float *g, float *buf, float lr, float wd)
{
	const struct param_info *p = model_param(o->model, i);
	const struct plan_param *pp = model_param_plan(o->model, i);
	const struct model_comm *mc = o->oc.mc;
	uint32_t axes = muon_group_axes(o->mesh, p), copy = axes & ~p->mat_split;
	int nd = p->ndim, R = p->mat_rows, C = p->mat_cols;
	size_t per = (size_t)p->shape[nd - 2] * p->shape[nd - 1], nmat = (size_t)(j1 - j0);
	struct xch x = { .nmat = (int)nmat, .g = members(o, axes) };
	if (!x.g)
		return -ENOMEM;
	x.n = x.g->n;
	for (x.me = 0; x.me < x.n && !same_on(x.g->coord[x.me], o->coord, axes); x.me++)
		;
	x.own = o->mp.owner + o->mp.first[i] + j0;
	size_t mine = 0;
	for (int j = 0; j < x.nmat; j++)
		mine += owner(&x, j) == x.me;
	/* ob: this device's blocks (momentum, then results); snd, rcv: step
	 * 2's; outb, res: step 4's */
	size_t own = mine * per * (size_t)x.n + 1;
	float *ob = malloc(sizeof(float) * nmat * per), *snd = malloc(sizeof(float) * nmat * per * 2);
	float *rcv = malloc(sizeof(float) * own * 2), *outb = rcv + own, *res = snd ? snd + nmat * per : NULL;
	int *fill = calloc((size_t)x.n, sizeof(int)), rc = -ENOMEM;
	x.sb = malloc(sizeof(size_t) * (size_t)x.n * 2);
	x.so = malloc(sizeof(int) * (size_t)x.n * 2);
	if (!ob || !snd || !rcv || !fill || !x.sb || !x.so)
		goto out;
	x.rb = x.sb + x.n;
	x.ro = x.so + x.n;
	/* 1, 2: momentum, then each block to its owner */
	for (size_t j = 0; j < nmat; j++)
		muon_momentum(ob + j * per, buf + j * per, g + j * per, per, (float)o->cfg.muon_momentum);
	counts(&x, false, copy, per);
	for (int r = 0; r < x.n; r++)
		for (int j = 0; j < x.nmat && x.sb[r]; j++)
			if (owner(&x, j) == r)
				memcpy(snd + (size_t)(x.so[r] + fill[r]++) * per, ob + (size_t)j * per, per * sizeof(float));
	if ((rc = mc->all_to_all(mc->ctx, axes, rcv, x.rb, snd, x.sb)))
		goto out;
	o->stats.muon_bytes += sent(&x);
	/* 3: each owned matrix whole from its senders' blocks, orthogonalised,
	 * every member's block of it into outb ([member][owned matrix]) */
	float *w = o->scratch, *ns = w + (size_t)R * C;
	for (size_t j = 0, k = 0; j < nmat; j++) {
		if (owner(&x, (int)j) != x.me)
			continue;
		for (int r = 0; r < x.n; r++)
			if (x.rb[r])
				block(o, p, pp, x.g->coord[r], w, rcv + ((size_t)x.ro[r] + k) * per, true);
		newton_schulz5(w, w, ns, R, C);
		o->stats.ns_matrices++;
		o->stats.ns_flops += newton_schulz5_flops(R, C);
		for (int r = 0; r < x.n; r++)
			block(o, p, pp, x.g->coord[r], w, outb + ((size_t)r * mine + k) * per, false);
		k++;
	}
	/* 4: back to every member */
	counts(&x, true, copy, per);
	if ((rc = mc->all_to_all(mc->ctx, axes, res, x.rb, outb, x.sb)))
		goto out;
	o->stats.muon_bytes += sent(&x);
	/* 5: the blocks in matrix order, applied */
	memset(fill, 0, sizeof(int) * (size_t)x.n);
	for (int q = 0; q < x.n; q++)
		for (int j = 0; j < x.nmat; j++)
			if (owner(&x, j) == q)
				memcpy(ob + (size_t)j * per, res + (size_t)(x.ro[q] + fill[q]++) * per,
				       per * sizeof(float));
	float scale = muon_scale(R, C);
	for (size_t j = 0; j < nmat; j++)
		muon_apply(P + j * per, ob + j * per, per, lr, scale, wd);
	rc = 0;
out:
	free(ob);
	free(snd);
	free(rcv);
	free(fill);
	free(x.sb);
	free(x.so);
	return rc;
}
