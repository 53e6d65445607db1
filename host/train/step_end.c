/* The step's end (host/train/train_int.h, step_end): after the table,
 * the gradient sums, the loss and the global norm over the mesh,
 * clipping, the learning rate and the update; with
 * pipeline_update_ahead, the update ahead of the norm and its check
 * (docs/training-step.md, "After backward" and "Updating ahead").
 * train.c calls it; it calls nothing of train.c. */
#include "host/train/train_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host/util/clock.h"

/* Muon's Newton-Schulz runs and bytes sent in the step, over every
 * device (exact, a collective when Muon runs on a mesh). */
static int count_muon(struct trainer *t, const struct train_comm *comm, struct step_stats *st)
{
	struct optim_stats os;
	optim_get_stats(t->opt, &os);
	double x[3] = { (double)os.ns_matrices, (double)os.muon_bytes, os.ns_flops };
	int rc = comm && !strcmp(t->cfg.opt_type, "muon") ? comm->sum(comm->mc.ctx, (1u << AX_COUNT) - 1, x, 3) : 0;
	bool plan = os.ns_plan_max > 0;  /* a mesh: the plan's spread; one device: its own */
	st->muon_ns = x[0];
	st->muon_bytes = x[1];
	st->muon_gflop[0] = x[2] * 1e-9;
	st->muon_gflop[1] = (plan ? os.ns_plan_max : os.ns_flops) * 1e-9;
	st->muon_gflop[2] = (plan ? os.ns_plan_min : os.ns_flops) * 1e-9;
	return rc;
}

/* The loss and the MoE auxiliary loss are summed over the axes that
 * split the rows (and stages), the gradients' sum of squares over every
 * axis. */
static uint32_t loss_axes(const struct trainer *t)
{
	bool staged = pipe_exec_table(t->px)->shape.stages > 1;
	return model_rows_axes(t->model) | (staged ? 1u << AX_STAGE : 0);
}

/* Whether the loss's axes make the same group as every axis: every
 * other axis has one device, so one sum carries all three scalars (the
 * same members in the same rank order: the same bits, one collective
 * fewer in the step's tail). */
static bool one_scalar_sum(const struct trainer *t)
{
	uint32_t rest = ((1u << AX_COUNT) - 1) & ~loss_axes(t);
	for (int a = 0; t->mesh && a < AX_COUNT; a++)
		if ((rest & (1u << a)) && t->mesh->size[a] > 1)
			return false;
	return true;
}

/* Every bucket summed (host/optim/); then the loss, the MoE auxiliary
 * loss and the global gradient norm over the mesh: scal = {loss, aux}. */
static int sum_scalars(struct trainer *t, const struct train_comm *comm, const struct model_step *ms,
		       double *scal, double *norm)
{
	double x[3] = { ms->loss_sum, ms->aux, 0 };
	int rc = optim_sum_grads(t->opt, &x[2]);
	if (!rc && comm) {
		if (one_scalar_sum(t))
			rc = comm->sum(comm->mc.ctx, (1u << AX_COUNT) - 1, x, 3);
		else if (!(rc = comm->sum(comm->mc.ctx, loss_axes(t), x, 2)))
			rc = comm->sum(comm->mc.ctx, (1u << AX_COUNT) - 1, &x[2], 1);
	}
	scal[0] = x[0];
	scal[1] = x[1];
	*norm = sqrt(x[2]);
	return rc;
}

/* Global-norm clipping over every trained parameter: the factor. */
static float clip_factor(const struct cfg *c, double norm)
{
	return c->gradient_clipping_threshold > 0 && norm > c->gradient_clipping_threshold ?
	       (float)(c->gradient_clipping_threshold / norm) : 1.0f;
}

/* The update of this device's shards, timed. */
static int update(struct trainer *t, const struct train_comm *comm, int64_t step, float lr, float clip,
		  struct step_stats *st)
{
	st->t_opt0 = util_now_s();
	int rc = optim_update(t->opt, step, lr, clip);
	st->t_opt1 = util_now_s();
	return rc ? rc : count_muon(t, comm, st);
}

/* ---- The update ahead (pipeline_update_ahead) ----
 *
 * In a pipeline the stages end the step's table at different times, and
 * each waits at the global gradient norm for the last. With the key,
 * every device sums the step's scalars (loss, aux, squares) in the
 * background; a stage whose list ends early (pipe_exec_ends_early)
 * updates at once as if clipping scaled nothing (optim_keep first) and
 * goes on to the next step's first gathers and forwards; at the next
 * table's first exchange (its gate) it waits for the sums. When clipping
 * would not scale the gradients its update stands (the same bits: a
 * factor of 1 is no scaling); else it puts the kept state back, updates
 * with the factor, and runs the table again from its start. A stage
 * that saw clipping in the step it checked last waits for the sums
 * before its next update (the norm changes slowly: the next would most
 * likely be redone too). docs/training-step.md, "Updating ahead". */

/* The scalars of the step pending: the sums started (x: loss sum, aux,
 * this device's share of the squares), over the axes sum_scalars uses. */
