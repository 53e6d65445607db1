/* Per-device trainer: see host/train.h. The optimizer keeps two buffers in
 * the parameters' layout: AdamW's m and v, or Muon's momentum in m. */
#include "host/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli.h"
#include "host/data.h"
#include "host/run.h"
#include "kernels/kernels.h"

struct trainer {
	struct cfg cfg;
	struct model *model;
	struct dataset *data;
	int rows;
	float *m, *v, *scratch;
	int32_t *inputs, *targets;
	bool muon;
	/* optimizer sharding (ZeRO): this replica updates floats [s0, s0 +
	 * shard_n) of the flat layout; m and v hold only that range */
	int nshards, srank;
	size_t shard_n, s0;
	float *pad;              /* [nshards * shard_n]: gradients in, parameters out */
	float *gshard;           /* reduced gradient shard */
	float *mfull, *vfull;    /* whole optimizer state, for checkpoints */
	/* model parallelism (tensor or expert: tp holds whichever is > 1):
	 * the whole model's table and buffers, filled for checkpoints by
	 * trainer_tp_gather */
	int tp, tpr;
	struct model *gmodel;
	float *gp, *gm, *gv;
};

struct model *trainer_model(struct trainer *t) { return t->model; }
struct dataset *trainer_data(struct trainer *t) { return t->data; }
int trainer_rows(const struct trainer *t) { return t->rows; }
float *trainer_opt_m(struct trainer *t) { return t->nshards > 1 ? t->mfull : t->m; }
float *trainer_opt_v(struct trainer *t) { return t->nshards > 1 ? t->vfull : t->v; }
const struct cfg *trainer_cfg(const struct trainer *t) { return &t->cfg; }

struct trainer *trainer_new(const struct cfg *c, int rows, int tp, int tpr, int ep, int epr,
			    int tt, int ttr, char *err, size_t errlen)
{
	struct model_dims d;
	struct trainer *t;

	if (model_dims_from_cfg(&d, c, err, errlen))
		return NULL;
	if (strcmp(c->opt_type, "adamw") && strcmp(c->opt_type, "muon")) {
		snprintf(err, errlen, "config: key 'opt_type' must be adamw or muon, got '%s'", c->opt_type);
		return NULL;
	}
	if (c->steps < 0) {
		snprintf(err, errlen, "config: key 'steps' must be >= 0, got %lld", c->steps);
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		goto oom;
	t->cfg = *c;
	t->rows = rows;
	t->muon = !strcmp(c->opt_type, "muon");
	t->nshards = 1;
	/* the model-parallel split (tensor or expert) checkpoints gather over */
	t->tp = tp > 1 ? tp : (ep > 1 ? ep : (tt > 1 ? tt : 1));
	t->tpr = tp > 1 ? tpr : (ep > 1 ? epr : (tt > 1 ? ttr : 0));
	if (t->muon && (tp > 1 || tt > 1)) {
		snprintf(err, errlen, "config: opt_type=muon needs whole matrices, but tensor "
			 "(or tensor_transpose) parallelism splits them; use opt_type=adamw with it");
		goto fail;
	}
	t->data = data_open(c, err, errlen);
	if (!t->data)
		goto fail;
	t->model = model_new(&d, rows, tp, tpr, ep, epr, tt, ttr, err, errlen);
	if (!t->model)
		goto fail;
	model_init(t->model, (uint64_t)c->init_weights_seed, (float)c->init_std);
	size_t n = model_numel(t->model);
	t->m = calloc(n, sizeof(float));
	t->v = calloc(n, sizeof(float));
	size_t big = 0;
	for (int i = 0; i < model_num_params(t->model); i++) {
		const struct param_info *p = model_param(t->model, i);
		if (p->opt != OPT_MUON)
			continue;
		size_t mx = (size_t)(p->mat_rows > p->mat_cols ? p->mat_rows : p->mat_cols);
		size_t need = 3 * mx * mx + 2 * (size_t)p->mat_rows * p->mat_cols;
		if (need > big)
			big = need;
	}
	t->scratch = malloc(sizeof(float) * (big ? big : 1));
	t->inputs = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	t->targets = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	if (!t->m || !t->v || !t->scratch || !t->inputs || !t->targets)
		goto oom;
	return t;
oom:
	snprintf(err, errlen, "train: out of memory");
fail:
	trainer_free(t);
	return NULL;
}

void trainer_free(struct trainer *t)
{
	if (!t)
		return;
	model_free(t->model);
	if (t->data)
		data_close(t->data);
	free(t->m);
	free(t->v);
	free(t->scratch);
	free(t->inputs);
	free(t->targets);
	free(t->pad);
	free(t->gshard);
	free(t->mfull);
	free(t->vfull);
	model_free(t->gmodel);
	free(t->gp);
	free(t->gm);
	free(t->gv);
	free(t);
}

/* DeepSeek-V3's auxiliary-loss-free balancing: nudge each expert's
 * selection bias toward the mean load (counts summed over all replicas, so
 * every replica makes the same update). */
static void update_router_bias(struct trainer *t, const struct param_info *p)
{
	const struct model_dims *d = model_dims(t->model);
	const int32_t *counts = model_expert_counts(t->model);
	float rate = (float)t->cfg.routed_bias_update_rate;
	float *b = model_params(t->model) + p->offset;
	if (!d->L_moe || rate == 0.0f)
		return;
	for (int l = 0; l < d->L_moe; l++)
		moe_bias_update(b + (size_t)l * d->E, counts + (size_t)l * d->E, d->E, rate);
}

/* Updates parameters [s0, s1) of the flat layout from gradients g (indexed
 * from s0), with t->m and t->v indexed from s0 too. Muon needs whole
 * matrices, so it only runs unsharded. */
static void optimizer_update(struct trainer *t, int64_t step, float lr, const float *g,
			     size_t s0, size_t s1)
{
	struct model *m = t->model;
	const struct cfg *c = &t->cfg;
	float *P = model_params(m);
	float wd = (float)c->adam_weight_decay;

	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t a = p->offset > s0 ? p->offset : s0;
		size_t b = p->offset + p->numel < s1 ? p->offset + p->numel : s1;
		if (p->opt == OPT_NONE) {
			update_router_bias(t, p);
		} else if (a >= b) {
			continue;
		} else if (p->opt == OPT_MUON && t->muon) {
			size_t per = (size_t)p->mat_rows * p->mat_cols;
			for (size_t o = a; o < b; o += per)
				muon_update(P + o, g + (o - s0), t->m + (o - s0), t->scratch,
					    p->mat_rows, p->mat_cols, lr, (float)c->muon_momentum,
					    p->decay ? wd : 0.0f);
		} else {
			adamw_update(P + a, g + (a - s0), t->m + (a - s0), t->v + (a - s0), b - a, lr,
				     (float)c->adam_b1, (float)c->adam_b2, (float)c->adam_eps,
				     p->decay ? wd : 0.0f, (int)step + 1);
		}
	}
}

