/* Per-device trainer: see host/train/train.h. The optimizer keeps two buffers:
 * AdamW's m and v, or Muon's momentum in m, laid out bucket by bucket like
 * the parameters, except that a bucket whose state ZeRO-1 splits over
 * `data` keeps only this device's part of it. */
#include "host/train/train.h"
#include "host/train/check.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/data/data.h"
#include "host/pipeline/pipe_config.h"
#include "host/mesh/plan.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

/* One gradient bucket of the layout and its optimizer state. */
struct seg {
	size_t p0, n;        /* floats [p0, p0 + n) of the parameter layout */
	uint32_t axes;       /* its gradients are summed over these */
	bool zero;           /* ZeRO-1: the state is split over `data` */
	size_t padded;       /* n and the zeros after it: shard_n * ndata */
	size_t shard_n;      /* zero: floats per data rank */
	size_t s0, len;      /* zero: this device's part [p0 + s0, + len) */
	size_t o0;           /* where its state starts in m and v */
};

#define MAX_TGROUPS 8

struct trainer {
	struct cfg cfg;
	struct model *model;
	struct data_source *data, *eval;    /* training and held-out data, or NULL */
	int rows, global_rows;
	const struct mesh *mesh;     /* NULL on one device */
	int device, coord[AX_COUNT];
	int ndata, rdata;            /* ZeRO-1: data ranks and this one */
	struct seg seg[MODEL_MAX_PARAMS];
	int nseg;
	size_t opt_n;
	float *m, *v, *scratch;
	float *gshard;               /* zero buckets' reduced gradient parts */
	int32_t *inputs, *targets;
	bool muon;
	struct mesh_members tg[MAX_TGROUPS];   /* groups that gather split tensors */
	int ntg;
	struct pipe_exec *px;        /* the step's executor (a pipeline over
				      * `stage`, or a table of one stage) */
	/* checkpoints: the whole model's table and buffers */
	struct model *gmodel;
	float *gp, *gm, *gv;
};

struct model *trainer_model(struct trainer *t) { return t->model; }
struct data_source *trainer_data(struct trainer *t) { return t->data; }
struct data_source *trainer_eval_data(struct trainer *t) { return t->eval; }
int trainer_rows(const struct trainer *t) { return t->rows; }
const struct cfg *trainer_cfg(const struct trainer *t) { return &t->cfg; }
struct pipe_exec *trainer_pipe(struct trainer *t) { return t->px; }

/* The part of parameter p inside layout floats [a, b): [*x, *y), empty
 * when *x >= *y. */
static void param_range(const struct param_info *p, size_t a, size_t b, size_t *x, size_t *y)
{
	*x = p->offset > a ? p->offset : a;
	*y = p->offset + p->numel < b ? p->offset + p->numel : b;
}

static const struct mesh_members *tgroup(struct trainer *t, uint32_t axes)
{
	for (int k = 0; k < t->ntg; k++)
		if (t->tg[k].axes == axes)
			return &t->tg[k];
	if (t->ntg == MAX_TGROUPS || mesh_members_init(t->mesh, t->device, axes, &t->tg[t->ntg]))
		return NULL;
	return &t->tg[t->ntg++];
}

/* Buckets and their optimizer state; ZeRO-1 splits the state of buckets
 * summed over `data`. */
static int lay_out_state(struct trainer *t, char *err, size_t errlen)
{
	struct model_bucket b[MODEL_MAX_PARAMS];
	struct model *m = t->model;
	int nb = model_buckets(m, b, MODEL_MAX_PARAMS);
	bool any_zero = false;
	t->nseg = nb;
	t->opt_n = 0;
	for (int i = 0; i < nb; i++) {
		struct seg *s = &t->seg[i];
		memset(s, 0, sizeof(*s));
		s->p0 = b[i].offset;
		s->n = b[i].numel;
		s->padded = b[i].padded;
		s->axes = b[i].axes;
		s->zero = t->ndata > 1 && (s->axes & (1u << AX_DATA));
		s->o0 = t->opt_n;
		if (!s->zero) {
			t->opt_n += s->n;
			continue;
		}
		any_zero = true;
		s->shard_n = s->padded / (size_t)t->ndata;
		s->s0 = s->shard_n * (size_t)t->rdata;
		s->len = s->s0 < s->n ? (s->n - s->s0 < s->shard_n ? s->n - s->s0 : s->shard_n) : 0;
		t->opt_n += s->shard_n;
		for (int k = 0; t->muon && k < model_num_params(m); k++) {
			const struct param_info *p = model_param(m, k);
			if (p->opt == OPT_MUON && p->offset >= s->p0 && p->offset < s->p0 + s->n) {
				return trainer_muon_zero_refusal(p->name, err, errlen);
			}
		}
	}
	t->m = calloc(t->opt_n ? t->opt_n : 1, sizeof(float));
	t->v = calloc(t->opt_n ? t->opt_n : 1, sizeof(float));
	if (any_zero)
		t->gshard = calloc(t->opt_n, sizeof(float));
	if (!t->m || !t->v || (any_zero && !t->gshard))
		return -ENOMEM;
	return 0;
}

