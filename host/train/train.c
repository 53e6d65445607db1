/* Per-device trainer: see host/train/train.h. The optimizer's state and
 * update live in host/optim/, the checkpoints' whole tensors in
 * train_ckpt.c. */
#include "host/train/train_int.h"
#include "host/train/check.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/data/data.h"
#include "host/model/window.h"
#include "host/pipeline/pipe_config.h"
#include "host/util/clock.h"

struct model *trainer_model(struct trainer *t) { return t->model; }
struct data_source *trainer_data(struct trainer *t) { return t->data; }
struct data_source *trainer_eval_data(struct trainer *t) { return t->eval; }
int trainer_rows(const struct trainer *t) { return t->rows; }
const struct cfg *trainer_cfg(const struct trainer *t) { return &t->cfg; }
struct pipe_exec *trainer_pipe(struct trainer *t) { return t->px; }

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
	pm.pipe_w_stashes = tab.w_stashes[stage];
	pm.pipe_w_reads_acts = !pc.shape.recompute;
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
	if ((rc = pipe_exec_new(&t->px, &tab, stage, pc.first_layer, dev, t->model, mb, err, errlen)))
		return rc;
	pipe_exec_set_fill(t->px, c->pipeline_fill_waits);
	enum pipe_parts parts = !strcmp(c->fsdp_layer_parts, "true")	 ? PIPE_PARTS_ON :
				!strcmp(c->fsdp_layer_parts, "false") ? PIPE_PARTS_OFF :
									  PIPE_PARTS_AUTO;
	if ((rc = pipe_exec_set_parts(t->px, parts, err, errlen)))
		return rc;
	struct pipe_costs sl;
	if ((rc = pipe_config_sleep(c, &sl, err, errlen)) < 0)
		return rc;
	pipe_exec_set_sleep(t->px, rc ? &sl : NULL);
	return 0;
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

/* The optimizer's call once it has updated the shards the next step's
 * table's leading gathers before upto read: they leave now
 * (pipe_exec_prefetch). */
static int prefetch(void *ctx, int upto)
{
	struct trainer *t = ctx;
	return t->step_mc ? pipe_exec_prefetch(t->px, t->step_mc, upto) : 0;
}

/* The optimizer, its buckets in the order the step's table makes
 * gradients final, and the executor's hook that starts their sums. */
