/* See host/train/loop.h. */
#include "host/train/loop.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "host/bench/bench_matmul.h"
#include "host/data/data.h"
#include "host/pipeline/pipe_config.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

int train_log_open(struct steplog *log, const struct train_opts *o, struct trainer *t,
		   int devices, const char *links, char *err, size_t errlen)
{
	const struct model_dims *d = model_dims(trainer_model(t));
	struct steplog_info info = {
		.peak_gflops = bench_sgemm_peak_gflops(blas_get_threads(), 0.3),
		.blas_threads = blas_get_threads(),
		.blas_core = blas_core_name(),
		.kernel_isa = kernel_isa_name(kernel_isa()),
		.flops_per_token = model_flops_per_token(d),
		.tokens_per_step = (int64_t)trainer_cfg(t)->per_device_batch_size * devices * d->T,
		.devices = devices,
		.total_steps = trainer_cfg(t)->steps,
		.quiet = o->quiet,
		.links = links,
	};
	return steplog_open(log, &info, o->metrics, o->resume, err, errlen);
}

static double comm_wait(const struct train_loop *l)
{
	return l->comm_wait_s ? l->comm_wait_s(l->ctx) : 0;
}

static double comm_bg(const struct train_loop *l)
{
	return l->comm_bg_s ? l->comm_bg_s(l->ctx) : 0;
}

static void bytes(const struct train_loop *l, uint64_t *dcn, uint64_t *ici, uint64_t *msgs)
{
	*dcn = *ici = *msgs = 0;
	if (l->bytes)
		l->bytes(l->ctx, dcn, ici, msgs);
}

/* The leader's data lines: where the run begins, each new epoch. */
static void data_news(const struct train_loop *l, int64_t step, bool first)
{
	char line[1024];
	struct data_source *d = trainer_data(l->t);
	if (first && data_describe(d, step, l->global_rows, line, sizeof(line)))
		steplog_note(l->log, line);
	if (data_epoch_note(d, step, l->global_rows, line, sizeof(line)))
		steplog_note(l->log, line);
}

/* What became of a step's update (pipeline_update_ahead), for the
 * metrics; NULL without the key. */
static const char *ahead_name(enum step_ahead a)
{
	static const char *const name[] = { [AHEAD_WAITED] = "waited", [AHEAD_KEPT] = "kept",
					    [AHEAD_REDONE] = "redone", [AHEAD_PENDING] = "pending" };
	return a == AHEAD_OFF ? NULL : name[a];
}

static int check_loss(double loss, int64_t s, char *err, size_t errlen)
{
	if (isfinite(loss))
		return 0;
	snprintf(err, errlen, "train: loss is %g at step %" PRId64, loss, s);
	return -ERANGE;
}

/* The leader's record of a step whose loss is known. */
static int record(struct train_loop *l, const struct step_report *r, bool log, int64_t start, char *err,
		  size_t errlen)
{
	if (!l->leader)
		return 0;
	if (r->step == start)
		l->first_loss = r->loss;
	l->last_loss = r->loss;
	return log ? steplog_step(l->log, r, err, errlen) : 0;
}

/* A step updated ahead (pipeline_update_ahead): its report waits for the
 * next step's table to check the update, then takes the loss. */
struct held_report {
	bool have, log;
	struct step_report r;
};

static int held_record(struct train_loop *l, struct held_report *h, int64_t start, char *err, size_t errlen)
{
	struct step_stats st;
	if (!h->have)
		return 0;
	h->have = false;
	if (trainer_settled(l->t, &st) != h->r.step) {
		snprintf(err, errlen, "train: step %" PRId64 "'s update ahead was never checked", h->r.step);
		return -EPROTO;
	}
	h->r.loss = st.loss;
	h->r.aux = st.aux;
	h->r.grad_norm = st.grad_norm;
	h->r.ahead = ahead_name(st.ahead);
	int rc = check_loss(st.loss, h->r.step, err, errlen);
	return rc ? rc : record(l, &h->r, h->log, start, err, errlen);
}

