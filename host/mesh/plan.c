/* The sharded-matmul planner; see host/mesh/plan.h. */
#include "host/mesh/plan.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void plan_mask_text(uint32_t mask, char *out, size_t outlen)
{
	size_t used = 0;
	out[0] = 0;
	for (int a = 0; a < AX_COUNT && used < outlen; a++)
		if (mask & (1u << a))
			used += (size_t)snprintf(out + used, outlen - used, "%s%s", used ? "+" : "",
						 mesh_axis_names[a]);
	if (!used)
		snprintf(out, outlen, "none");
}

uint32_t plan_axes_mask(const struct plan_axes *a)
{
	uint32_t m = 0;
	for (int i = 0; i < a->n; i++)
		m |= 1u << a->axis[i];
	return m;
}

void plan_axes_of(struct plan_axes *a, const struct shard_spec *s, int d)
{
	a->n = s->naxes[d];
	memcpy(a->axis, s->axis[d], sizeof(int) * (size_t)a->n);
}

int plan_kept_axes(const struct plan_param *p, int d, int *axes)
{
	int n = 0;
	for (int k = 0; k < p->spec.naxes[d]; k++)
		if (!(p->gather & (1u << p->spec.axis[d][k])))
			axes[n++] = p->spec.axis[d][k];
	return n;
}

/* plan_kept_axes as a bit mask */
static uint32_t plan_kept_mask(const struct plan_param *p, int d)
{
	return p->spec.axes[d] & ~p->gather;
}

int plan_param(struct plan_param *p, const struct shard_rules *r, const struct mesh *m,
	       const char *tensor, int ndim, const int *shape, const char *const *logical,
	       int head_dim, uint32_t rows, char *err, size_t errlen)
{
	int unit[SHARD_MAX_DIMS];
	memset(p, 0, sizeof(*p));
	shard_head_units(ndim, logical, head_dim, unit);
	int rc = shard_resolve(r, m, tensor, ndim, shape, unit, logical, &p->spec, err, errlen);
	if (rc)
		return rc;
	p->gather = p->spec.used & rows;
	p->gsum = rows & ~p->spec.used;
	p->cnumel = 1;
	for (int d = 0; d < ndim; d++) {
		/* kept axes major, gathered minor: a gather then fills one
		 * contiguous range of the dimension */
		int kept[AX_COUNT], nk = plan_kept_axes(p, d, kept), k = nk;
		for (int i = 0; i < p->spec.naxes[d]; i++)
			if (p->gather & (1u << p->spec.axis[d][i]))
				kept[k++] = p->spec.axis[d][i];
		memcpy(p->spec.axis[d], kept, sizeof(int) * (size_t)k);
		p->cshape[d] = shape[d] / mesh_axes_size(m, plan_kept_mask(p, d));
		p->cnumel *= (size_t)p->cshape[d];
	}
	return 0;
}

int plan_param_slice(struct plan_param *p, const struct mesh *m, int dim,
		     const struct plan_axes *axes, char *err, size_t errlen)
{
	uint32_t mask = plan_axes_mask(axes);
	int n = mesh_axes_size(m, mask);
	if (p->spec.axes[dim] & ~mask || p->spec.shape[dim] % n) {
		char a[96], b[96];
		plan_mask_text(p->spec.axes[dim], a, sizeof(a));
		plan_mask_text(mask, b, sizeof(b));
		snprintf(err, errlen, "sharding: tensor '%s' dimension %d (%d) is sharded over %s but used "
			 "in slices over %s", p->spec.name, dim, p->spec.shape[dim], a, b);
		return -EINVAL;
	}
	if (p->spec.axes[dim] == mask)
		return 0;          /* stored as it is used */
	p->slice |= mask;
	p->gsum |= mask;
	p->cnumel /= (size_t)p->cshape[dim];
	p->cshape[dim] = p->spec.shape[dim] / n;
	p->cnumel *= (size_t)p->cshape[dim];
	return 0;
}