/* The step's table and its shape: the pipeline's keys with a `stage`
 * axis, else the step without a pipeline (a table of one stage). */
static int step_table(struct trainer *t, const struct cfg *c, const struct model_dims *d,
		      struct pipe_config *pc, struct pipe_table *tab, char *err, size_t errlen)
{
	int rc;
	if (t->mesh && t->mesh->size[AX_STAGE] > 1) {
		if ((rc = pipe_config_resolve(pc, c, d, err, errlen)) ||
		    (rc = train_check_pipe(c, pc, t->rows, err, errlen)))
			return rc;
	} else {
		pipe_config_one_device(pc, d, t->rows);
	}
	return pipe_table_build(tab, &pc->shape, err, errlen);
}

/* The model for one microbatch of rows and the executor of this stage:
 * every step, with or without a pipeline, runs a schedule's table. */
static int pipe_open(struct trainer *t, const struct cfg *c, const struct model_dims *d,
		     const struct model_mesh *mm, char *err, size_t errlen)
{
	struct pipe_config pc;
	struct pipe_table tab;
	int coord[AX_COUNT] = { 0 }, rc, dev[MESH_MAX_DEVICES], stage = 0;
	if ((rc = step_table(t, c, d, &pc, &tab, err, errlen)))
		return rc;
	int S = pc.shape.stages, mb = t->rows / pc.shape.microbatches;
	if (t->mesh) {
		mesh_coords(t->mesh, t->device, coord);
		stage = coord[AX_STAGE];
	}
	struct model_mesh pm = { 0 };
	if (mm) {
		pm = *mm;
		if (S > 1)
			pipe_config_model_mesh(&pc, &pm);
	}
	pm.pipe_act_sets = tab.act_sets[stage];
	if (!mm && pm.pipe_act_sets > 1) {  /* one device's table keeps one set */
		snprintf(err, errlen, "train: the step's table keeps %d sets of activations on one device",
			 pm.pipe_act_sets);
		rc = -EINVAL;
	} else {
		rc = model_open(&t->model, d, mb, mm ? &pm : NULL, err, errlen);
	}
	if (rc) {
		pipe_table_free(&tab);
		return rc;
	}
	for (int s = 0; s < S; s++) {
		coord[AX_STAGE] = s;
		dev[s] = t->mesh ? mesh_device(t->mesh, coord) : 0;
	}
	return pipe_exec_new(&t->px, &tab, stage, pc.first_layer, dev, t->model, mb, err, errlen);
}

/* The data a trainer reads: training data unless eval_only, held-out
 * data when it evaluates. */
static int open_data(struct trainer *t, const struct cfg *c, bool eval_only, char *err, size_t errlen)
{
	char why[1024];
	int rc = 0;
	bool held = c->eval_dataset_path[0] || c->eval_split_fraction > 0;
	if (!eval_only && c->eval_interval > 0 && !held && strcmp(c->dataset_type, "synthetic")) {
		snprintf(err, errlen, "config: key 'eval_interval' needs held-out data: set "
			 "'eval_dataset_path' or 'eval_split_fraction'");
		return -EINVAL;
	}
	if (!eval_only)
		rc = data_open(&t->data, c, DATA_TRAIN, t->global_rows, why, sizeof(why));
	if (!rc && (eval_only || c->eval_interval > 0) &&
	    !(rc = data_open(&t->eval, c, DATA_EVAL, t->global_rows, why, sizeof(why))))
		rc = (int)data_eval_batches(t->eval, t->global_rows, c->eval_steps, why, sizeof(why));
	if (rc < 0) {
		snprintf(err, errlen, "%s", why);
		return rc;
	}
	return 0;
}