int train_loop_run(struct train_loop *l, int64_t start, char *err, size_t errlen)
{
	const struct cfg *c = trainer_cfg(l->t);
	const struct train_opts *o = l->opts;
	uint64_t dcn0, ici0, msgs0;
	struct held_report held = { 0 };
	int rc;

	l->first_loss = l->last_loss = NAN;
	bytes(l, &dcn0, &ici0, &msgs0);
	for (int64_t s = start; s < c->steps; s++) {
		struct step_stats st;
		if (l->leader)
			data_news(l, s, s == start);
		if (l->step_begin)
			l->step_begin(l->ctx, s);
		double w0 = comm_wait(l), g0 = comm_bg(l), t0 = util_now_s();
		if ((rc = trainer_step(l->t, s, l->global_rows, l->row0, l->comm, &st, err, errlen)))
			return rc;
		double t1 = util_now_s(), waited = comm_wait(l) - w0, bg = comm_bg(l) - g0;
		if (l->step_end)
			l->step_end(l->ctx, &st, t0, t1);
		if ((rc = held_record(l, &held, start, err, errlen)))
			return rc;
		bool last = s == c->steps - 1;
		/* every device evaluates its rows of the held-out batches */
		bool eval = c->eval_interval > 0 && (s + 1) % c->eval_interval == 0;
		bool save = o->ckpt_dir &&
			    ((c->checkpoint_period > 0 && (s + 1) % c->checkpoint_period == 0) || last);
		/* an update ahead checked before anything reads the parameters */
		if (st.ahead == AHEAD_PENDING && (eval || save || last)) {
			if ((rc = trainer_settle(l->t, err, errlen)))
				return rc;
			trainer_settled(l->t, &st);
		}
		bool pending = st.ahead == AHEAD_PENDING;
		if (!pending && (rc = check_loss(st.loss, s, err, errlen)))
			return rc;
		double ev_loss = NAN;
		int64_t ev_tokens = 0;
		if (eval && (rc = trainer_eval(l->t, l->global_rows, l->row0, l->comm, &ev_loss,
					       &ev_tokens, err, errlen)))
			return rc;
		/* every device takes part in gathering the whole tensors */
		if (save && (rc = trainer_ckpt_gather(l->t, l->comm, err, errlen)))
			return rc;
		if (!l->leader) {
			held.have = pending;
			held.r.step = s;
			continue;
		}
		uint64_t dcn, ici, msgs;
		bytes(l, &dcn, &ici, &msgs);
		struct data_pos pos;
		data_position(trainer_data(l->t), s, l->global_rows, &pos);
		struct step_report r = {
			.step = s, .loss = st.loss, .aux = st.aux, .grad_norm = st.grad_norm,
			.lr = st.lr, .seconds = t1 - t0, .dcn_bytes = dcn - dcn0,
			.ici_bytes = ici - ici0, .messages = msgs - msgs0,
			.comm_wait_s = waited, .comm_bg_s = bg,
			.weight_gathers = st.weight_gathers, .window_copies = st.window_copies, .muon_ns = st.muon_ns, .muon_bytes = st.muon_bytes,
			.muon_gflop = { st.muon_gflop[0], st.muon_gflop[1], st.muon_gflop[2] }, .data_s = st.t_data1 - st.t_data0,
			.data_epoch = pos.epoch_rows ? pos.epoch : -1,
			.eval_loss = ev_loss, .eval_tokens = ev_tokens,
			.synthetic = pipe_config_synthetic(c), .ahead = ahead_name(st.ahead),
		};
		if (l->recovery)
			l->recovery(l->ctx, &r.reconnects, &r.frames_resent);
		bool log = (c->log_period > 0 && (s % c->log_period == 0 || last)) || eval;
		if (pending)
			held = (struct held_report){ .have = true, .log = log, .r = r };
		else if ((rc = record(l, &r, log, start, err, errlen)))
			return rc;
		dcn0 = dcn;
		ici0 = ici;
		msgs0 = msgs;
		if (save && (rc = trainer_save(l->t, o->ckpt_dir, s + 1, err, errlen)))
			return rc;
	}
	return trainer_sync(l->t, l->comm, err, errlen);
}
