/* The training job every agent runs (`meshrun agent`, `meshrun local`):
 * one trainer per device thread. Its rows of the global batch follow from
 * the axes that split activation_batch; everything else (which weights are
 * gathered per layer, which partial sums are all-reduced, where tokens go)
 * comes from the model's plans (host/mesh/plan.h); this file hands the
 * trainer its communication (the collectives by axis set and a pipeline's
 * messages: host/train/job_comm.h) and drives the step loop
 * (host/train/loop.h): faults, the trace, resume. Global device 0 prints
 * the step log, writes metrics and checkpoints; on --resume it loads the
 * checkpoint and broadcasts it, so only host 0 needs the directory. */
#include "host/train/train_job.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/mesh/plan.h"
#include "host/mesh/shard.h"
#include "host/obs/trace.h"
#include "host/pipeline/pipe_config.h"
#include "host/train/check.h"
#include "host/train/job_comm.h"
#include "host/train/loop.h"
#include "host/util/clock.h"
#include "host/util/threads.h"
#include "net/coll.h"

/* Resume: device 0 loaded the checkpoint (whole tensors, the step and
 * the data position); every device takes it, then its own shards. */
static int broadcast_state(struct trainer *t, struct job_ctx *jc, const struct coll_group *all,
			   int64_t *start, char *err, size_t errlen)
{
	struct ckpt_state cs;
	trainer_ckpt_state(t, &cs, *start);
	size_t n = cs.numel;
	int64_t s[3] = { *start, cs.data_sample, cs.data_epoch_rows };
	if (coll_broadcast(jc->coll, all, cs.params, n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(jc->coll, all, cs.m, n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(jc->coll, all, cs.v, n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(jc->coll, all, s, sizeof(s), 0, err, errlen))
		return -EHOSTDOWN;
	*start = s[0];
	int rc = trainer_seek_data(t, s[0], s[1], s[2], err, errlen);
	return rc ? rc : trainer_ckpt_scatter(t, err, errlen);
}

/* Gathers every device's spans to device 0, which writes the file. */
static int write_trace(struct device_ctx *dev, struct job_ctx *rc, const struct coll_group *all,
		       const char *path, char *err, size_t errlen)
{
	int n = all->n, ret = 0;
	bool leader = dev->device_id == 0;
	int *counts = calloc((size_t)n, sizeof(int)), *host_of = calloc((size_t)n, sizeof(int));
	struct trace_event *ev = malloc(sizeof(*ev) * TRACE_MAX_EVENTS * (size_t)n);
	if (!counts || !host_of || !ev) {
		snprintf(err, errlen, "train: out of memory for the trace");
		ret = -ENOMEM;
		goto out;
	}
	if (coll_all_gather(rc->coll, all, counts, &rc->tr->n, sizeof(int), err, errlen) ||
	    coll_all_gather(rc->coll, all, ev, rc->tr->ev, sizeof(*ev) * TRACE_MAX_EVENTS, err, errlen)) {
		ret = -EHOSTDOWN;
		goto out;
	}
	for (int i = 0; i < n; i++)
		host_of[i] = mesh_host_of(dev->mesh, all->devs[i]);
	/* a trace file that cannot be written fails the job with its errno */
	if (leader)
		ret = trace_write(path, ev, counts, host_of, n, err, errlen);
out:
	free(counts);
	free(host_of);
	free(ev);
	return ret;
}

/* A kill or stop fault for this host at this step: the whole agent
 * process gets SIGKILL or SIGSTOP, as a crash or a hang would. */
static void host_fault(const struct job_ctx *c, int64_t step)
{
	int a = c->faults ? fault_host_action(c->faults, c->host, step) : -1;
	if (a < 0)
		return;
	fprintf(stderr, "meshrun: host %d: fault: injected %s on host %d at step %" PRId64 "\n",
		c->host, fault_kind_name((enum fault_kind)a), c->host, step);
	fflush(stderr);
	raise(a == FAULT_KILL ? SIGKILL : SIGSTOP);
}

static void job_step_begin(void *vctx, int64_t step)
{
	struct job_ctx *c = vctx;
	host_fault(c, step);
	coll_set_step(c->coll, (uint64_t)step);
	if (c->xcoll)
		coll_set_step(c->xcoll, (uint64_t)step);
	c->step = step;
	if (c->tr)
		c->tr->step = step;
}

static void job_step_end(void *vctx, const struct step_stats *st, double t0, double t1)
{
	struct job_ctx *c = vctx;
	trace_span_cpu(c->tr, "forward+backward", "compute", st->t_fb0, st->t_fb1, st->cpu_fb);
	/* the executor's compute actions, each its span (F, B, I, W of a
	 * microbatch and chunk; the owners' embed, head, embed_back; without
	 * a pipeline chunk c is layer c, so each layer's forward and backward
	 * is a span) */
	struct pipe_exec *px = c->t ? trainer_pipe(c->t) : NULL;
	int n = 0;
	const struct pipe_act_time *pt = px && c->tr ? pipe_exec_times(px, &n) : NULL;
	for (int i = 0; i < n; i++) {
		char name[32];
		if (pt[i].op == PA_EMBED || pt[i].op == PA_HEAD || pt[i].op == PA_EMBED_BACK)
			snprintf(name, sizeof(name), "%s mb%d", pipe_act_name(pt[i].op), pt[i].mb);
		else
			snprintf(name, sizeof(name), "%s mb%d c%d", pipe_act_name(pt[i].op), pt[i].mb, pt[i].chunk);
		trace_span_cpu(c->tr, name, "pipeline", pt[i].t0, pt[i].t1, pt[i].cpu);
	}
	trace_span(c->tr, "optimizer", "compute", st->t_opt0, st->t_opt1);
	trace_span(c->tr, "step", "step", t0, t1);
}

static void job_bytes(void *vctx, uint64_t *dcn, uint64_t *ici, uint64_t *msgs)
{
	struct job_ctx *c = vctx;
	*dcn = agent_dcn_bytes_sent(c->agent);
	*ici = xport_local_bytes(c->xport);
	*msgs = xport_messages(c->xport);
}

static void job_recovery(void *vctx, uint64_t *reconnects, uint64_t *resent)
{
	struct job_ctx *c = vctx;
	*reconnects = agent_reconnects(c->agent);
	*resent = agent_frames_resent(c->agent);
}

static double job_waited(void *vctx)
{
	return ((struct job_ctx *)vctx)->waited_s;
}

static double job_background(void *vctx)
{
	return ((struct job_ctx *)vctx)->bg_s;
}

/* The one line device 0 prints at the end. */
static void print_finished(const struct device_ctx *dev, const struct train_loop *l, int64_t start,
			   double seconds)
{
	const struct cfg *c = dev->cfg;
	const char *dir = l->opts->ckpt_dir;
	char mesh[256] = "";
	size_t used = 0;
	for (int a = 0; a < AX_COUNT; a++)
		if (dev->mesh->size[a] > 1)
			used += snprintf(mesh + used, sizeof(mesh) - used, "%s%s=%d", used ? " " : "",
					 mesh_axis_names[a], dev->mesh->size[a]);
	char loss[80] = "loss - (synthetic compute: pipeline_compute=sleep)";
	if (!pipe_config_synthetic(c))
		snprintf(loss, sizeof(loss), "loss %.4f -> %.4f", l->first_loss, l->last_loss);
	printf("finished: %" PRId64 " steps on %d hosts x %d devices (%s), %s, %.1f s%s%s\n",
	       (int64_t)(c->steps - start), dev->mesh->num_hosts, dev->mesh->devices_per_host,
	       used ? mesh : "one device", loss, seconds, dir ? ", checkpoint in " : "", dir ? dir : "");
	fflush(stdout);
}

/* load_parameters_path: this device's shards of the weights (the host's
 * devices one at a time, each block read once per host); host's first
 * device says what the host read. Every device of the host gets here
 * (train_job's exit calls hf_src_done for one that failed before). */
static int load_weights(struct device_ctx *dev, struct hf_src *src, struct trainer *t, char *err,
			size_t errlen)
{
	struct model *m = trainer_model(t);
	int rc = hf_src_done(src, hf_src_load(src, m, model_params(m), err, errlen), err, errlen);
	if (!rc && dev->local_index == 0) {
		char line[1024];
		hf_src_summary(src, line, sizeof(line));
		printf("meshrun: host %d: %s\n", dev->host_id, line);
		fflush(stdout);
	}
	return rc;
}

/* Resume, on any mesh. When every host opened the same save as host 0
 * (a shared file system), each device reads its own shards of it;
 * otherwise (the checkpoint is on host 0's disk alone) device 0 reads it
 * whole and broadcasts it, and every device takes its shards. */
static int resume(struct device_ctx *dev, struct trainer *t, struct job_ctx *jc,
		  const struct coll_group *all, const struct train_opts *o, int64_t *start, char *err,
		  size_t errlen)
{
	struct ckpt_resume *src = o->resume_from;
	bool leader = dev->device_id == 0;
	uint64_t id = leader && src ? ckpt_resume_id(src) : 0;
	double missing;
	int rc;
	if (coll_broadcast(jc->coll, all, &id, sizeof(id), 0, err, errlen))
		return -EHOSTDOWN;
	missing = src && id && ckpt_resume_id(src) == id ? 0 : 1;
	if ((rc = job_sum(jc, (1u << AX_COUNT) - 1, &missing, 1)))
		return rc;
	if (missing == 0) {
		int64_t sample, epoch_rows;
		if ((rc = trainer_resume_read(t, src, err, errlen)))
			return rc;
		*start = ckpt_resume_step(src);
		ckpt_resume_data_pos(src, &sample, &epoch_rows);
		if ((rc = trainer_seek_data(t, *start, sample, epoch_rows, err, errlen)))
			return rc;
		if (dev->local_index == 0) {
			char line[1024];
			ckpt_resume_summary(src, line, sizeof(line));
			printf("meshrun: host %d: %s\n", dev->host_id, line);
			fflush(stdout);
		}
		return 0;
	}
	if (leader)
		fprintf(stderr, "meshrun: host 0: resume: %.0f device%s cannot read this checkpoint where "
			"host 0 does: host 0 reads it whole and sends it\n", missing, missing == 1 ? "" : "s");
	rc = trainer_ckpt_prepare(t, err, errlen);
	if (!rc && leader)
		rc = trainer_load(t, o->ckpt_dir, start, err, errlen);
	if (!rc)
		rc = broadcast_state(t, jc, all, start, err, errlen);
	return rc;
}

/* The device computes at device_nice (or under device_batch); the threads
 * that move bytes must not inherit it, so the exchange thread (an MoE
 * model's expert all-to-all, Muon's exchanges on a mesh) starts first. A
 * setting the system refuses is said, not fatal. */
static int device_priority(struct device_ctx *dev, struct job_ctx *jc)
{
	const struct cfg *c = dev->cfg;
	int rc;
	bool xchg = c->num_experts > 1 || (!strcmp(c->opt_type, "muon") && dev->mesh->num_devices > 1);
	if ((c->device_nice > 0 || c->device_batch) && xchg && (rc = job_start_xcoll(jc)))
		return rc;
	if ((rc = util_device_nice(c)))
		fprintf(stderr, "meshrun: device %d: device_nice=%lld%s not applied (%s); computing at "
			"nice %d\n", dev->device_id, c->device_nice, c->device_batch ? " device_batch=true" : "",
			strerror(-rc), util_thread_nice());
	return 0;
}

int train_job(struct device_ctx *dev)
{
	const struct train_opts *o = dev->job_arg;
	const struct cfg *c = dev->cfg;
	char *err = dev->err;
	size_t errlen = sizeof(dev->err);
	struct job_ctx jc = { .mesh = dev->mesh, .device = dev->device_id, .err = err, .errlen = errlen,
			      .timeout_s = c->collective_timeout_s, .agent = dev->agent,
			      .segment_bytes = (size_t)c->segment_bytes,
			      .two_level = c->coll_two_level,
			      .xport = dev->xport };
	struct shard_rules *rules = NULL;
	struct trainer *t = NULL;
	struct steplog log = { 0 };
	int ret = 0;
	int64_t start = 0;
	bool leader = dev->device_id == 0, loaded = false;
	uint32_t rows = 0;

	/* everything the trainer would refuse, before anything is made */
	struct fault_plan faults;
	if ((ret = train_check(c, dev->mesh, err, errlen)) ||
	    (ret = agent_faults(c, dev->mesh->num_hosts, &faults, err, errlen)))
		goto out;
	/* host faults fire in the job's first launch only: a launcher's
	 * restart (--restart N) would otherwise meet the same kill again at
	 * the same step and never finish; link faults fire in every launch
	 * (the net's own copy of the plan) */
	if (dev->local_index == 0 && o->restart == 0)
		jc.faults = &faults;
	jc.host = dev->host_id;
	rules = malloc(sizeof(*rules));
	if (!rules) {
		snprintf(err, errlen, "train: out of memory");
		ret = -ENOMEM;
		goto out;
	}
	struct model_mesh mm = { .mesh = dev->mesh, .rules = rules, .device = dev->device_id };
	if (shard_rules_from_cfg(rules, c, err, errlen) ||
	    model_plan_rows(&mm, (int)c->base_emb_dim, &rows, err, errlen)) {
		ret = -EINVAL;
		goto out;
	}
	jc.coll = coll_dev_new(dev->xport, dev->device_id, (size_t)c->segment_bytes, c->collective_timeout_s);
	if (!jc.coll) {
		snprintf(err, errlen, "train: unable to start the communication thread");
		ret = -EAGAIN;
		goto out;
	}
	coll_set_two_level(jc.coll, c->coll_two_level);
	if ((ret = device_priority(dev, &jc)))
		goto out;
	const struct coll_group *rg = job_group(&jc, rows), *allg = job_group(&jc, (1u << AX_COUNT) - 1);
	if (!rg || !allg) {
		ret = -ENOMEM;
		goto out;
	}
	struct coll_group all = *allg;
	/* global batch = per_device_batch_size x every device (as in MaxText),
	 * split over the devices that split the rows; the others (tensor,
	 * tensor_transpose) share theirs */
	int global_rows = (int)c->per_device_batch_size * dev->mesh->num_devices;
	int B = global_rows / rg->n, row0 = rg->rank * B;
	if ((ret = trainer_open(&t, c, B, &mm, err, errlen)))
		goto out;
	if (o->weights) {
		ret = load_weights(dev, o->weights, t, err, errlen);
		loaded = true;
		if (ret)
			goto out;
	}
	jc.t = t;
	/* test hook: an idle pipeline slot that read its buffers would see NaN */
	if (trainer_pipe(t) && getenv("MESHRUN_TEST_PIPE_POISON"))
		pipe_exec_poison(trainer_pipe(t), 1);
	/* every device starts from the same weights (init is a function of each
	 * element's global index); on resume, from device 0's checkpoint */
	if (o->resume && (ret = resume(dev, t, &jc, &all, o, &start, err, errlen)))
		goto out;
	char links[160] = "";
	if (leader)
		agent_link_security(dev->agent, links, sizeof(links));
	if (leader && (ret = train_log_open(&log, o, t, dev->mesh->num_devices, links, err, errlen)))
		goto out;

	struct train_comm comm = { .err = err, .errlen = errlen };
	job_coll_hooks(&jc, o->trace != NULL, &comm);
	comm.p2p = job_p2p_hooks(&jc);
	if (o->trace) {
		xport_set_stamps(jc.xport, true);   /* the p2p row's times */
		jc.tr = malloc(sizeof(*jc.tr));
		if (!jc.tr) {
			snprintf(err, errlen, "train: out of memory for the trace");
			ret = -ENOMEM;
			goto out;
		}
		/* line the devices' clocks up on a barrier */
		if (coll_barrier(jc.coll, &all, err, errlen)) {
			ret = -EHOSTDOWN;
			goto out;
		}
		trace_start(jc.tr, true);
	}
	struct train_loop loop = {
		.t = t, .opts = o, .global_rows = global_rows, .row0 = row0, .comm = &comm,
		.leader = leader, .log = &log, .step_begin = job_step_begin, .step_end = job_step_end,
		.bytes = job_bytes, .recovery = job_recovery, .comm_wait_s = job_waited, .comm_bg_s = job_background,
		.ctx = &jc,
	};
	double run_t0 = util_now_s();
	if ((ret = train_loop_run(&loop, start, err, errlen)))
		goto out;
	if (leader && c->steps > start)
		print_finished(dev, &loop, start, util_now_s() - run_t0);
	/* the metrics file is synced and closed while every host is still in
	 * the job, so a failure there fails it everywhere */
	if (leader && (ret = steplog_close(&log, err, errlen)))
		goto out;
	if (jc.tr && (ret = write_trace(dev, &jc, &all, o->trace, err, errlen)))
		goto out;
	/* nobody leaves before the checkpoint is written */
	if (coll_barrier(jc.coll, &all, err, errlen))
		ret = -EHOSTDOWN;
out:
	if (o->weights && !loaded)  /* the host's other devices wait for this one */
		hf_src_done(o->weights, ret ? ret : -ECANCELED, err, errlen);
	/* before the collectives go: the siblings would fail on them first */
	if (ret)
		agent_job_failed(dev, ret);
	if (leader)
		steplog_close(&log, NULL, 0);
	/* the communication threads first: a failed step may leave
	 * background collectives (window, gradient buckets, exchanges)
	 * writing into the trainer's buffers until they stop */
	coll_dev_free(jc.xcoll);
	if (jc.coll)
		coll_dev_free(jc.coll);
	trainer_free(t);
	for (int i = 0; i < jc.ngrp; i++)
		free(jc.grp[i].mg);
	free(jc.tr);
	free(jc.sends);
	free(rules);
	return ret;
}
