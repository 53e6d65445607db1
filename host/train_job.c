/* The training job every agent runs (`meshrun agent`, `meshrun local`):
 * one trainer per device thread, each computing its rows of the global
 * batch. Today the batch axes train: `data`, and `fsdp`/`fsdp_transpose`
 * whose devices also split the optimizer state and its update into flat
 * shards (ZeRO style: gradients reduce-scattered over the shard group,
 * parameters all-gathered after the update); `shard_optimizer_over_data`
 * adds `data` to the shard group (ZeRO-1). Parameters are still gathered
 * whole for the step: per-layer gathering (real FSDP memory) and the other
 * axes wait for the sharded-matmul planner (DESIGN §6) and are refused.
 * Global device 0 prints the step log, writes metrics and checkpoints; on
 * --resume it loads the checkpoint and broadcasts it, so only host 0 needs
 * the directory. */
#include "host/train_job.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli.h"
#include "host/trace.h"
#include "net/coll.h"

struct reduce_ctx {
	struct coll_dev *coll;
	struct coll_group group;     /* every device */
	struct coll_group shard;     /* optimizer shard group */
	struct coll_group repl;      /* replicas of one shard */
	struct coll_group tensor;    /* tensor-parallel group */
	struct coll_group ttg;       /* tensor-transpose group */
	struct coll_group expert;    /* expert-parallel group */
	struct coll_group mp;        /* the model-parallel one: tensor or expert */
	struct coll_group xrepl;     /* batch group less expert: holders of the same experts */
	size_t e0, e1;               /* the experts' range of the flat layout */
	double *gathered;       /* [n, nscal] */
	int cap;
	int32_t *counts;        /* [n, ncounts] */
	int ccap;
	char *err;
	size_t errlen;
	struct trace *tr;
};

#define SPAN(c, name, call) ({ double t0_ = run_now(); int r_ = (call); \
	trace_span((c)->tr, name, "comm", t0_, run_now()); r_; })

/* MoE expert counts between forward and backward: gathered and summed in
 * rank order (exact integers). */
static int reduce_counts(void *vctx, int32_t *counts, int n)
{
	struct reduce_ctx *c = vctx;
	if (n > c->ccap) {
		free(c->counts);
		c->counts = malloc(sizeof(int32_t) * (size_t)n * c->group.n);
		if (!c->counts) {
			snprintf(c->err, c->errlen, "train: out of memory");
			return EXIT_FAIL;
		}
		c->ccap = n;
	}
	if (SPAN(c, "moe counts", coll_all_gather(c->coll, &c->group, c->counts, counts,
						  sizeof(int32_t) * n, c->err, c->errlen)))
		return EXIT_PEER_LOST;
	for (int i = 0; i < n; i++) {
		int32_t s = 0;
		for (int r = 0; r < c->group.n; r++)
			s += c->counts[(size_t)r * n + i];
		counts[i] = s;
	}
	return 0;
}

/* Gradients: ring all-reduce (deterministic order). Scalars (loss sums,
 * expert counts) travel as doubles: gathered, then summed in rank order on
 * every rank, so every replica sees the same bits. */