static int trainer_open_what(struct trainer **out, const struct cfg *c, int rows,
			     const struct model_mesh *mm, bool eval_only, char *err, size_t errlen)
{
	struct model_dims d;
	struct trainer *t;
	int rc;

	*out = NULL;
	if ((rc = train_check_keys(c, &d, err, errlen)))
		return rc;
	size_t asked = sizeof(*t);
	const char *what = "the trainer";
	t = calloc(1, sizeof(*t));
	if (!t)
		goto oom;
	t->cfg = *c;
	t->rows = rows;
	t->muon = !strcmp(c->opt_type, "muon");
	t->ndata = 1;
	struct model_mesh mmz;
	if (mm && mm->mesh->num_devices > 1) {
		t->mesh = mm->mesh;
		t->device = mm->device;
		mesh_coords(t->mesh, t->device, t->coord);
		mmz = *mm;
		/* ZeRO-1: buckets padded to split evenly over data, in place */
		if (c->shard_optimizer_over_data && t->mesh->size[AX_DATA] > 1) {
			t->ndata = t->mesh->size[AX_DATA];
			t->rdata = t->coord[AX_DATA]; /* one axis: its coordinate order */
			mmz.bucket_align = t->ndata;
		}
		mm = &mmz;
	}
	/* the global batch is per_device_batch_size x every device (as in
	 * MaxText); the data must hold one */
	t->global_rows = (int)c->per_device_batch_size * (mm ? mm->mesh->num_devices : 1);
	if ((rc = open_data(t, c, eval_only, err, errlen)))
		goto fail;
	/* the model refuses shapes and shardings it cannot make */
	if ((rc = pipe_open(t, c, &d, mm, err, errlen)))
		goto fail;
	/* weights from a checkpoint replace every element: no init to pay for */
	if (!c->load_parameters_path[0])
		model_init(t->model, (uint64_t)c->init_weights_seed, (float)c->init_std);
	rc = lay_out_state(t, err, errlen);
	if (rc == -ENOMEM) {
		asked = sizeof(float) * t->opt_n * (t->gshard || t->ndata > 1 ? 3 : 2);
		what = "the optimizer state";
		goto oom;
	}
	if (rc)
		goto fail;
	size_t big = 0;
	for (int i = 0; i < model_num_params(t->model); i++) {
		const struct param_info *p = model_param(t->model, i);
		if (p->opt != OPT_MUON)
			continue;
		size_t R = (size_t)p->mat_rows, C = (size_t)p->mat_cols, mx = R > C ? R : C;
		size_t need = 3 * mx * mx + 6 * R * C;
		if (need > big)
			big = need;
	}
	t->scratch = malloc(sizeof(float) * (big ? big : 1));
	t->inputs = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	t->targets = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	if (!t->scratch || !t->inputs || !t->targets) {
		asked = sizeof(float) * (big ? big : 1) + 2 * sizeof(int32_t) * (size_t)rows * d.T;
		what = "Muon's scratch and the batch";
		goto oom;
	}
	*out = t;
	return 0;
oom:
	snprintf(err, errlen, "train: out of memory: %zu bytes for %s", asked, what);
	rc = -ENOMEM;
fail:
	trainer_free(t);
	return rc;
}

int trainer_open(struct trainer **t, const struct cfg *c, int rows, const struct model_mesh *mm,
		 char *err, size_t errlen)
{
	return trainer_open_what(t, c, rows, mm, false, err, errlen);
}

int trainer_open_eval(struct trainer **t, const struct cfg *c, int rows,
		      const struct model_mesh *mm, char *err, size_t errlen)
{
	return trainer_open_what(t, c, rows, mm, true, err, errlen);
}

struct trainer *trainer_new(const struct cfg *c, int rows, const struct model_mesh *mm,
			    char *err, size_t errlen)
{
	struct trainer *t;
	return trainer_open(&t, c, rows, mm, err, errlen) ? NULL : t;
}

void trainer_free(struct trainer *t)
{
	if (!t)
		return;
	pipe_exec_free(t->px);
	model_free(t->model);
	data_close(t->data);
	data_close(t->eval);
	free(t->m);
	free(t->v);
	free(t->scratch);
	free(t->gshard);
	free(t->inputs);
	free(t->targets);
	for (int k = 0; k < t->ntg; k++)
		mesh_members_free(&t->tg[k]);
	model_free(t->gmodel);
	free(t->gp);
	free(t->gm);
	free(t->gv);
	free(t);
}

/* DeepSeek-V3's auxiliary-loss-free balancing: nudge each expert's
 * selection bias toward the mean load (counts summed over all replicas, so
 * every device makes the same update to the part it holds). */
static void update_router_bias(struct trainer *t, const struct param_info *p)
{
	const struct model_dims *d = model_dims(t->model);
	const int32_t *counts = model_expert_counts(t->model);
	float rate = (float)t->cfg.routed_bias_update_rate;
	float *b = model_params(t->model) + p->offset;
	int E = d->E, El = p->shape[1], e0 = p->goff[1];
	if (!d->L_moe || rate == 0.0f)
		return;
	/* storage index q holds MoE layer model_stack_layer(q) (a pipeline's order) */
	for (int l = 0; l < p->shape[0]; l++) {
		int q = model_stack_layer(t->model, l + p->goff[0], p->global_shape[0]);
		moe_bias_update(b + (size_t)l * El, counts + (size_t)q * E, E, e0, El, rate);
	}
}

/* After an all-gather over tg's axes (member r's block at recv + r * per),
 * puts every member's block of pp's tensor in its place in whole: the last
 * dims dimensions of an nd-dimensional tensor, shapes wshape (whole) and
 * bshape (block). */