int trainer_set_shards(struct trainer *t, int nshards, int rank, char *err, size_t errlen)
{
	size_t n = model_numel(t->model);
	if (nshards <= 1)
		return 0;
	if (t->muon) {
		snprintf(err, errlen, "config: opt_type=muon cannot shard its optimizer state over "
			 "flat shards yet (it needs whole matrices); use opt_type=adamw with "
			 "shard_optimizer_over_data or fsdp");
		return -EINVAL;
	}
	t->nshards = nshards;
	t->srank = rank;
	t->shard_n = (n + (size_t)nshards - 1) / (size_t)nshards;
	t->s0 = t->shard_n * (size_t)rank;
	size_t full = t->shard_n * (size_t)nshards;
	free(t->m);
	free(t->v);
	t->m = calloc(t->shard_n, sizeof(float));
	t->v = calloc(t->shard_n, sizeof(float));
	t->gshard = calloc(t->shard_n, sizeof(float));
	t->pad = calloc(full, sizeof(float));
	t->mfull = calloc(full, sizeof(float));
	t->vfull = calloc(full, sizeof(float));
	if (!t->m || !t->v || !t->gshard || !t->pad || !t->mfull || !t->vfull) {
		snprintf(err, errlen, "train: out of memory");
		return -ENOMEM;
	}
	return 0;
}

size_t trainer_shard_len(const struct trainer *t) { return t->shard_n; }

/* ---- tensor-parallel checkpoints ---- */

struct model *trainer_ckpt_model(struct trainer *t) { return t->tp > 1 ? t->gmodel : t->model; }
float *trainer_ckpt_params(struct trainer *t) { return t->tp > 1 ? t->gp : model_params(t->model); }
float *trainer_ckpt_m(struct trainer *t) { return t->tp > 1 ? t->gm : trainer_opt_m(t); }
float *trainer_ckpt_v(struct trainer *t) { return t->tp > 1 ? t->gv : trainer_opt_v(t); }