static int reduce_all(void *vctx, float *grads, size_t n, double *scal, int nscal,
		      char *err, size_t errlen)
{
	struct reduce_ctx *c = vctx;
	int rc = 0;
	if (n && c->expert.n > 1 && c->e1 > c->e0) {
		/* expert weights: only over the devices holding the same experts */
		rc = SPAN(c, "all_reduce grads", coll_all_reduce(c->coll, &c->group, grads, c->e0, err, errlen)) ||
		     SPAN(c, "all_reduce experts", coll_all_reduce(c->coll, &c->xrepl, grads + c->e0,
								  c->e1 - c->e0, err, errlen)) ||
		     SPAN(c, "all_reduce grads", coll_all_reduce(c->coll, &c->group, grads + c->e1,
								n - c->e1, err, errlen));
	} else if (n) {
		rc = SPAN(c, "all_reduce grads", coll_all_reduce(c->coll, &c->group, grads, n, err, errlen));
	}
	if (rc)
		return EXIT_PEER_LOST;
	if (nscal > c->cap) {
		free(c->gathered);
		c->gathered = malloc(sizeof(double) * (size_t)nscal * c->group.n);
		if (!c->gathered) {
			snprintf(err, errlen, "train: out of memory");
			return EXIT_FAIL;
		}
		c->cap = nscal;
	}
	rc = coll_all_gather(c->coll, &c->group, c->gathered, scal, sizeof(double) * nscal, err, errlen);
	if (rc)
		return EXIT_PEER_LOST;
	for (int i = 0; i < nscal; i++) {
		double s = 0;
		for (int r = 0; r < c->group.n; r++)
			s += c->gathered[(size_t)r * nscal + i];
		scal[i] = s;
	}
	return 0;
}

static int tt_allreduce(void *vctx, float *buf, size_t n)
{
	struct reduce_ctx *c = vctx;
	return SPAN(c, "tt all_reduce", coll_all_reduce(c->coll, &c->ttg, buf, n, c->err, c->errlen))
	       ? EXIT_PEER_LOST : 0;
}

static int tp_allreduce(void *vctx, float *buf, size_t n)
{
	struct reduce_ctx *c = vctx;
	return SPAN(c, "tp all_reduce", coll_all_reduce(c->coll, &c->tensor, buf, n, c->err, c->errlen))
	       ? EXIT_PEER_LOST : 0;
}

/* Sums doubles over a group exactly the same way on every member:
 * gathered, then added in rank order. */
static int group_sum(struct coll_dev *coll, const struct coll_group *g, double *x, int n,
		     char *err, size_t errlen)
{
	double *all = malloc(sizeof(double) * (size_t)n * g->n);
	if (!all) {
		snprintf(err, errlen, "train: out of memory");
		return EXIT_FAIL;
	}
	int rc = coll_all_gather(coll, g, all, x, sizeof(double) * n, err, errlen);
	for (int i = 0; !rc && i < n; i++) {
		double s = 0;
		for (int r = 0; r < g->n; r++)
			s += all[(size_t)r * n + i];
		x[i] = s;
	}
	free(all);
	return rc ? EXIT_PEER_LOST : 0;
}

static int tp_sum(void *vctx, double *x, int n, char *err, size_t errlen)
{
	struct reduce_ctx *c = vctx;
	return c->mp.n > 1 ? group_sum(c->coll, &c->mp, x, n, err, errlen) : 0;
}

static int ep_all_gather(void *vctx, int32_t *all, const int32_t *mine, int n)
{
	struct reduce_ctx *c = vctx;
	return SPAN(c, "ep counts", coll_all_gather(c->coll, &c->expert, all, mine, sizeof(int32_t) * n,
						    c->err, c->errlen)) ? EXIT_PEER_LOST : 0;
}

static int ep_all_to_all(void *vctx, void *out, const size_t *recv_bytes, const void *in,
			 const size_t *send_bytes)
{
	struct reduce_ctx *c = vctx;
	return SPAN(c, "ep all_to_all", coll_all_to_all(c->coll, &c->expert, out, recv_bytes, in,
							send_bytes, c->err, c->errlen)) ? EXIT_PEER_LOST : 0;
}

static int shard_reduce_scatter(void *vctx, float *shard, const float *full, size_t shard_n,
				char *err, size_t errlen)
{
	struct reduce_ctx *c = vctx;
	if (SPAN(c, "reduce_scatter grads", coll_reduce_scatter(c->coll, &c->shard, shard, full, shard_n,
								err, errlen)))
		return EXIT_PEER_LOST;
	if (c->repl.n > 1 && SPAN(c, "all_reduce shard", coll_all_reduce(c->coll, &c->repl, shard,
									 shard_n, err, errlen)))
		return EXIT_PEER_LOST;
	return 0;
}