static int open_optim(struct trainer *t, const struct cfg *c, struct optim_place *pl, char *err,
		      size_t errlen)
{
	int n = pipe_exec_grad_order(t->px, NULL, NULL, 0), rc;
	/* room for the order and for the groups the leading gathers read
	 * (a stage may read more groups first than it completes) */
	int nf = pipe_exec_first_reads(t->px, NULL, NULL, NULL, 0), cap = (n > nf ? n : nf) + 1;
	int *l0 = malloc(sizeof(int) * (size_t)cap), *l1 = malloc(sizeof(int) * (size_t)cap);
	int *by = malloc(sizeof(int) * (size_t)cap);
	if (!l0 || !l1 || !by) {
		free(l0);
		free(l1);
		free(by);
		snprintf(err, errlen, "train: out of memory for the gradient order");
		return -ENOMEM;
	}
	pipe_exec_grad_order(t->px, l0, l1, n);
	pl->stages = pipe_exec_table(t->px)->shape.stages;
	pl->order_l0 = l0;
	pl->order_l1 = l1;
	pl->norder = n;
	rc = optim_new(&t->opt, t->model, c, pl, err, errlen);
	if (!rc) {
		pipe_exec_set_hooks(t->px, &(struct pipe_hooks){ .grads_done = optim_hook_grads,
								 .weights_needed = optim_hook_weights,
								 .stage_sums = optim_hook_stage_sums,
								 .ctx = t->opt });
		/* the groups the table's leading gathers read, every one:
		 * the prefetch's gathers copy their shards into the windows
		 * (on the communication thread, once they run), so each
		 * must be updated before it starts and not written after */
		nf = pipe_exec_first_reads(t->px, l0, l1, by, nf);
		optim_set_prefetch(t->opt, prefetch, t, l0, l1, by, nf);
	}
	free(l0);
	free(l1);
	free(by);
	return rc;
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
	struct optim_place pl = { .ndata = 1 };
	struct model_mesh mmz;
	if (mm && mm->mesh->num_devices > 1) {
		t->mesh = mm->mesh;
		t->device = mm->device;
		mesh_coords(t->mesh, t->device, t->coord);
		mmz = *mm;
		/* ZeRO-1: buckets padded to split evenly over data, in place */
		pl = (struct optim_place){ .mesh = t->mesh, .device = t->device, .ndata = 1 };
		if (c->shard_optimizer_over_data && t->mesh->size[AX_DATA] > 1) {
			pl.ndata = t->mesh->size[AX_DATA];
			pl.rdata = t->coord[AX_DATA]; /* one axis: its coordinate order */
			mmz.bucket_align = pl.ndata;
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
	if ((rc = open_optim(t, c, &pl, err, errlen)))
		goto fail;
	t->ah.all = c->pipeline_update_ahead && t->mesh && pipe_exec_table(t->px)->shape.stages > 1;
	t->ah.on = t->ah.all && pipe_exec_ends_early(t->px);
	t->ah.done_step = -1;
	t->inputs = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	t->targets = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	if (!t->inputs || !t->targets) {
		asked = 2 * sizeof(int32_t) * (size_t)rows * d.T;
		what = "the batch";
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
	optim_free(t->opt);
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

/* The step's forward and backward (the schedule's table). With a
 * pipeline the gradients of what runs data-parallel over `stage` (every
 * tensor not split over it: embedding, head, final norm) are summed over
 * it by the optimizer: started when the table says they are final on
 * this stage (optim_hook_stage_sums), else after it. */
static int pipe_step(struct trainer *t, const struct train_comm *comm, struct model_step *ms)
{
	bool staged = pipe_exec_table(t->px)->shape.stages > 1;  /* else nothing moves point to point */
	return pipe_exec_step(t->px, t->inputs, t->targets, ms, comm && staged ? &comm->p2p : NULL);
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

/* The step's model_step: the loss is the mean over the global batch's
 * *denom targets that count (all of them unless the data masks some). */
static int step_scale(struct trainer *t, const struct train_comm *comm, int global_rows, struct model_step *ms,
		      double *denom)
{
	const struct model_dims *d = model_dims(t->model);
	*denom = (double)global_rows * d->T;
	int rc = data_masks(t->data) ? count_targets(t, comm, denom) : 0;
	*ms = (struct model_step){
		.loss_scale = (float)(1.0 / *denom),
		.lb_weight = (float)t->cfg.load_balance_loss_weight,
		.global_tokens = (double)global_rows * d->T,
		.comm = comm ? &comm->mc : NULL,
	};
	return rc;
}

/* Forward and backward (the table), the optimizer's buckets started as
 * their gradients are final. An update that went ahead is checked at the
 * table's gate (step_end_gate); when it must be redone, the table stopped
 * there, and runs again after the redone update. */
static int forward_backward(struct trainer *t, const struct train_comm *comm, struct model_step *ms,
			    struct step_stats *st)
{
	struct optim_comm oc;
	memset(model_grads(t->model), 0, model_numel(t->model) * sizeof(float));
	optim_step_begin(t->opt, trainer_optim_comm(comm, &oc));
	t->step_mc = comm ? &comm->mc : NULL;
	st->t_fb0 = util_now_s();
	double c0 = util_thread_cpu_s();
	if (t->ah.pending)
		pipe_exec_set_gate(t->px, step_end_gate, t);
	int rc = pipe_step(t, comm, ms);
	if (rc == -EAGAIN && t->ah.redo && !(rc = step_end_redo(t))) {
		memset(model_grads(t->model), 0, model_numel(t->model) * sizeof(float));
		optim_step_begin(t->opt, trainer_optim_comm(comm, &oc));
		rc = pipe_step(t, comm, ms);
	}
	if (!rc && t->ah.pending) {  /* every pipeline stage's list exchanges something */
		snprintf(comm->err, comm->errlen, "train: the update ahead of step %lld was never checked",
			 (long long)t->ah.step);
		rc = -EPROTO;
	}
	st->cpu_fb = util_thread_cpu_s() - c0;
	st->t_fb1 = util_now_s();
	st->weight_gathers = pipe_exec_gathers(t->px);
	/* counted from step to step: a gather the last update started too */
	size_t copied = model_window(t->model) ? win_copied(model_window(t->model)) : 0;
	st->window_copies = (double)(copied - t->win_copied);
	t->win_copied = copied;
	return rc;
}

int trainer_step(struct trainer *t, int64_t step, int global_rows, int row0,
		 const struct train_comm *comm, struct step_stats *st, char *err, size_t errlen)
{
	struct model_step ms;
	double denom;
	int rc;

	st->ahead = AHEAD_OFF;
	st->t_data0 = util_now_s();
	rc = data_batch(t->data, step, global_rows, row0, t->rows, t->inputs, t->targets, err, errlen);
	st->t_data1 = util_now_s();
	if (rc)
		return rc;
	if ((rc = step_scale(t, comm, global_rows, &ms, &denom)) || (rc = forward_backward(t, comm, &ms, st)) ||
	    (rc = step_end(t, comm, step, &ms, denom, st))) {
		if (comm && comm->err != err)
			snprintf(err, errlen, "%s", comm->err);
		return rc;
	}
	return 0;
}

int trainer_sync(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen)
{
	int rc = trainer_settle(t, err, errlen);
	if (rc)
		return rc;
	rc = optim_wait_params(t->opt);
	int r = pipe_exec_prefetch_drop(t->px);
	rc = rc ? rc : r;
	if (rc && comm && comm->err != err)
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
	int rc = trainer_sync(t, comm, err, errlen);
	if (rc)
		return rc;
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