/* Do two ordered axis lists name the same axes in the same order? */
static bool same_axes(const int *a, int na, const int *b, int nb)
{
	if (na != nb)
		return false;
	for (int i = 0; i < na; i++)
		if (a[i] != b[i])
			return false;
	return true;
}

int plan_linear(struct plan_linear *l, const char *name, const struct plan_param *w,
		int out_dim, int in_dim, const struct plan_axes *x_in, const struct plan_axes *y_out,
		char *err, size_t errlen)
{
	const struct shard_spec *s = &w->spec;
	int kin[AX_COUNT], kout[AX_COUNT];
	int nin = plan_kept_axes(w, in_dim, kin), nout = plan_kept_axes(w, out_dim, kout);
	char a[96], b[96];

	memset(l, 0, sizeof(*l));
	if (!same_axes(kin, nin, x_in->axis, x_in->n)) {
		mesh_axes_text(kin, nin, ",", a, sizeof(a));
		mesh_axes_text(x_in->axis, x_in->n, ",", b, sizeof(b));
		snprintf(err, errlen, "sharding: linear '%s' contracts weight '%s' dimension %d over (%s) "
			 "but its input over (%s); only equal splits are implemented (no "
			 "sequence-parallel all-gather)", name, s->name, in_dim, a, b);
		return -EINVAL;
	}
	if (!same_axes(kout, nout, y_out->axis, y_out->n)) {
		mesh_axes_text(kout, nout, ",", a, sizeof(a));
		mesh_axes_text(y_out->axis, y_out->n, ",", b, sizeof(b));
		snprintf(err, errlen, "sharding: linear '%s' gives weight '%s' dimension %d split over (%s) "
			 "but its output is wanted over (%s)", name, s->name, out_dim, a, b);
		return -EINVAL;
	}
	l->reduce = plan_axes_mask(x_in);
	l->dx_reduce = plan_axes_mask(y_out);
	l->dw_scatter = w->gather;
	return 0;
}

void plan_block_offsets(const struct plan_param *p, const struct mesh *m, uint32_t axes,
			const int coord[AX_COUNT], int *off)
{
	shard_block_offsets(&p->spec, m, axes, coord, off);
}

void plan_copy_block(float *tensor, const int *tshape, float *block, const int *bshape,
		     const int *off, int ndim, bool into)
{
	/* rows of the innermost dimension, walked with an odometer */
	int idx[SHARD_MAX_DIMS] = { 0 };
	size_t run = ndim ? (size_t)bshape[ndim - 1] : 1, nrows = 1;
	for (int d = 0; d + 1 < ndim; d++)
		nrows *= (size_t)bshape[d];
	for (int d = 0; d < ndim; d++)
		if (bshape[d] == 0)
			return;
	for (size_t r = 0; r < nrows; r++) {
		size_t t = 0;
		for (int d = 0; d < ndim; d++)
			t = t * (size_t)tshape[d] + (size_t)(off[d] + (d + 1 < ndim ? idx[d] : 0));
		float *tp = tensor + t, *bp = block + r * run;
		if (into)
			memcpy(tp, bp, run * sizeof(float));
		else
			memcpy(bp, tp, run * sizeof(float));
		for (int d = ndim - 2; d >= 0; d--) {
			if (++idx[d] < bshape[d])
				break;
			idx[d] = 0;
		}
	}
}

void plan_place_gathered(const struct plan_param *p, const struct mesh *m,
			 const struct mesh_members *members, int nd, int dims, float *whole,
			 const int *wshape, const float *recv, const int *bshape, size_t per)
{
	int off[SHARD_MAX_DIMS];
	for (int r = 0; r < members->n; r++) {
		plan_block_offsets(p, m, members->axes, members->coord[r], off);
		plan_copy_block(whole, wshape, (float *)(recv + (size_t)r * per), bshape, off + nd - dims,
				dims, true);
	}
}