/* The whole model's table (a tp=1 model of one sequence) and buffers. */
static int global_view(struct trainer *t, char *err, size_t errlen)
{
	if (t->gmodel)
		return 0;
	struct model_dims d = *model_dims(t->model);
	d.T = 1;
	t->gmodel = model_new(&d, 1, 1, 0, 1, 0, 1, 0, err, errlen);
	if (!t->gmodel)
		return -ENOMEM;
	size_t n = model_numel(t->gmodel);
	t->gp = calloc(n, sizeof(float));
	t->gm = calloc(n, sizeof(float));
	t->gv = calloc(n, sizeof(float));
	if (!t->gp || !t->gm || !t->gv) {
		snprintf(err, errlen, "train: out of memory");
		return -ENOMEM;
	}
	return 0;
}

/* Copies between this device's shard layout (local) and the whole layout
 * (global) for one shard index r; to_global picks the direction. */
static void tp_copy(struct trainer *t, int r, float *local, float *global, bool to_global)
{
	for (int i = 0; i < model_num_params(t->model); i++) {
		struct param_info p = *model_param(t->model, i);
		const struct param_info *gpi = model_param_by_name(t->gmodel, p.name);
		if (p.shard_dim >= 0)
			p.shard_idx = r;
		else if (r != t->tpr && to_global)
			continue; /* replicated: one copy is enough */
		for (size_t k = 0; k < p.numel; k++) {
			size_t gk = gpi->offset + param_global_index(&p, k);
			if (to_global)
				global[gk] = local[p.offset + k];
			else
				local[p.offset + k] = global[gk];
		}
	}
}

int trainer_tp_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen)
{
	int rc;
	if (t->tp <= 1)
		return 0;
	if ((rc = global_view(t, err, errlen)))
		return EXIT_FAIL;
	size_t n = model_numel(t->model);
	float *all = malloc(sizeof(float) * n * (size_t)t->tp);
	if (!all) {
		snprintf(err, errlen, "train: out of memory");
		return EXIT_FAIL;
	}
	float *src[3] = { model_params(t->model), trainer_opt_m(t), trainer_opt_v(t) };
	float *dst[3] = { t->gp, t->gm, t->gv };
	for (int b = 0; b < 3; b++) {
		if ((rc = comm->tp_all_gather(comm->ctx, all, src[b], n, err, errlen)))
			break;
		for (int r = 0; r < t->tp; r++)
			tp_copy(t, r, all + (size_t)r * n, dst[b], true);
	}
	free(all);
	return rc;
}

int trainer_tp_prepare_load(struct trainer *t, char *err, size_t errlen)
{
	return t->tp > 1 && global_view(t, err, errlen) ? EXIT_FAIL : 0;
}

size_t trainer_ckpt_numel(struct trainer *t)
{
	return model_numel(trainer_ckpt_model(t));
}

void trainer_tp_scatter(struct trainer *t)
{
	if (t->tp <= 1)
		return;
	tp_copy(t, t->tpr, model_params(t->model), t->gp, false);
	tp_copy(t, t->tpr, trainer_opt_m(t), t->gm, false);
	tp_copy(t, t->tpr, trainer_opt_v(t), t->gv, false);
}

void trainer_opt_take_shard(struct trainer *t)
{
	if (t->nshards > 1) {
		memcpy(t->m, t->mfull + t->s0, t->shard_n * sizeof(float));
		memcpy(t->v, t->vfull + t->s0, t->shard_n * sizeof(float));
	}
}

int trainer_opt_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen)
{
	int rc;
	if (t->nshards <= 1)
		return 0;
	memcpy(t->mfull + t->s0, t->m, t->shard_n * sizeof(float));
	memcpy(t->vfull + t->s0, t->v, t->shard_n * sizeof(float));
	if ((rc = comm->shard_all_gather(comm->ctx, t->mfull, t->shard_n, err, errlen)) ||
	    (rc = comm->shard_all_gather(comm->ctx, t->vfull, t->shard_n, err, errlen)))
		return rc;
	return 0;
}

/* Sums of squares of the trained parameters' gradients within [s0, s1), g
 * indexed from s0: ss[0] over tensors split over the tensor axis (each
 * device holds a different part), ss[1] over replicated ones. */
static void grad_sumsq(struct trainer *t, const float *g, size_t s0, size_t s1, double ss[2])
{
	struct model *m = t->model;
	ss[0] = ss[1] = 0;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		size_t a = p->offset > s0 ? p->offset : s0;
		size_t b = p->offset + p->numel < s1 ? p->offset + p->numel : s1;
		if (p->opt != OPT_NONE && a < b)
			ss[p->shard_dim >= 0 ? 0 : 1] += sumsq(g + (a - s0), b - a);
	}
}

