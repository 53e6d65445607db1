/* The trainer's side of checkpoints (host/train/train.h): whole tensors
 * from every device's shards and back, in layer order (a pipeline with
 * repeats stores its layers in stage order), the optimizer state in the
 * parameters' layout, and the data position. */
#include "host/train/train_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/data/data.h"
#include "host/mesh/plan.h"

static const struct mesh_members *tgroup(struct trainer *t, uint32_t axes)
{
	for (int k = 0; k < t->ntg; k++)
		if (t->tg[k].axes == axes)
			return &t->tg[k];
	if (t->ntg == MAX_TGROUPS || mesh_members_init(t->mesh, t->device, axes, &t->tg[t->ntg]))
		return NULL;
	return &t->tg[t->ntg++];
}

int trainer_seek_data(struct trainer *t, int64_t step, int64_t sample, int64_t epoch_rows,
		      char *err, size_t errlen)
{
	if (sample < 0 || !t->data)
		return 0;
	struct data_pos p = { .sample = sample, .epoch_rows = epoch_rows };
	return data_seek(t->data, step, &p, err, errlen);
}

float *trainer_ckpt_m(struct trainer *t) { return t->mesh ? t->gm : optim_state(t->opt, 0); }
float *trainer_ckpt_v(struct trainer *t) { return t->mesh ? t->gv : optim_state(t->opt, 1); }

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

/* Resume in place: the floats of the layout this device's optimizer
 * state holds (a ZeRO-1 bucket: its part), sorted, touching ones merged. */
static int state_ranges(const struct trainer *t, struct hf_range *r)
{
	int n = 0;
	for (int i = 0; i < optim_state_nranges(t->opt); i++) {
		size_t lo, hi;
		optim_state_range(t->opt, i, &lo, &hi);
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
	int nr = optim_state_nranges(t->opt);
	struct hf_range *ranges = malloc(sizeof(*ranges) * (size_t)(nr ? nr : 1));
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
		optim_layout_to_state(t->opt, 0, lm);
		optim_layout_to_state(t->opt, 1, lv);
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

/* The whole tensors of the layout lay (parameters, or state in their
 * layout) into dst, every split one gathered over its axes (collective). */
static int gather_whole(struct trainer *t, const struct train_comm *comm, const float *lay, float *dst,
			float *recv)
{
	struct model *m = t->model;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		const struct param_info *gpi = model_param_by_name(t->gmodel, p->name);
		const struct plan_param *pp = model_param_plan(m, i);
		const struct mesh_members *tg = p->split ? tgroup(t, p->split) : NULL;
		float *whole = dst + gpi->offset;
		if (!p->split) {
			memcpy(whole, lay + p->offset, p->numel * sizeof(float));
			continue;
		}
		if (!tg)
			return -ENOMEM;
		int rc = comm->mc.all_gather(comm->mc.ctx, p->split, recv, lay + p->offset,
					     p->numel * sizeof(float));
		if (rc)
			return rc;
		plan_place_gathered(pp, t->mesh, tg, p->ndim, p->ndim, whole, p->global_shape, recv, p->shape,
				    p->numel);
	}
	return 0;
}

int trainer_ckpt_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen)
{
	struct model *m = t->model;
	size_t n = model_numel(m), big = 0;
	struct optim_comm oc;
	int rc;
	if (!t->mesh)
		return 0;
	if ((rc = trainer_sync(t, comm, err, errlen)) || (rc = trainer_ckpt_prepare(t, err, errlen)))
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
	float *dst[3] = { t->gp, t->gm, t->gv };
	for (int b = 0; b < 3 && !rc; b++) {
		/* parameters are in the layout already; optimizer state may not be */
		const float *lay = b ? loc : model_params(m);
		if (b && (rc = optim_state_to_layout(t->opt, trainer_optim_comm(comm, &oc), b - 1, loc)))
			break;
		rc = gather_whole(t, comm, lay, dst[b], recv);
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
			optim_layout_to_state(t->opt, b - 1, loc);
	}
	free(loc);
	for (int b = 0; b < 3; b++)  /* the whole tensors stay in layer order */
		if (reorder_layers(t, src[b], true)) {
			snprintf(err, errlen, "train: out of memory");
			return -ENOMEM;
		}
	return 0;
}