static void place_gathered(const struct trainer *t, const struct plan_param *pp,
			   const struct mesh_members *tg, int nd, int dims, float *whole,
			   const int *wshape, float *recv, const int *bshape, size_t per)
{
	int off[SHARD_MAX_DIMS];
	for (int r = 0; r < tg->n; r++) {
		plan_block_offsets(pp, t->mesh, tg->axes, tg->coord[r], off);
		plan_copy_block(whole, wshape, recv + (size_t)r * per, bshape, off + nd - dims, dims,
				true);
	}
}

/* Muon on matrices split over devices: the momentum is local, the
 * orthogonalisation needs the whole matrix, so every member gathers it,
 * runs NS5 (the same bits everywhere) and applies its own block. */
static int muon_split(struct trainer *t, const struct train_comm *comm, int i, float *P,
		      const float *g, float *buf, float lr, float wd)
{
	const struct param_info *p = model_param(t->model, i);
	const struct plan_param *pp = model_param_plan(t->model, i);
	const struct mesh_members *tg = tgroup(t, p->mat_split);
	int nd = p->ndim, R = p->mat_rows, C = p->mat_cols;
	int bshape[2] = { p->shape[nd - 2], p->shape[nd - 1] }, wshape[2] = { R, C };
	size_t per = (size_t)bshape[0] * bshape[1], nmat = p->numel / per, whole = (size_t)R * C;
	float *o = t->scratch, *w = o + whole, *recv = w + whole, *ns = recv + whole;
	float k = muon_scale(R, C);
	int off[SHARD_MAX_DIMS];
	if (!tg)
		return -ENOMEM;
	for (size_t j = 0; j < nmat; j++) {
		muon_momentum(o, buf + j * per, g + j * per, per, (float)t->cfg.muon_momentum);
		int rc = comm->mc.all_gather(comm->mc.ctx, p->mat_split, recv, o, per * sizeof(float));
		if (rc)
			return rc;
		place_gathered(t, pp, tg, nd, 2, w, wshape, recv, bshape, per);
		newton_schulz5(w, w, ns, R, C);
		plan_block_offsets(pp, t->mesh, p->mat_split, t->coord, off);
		plan_copy_block(w, wshape, o, bshape, off + nd - 2, 2, false);
		muon_apply(P + j * per, o, per, lr, k, wd);
	}
	return 0;
}

/* Updates parameters [a, b) of the layout from gradients g, with state m
 * and v, all three indexed from a. */
static int optimizer_update(struct trainer *t, const struct train_comm *comm, int64_t step, float lr,
			    const float *g, float *mb, float *vb, size_t a, size_t b)
{
	struct model *m = t->model;
	const struct cfg *c = &t->cfg;
	float *P = model_params(m);
	float wd = (float)c->adam_weight_decay;

	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t x, y;
		param_range(p, a, b, &x, &y);
		if (p->opt == OPT_NONE || x >= y)
			continue;
		float pwd = p->decay ? wd : 0.0f;
		if (p->opt == OPT_MUON && t->muon && p->mat_split) {
			int rc = muon_split(t, comm, i, P + x, g + (x - a), mb + (x - a), lr, pwd);
			if (rc)
				return rc;
		} else if (p->opt == OPT_MUON && t->muon) {
			int R = p->shape[p->ndim - 2], C = p->shape[p->ndim - 1];
			size_t per = (size_t)R * C;
			for (size_t o = x; o < y; o += per)
				muon_update(P + o, g + (o - a), mb + (o - a), t->scratch, R, C, lr,
					    (float)c->muon_momentum, pwd);
		} else {
			adamw_update(P + x, g + (x - a), mb + (x - a), vb + (x - a), y - x, lr,
				     (float)c->adam_b1, (float)c->adam_b2, (float)c->adam_eps, pwd, (int)step + 1);
		}
	}
	return 0;
}

/* Sum of squares of the trained gradients in [a, b) (g indexed from a),
 * each divided by the number of devices holding the same values
 * (`copies` per whole-layout float), so that summing over every device
 * counts each element of the whole model once. */
static double grad_sumsq(struct trainer *t, const float *g, size_t a, size_t b, int extra_split)
{
	struct model *m = t->model;
	double ss = 0;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t x, y;
		param_range(p, a, b, &x, &y);
		if (p->opt == OPT_NONE || x >= y)
			continue;
		double copies = 1;
		if (t->mesh)
			copies = (double)t->mesh->num_devices / mesh_axes_size(t->mesh, p->split) / extra_split;
		ss += sumsq(g + (x - a), y - x) / copies;
	}
	return ss;
}

/* The step's forward and backward (the schedule's table); then with a
 * pipeline the gradients of what runs data-parallel over `stage` (every
 * tensor not split over it: embedding, head, final norm) are summed over
 * it. */
