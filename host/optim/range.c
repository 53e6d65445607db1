/* What every path of the update shares (host/optim/optim_int.h): the
 * update of a range of the layout's floats, AdamW or Muon tensor by
 * tensor, where a ZeRO-1 seg's reduced gradients are (zero_part), and a
 * bucket's name in the trace. optim.c, buckets.c and zero.c
 * call down into it; it calls only muon.c and the kernels. */
#include "host/optim/optim_int.h"

#include <assert.h>
#include <stdio.h>

#include "kernels/kernels.h"

/* The part of parameter p inside layout floats [a, b): [*x, *y), empty
 * when *x >= *y. */
void param_range(const struct param_info *p, size_t a, size_t b, size_t *x, size_t *y)
{
	*x = p->offset > a ? p->offset : a;
	*y = p->offset + p->numel < b ? p->offset + p->numel : b;
}

/* A ZeRO-1 seg's reduced gradients: in buckets, its rank's part of the
 * gradient arena itself; otherwise gshard (the whole-seg reduce-scatter
 * may not write over its input). */
float *zero_part(struct optim *o, const struct seg *s)
{
	return s->bucketed ? model_grads(o->model) + s->p0 + s->s0 : o->gshard + s->o0;
}

int optim_update_range(struct optim *o, int64_t step, float lr, const float *g, float *mb, float *vb,
		       size_t a, size_t b)
{
	struct model *m = o->model;
	const struct cfg *c = &o->cfg;
	float *P = model_params(m);
	float wd = (float)c->adam_weight_decay;

	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t x, y;
		param_range(p, a, b, &x, &y);
		if (p->opt == OPT_NONE || x >= y)
			continue;
		float pwd = p->decay ? wd : 0.0f;
		bool shared = o->mesh && mesh_axes_size(o->mesh, muon_group_axes(o->mesh, p)) > 1;
		if (p->opt == OPT_MUON && o->muon && shared) {
			/* whole matrices: the update cuts ranges at layer slices */
			size_t per = (size_t)p->shape[p->ndim - 2] * p->shape[p->ndim - 1];
			int j0 = (int)((x - p->offset) / per), j1 = (int)((y - p->offset) / per);
			assert((x - p->offset) % per == 0 && (y - p->offset) % per == 0);
			int rc = muon_dist(o, i, j0, j1, P + x, g + (x - a), mb + (x - a), lr, pwd);
			if (rc)
				return rc;
		} else if (p->opt == OPT_MUON && o->muon) {
			int R = p->shape[p->ndim - 2], C = p->shape[p->ndim - 1];
			size_t per = (size_t)R * C;
			for (size_t q = x; q < y; q += per, o->stats.ns_matrices++) {
				o->stats.ns_flops += newton_schulz5_flops(R, C);
				muon_update(P + q, g + (q - a), mb + (q - a), o->scratch, R, C, lr,
					    (float)c->muon_momentum, pwd);
			}
		} else if (o->keeping) {  /* optim_keep: g is the gradients' layout at a */
			size_t k = (size_t)(mb - o->m) + (x - a);
			adamw_update_keep(P + x, g + (x - a), mb + (x - a), vb + (x - a), o->malt + k, o->valt + k,
					  o->pk + x, o->gk + x, y - x, lr, (float)c->adam_b1, (float)c->adam_b2,
					  (float)c->adam_eps, pwd, (int)step + 1);
		} else {
			adamw_update(P + x, g + (x - a), mb + (x - a), vb + (x - a), y - x, lr,
				     (float)c->adam_b1, (float)c->adam_b2, (float)c->adam_eps, pwd, (int)step + 1);
		}
	}
	return 0;
}

void bucket_name(const struct optim *o, const struct bucket *b, const char *what, char *out,
			size_t len)
{
	int hi = -3, lo = 1 << 30;
	bool head = false, embed = false;
	for (int j = b->u0; j < b->u1; j++) {
		int key = o->u[o->ubk[j]].key;
		head |= key == KEY_HEAD;
		embed |= key == KEY_EMBED;
		if (key >= 0) {
			hi = key > hi ? key : hi;
			lo = key < lo ? key : lo;
		}
	}
	if (hi >= 0)
		snprintf(out, len, "%s L%d-%d%s%s", what, hi, lo, head ? "h" : "", embed ? "e" : "");
	else
		snprintf(out, len, "%s %s", what, head ? (embed ? "head+embed" : "head") : "embed");
}