int trainer_step(struct trainer *t, int64_t step, int global_rows, int row0,
		 const struct train_comm *comm, struct step_stats *st, char *err, size_t errlen)
{
	struct model *m = t->model;
	const struct cfg *c = &t->cfg;
	const struct model_dims *d = model_dims(m);
	size_t n = model_numel(m);
	double global_tokens = (double)global_rows * d->T;
	int rc;

	data_batch(t->data, step, global_rows, row0, t->rows, t->inputs, t->targets);
	memset(model_grads(m), 0, n * sizeof(float));
	struct model_step ms = {
		.loss_scale = (float)(1.0 / global_tokens),
		.lb_weight = (float)c->load_balance_loss_weight,
		.global_tokens = global_tokens,
		.counts = comm ? comm->counts : NULL,
		.tp_allreduce = comm ? comm->tp_allreduce : NULL,
		.tt_allreduce = comm ? comm->tt_allreduce : NULL,
		.ep_all_gather = comm ? comm->ep_all_gather : NULL,
		.ep_all_to_all = comm ? comm->ep_all_to_all : NULL,
		.ctx = comm ? comm->ctx : NULL,
	};
	st->t_fb0 = run_now();
	rc = model_forward_backward(m, t->inputs, t->targets, &ms);
	st->t_fb1 = run_now();
	if (rc) {
		if (comm && comm->err != err)
			snprintf(err, errlen, "%s", comm->err);
		return rc;
	}
	double scal[2] = { ms.loss_sum, ms.aux };
	bool sharded = t->nshards > 1;
	if (comm && (rc = comm->reduce(comm->ctx, model_grads(m), sharded ? 0 : n, scal, 2, err, errlen)))
		return rc;

	/* the gradient this replica applies, over [s0, s1) of the layout */
	const float *g = model_grads(m);
	size_t s0 = 0, s1 = n;
	double ss[2];
	if (sharded) {
		/* ZeRO: reduce-scatter the gradients, update the own shard, then
		 * all-gather the parameters */
		memcpy(t->pad, model_grads(m), n * sizeof(float));
		memset(t->pad + n, 0, (t->shard_n * t->nshards - n) * sizeof(float));
		if ((rc = comm->shard_reduce_scatter(comm->ctx, t->gshard, t->pad, t->shard_n, err, errlen)))
			return rc;
		g = t->gshard;
		s0 = t->s0;
		s1 = t->s0 + t->shard_n < n ? t->s0 + t->shard_n : n;
		s1 = s1 > s0 ? s1 : s0;
		grad_sumsq(t, g, s0, s1, ss);
		if ((rc = comm->shard_sum(comm->ctx, ss, 2, err, errlen)))
			return rc;
	} else {
		grad_sumsq(t, g, 0, n, ss);
	}
	/* tensor-split gradients: every device of the tensor group holds a
	 * different part; replicated ones are the same on all of them */
	if (comm && comm->tp_sum && (rc = comm->tp_sum(comm->ctx, ss, 1, err, errlen)))
		return rc;
	double norm = sqrt(ss[0] + ss[1]);
	/* global-norm clipping over every trained parameter */
	st->t_opt0 = run_now();
	if (c->gradient_clipping_threshold > 0 && norm > c->gradient_clipping_threshold)
		scale_inplace((float *)g, s1 - s0, (float)(c->gradient_clipping_threshold / norm));

	int total = c->learning_rate_schedule_steps > 0 ? (int)c->learning_rate_schedule_steps : (int)c->steps;
	int warmup = (int)(c->warmup_steps_fraction * total);
	float lr = lr_schedule((int)step, (float)c->learning_rate, warmup, total,
			       (float)c->cosine_learning_rate_final_fraction);
	optimizer_update(t, step, lr, g, s0, s1);
	st->t_opt1 = run_now();
	if (sharded) {
		float *P = model_params(m);
		memcpy(t->pad + t->s0, P + s0, (s1 - s0) * sizeof(float));
		if ((rc = comm->shard_all_gather(comm->ctx, t->pad, t->shard_n, err, errlen)))
			return rc;
		memcpy(P, t->pad, n * sizeof(float));
	}

	st->loss = scal[0] / global_tokens;
	st->aux = scal[1];
	st->grad_norm = norm;
	st->lr = lr;
	return 0;
}