static int pipe_step(struct trainer *t, const struct train_comm *comm, struct model_step *ms)
{
	struct model *m = t->model;
	float *G = model_grads(m);
	const uint32_t stage = 1u << AX_STAGE;
	bool staged = pipe_exec_table(t->px)->shape.stages > 1;  /* else nothing moves point to point */
	int rc = pipe_exec_step(t->px, t->inputs, t->targets, ms, comm && staged ? &comm->p2p : NULL);
	for (int i = 0; !rc && staged && i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		if (!(p->split & stage))
			rc = comm->mc.all_reduce(comm->mc.ctx, stage, G + p->offset, p->numel);
	}
	return rc;
}

/* The unmasked targets of the global batch, at least 1: this device's
 * rows' (in t->targets), summed over the axes that split the rows, so
 * rows shared by devices (tensor, stage) count once. */
static int count_targets(struct trainer *t, const struct train_comm *comm, double *n)
{
	size_t len = (size_t)t->rows * model_dims(t->model)->T;
	uint32_t axes = model_rows_axes(t->model);
	double k = 0;
	for (size_t i = 0; i < len; i++)
		k += t->targets[i] >= 0;
	int rc = comm && axes ? comm->sum(comm->mc.ctx, axes, &k, 1) : 0;
	*n = k > 1 ? k : 1;
	return rc;
}

int trainer_step(struct trainer *t, int64_t step, int global_rows, int row0,
		 const struct train_comm *comm, struct step_stats *st, char *err, size_t errlen)
{
	struct model *m = t->model;
	const struct cfg *c = &t->cfg;
	const struct model_dims *d = model_dims(m);
	size_t n = model_numel(m);
	float *G = model_grads(m), *P = model_params(m);
	double global_tokens = (double)global_rows * d->T;
	const uint32_t data = 1u << AX_DATA, all = (1u << AX_COUNT) - 1;
	void *ctx = comm ? comm->mc.ctx : NULL;
	int rc = 0;

	st->t_data0 = util_now_s();
	rc = data_batch(t->data, step, global_rows, row0, t->rows, t->inputs, t->targets, err, errlen);
	st->t_data1 = util_now_s();
	if (rc)
		return rc;
	/* the loss is the mean over the targets that count */
	double denom = global_tokens;
	if (data_masks(t->data) && (rc = count_targets(t, comm, &denom)))
		goto comm_failed;
	memset(G, 0, n * sizeof(float));
	struct model_step ms = {
		.loss_scale = (float)(1.0 / denom),
		.lb_weight = (float)c->load_balance_loss_weight,
		.global_tokens = global_tokens,
		.comm = comm ? &comm->mc : NULL,
	};
	st->t_fb0 = util_now_s();
	rc = pipe_step(t, comm, &ms);
	st->t_fb1 = util_now_s();
	st->weight_gathers = pipe_exec_gathers(t->px);
	if (rc)
		goto comm_failed;
	double scal[2] = { ms.loss_sum, ms.aux };
	bool staged = pipe_exec_table(t->px)->shape.stages > 1;
	uint32_t loss_axes = model_rows_axes(m) | (staged ? 1u << AX_STAGE : 0);
	if (comm && (rc = comm->sum(ctx, loss_axes, scal, 2)))
		goto comm_failed;

	/* gradients: each bucket summed over its axes; ZeRO-1 buckets
	 * reduce-scattered over data (the rest of their axes summed on the
	 * part) */
	double ss = 0;
	for (int i = 0; i < t->nseg; i++) {
		struct seg *s = &t->seg[i];
		uint32_t rest = s->axes & ~(s->zero ? data : 0);
		if (!s->zero) {
			if (comm && rest && (rc = comm->mc.all_reduce(ctx, rest, G + s->p0, s->n)))
				goto comm_failed;
			ss += grad_sumsq(t, G + s->p0, s->p0, s->p0 + s->n, 1);
			continue;
		}
		/* the bucket's padding is zero: the grads were zeroed whole */
		float *gs = t->gshard + s->o0;
		if ((rc = comm->mc.reduce_scatter(ctx, data, gs, G + s->p0, s->shard_n)) ||
		    (rest && (rc = comm->mc.all_reduce(ctx, rest, gs, s->shard_n))))
			goto comm_failed;
		ss += grad_sumsq(t, gs, s->p0 + s->s0, s->p0 + s->s0 + s->len, t->ndata);
	}
	if (comm && (rc = comm->sum(ctx, all, &ss, 1)))
		goto comm_failed;
	double norm = sqrt(ss);
	/* global-norm clipping over every trained parameter */
	st->t_opt0 = util_now_s();
	float clip = 1.0f;
	if (c->gradient_clipping_threshold > 0 && norm > c->gradient_clipping_threshold)
		clip = (float)(c->gradient_clipping_threshold / norm);

	int total = c->learning_rate_schedule_steps > 0 ? (int)c->learning_rate_schedule_steps : (int)c->steps;
	int warmup = (int)(c->warmup_steps_fraction * total);
	float lr = lr_schedule((int)step, (float)c->learning_rate, warmup, total,
			       (float)c->cosine_learning_rate_final_fraction);
	for (int i = 0; i < t->nseg; i++) {
		struct seg *s = &t->seg[i];
		float *g = s->zero ? t->gshard + s->o0 : G + s->p0;
		size_t a = s->p0 + s->s0, len = s->zero ? s->len : s->n;
		if (clip != 1.0f)
			scale_inplace(g, len, clip);
		if ((rc = optimizer_update(t, comm, step, lr, g, t->m + s->o0, t->v + s->o0, a, a + len)))
			goto comm_failed;
	}
	for (int i = 0; i < model_num_params(m); i++)
		if (model_param(m, i)->opt == OPT_NONE)
			update_router_bias(t, model_param(m, i));
	st->t_opt1 = util_now_s();
	/* ZeRO-1: every data rank takes the others' updated parts */
	for (int i = 0; i < t->nseg; i++) {
		struct seg *s = &t->seg[i];
		if (!s->zero)
			continue;
		/* in place: this rank's part already sits in the bucket */
		if ((rc = comm->mc.all_gather(ctx, data, P + s->p0, P + s->p0 + s->s0,
					      s->shard_n * sizeof(float))))
			goto comm_failed;
	}

	st->loss = scal[0] / denom;
	st->aux = scal[1];
	st->grad_norm = norm;
	st->lr = lr;
	return 0;
comm_failed:
	if (comm && comm->err != err)
		snprintf(err, errlen, "%s", comm->err);
	return rc;
}