static int ahead_sums_start(struct trainer *t, const struct train_comm *comm, const double x[3])
{
	t->ah.h[0] = t->ah.h[1] = NULL;
	memcpy(t->ah.x, x, sizeof(t->ah.x));
	if (one_scalar_sum(t))
		return comm->sum_start(comm->mc.ctx, (1u << AX_COUNT) - 1, x, 3, &t->ah.h[0]);
	int rc = comm->sum_start(comm->mc.ctx, loss_axes(t), x, 2, &t->ah.h[0]);
	return rc ? rc : comm->sum_start(comm->mc.ctx, (1u << AX_COUNT) - 1, &x[2], 1, &t->ah.h[1]);
}

/* Waits for them: the step's loss, aux and norm known, and its clip
 * factor. */
static int ahead_sums_wait(struct trainer *t)
{
	const struct train_comm *comm = t->ah.comm;
	int rc = comm->sum_wait(comm->mc.ctx, t->ah.h[0], t->ah.x);
	int r = comm->sum_wait(comm->mc.ctx, t->ah.h[1], &t->ah.x[2]);
	t->ah.h[0] = t->ah.h[1] = NULL;
	t->ah.clip = clip_factor(&t->cfg, sqrt(t->ah.x[2]));
	return rc ? rc : r;
}

/* The pending update checked: it stands, or ah.redo; what
 * trainer_settled gives. */
static int ahead_check(struct trainer *t)
{
	int rc = ahead_sums_wait(t);
	t->ah.pending = false;
	t->ah.clipped = t->ah.clip != 1.0f;
	t->ah.redo = !rc && t->ah.clipped;
	t->ah.done_step = t->ah.step;
	t->ah.done[0] = t->ah.x[0] / t->ah.denom;
	t->ah.done[1] = t->ah.x[1];
	t->ah.done[2] = sqrt(t->ah.x[2]);
	t->ah.how = t->ah.redo ? AHEAD_REDONE : AHEAD_KEPT;
	return rc;
}

int step_end_gate(void *ctx)
{
	struct trainer *t = ctx;
	int rc = ahead_check(t);
	return rc ? rc : t->ah.redo ? -EAGAIN : 0;
}

int step_end_redo(struct trainer *t)
{
	struct step_stats scratch;
	t->ah.redo = false;
	int rc = optim_restore(t->opt);
	return rc ? rc : update(t, t->ah.comm, t->ah.step, t->ah.lr, t->ah.clip, &scratch);
}

/* The step's end with the key: the sums in the background; the update at
 * once (this stage ends early and the last check did not clip) or after
 * them. */
static int ahead_end(struct trainer *t, const struct train_comm *comm, int64_t step, const struct model_step *ms,
		     double denom, struct step_stats *st)
{
	double x[3] = { ms->loss_sum, ms->aux, 0 };
	int rc = optim_sum_grads(t->opt, &x[2]);
	if (rc || (rc = ahead_sums_start(t, comm, x)))
		return rc;
	t->ah.comm = comm;
	t->ah.step = step;
	t->ah.denom = denom;
	t->ah.lr = optim_lr(t->opt, step);
	st->lr = t->ah.lr;
	if (t->ah.on && !t->ah.clipped) {
		if ((rc = optim_keep(t->opt))) {
			snprintf(comm->err, comm->errlen, "train: out of memory for pipeline_update_ahead's second "
				 "parameters, gradients, m and v (%zu floats each)", model_numel(t->model));
			return rc;
		}
		if ((rc = update(t, comm, step, t->ah.lr, 1.0f, st)))
			return rc;
		t->ah.pending = true;
		st->ahead = AHEAD_PENDING;
		st->loss = st->aux = st->grad_norm = NAN;
		return 0;
	}
	if ((rc = ahead_sums_wait(t)) || (rc = update(t, comm, step, t->ah.lr, t->ah.clip, st)))
		return rc;
	t->ah.clipped = t->ah.clip != 1.0f;
	st->ahead = AHEAD_WAITED;
	st->loss = t->ah.x[0] / denom;
	st->aux = t->ah.x[1];
	st->grad_norm = sqrt(t->ah.x[2]);
	return 0;
}

int64_t trainer_settled(const struct trainer *t, struct step_stats *st)
{
	st->ahead = t->ah.how;
	st->loss = t->ah.done[0];
	st->aux = t->ah.done[1];
	st->grad_norm = t->ah.done[2];
	return t->ah.done_step;
}

int trainer_settle(struct trainer *t, char *err, size_t errlen)
{
	if (!t->ah.pending)
		return 0;
	const struct train_comm *comm = t->ah.comm;
	/* the next step's first gathers the update started read the
	 * parameters a redo rewrites */
	int rc = ahead_check(t);
	if (!rc && t->ah.redo && !(rc = pipe_exec_prefetch_drop(t->px)))
		rc = step_end_redo(t);
	if (rc && comm->err != err)
		snprintf(err, errlen, "%s", comm->err);
	return rc;
}

int step_end(struct trainer *t, const struct train_comm *comm, int64_t step, const struct model_step *ms,
	     double denom, struct step_stats *st)
{
	double scal[2], norm;
	int rc;
	if (t->ah.all && comm && comm->sum_start)
		return ahead_end(t, comm, step, ms, denom, st);
	if ((rc = sum_scalars(t, comm, ms, scal, &norm)))
		return rc;
	float clip = clip_factor(&t->cfg, norm), lr = optim_lr(t->opt, step);
	if ((rc = update(t, comm, step, lr, clip, st)))
		return rc;
	st->loss = scal[0] / denom;
	st->aux = scal[1];
	st->grad_norm = norm;
	st->lr = lr;
	return 0;
}