static int shard_all_gather(void *vctx, float *full, size_t shard_n, char *err, size_t errlen)
{
	struct reduce_ctx *c = vctx;
	if (SPAN(c, "all_gather params", coll_all_gather(c->coll, &c->shard, full,
							 full + shard_n * (size_t)c->shard.rank,
							 shard_n * sizeof(float), err, errlen)))
		return EXIT_PEER_LOST;
	return 0;
}

static int shard_sum(void *vctx, double *x, int n, char *err, size_t errlen)
{
	struct reduce_ctx *c = vctx;
	return group_sum(c->coll, &c->shard, x, n, err, errlen);
}

/* Axes the routed experts are split over: expert, and fsdp too under
 * custom_mesh_and_rule=shard-exp-on-fsdp (DESIGN §6: exp -> expert, fsdp). */
static uint32_t expert_axes(const struct cfg *c)
{
	uint32_t a = 1u << AX_EXPERT;
	if (!strcmp(c->custom_mesh_and_rule, "shard-exp-on-fsdp"))
		a |= 1u << AX_FSDP;
	return a;
}

/* The batch axes and tensor train today; every other axis must be 1. */
static int check_mesh(const struct cfg *c, const struct run_opts *o, char *err, size_t errlen)
{
	for (int a = 0; a < AX_COUNT; a++) {
		if (a == AX_DATA || a == AX_FSDP || a == AX_FSDP_T || a == AX_TENSOR || a == AX_EXPERT ||
		    a == AX_TENSOR_T || (c->ici[a] == 1 && c->dcn[a] == 1))
			continue;
		snprintf(err, errlen, "config: the '%s' mesh axis has size %d, but sharded training "
			 "along it is not implemented yet; today data, fsdp, fsdp_transpose, "
			 "tensor, tensor_transpose and expert parallelism train",
			 mesh_axis_names[a], c->ici[a] * c->dcn[a]);
		return -EINVAL;
	}
	if (c->custom_mesh_and_rule[0] && strcmp(c->custom_mesh_and_rule, "shard-exp-on-fsdp")) {
		snprintf(err, errlen, "config: key 'custom_mesh_and_rule' must be \"\" or shard-exp-on-fsdp, got '%s'",
			 c->custom_mesh_and_rule);
		return -EINVAL;
	}
	if (expert_axes(c) != (1u << AX_EXPERT) || c->ici[AX_EXPERT] * c->dcn[AX_EXPERT] > 1) {
		if (c->shard_optimizer_over_data && c->num_experts > 1) {
			snprintf(err, errlen, "config: expert parallelism together with "
				 "shard_optimizer_over_data is not implemented yet");
			return -EINVAL;
		}
	}
	(void)o;
	return 0;
}

/* Resume: device 0 loaded the checkpoint (whole tensors); every device
 * takes it, then its own shards. */