int trainer_eval(struct trainer *t, int global_rows, int row0, const struct train_comm *comm,
		 double *loss, int64_t *tokens, char *err, size_t errlen)
{
	struct model *m = t->model;
	const int T = model_dims(m)->T;
	const bool staged = pipe_exec_table(t->px)->shape.stages > 1;
	const uint32_t rows = model_rows_axes(m), stage = staged ? 1u << AX_STAGE : 0;
	int64_t nb = data_eval_batches(t->eval, global_rows, t->cfg.eval_steps, err, errlen);
	double sum = 0, count = 0;
	int rc = 0;
	if (nb < 0)
		return (int)nb;
	for (int64_t b = 0; b < nb; b++) {
		if ((rc = data_batch(t->eval, b, global_rows, row0, t->rows, t->inputs, t->targets, err,
				     errlen)))
			return rc;
		for (size_t i = 0; i < (size_t)t->rows * T; i++)
			count += t->targets[i] >= 0;
		struct model_step ms = {
			.loss_scale = (float)(1.0 / ((double)global_rows * T)),
			.lb_weight = (float)t->cfg.load_balance_loss_weight,
			.global_tokens = (double)global_rows * T,
			.comm = comm ? &comm->mc : NULL,
		};
		/* the executor has no forward-only table: its gradients are
		 * dropped (the next step zeroes them) */
		rc = staged ? pipe_exec_step(t->px, t->inputs, t->targets, &ms, comm ? &comm->p2p : NULL)
			    : model_forward(m, t->inputs, t->targets, &ms);
		if (rc)
			goto comm_failed;
		sum += ms.loss_sum;
	}
	/* each device's loss covers its rows (a stage its microbatches); rows
	 * shared by devices count once */
	if (comm && (((rows | stage) && (rc = comm->sum(comm->mc.ctx, rows | stage, &sum, 1))) ||
		     (rows && (rc = comm->sum(comm->mc.ctx, rows, &count, 1)))))
		goto comm_failed;
	*loss = count > 0 ? sum / count : NAN;
	*tokens = (int64_t)count;
	return 0;
comm_failed:
	if (comm && comm->err != err)
		snprintf(err, errlen, "%s", comm->err);
	else if (!comm && !err[0])
		snprintf(err, errlen, "eval: forward failed");
	return rc;
}

int trainer_seek_data(struct trainer *t, int64_t step, int64_t sample, int64_t epoch_rows,
		      char *err, size_t errlen)
{
	if (sample < 0 || !t->data)
		return 0;
	struct data_pos p = { .sample = sample, .epoch_rows = epoch_rows };
	return data_seek(t->data, step, &p, err, errlen);
}

/* ---- checkpoints: whole tensors ---- */

float *trainer_ckpt_m(struct trainer *t) { return t->mesh ? t->gm : t->m; }
float *trainer_ckpt_v(struct trainer *t) { return t->mesh ? t->gv : t->v; }

void trainer_ckpt_state(struct trainer *t, struct ckpt_state *s, int64_t next_step)
{
	s->cfg = &t->cfg;
	s->model = t->mesh ? t->gmodel : t->model;
	s->params = t->mesh ? t->gp : model_params(t->model);
	s->m = trainer_ckpt_m(t);
	s->v = trainer_ckpt_v(t);
	s->numel = model_numel(s->model);
	s->next_step = next_step;
	/* the job's rows per step: per_device_batch_size x every device */
	s->global_batch = t->global_rows;
	s->data_sample = s->data_epoch_rows = -1;
	if (t->data) {
		struct data_pos p;
		data_position(t->data, next_step, t->global_rows, &p);
		s->data_sample = p.sample;
		s->data_epoch_rows = p.epoch_rows;
	}
}

int trainer_save(struct trainer *t, const char *dir, int64_t next_step, char *err, size_t errlen)
{
	struct ckpt_state s;
	trainer_ckpt_state(t, &s, next_step);
	return ckpt_save(&s, dir, err, errlen);
}

int trainer_load(struct trainer *t, const char *dir, int64_t *next_step, char *err, size_t errlen)
{
	struct ckpt_state s;
	trainer_ckpt_state(t, &s, 0);
	int rc = ckpt_load(&s, dir, next_step != NULL, err, errlen);
	if (!rc && next_step) {
		*next_step = s.next_step;
		rc = trainer_seek_data(t, s.next_step, s.data_sample, s.data_epoch_rows, err, errlen);
	}
	return rc;
}

static void layout_to_state(struct trainer *t, float *st, const float *loc);

/* Resume in place: the floats of the layout this device's optimizer
 * state holds (a ZeRO-1 bucket: its part), sorted, touching ones merged. */
static int state_ranges(const struct trainer *t, struct hf_range *r)
{
	int n = 0;
	for (int i = 0; i < t->nseg; i++) {
		const struct seg *s = &t->seg[i];
		size_t lo = s->p0 + s->s0, hi = lo + (s->zero ? s->len : s->n);
		if (lo == hi)
			continue;
		if (n && r[n - 1].hi == lo)
			r[n - 1].hi = hi;
		else
			r[n++] = (struct hf_range){ lo, hi };
	}
	return n;
}

int trainer_resume_read(struct trainer *t, struct ckpt_resume *r, char *err, size_t errlen)
{
	size_t n = model_numel(t->model);
	struct hf_range *ranges = malloc(sizeof(*ranges) * (size_t)(t->nseg ? t->nseg : 1));
	float *lm = malloc(sizeof(float) * n), *lv = malloc(sizeof(float) * n);
	int rc = 0;
	if (!ranges || !lm || !lv) {
		snprintf(err, errlen, "train: out of memory: %zu bytes to resume", 2 * n * sizeof(float));
		rc = -ENOMEM;
	}
	if (!rc)
		rc = ckpt_resume_read(r, t->model, model_params(t->model), lm, lv, ranges,
				      state_ranges(t, ranges), err, errlen);
	/* the host's other devices may copy from lm and lv until then */
	rc = ckpt_resume_done(r, rc, err, errlen);
	if (!rc) {
		layout_to_state(t, t->m, lm);
		layout_to_state(t, t->v, lv);
	}
	free(ranges);
	free(lm);
	free(lv);
	return rc;
}

/* The whole model's table (a one-device model of one token) and buffers. */
int trainer_ckpt_prepare(struct trainer *t, char *err, size_t errlen)
{
	if (!t->mesh || t->gmodel)
		return 0;
	struct model_dims d = *model_dims(t->model);
	d.T = 1;
	d.bsplit = 0;  /* the table and one row: no halves */
	int rc = model_open(&t->gmodel, &d, 1, NULL, err, errlen);
	if (rc)
		return rc;
	size_t n = model_numel(t->gmodel);
	t->gp = calloc(n, sizeof(float));
	t->gm = calloc(n, sizeof(float));
	t->gv = calloc(n, sizeof(float));
	if (!t->gp || !t->gm || !t->gv) {
		snprintf(err, errlen, "train: out of memory: %zu bytes for the whole model's parameters and "
			 "optimizer state (checkpoints)", 3 * n * sizeof(float));
		return -ENOMEM;
	}
	return 0;
}

/* Optimizer state in the parameters' layout (loc) from m or v: ZeRO-1
 * parts are gathered over data (collective). */
static int state_to_layout(struct trainer *t, const struct train_comm *comm, float *loc, const float *st)
{
	for (int i = 0; i < t->nseg; i++) {
		struct seg *s = &t->seg[i];
		if (!s->zero) {
			memcpy(loc + s->p0, st + s->o0, s->n * sizeof(float));
			continue;
		}
		/* loc has the bucket's padding too: gather straight into it */
		int rc = comm->mc.all_gather(comm->mc.ctx, 1u << AX_DATA, loc + s->p0, st + s->o0,
					     s->shard_n * sizeof(float));
		if (rc)
			return rc;
	}
	return 0;
}

static void layout_to_state(struct trainer *t, float *st, const float *loc)
{
	for (int i = 0; i < t->nseg; i++) {
		struct seg *s = &t->seg[i];
		memcpy(st + s->o0, loc + s->p0 + s->s0, (s->zero ? s->len : s->n) * sizeof(float));
	}
}

/* The whole stacked tensors of buf (the checkpoint's layout) from the
 * model's storage order to layer order (to_layers) or back: a pipeline
 * with repeats stores its layers in stage order (model_stack_layer). */