static int broadcast_state(struct trainer *t, struct reduce_ctx *rc, const struct coll_group *all,
			   int64_t *start, char *err, size_t errlen)
{
	size_t n = trainer_ckpt_numel(t);
	int64_t s = *start;
	if (coll_broadcast(rc->coll, all, trainer_ckpt_params(t), n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(rc->coll, all, trainer_ckpt_m(t), n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(rc->coll, all, trainer_ckpt_v(t), n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(rc->coll, all, &s, sizeof(s), 0, err, errlen))
		return EXIT_PEER_LOST;
	*start = s;
	trainer_tp_scatter(t);
	trainer_opt_take_shard(t);
	return 0;
}

static int tp_all_gather(void *vctx, float *all, const float *mine, size_t n, char *err, size_t errlen)
{
	struct reduce_ctx *c = vctx;
	if (coll_all_gather(c->coll, &c->mp, all, mine, n * sizeof(float), err, errlen))
		return EXIT_PEER_LOST;
	return 0;
}

/* Gathers every device's spans to device 0, which writes the file. */
static int write_trace(struct device_ctx *dev, struct reduce_ctx *rc, const struct coll_group *all,
		       const char *path, char *err, size_t errlen)
{
	int n = all->n, ret = 0;
	bool leader = dev->device_id == 0;
	int *counts = calloc((size_t)n, sizeof(int)), *host_of = calloc((size_t)n, sizeof(int));
	struct trace_event *ev = malloc(sizeof(*ev) * TRACE_MAX_EVENTS * (size_t)n);
	if (!counts || !host_of || !ev) {
		snprintf(err, errlen, "train: out of memory for the trace");
		ret = EXIT_FAIL;
		goto out;
	}
	if (coll_all_gather(rc->coll, all, counts, &rc->tr->n, sizeof(int), err, errlen) ||
	    coll_all_gather(rc->coll, all, ev, rc->tr->ev, sizeof(*ev) * TRACE_MAX_EVENTS, err, errlen)) {
		ret = EXIT_PEER_LOST;
		goto out;
	}
	for (int i = 0; i < n; i++)
		host_of[i] = mesh_host_of(dev->mesh, all->devs[i]);
	if (leader && trace_write(path, ev, counts, host_of, n, err, errlen))
		ret = EXIT_FAIL;
out:
	free(counts);
	free(host_of);
	free(ev);
	return ret;
}

int train_job(struct device_ctx *dev)
{
	const struct train_job_arg *arg = dev->job_arg;
	const struct cfg *c = dev->cfg;
	const struct run_opts *o = &arg->opts;
	char *err = dev->err;
	size_t errlen = sizeof(dev->err);
	struct reduce_ctx rc = { 0 };
	struct mesh_group *g = NULL, *gs = NULL, *gr = NULL, *gt = NULL, *ga = NULL, *gx = NULL, *gxr = NULL,
			  *gtt = NULL;
	struct trainer *t = NULL;
	struct run_log log = { 0 };
	int ret = 0;
	int64_t start = 0;
	bool leader = dev->device_id == 0;

	if (check_mesh(c, o, err, errlen))
		return EXIT_CONFIG;
	g = malloc(sizeof(*g));
	gs = malloc(sizeof(*gs));
	gr = malloc(sizeof(*gr));
	gt = malloc(sizeof(*gt));
	ga = malloc(sizeof(*ga));
	gx = malloc(sizeof(*gx));
	gxr = malloc(sizeof(*gxr));
	gtt = malloc(sizeof(*gtt));
	if (!g || !gs || !gr || !gt || !ga || !gx || !gxr || !gtt) {
		snprintf(err, errlen, "train: out of memory");
		ret = EXIT_FAIL;
		goto out;
	}
	uint32_t shard_axes = (1u << AX_FSDP) | (1u << AX_FSDP_T);
	if (c->shard_optimizer_over_data)
		shard_axes |= 1u << AX_DATA;
	/* experts split over devices: the flat optimizer shards would cut
	 * across different experts, so the optimizer stays whole (fsdp then
	 * splits the batch and, with shard-exp-on-fsdp, the experts) */
	mesh_group(dev->mesh, dev->device_id, expert_axes(c), g);
	if (c->num_experts > 1 && g->n > 1)
		shard_axes = 0;
	/* the batch group: every axis but tensor and tensor_transpose (their
	 * devices share rows) */
	uint32_t batch_axes = ((1u << AX_COUNT) - 1) & ~(1u << AX_TENSOR) & ~(1u << AX_TENSOR_T);
	mesh_group(dev->mesh, dev->device_id, batch_axes, g);
	mesh_group(dev->mesh, dev->device_id, shard_axes, gs);
	mesh_group(dev->mesh, dev->device_id, batch_axes & ~shard_axes, gr);
	mesh_group(dev->mesh, dev->device_id, 1u << AX_TENSOR, gt);
	mesh_group(dev->mesh, dev->device_id, (1u << AX_COUNT) - 1, ga);
	mesh_group(dev->mesh, dev->device_id, 1u << AX_TENSOR_T, gtt);
	rc.ttg = (struct coll_group){ .id = gtt->id, .n = gtt->n, .rank = gtt->rank, .devs = gtt->devs };
	mesh_group(dev->mesh, dev->device_id, c->num_experts > 1 ? expert_axes(c) : 0, gx);
	mesh_group(dev->mesh, dev->device_id, batch_axes & ~(c->num_experts > 1 ? expert_axes(c) : 0), gxr);
	rc.expert = (struct coll_group){ .id = gx->id, .n = gx->n, .rank = gx->rank, .devs = gx->devs };
	rc.xrepl = (struct coll_group){ .id = gxr->id, .n = gxr->n, .rank = gxr->rank, .devs = gxr->devs };
	struct coll_group all = { .id = ga->id, .n = ga->n, .rank = ga->rank, .devs = ga->devs };
	rc.tensor = (struct coll_group){ .id = gt->id, .n = gt->n, .rank = gt->rank, .devs = gt->devs };
	rc.mp = rc.tensor.n > 1 ? rc.tensor : (rc.expert.n > 1 ? rc.expert : rc.ttg);
	rc.group = (struct coll_group){ .id = g->id, .n = g->n, .rank = g->rank, .devs = g->devs };
	rc.shard = (struct coll_group){ .id = gs->id, .n = gs->n, .rank = gs->rank, .devs = gs->devs };
	rc.repl = (struct coll_group){ .id = gr->id, .n = gr->n, .rank = gr->rank, .devs = gr->devs };
	rc.coll = coll_dev_new(dev->xport, dev->device_id, (size_t)c->segment_bytes,
			       c->collective_timeout_s);
	if (!rc.coll) {
		snprintf(err, errlen, "train: unable to start the communication thread");
		ret = EXIT_FAIL;
		goto out;
	}
	/* global batch = per_device_batch_size x every device (as in MaxText),
	 * split over the batch group */
	int global_rows = (int)c->per_device_batch_size * dev->mesh->num_devices;
	int B = global_rows / g->n;
	t = trainer_new(c, B, gt->n, gt->rank, gx->n, gx->rank, gtt->n, gtt->rank, err, errlen);
	if (!t) {
		ret = strncmp(err, "config", 6) ? EXIT_INPUT : EXIT_CONFIG;
		goto out;
	}
	model_expert_range(trainer_model(t), &rc.e0, &rc.e1);
	if (trainer_set_shards(t, rc.shard.n, rc.shard.rank, err, errlen)) {
		ret = strncmp(err, "config", 6) ? EXIT_FAIL : EXIT_CONFIG;
		goto out;
	}
	/* every device starts from the same weights (init is a function of each
	 * element's global index); on resume, from device 0's checkpoint */
	if (o->resume) {
		if (trainer_tp_prepare_load(t, err, errlen)) {
			ret = EXIT_FAIL;
			goto out;
		}
		if (leader && trainer_load(t, o->ckpt_dir, &start, err, errlen)) {
			ret = EXIT_INPUT;
			goto out;
		}
		if ((ret = broadcast_state(t, &rc, &all, &start, err, errlen)))
			goto out;
	}
	if (leader && (ret = run_log_open(&log, o, c, model_dims(trainer_model(t)), dev->mesh->num_devices,
					  err, errlen)))
		goto out;

	rc.err = err;
	rc.errlen = errlen;
	struct train_comm comm = { .reduce = reduce_all, .counts = reduce_counts,
				   .tp_allreduce = tp_allreduce, .tt_allreduce = tt_allreduce, .tp_sum = tp_sum,
				   .ep_all_gather = ep_all_gather, .ep_all_to_all = ep_all_to_all,
				   .tp_all_gather = tp_all_gather,
				   .shard_reduce_scatter = shard_reduce_scatter,
				   .shard_all_gather = shard_all_gather, .shard_sum = shard_sum,
				   .ctx = &rc, .err = err, .errlen = errlen };
	if (o->trace) {
		rc.tr = malloc(sizeof(*rc.tr));
		if (!rc.tr) {
			snprintf(err, errlen, "train: out of memory for the trace");
			ret = EXIT_FAIL;
			goto out;
		}
		/* line the devices' clocks up on a barrier */
		if (coll_barrier(rc.coll, &all, err, errlen)) {
			ret = EXIT_PEER_LOST;
			goto out;
		}
		trace_start(rc.tr, true);
	}
	uint64_t dcn0 = agent_dcn_bytes_sent(dev->agent), ici0 = xport_local_bytes(dev->xport);
	double first_loss = NAN, last_loss = NAN, run_t0 = run_now();
	for (int64_t s = start; s < c->steps; s++) {
		struct step_stats st;
		coll_set_step(rc.coll, (uint64_t)s);
		if (rc.tr)
			rc.tr->step = s;
		double t0 = run_now();
		ret = trainer_step(t, s, global_rows, g->rank * B, &comm, &st, err, errlen);
		if (ret)
			goto out;
		double dt = run_now() - t0;
		trace_span(rc.tr, "forward+backward", "compute", st.t_fb0, st.t_fb1);
		trace_span(rc.tr, "optimizer", "compute", st.t_opt0, st.t_opt1);
		trace_span(rc.tr, "step", "step", t0, t0 + dt);
		if (!isfinite(st.loss)) {
			snprintf(err, errlen, "train: loss is %g at step %" PRId64, st.loss, s);
			ret = EXIT_FAIL;
			goto out;
		}
		bool last = s == c->steps - 1;
		bool save = o->ckpt_dir && ((c->checkpoint_period > 0 && (s + 1) % c->checkpoint_period == 0) || last);
		if (save && ((ret = trainer_opt_gather(t, &comm, err, errlen)) ||
			     (ret = trainer_tp_gather(t, &comm, err, errlen))))
			goto out;
		if (!leader)
			continue;
		if (s == start)
			first_loss = st.loss;
		last_loss = st.loss;
		uint64_t dcn = agent_dcn_bytes_sent(dev->agent), ici = xport_local_bytes(dev->xport);
		if (c->log_period > 0 && (s % c->log_period == 0 || s == c->steps - 1))
			run_log_step(&log, s, &st, dt, dcn - dcn0, ici - ici0);
		dcn0 = dcn;
		ici0 = ici;
		if (save && trainer_save(t, o->ckpt_dir, s + 1, err, errlen)) {
			ret = EXIT_FAIL;
			goto out;
		}
	}
	if (leader && c->steps > start) {
		char mesh[256] = "";
		size_t used = 0;
		for (int a = 0; a < AX_COUNT; a++)
			if (dev->mesh->size[a] > 1)
				used += snprintf(mesh + used, sizeof(mesh) - used, "%s%s=%d", used ? " " : "",
						 mesh_axis_names[a], dev->mesh->size[a]);
		printf("finished: %" PRId64 " steps on %d hosts x %d devices (%s), loss %.4f -> %.4f, %.1f s%s%s\n",
		       (int64_t)(c->steps - start), dev->mesh->num_hosts, dev->mesh->devices_per_host,
		       used ? mesh : "one device", first_loss, last_loss, run_now() - run_t0,
		       o->ckpt_dir ? ", checkpoint in " : "", o->ckpt_dir ? o->ckpt_dir : "");
		fflush(stdout);
	}
	if (rc.tr && (ret = write_trace(dev, &rc, &all, o->trace, err, errlen)))
		goto out;
	/* nobody leaves before the checkpoint is written */
	if (coll_barrier(rc.coll, &all, err, errlen))
		ret = EXIT_PEER_LOST;
out:
	if (leader)
		run_log_close(&log);
	trainer_free(t);
	if (rc.coll)
		coll_dev_free(rc.coll);
	free(rc.gathered);
	free(rc.counts);
	free(g);
	free(gs);
	free(gr);
	free(gt);
	free(ga);
	free(gx);
	free(gxr);
	free(gtt);
	free(rc.tr);
	return ret;
}