static int reorder_layers(struct trainer *t, float *buf, bool to_layers)
{
	struct model *m = t->model;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		const struct param_info *gpi = model_param_by_name(t->gmodel, p->name);
		int n = p->global_shape[0], q = 0;
		while (p->stacked && q < n && model_stack_layer(m, q, n) == q)
			q++;
		if (!p->stacked || q == n)  /* layer order already */
			continue;
		size_t per = gpi->numel / (size_t)n;
		float *w = buf + gpi->offset, *tmp = malloc(sizeof(float) * gpi->numel);
		if (!tmp)
			return -ENOMEM;
		for (q = 0; q < n; q++) {
			size_t l = (size_t)model_stack_layer(m, q, n);
			memcpy(tmp + (to_layers ? l : (size_t)q) * per, w + (to_layers ? (size_t)q : l) * per,
			       per * sizeof(float));
		}
		memcpy(w, tmp, sizeof(float) * gpi->numel);
		free(tmp);
	}
	return 0;
}

int trainer_ckpt_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen)
{
	struct model *m = t->model;
	size_t n = model_numel(m), big = 0;
	int rc;
	if (!t->mesh)
		return 0;
	if ((rc = trainer_ckpt_prepare(t, err, errlen)))
		return rc;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t need = p->numel * (size_t)mesh_axes_size(t->mesh, p->split);
		big = need > big ? need : big;
	}
	float *loc = malloc(sizeof(float) * n), *recv = malloc(sizeof(float) * (big ? big : 1));
	if (!loc || !recv) {
		free(loc);
		free(recv);
		snprintf(err, errlen, "train: out of memory: %zu bytes to gather a checkpoint",
			 sizeof(float) * (n + big));
		return -ENOMEM;
	}
	const float *src[3] = { model_params(m), t->m, t->v };
	float *dst[3] = { t->gp, t->gm, t->gv };
	for (int b = 0; b < 3 && !rc; b++) {
		/* parameters are in the layout already; optimizer state may not be */
		const float *lay = b ? loc : src[0];
		if (b && (rc = state_to_layout(t, comm, loc, src[b])))
			break;
		for (int i = 0; i < model_num_params(m) && !rc; i++) {
			const struct param_info *p = model_param(m, i);
			const struct param_info *gpi = model_param_by_name(t->gmodel, p->name);
			const struct plan_param *pp = model_param_plan(m, i);
			const struct mesh_members *tg = p->split ? tgroup(t, p->split) : NULL;
			float *whole = dst[b] + gpi->offset;
			if (!p->split) {
				memcpy(whole, lay + p->offset, p->numel * sizeof(float));
				continue;
			}
			if (!tg) {
				rc = -ENOMEM;
				break;
			}
			if ((rc = comm->mc.all_gather(comm->mc.ctx, p->split, recv, lay + p->offset,
						      p->numel * sizeof(float))))
				break;
			place_gathered(t, pp, tg, p->ndim, p->ndim, whole, p->global_shape, recv, p->shape,
				       p->numel);
		}
	}
	free(loc);
	free(recv);
	for (int b = 0; b < 3 && !rc; b++)
		if (reorder_layers(t, dst[b], true))
			rc = -ENOMEM;
	if (rc == -ENOMEM)
		snprintf(err, errlen, "train: out of memory");
	else if (rc && comm->err != err)
		snprintf(err, errlen, "%s", comm->err[0] ? comm->err : "train: out of memory");
	return rc;
}

int trainer_ckpt_scatter(struct trainer *t, char *err, size_t errlen)
{
	struct model *m = t->model;
	size_t n = model_numel(m);
	if (!t->mesh)
		return 0;
	float *loc = malloc(sizeof(float) * n);
	if (!loc) {
		snprintf(err, errlen, "train: out of memory");
		return -ENOMEM;
	}
	float *src[3] = { t->gp, t->gm, t->gv };
	for (int b = 0; b < 3; b++)
		if (reorder_layers(t, src[b], false)) {
			free(loc);
			snprintf(err, errlen, "train: out of memory");
			return -ENOMEM;
		}
	for (int b = 0; b < 3; b++) {
		float *out = b == 0 ? model_params(m) : loc;
		for (int i = 0; i < model_num_params(m); i++) {
			const struct param_info *p = model_param(m, i);
			const struct param_info *gpi = model_param_by_name(t->gmodel, p->name);
			plan_copy_block(src[b] + gpi->offset, p->global_shape, out + p->offset, p->shape,
					p->goff, p->ndim, false);
		}
		if (b > 0)
			layout_to_state(t, b == 1 ? t->m : t->v, loc);
	}
	free(loc);
	for (int b = 0; b < 3; b++)  /* the whole tensors stay in layer order */
		if (reorder_layers(t, src[b], true)) {
			snprintf(err, errlen, "train: out of memory");
			return -ENOMEM;
		}
	return 0;
}
