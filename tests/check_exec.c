/* The pipeline executor in one process, through its point-to-point seam
 * (struct pipe_p2p): each stage a thread with its own model, messages
 * handed over by a mailbox that moves a send's bytes only when its
 * receive runs (so an executor that wrote a buffer before its send was
 * taken would corrupt what the next stage gets). For every schedule the
 * executor runs, recompute on and off, a dense and an MoE model: one
 * step's loss and every parameter's gradient (summed over the stages
 * that hold it) equal the step without a pipeline on one device, and a
 * second run is bit-identical. Filling receive waits with W's
 * (pipe_exec_set_fill): with a probe that reports every receive late
 * at first, W's run ahead, and the loss, every gradient and the order
 * of the grads_done hooks are those of table order, bit for bit.
 * Receives posted ahead (a transport that probes, without the fill):
 * the probe lands a message that has come into its buffer at once, and
 * fills the buffer with NaN when it has not (its bytes may land any time
 * after the post), so a receive posted over a buffer still in use
 * changes the bits; they equal table order's. Synthetic compute
 * (pipe_exec_set_sleep): every schedule's step takes at least the
 * simulator's makespan at the sleeps' times (its critical path: no
 * executor beats it, so a mode that skipped sleeps fails), runs each of
 * the table's compute actions once (its counts by kind), each at least
 * its sleep long (also when each sleep's end is spun, or all of it:
 * MESHRUN_SYNTH_SPIN_US), and computes no loss. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/pipeline/exec.h"
#include "host/pipeline/pipe_config.h"
#include "host/util/clock.h"

static char err[1024];

#define MAXS 4
#define MAXMSG 4096
#define MAXIO 1024

/* ---- the mailbox: sends posted, taken by their receives ---- */

struct msg {
	int from, to;
	uint32_t kind, idx;
	const void *buf;
	size_t bytes;
	bool taken;
	bool early;  /* landed by a probe (mb_probe_land): its receive takes nothing */
};

struct mailbox {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct msg m[MAXMSG];
	int n;
	/* the expert-count all-gather over stage */
	pthread_barrier_t bar;
	const void *part[MAXS];
};

struct stage_ctx {
	struct mailbox *mb;
	int me;
	int recvs, probe_at;  /* receives taken; the receive probed last */
	int early;            /* messages landed by mb_probe_land */
	/* the grads_done hooks in the order they came: l0, l1, landed */
	int hooks[64][3];
	int nhooks;
	/* the sends and posts ahead in the order they came (util_now_s(),
	 * 's' or 'p', the peer), for the gaps' order (posts_after_send) */
	double io_t[MAXIO];
	char io_op[MAXIO];
	int io_dev[MAXIO];
	int nio;
};

static void log_io(struct stage_ctx *c, char op, int dev)
{
	ck_assert_int_lt(c->nio, MAXIO);
	c->io_t[c->nio] = util_now_s();
	c->io_dev[c->nio] = dev;
	c->io_op[c->nio++] = op;
}

static int mb_send(void *ctx, int dev, uint32_t kind, uint32_t idx, const void *buf, size_t bytes)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	log_io(c, 's', dev);
	pthread_mutex_lock(&b->mu);
	ck_assert_int_lt(b->n, MAXMSG);
	b->m[b->n++] = (struct msg){ .from = c->me, .to = dev, .kind = kind, .idx = idx, .buf = buf, .bytes = bytes };
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static struct msg *find(struct mailbox *b, int from, int to, uint32_t kind, uint32_t idx)
{
	for (int i = 0; i < b->n; i++)
		if (b->m[i].from == from && b->m[i].to == to && b->m[i].kind == kind && b->m[i].idx == idx)
			return &b->m[i];
	return NULL;
}

static int mb_recv(void *ctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	struct msg *m;
	pthread_mutex_lock(&b->mu);
	c->recvs++;
	while (!(m = find(b, dev, c->me, kind, idx)))
		pthread_cond_wait(&b->cv, &b->mu);
	if (m->early) {
		m->early = false;
		pthread_mutex_unlock(&b->mu);
		return 0;
	}
	ck_assert(!m->taken && m->bytes == bytes);
	memcpy(buf, m->buf, bytes);  /* the sender's buffer, now */
	m->taken = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int mb_wait_send(void *ctx, int dev, uint32_t kind, uint32_t idx)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	struct msg *m;
	pthread_mutex_lock(&b->mu);
	m = find(b, c->me, dev, kind, idx);
	ck_assert_ptr_nonnull(m);
	while (!m->taken)
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static int mb_flush(void *ctx)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	pthread_mutex_lock(&b->mu);
	for (int i = 0; i < b->n; i++)
		while (b->m[i].from == c->me && !b->m[i].taken)
			pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	return 0;
}

/* A receive is late the first time it is probed (whether its send has
 * come or not), and after that arrived once its send has come. */
static int mb_probe(void *ctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes, int hold)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	(void)buf, (void)bytes, (void)hold;
	pthread_mutex_lock(&b->mu);
	bool first = c->probe_at != c->recvs, here = find(b, dev, c->me, kind, idx);
	c->probe_at = c->recvs;
	pthread_mutex_unlock(&b->mu);
	return !first && here;
}

/* A receive posted ahead: its message lands now if it has come, else
 * the buffer is poisoned (the bytes may land any time from now on). */
static int mb_probe_land(void *ctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes, int hold)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	log_io(c, hold == PIPE_RR_RIDE ? 'h' : 'p', dev);
	pthread_mutex_lock(&b->mu);
	struct msg *m = find(b, dev, c->me, kind, idx);
	if (m) {
		ck_assert(!m->taken && m->bytes == bytes);
		memcpy(buf, m->buf, bytes);
		m->taken = m->early = true;
		c->early++;
		pthread_cond_broadcast(&b->cv);
	} else {
		for (size_t i = 0; i < bytes / sizeof(float); i++)
			((float *)buf)[i] = NAN;
	}
	pthread_mutex_unlock(&b->mu);
	return m != NULL;
}

/* Every receive arrived: nothing to fill. */
static int mb_probe_here(void *ctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes, int hold)
{
	(void)ctx, (void)dev, (void)kind, (void)idx, (void)buf, (void)bytes, (void)hold;
	return 1;
}

static int record_hook(void *ctx, int l0, int l1, bool landed)
{
	struct stage_ctx *c = ctx;
	ck_assert_int_lt(c->nhooks, 64);
	c->hooks[c->nhooks][0] = l0;
	c->hooks[c->nhooks][1] = l1;
	c->hooks[c->nhooks++][2] = landed;
	return 0;
}

/* The model's collectives: only the expert-count all-gather over stage
 * runs in these steps (no other axis splits anything). */
static int mb_all_gather(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes)
{
	struct stage_ctx *c = ctx;
	struct mailbox *b = c->mb;
	ck_assert_uint_eq(axes, 1u << AX_STAGE);
	b->part[c->me] = in;
	pthread_barrier_wait(&b->bar);
	for (int s = 0; s < MAXS && b->part[s]; s++)
		memcpy((char *)out + (size_t)s * bytes, b->part[s], bytes);
	pthread_barrier_wait(&b->bar);
	return 0;
}

/* ---- one step on S stages ---- */

struct stage {
	pthread_t th;
	struct model *m;
	struct pipe_exec *x;
	struct stage_ctx ctx;
	struct pipe_p2p io;
	struct model_comm comm;
	const int32_t *in, *tg;
	double loss;
	double t_end;  /* util_now_s() when its step returned */
	int rc;
	bool gate;     /* GATE: stop the first step at its gate, run it again */
	int gates;     /* the gate's calls */
	int ran;       /* compute actions timed before the gate stopped it */
};

static int stop_gate(void *ctx)
{
	struct stage *st = ctx;
	int n;
	pipe_exec_times(st->x, &n);
	st->ran = n;
	st->gates++;
	return -EAGAIN;
}

static void *stage_main(void *arg)
{
	struct stage *st = arg;
	struct model_step ms = { .loss_scale = 1.0f / 1024, .lb_weight = 0.01f, .global_tokens = 1024,
				 .comm = &st->comm };
	memset(model_grads(st->m), 0, model_numel(st->m) * sizeof(float));
	if (st->gate)
		pipe_exec_set_gate(st->x, stop_gate, st);
	st->rc = pipe_exec_step(st->x, st->in, st->tg, &ms, &st->io);
	if (st->gate && st->rc == -EAGAIN) {  /* the gate holds for one step only */
		memset(model_grads(st->m), 0, model_numel(st->m) * sizeof(float));
		st->rc = pipe_exec_step(st->x, st->in, st->tg, &ms, &st->io);
	}
	st->loss = ms.loss_sum;
	st->t_end = util_now_s();
	return NULL;
}

/* The config of a test model: 16 rows of 16 tokens, 4 layers (MoE: one
 * dense, then MoE). */
static void test_cfg(struct cfg *c, bool moe, int S, const char *sched, bool recompute, int v)
{
	char kv[64];
	const char *base[] = { "vocab_size=37", "base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2",
			       "base_mlp_dim=48", "max_target_length=16", "init_std=0.2", NULL };
	cfg_defaults(c);
	for (const char *const *k = base; *k; k++)
		ck_assert_msg(cfg_override(c, *k, err, sizeof(err)) == 0, "%s", err);
	snprintf(kv, sizeof(kv), "base_num_decoder_layers=%d", moe ? 1 + S * v : S * v);
	cfg_override(c, kv, err, sizeof(err));
	if (moe) {
		const char *mk[] = { "num_experts=4", "num_experts_per_tok=2", "first_num_dense_layers=1",
				     "shared_experts=1", "base_moe_mlp_dim=16", NULL };
		for (const char *const *k = mk; *k; k++)
			cfg_override(c, *k, err, sizeof(err));
	}
	snprintf(kv, sizeof(kv), "ici_pipeline_parallelism=%d", S);
	cfg_override(c, kv, err, sizeof(err));
	snprintf(kv, sizeof(kv), "pipeline_schedule=%s", sched);
	cfg_override(c, kv, err, sizeof(err));
	cfg_override(c, recompute ? "pipeline_recompute=true" : "pipeline_recompute=false", err, sizeof(err));
	snprintf(kv, sizeof(kv), "num_pipeline_microbatches=%d", 2 * S);
	cfg_override(c, kv, err, sizeof(err));
	snprintf(kv, sizeof(kv), "per_device_batch_size=%d", 16 / S);
	cfg_override(c, kv, err, sizeof(err));
	cfg_override(c, "ici_data_parallelism=1", err, sizeof(err));
	ck_assert_msg(cfg_finish(c, 1, S, err, sizeof(err)) == 0, "%s", err);
}

static void tokens(int32_t *in, int32_t *tg, int n, int V)
{
	unsigned r = 2024;
	for (int i = 0; i < n; i++) {
		r = r * 1103515245u + 12345u;
		in[i] = (int32_t)((r >> 16) % V);
		r = r * 1103515245u + 12345u;
		tg[i] = (int32_t)((r >> 16) % V);
	}
}

/* Per parameter: the sum of squares of its gradient summed over the
 * stages that hold it (the stage-split ones are held once). */
struct result {
	double loss, sq[MODEL_MAX_PARAMS];
	float *g;  /* stage 0's gradients (for the rerun) */
	size_t n;
	int fills;  /* W's run ahead, over the stages */
	int preposts, early;  /* receives posted ahead, landed by the probe */
	int landed, depth;    /* posted into a landing buffer; most outstanding on a stage */
	int posted_after_send;  /* posts ahead after a send to their peer with no compute between */
	int held, held_unsent;  /* posts that held their RecvReady; of them, with no send to their peer after */
	int hooks[MAXS][64][3], nhooks[MAXS];
	double wall;  /* SLEEP: the threads' start to the last step's return */
	int gates;    /* GATE: the gate's calls, over the stages */
	int nearly;   /* GATE: stages that end early (pipe_exec_ends_early) */
};

/* fill: probe receives (FILL_LATE: late at first; FILL_HERE: every one
 * arrived) and fill their waits with W's; PREPOST: no fill, receives
 * posted ahead (mb_probe_land); SLEEP: table order, synthetic compute at
 * sleep_costs (sleep_check); GATE: table order, and a stage that ends
 * early (pipe_exec_ends_early) has a gate that stops its step, which it
 * then runs again (the trainer's update ahead, redone); the grads_done
 * hooks recorded. */
enum { FILL_OFF, FILL_LATE, FILL_HERE, PREPOST, SLEEP, GATE };
static const struct pipe_costs sleep_costs = { .f = 0.001, .i = 0.0007, .w = 0.0003, .b = 0.001,
					       .embed = 0.0002, .head = 0.0004, .embed_back = 0.0002 };

static bool compute_op(int op)
{
	return op == PA_F || op == PA_FC || op == PA_B || op == PA_I || op == PA_W || op == PA_EMBED ||
	       op == PA_HEAD || op == PA_EMBED_BACK;
}

static double sleep_of(int op)
{
	const struct pipe_costs *c = &sleep_costs;
	return op == PA_F || op == PA_FC ? c->f : op == PA_B ? c->b : op == PA_I ? c->i : op == PA_W ? c->w :
	       op == PA_EMBED ? c->embed : op == PA_HEAD ? c->head : c->embed_back;
}

/* A step of synthetic compute: each stage ran every compute action of
 * its list once (counts by kind), each at least its sleep, and no loss;
 * and the step took at least the table's critical path at the sleeps
 * (the simulator's makespan, every transfer free). */
static void sleep_check(const struct pipe_config *pc, struct stage *st, int S, double wall, const char *sched)
{
	struct pipe_table t;
	ck_assert_msg(pipe_table_build(&t, &pc->shape, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(pipe_table_simulate(&t, &sleep_costs, false, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(wall >= t.makespan, "%s S=%d: the step took %.4f s, under its critical path %.4f s", sched, S,
		      wall, t.makespan);
	ck_assert_double_gt(t.makespan, 0.002);  /* far over the tiny model's compute */
	for (int s = 0; s < S; s++) {
		int want[PA_COUNT] = { 0 }, got[PA_COUNT] = { 0 }, n, all = 0;
		const struct pipe_act_time *at = pipe_exec_times(st[s].x, &n);
		for (int k = 0; k < t.n[s]; k++)
			if (compute_op(t.a[s][k].op)) {
				want[t.a[s][k].op]++;
				all++;
			}
		for (int i = 0; i < n; i++) {
			got[at[i].op]++;
			ck_assert_msg(at[i].t1 - at[i].t0 >= sleep_of(at[i].op), "%s stage %d: %s mb%d took %.6f s",
				      sched, s, pipe_act_name(at[i].op), at[i].mb, at[i].t1 - at[i].t0);
		}
		for (int op = 0; op < PA_COUNT; op++)
			ck_assert_msg(got[op] == want[op], "%s stage %d: %d %s run, the table has %d", sched, s,
				      got[op], pipe_act_name(op), want[op]);
		ck_assert_int_eq(pipe_exec_slept(st[s].x), all);
		ck_assert(st[s].loss == 0);
	}
	pipe_table_free(&t);
}

/* The posts ahead that came after a send to their peer with no compute
 * action started between them (in the same gap between computes): from
 * the calls' times and the executor's compute actions'
 * (pipe_exec_times). */
static int posts_after_send(const struct stage *st)
{
	int n, k = 0, bad = 0;
	const struct pipe_act_time *at = pipe_exec_times(st->x, &n);
	bool sent[MAXS] = { false };
	for (int i = 0; i < st->ctx.nio; i++) {
		for (; k < n && at[k].t0 <= st->ctx.io_t[i]; k++)
			memset(sent, 0, sizeof(sent));
		if (st->ctx.io_op[i] == 's')
			sent[st->ctx.io_dev[i]] = true;
		else
			bad += sent[st->ctx.io_dev[i]];
	}
	return bad;
}

/* The posts that held their RecvReady ('h': to ride on a send to their
 * peer) and how many of them no send to that peer followed before the
 * next compute action started (or the step ended). */
static int held_unsent(const struct stage *st, int *held)
{
	int n, k = 0, bad = 0;
	const struct pipe_act_time *at = pipe_exec_times(st->x, &n);
	int owed[MAXS] = { 0 };
	for (int i = 0; i <= st->ctx.nio; i++) {
		for (; k < n && (i == st->ctx.nio || at[k].t0 <= st->ctx.io_t[i]); k++)
			for (int d = 0; d < MAXS; d++) {
				bad += owed[d];
				owed[d] = 0;
			}
		if (i == st->ctx.nio)
			break;
		if (st->ctx.io_op[i] == 's')
			owed[st->ctx.io_dev[i]] = 0;
		else if (st->ctx.io_op[i] == 'h') {
			owed[st->ctx.io_dev[i]]++;
			(*held)++;
		}
	}
	for (int d = 0; d < MAXS; d++)
		bad += owed[d];
	return bad;
}

static void pipelined_fill(struct result *res, bool moe, int S, const char *sched, bool recompute, int fill)
{
	struct cfg c;
	struct model_dims d;
	struct shard_rules rules;
	struct mesh mesh;
	struct pipe_config pc;
	struct mailbox box = { .n = 0 };
	struct stage st[MAXS];
	int v = !strcmp(sched, "interleaved_1f1b") || !strcmp(sched, "circular") || !strcmp(sched, "zbv") ? 2 : 1;
	test_cfg(&c, moe, S, sched, recompute, v);
	ck_assert(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0);
	ck_assert_msg(shard_rules_from_cfg(&rules, &c, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&mesh, &c);
	ck_assert_msg(pipe_config_resolve(&pc, &c, &d, err, sizeof(err)) == 0, "%s", err);
	int rows = pc.global_batch, mb = pc.microbatch_rows, dev[MAXS];
	int32_t *in = malloc(sizeof(int32_t) * (size_t)rows * d.T), *tg = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	tokens(in, tg, rows * d.T, d.V);
	pthread_mutex_init(&box.mu, NULL);
	pthread_cond_init(&box.cv, NULL);
	pthread_barrier_init(&box.bar, NULL, (unsigned)S);
	for (int s = 0; s < S; s++)
		dev[s] = s;
	for (int s = 0; s < S; s++) {
		struct pipe_table t;
		struct model_mesh mm = { .mesh = &mesh, .rules = &rules, .device = s };
		ck_assert_msg(pipe_table_build(&t, &pc.shape, err, sizeof(err)) == 0, "%s", err);
		pipe_config_model_mesh(&pc, &mm);
		mm.pipe_act_sets = t.act_sets[s];
		mm.pipe_w_stashes = t.w_stashes[s];
		mm.pipe_w_reads_acts = !recompute;
		st[s].m = model_new(&d, mb, &mm, err, sizeof(err));
		ck_assert_msg(st[s].m, "%s", err);
		model_init(st[s].m, 11, 0.2f);
		ck_assert_msg(pipe_exec_new(&st[s].x, &t, s, pc.first_layer, dev, st[s].m, mb, err, sizeof(err)) == 0,
			      "%s", err);
		/* the landing buffers it allocates are the rule's `meshrun
		 * schedule` and plan count: 4 (every stage receives; a
		 * microbatch's input is far under 16 MiB) */
		ck_assert_int_eq(pipe_exec_landing_bufs(st[s].x),
				 pipe_landing_bufs(pipe_exec_table(st[s].x), s, sizeof(float) * (size_t)mb * d.T * d.C));
		ck_assert_int_eq(pipe_exec_landing_bufs(st[s].x), 4);
		st[s].ctx = (struct stage_ctx){ .mb = &box, .me = s, .probe_at = -1 };
		st[s].io = (struct pipe_p2p){ mb_send, mb_recv, mb_wait_send, mb_flush,
					      fill == FILL_LATE ? mb_probe : fill == FILL_HERE ? mb_probe_here :
					      fill == PREPOST ? mb_probe_land : NULL,
					      &st[s].ctx };
		pipe_exec_set_fill(st[s].x, fill == FILL_LATE || fill == FILL_HERE);
		pipe_exec_set_sleep(st[s].x, fill == SLEEP ? &sleep_costs : NULL);
		pipe_exec_set_hooks(st[s].x, &(struct pipe_hooks){ .grads_done = record_hook, .ctx = &st[s].ctx });
		st[s].comm = (struct model_comm){ .all_gather = mb_all_gather, .ctx = &st[s].ctx };
		st[s].in = in;
		st[s].tg = tg;
		st[s].gate = fill == GATE && pipe_exec_ends_early(st[s].x);
		st[s].gates = st[s].ran = 0;
	}
	double t0 = util_now_s();
	for (int s = 0; s < S; s++)
		pthread_create(&st[s].th, NULL, stage_main, &st[s]);
	res->loss = 0;
	res->wall = 0;
	res->fills = res->preposts = res->early = res->landed = res->depth = res->posted_after_send = 0;
	res->held = res->held_unsent = 0;
	res->gates = res->nearly = 0;
	for (int s = 0; s < S; s++) {
		pthread_join(st[s].th, NULL);
		ck_assert_int_eq(st[s].rc, 0);
		res->gates += st[s].gates;
		res->nearly += st[s].gate;
		/* only the embedding and forwards ran before the gate */
		ck_assert_msg(!st[s].gate || st[s].ran >= 1, "%s S=%d stage %d: no compute before its gate", sched, S, s);
		res->loss += st[s].loss;
		res->fills += pipe_exec_fills(st[s].x);
		res->preposts += pipe_exec_preposts(st[s].x);
		res->early += st[s].ctx.early;
		res->landed += pipe_exec_landed(st[s].x);
		if (pipe_exec_prepost_depth(st[s].x) > res->depth)
			res->depth = pipe_exec_prepost_depth(st[s].x);
		res->nhooks[s] = st[s].ctx.nhooks;
		res->posted_after_send += posts_after_send(&st[s]);
		res->held_unsent += held_unsent(&st[s], &res->held);
		if (st[s].t_end - t0 > res->wall)
			res->wall = st[s].t_end - t0;
		memcpy(res->hooks[s], st[s].ctx.hooks, sizeof(res->hooks[s]));
	}
	if (fill == SLEEP)
		sleep_check(&pc, st, S, res->wall, sched);
	/* gradients: a tensor split over stage is held once; the others are
	 * summed over the stages first */
	memset(res->sq, 0, sizeof(res->sq));
	for (int i = 0; i < model_num_params(st[0].m); i++) {
		const struct param_info *p = model_param(st[0].m, i);
		float *sum = calloc(p->numel, sizeof(float));
		for (int s = 0; s < S; s++) {
			const struct param_info *q = model_param(st[s].m, i);
			const float *g = model_grads(st[s].m) + q->offset;
			if (p->split & (1u << AX_STAGE)) {
				for (size_t k = 0; k < q->numel; k++)
					res->sq[i] += (double)g[k] * g[k];
			} else {
				for (size_t k = 0; k < q->numel; k++)
					sum[k] += g[k];
			}
		}
		if (!(p->split & (1u << AX_STAGE)))
			for (size_t k = 0; k < p->numel; k++)
				res->sq[i] += (double)sum[k] * sum[k];
		free(sum);
	}
	res->n = model_numel(st[0].m);
	res->g = malloc(sizeof(float) * res->n);
	memcpy(res->g, model_grads(st[0].m), sizeof(float) * res->n);
	for (int s = 0; s < S; s++) {
		pipe_exec_free(st[s].x);
		model_free(st[s].m);
	}
	pthread_barrier_destroy(&box.bar);
	free(in);
	free(tg);
}

static void pipelined(struct result *res, bool moe, int S, const char *sched, bool recompute)
{
	pipelined_fill(res, moe, S, sched, recompute, FILL_OFF);
}

/* The same batch on one device, the step without a pipeline. */
static void one_device(struct result *res, bool moe, int S, const char *sched)
{
	struct cfg c;
	struct model_dims d;
	struct pipe_config pc;
	struct pipe_table t;
	struct pipe_exec *x;
	int v = !strcmp(sched, "interleaved_1f1b") || !strcmp(sched, "circular") || !strcmp(sched, "zbv") ? 2 : 1;
	int dev = 0;
	test_cfg(&c, moe, S, sched, true, v);
	ck_assert(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0);
	int rows = 16;
	struct model *m = model_new(&d, rows, NULL, err, sizeof(err));
	ck_assert_msg(m, "%s", err);
	model_init(m, 11, 0.2f);
	pipe_config_one_device(&pc, &d, rows);
	ck_assert_msg(pipe_table_build(&t, &pc.shape, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(pipe_exec_new(&x, &t, 0, 0, &dev, m, rows, err, sizeof(err)) == 0, "%s", err);
	int32_t *in = malloc(sizeof(int32_t) * (size_t)rows * d.T), *tg = malloc(sizeof(int32_t) * (size_t)rows * d.T);
	tokens(in, tg, rows * d.T, d.V);
	struct model_step ms = { .loss_scale = 1.0f / 1024, .lb_weight = 0.01f, .global_tokens = 1024 };
	memset(model_grads(m), 0, model_numel(m) * sizeof(float));
	ck_assert_int_eq(pipe_exec_step(x, in, tg, &ms, NULL), 0);
	res->loss = ms.loss_sum;
	memset(res->sq, 0, sizeof(res->sq));
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		const float *g = model_grads(m) + p->offset;
		for (size_t k = 0; k < p->numel; k++)
			res->sq[i] += (double)g[k] * g[k];
	}
	res->g = NULL;
	pipe_exec_free(x);
	model_free(m);
	free(in);
	free(tg);
}

static void equal_to_one_device(bool moe, int S, const char *sched, bool recompute)
{
	struct result one, pp, again;
	one_device(&one, moe, S, sched);
	pipelined(&pp, moe, S, sched, recompute);
	pipelined(&again, moe, S, sched, recompute);
	ck_assert_msg(fabs(pp.loss - one.loss) < 1e-5 * fabs(one.loss), "%s S=%d: loss %.9g, one device %.9g",
		      sched, S, pp.loss, one.loss);
	for (int i = 0; i < MODEL_MAX_PARAMS; i++) {
		if (one.sq[i] == 0)
			continue;
		double rel = fabs(pp.sq[i] - one.sq[i]) / one.sq[i];
		ck_assert_msg(rel < 1e-4, "%s S=%d %s recompute %d: gradient %d's norm^2 %.9g, one device %.9g",
			      sched, S, moe ? "moe" : "dense", recompute, i, pp.sq[i], one.sq[i]);
	}
	ck_assert(pp.loss == again.loss);
	ck_assert(!memcmp(pp.g, again.g, sizeof(float) * pp.n));
	free(pp.g);
	free(again.g);
}

static const char *const scheds[] = { "circular", "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv" };
#define NSCHED (int)(sizeof(scheds) / sizeof(scheds[0]))

START_TEST(test_dense)
{
	for (int k = 0; k < NSCHED; k++)
		for (int S = 2; S <= 4; S += 2)
			for (int rc = 0; rc < 2; rc++)
				equal_to_one_device(false, S, scheds[k], rc);
}
END_TEST

START_TEST(test_moe)
{
	for (int k = 0; k < NSCHED; k++)
		for (int rc = 0; rc < 2; rc++)
			equal_to_one_device(true, 2, scheds[k], rc);
}
END_TEST

/* The gate (pipe_exec_set_gate) of a stage that ends early stops its
 * step before the step's first exchange or gradient write, after some
 * compute; the step run again gives table order's bits and hooks. Under
 * zbv, stage 0 alone ends early (it starts a slot ahead) and computes
 * before its gate; in 1F1B and the circular schedule stage 0 ends last
 * and the others begin with a receive: no stage. */
START_TEST(test_gate_stops_and_reruns)
{
	static const struct { const char *sched; int S, early; } c[] = {
		{ "zbv", 2, 1 }, { "zbv", 4, 1 }, { "1f1b", 2, 0 }, { "circular", 2, 0 }, { "interleaved_1f1b", 2, 0 },
	};
	for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
		struct result plain, gated;
		pipelined_fill(&plain, false, c[k].S, c[k].sched, false, FILL_OFF);
		pipelined_fill(&gated, false, c[k].S, c[k].sched, false, GATE);
		ck_assert_msg(gated.nearly == c[k].early, "%s S=%d: %d stages end early, want %d", c[k].sched, c[k].S,
			      gated.nearly, c[k].early);
		ck_assert_int_eq(gated.gates, c[k].early);
		ck_assert_msg(gated.loss == plain.loss, "%s S=%d: loss %a, plain %a", c[k].sched, c[k].S, gated.loss,
			      plain.loss);
		ck_assert(!memcmp(gated.sq, plain.sq, sizeof(gated.sq)));
		ck_assert(!memcmp(gated.g, plain.g, sizeof(float) * gated.n));
		for (int s = 0; s < c[k].S; s++) {
			ck_assert_int_eq(gated.nhooks[s], plain.nhooks[s]);
			ck_assert(!memcmp(gated.hooks[s], plain.hooks[s], sizeof(int) * 3 * (size_t)gated.nhooks[s]));
		}
		free(plain.g);
		free(gated.g);
	}
}
END_TEST

/* W's run in receive waits: the bits and the hooks' order of table
 * order, for the split-backward schedules (dense: S 2 and 4, recompute
 * on and off; MoE: S 2). */
static void fill_same(bool moe, int S, const char *sched, bool recompute)
{
	struct result in_order, filled, ready;
	pipelined_fill(&in_order, moe, S, sched, recompute, FILL_OFF);
	pipelined_fill(&filled, moe, S, sched, recompute, FILL_LATE);
	pipelined_fill(&ready, moe, S, sched, recompute, FILL_HERE);
	ck_assert_int_eq(in_order.fills, 0);
	ck_assert_int_eq(ready.fills, 0);  /* nothing waited: table order */
	ck_assert(ready.loss == in_order.loss);
	ck_assert(!memcmp(ready.g, in_order.g, sizeof(float) * ready.n));
	ck_assert_msg(filled.fills > 0, "%s S=%d: no W ran in a receive wait", sched, S);
	ck_assert_msg(filled.loss == in_order.loss, "%s S=%d: loss %a, in order %a", sched, S, filled.loss,
		      in_order.loss);
	ck_assert(!memcmp(filled.sq, in_order.sq, sizeof(filled.sq)));
	ck_assert(!memcmp(filled.g, in_order.g, sizeof(float) * filled.n));
	for (int s = 0; s < S; s++) {
		ck_assert_int_gt(filled.nhooks[s], 0);
		ck_assert_int_eq(filled.nhooks[s], in_order.nhooks[s]);
		ck_assert(!memcmp(filled.hooks[s], in_order.hooks[s], sizeof(int) * 3 * (size_t)filled.nhooks[s]));
	}
	free(in_order.g);
	free(filled.g);
	free(ready.g);
}

START_TEST(test_fill_waits)
{
	const char *split[] = { "zb_h1", "zbv" };
	for (int k = 0; k < 2; k++) {
		for (int S = 2; S <= 4; S += 2)
			for (int rc = 0; rc < 2; rc++)
				fill_same(false, S, split[k], rc);
		fill_same(true, 2, split[k], false);
	}
}
END_TEST

/* Receives posted ahead: the bits of table order (posted at their
 * place), for every schedule, dense at S 2 and 4 with recompute on and
 * off, MoE at S 2; returns the messages that landed at their post. */
static int prepost_same(bool moe, int S, const char *sched, bool recompute)
{
	struct result in_order, ahead;
	pipelined_fill(&in_order, moe, S, sched, recompute, FILL_OFF);
	pipelined_fill(&ahead, moe, S, sched, recompute, PREPOST);
	ck_assert_int_eq(in_order.preposts, 0);
	ck_assert_msg(ahead.preposts > 0, "%s S=%d: no receive posted ahead", sched, S);
	/* a receive is posted ahead before a send of its gap to its peer,
	 * never after one (a handed-off send's link is its stream
	 * thread's while it seals) */
	ck_assert_msg(ahead.posted_after_send == 0, "%s S=%d recompute %d: %d receives posted ahead after a send "
		      "to their peer in the same gap", sched, S, recompute, ahead.posted_after_send);
	/* a post that holds its RecvReady (to ride on a send's data
	 * frame) is followed by a send to its peer in the same gap */
	ck_assert_msg(ahead.held_unsent == 0, "%s S=%d recompute %d: %d of %d posts held their RecvReady with no "
		      "send to their peer before the next compute", sched, S, recompute, ahead.held_unsent,
		      ahead.held);
	ck_assert_msg(S == 2 || ahead.held > 0, "%s S=%d recompute %d: no post held its RecvReady", sched, S,
		      recompute);
	ck_assert_msg(ahead.loss == in_order.loss, "%s S=%d recompute %d: loss %a, in order %a", sched, S,
		      recompute, ahead.loss, in_order.loss);
	ck_assert(!memcmp(ahead.sq, in_order.sq, sizeof(ahead.sq)));
	ck_assert(!memcmp(ahead.g, in_order.g, sizeof(float) * ahead.n));
	free(in_order.g);
	free(ahead.g);
	return ahead.early;
}

START_TEST(test_prepost)
{
	int early = 0;
	for (int k = 0; k < NSCHED; k++) {
		for (int S = 2; S <= 4; S += 2)
			for (int rc = 0; rc < 2; rc++)
				early += prepost_same(false, S, scheds[k], rc);
		early += prepost_same(true, 2, scheds[k], false);
	}
	/* (how many land at their post depends on the threads' timing) */
	fprintf(stderr, "prepost: %d messages landed at their post\n", early);
}
END_TEST

/* Receives posted into landing buffers (their table buffer still in
 * use), several outstanding: the bits of one ahead without landing
 * buffers (zb3's posting, MESHRUN_PIPE_PREPOST=1 MESHRUN_PIPE_LANDING=0),
 * for every schedule, dense at S 2 and 4 with recompute on and off, MoE
 * at S 2. A landing buffer that did not take its table buffer's place
 * would leave the message unread (the probe poisons a buffer posted
 * before its message came). */
static void landing_same(bool moe, int S, const char *sched, bool recompute, int *landed, int *depth)
{
	struct result one, many;
	setenv("MESHRUN_PIPE_PREPOST", "1", 1);
	setenv("MESHRUN_PIPE_LANDING", "0", 1);
	pipelined_fill(&one, moe, S, sched, recompute, PREPOST);
	unsetenv("MESHRUN_PIPE_PREPOST");
	unsetenv("MESHRUN_PIPE_LANDING");
	pipelined_fill(&many, moe, S, sched, recompute, PREPOST);
	ck_assert_int_eq(one.landed, 0);
	ck_assert_int_le(one.depth, 1);
	ck_assert_msg(many.loss == one.loss, "%s S=%d recompute %d: loss %a, one ahead %a", sched, S, recompute,
		      many.loss, one.loss);
	ck_assert(!memcmp(many.sq, one.sq, sizeof(many.sq)));
	ck_assert(!memcmp(many.g, one.g, sizeof(float) * many.n));
	*landed += many.landed;
	*depth = many.depth > *depth ? many.depth : *depth;
	free(one.g);
	free(many.g);
}

START_TEST(test_landing)
{
	for (int k = 0; k < NSCHED; k++) {
		int landed = 0, depth = 0;
		for (int S = 2; S <= 4; S += 2)
			for (int rc = 0; rc < 2; rc++)
				landing_same(false, S, scheds[k], rc, &landed, &depth);
		landing_same(true, 2, scheds[k], false, &landed, &depth);
		fprintf(stderr, "landing: %s: %d receives posted into a landing buffer, %d outstanding at most\n",
			scheds[k], landed, depth);
		/* the schedules that move messages (one stage moves none) */
		ck_assert_msg(landed > 0, "%s: no receive posted into a landing buffer", scheds[k]);
		ck_assert_msg(depth > 1, "%s: never more than one receive outstanding", scheds[k]);
	}
}
END_TEST

/* Synthetic compute, every schedule, dense at S 2 and 4 with recompute
 * on and off, MoE at S 2 (its counting pass and count sum): the checks
 * of sleep_check; and dense at S 2 with each sleep spun whole. */
START_TEST(test_sleep)
{
	struct result r;
	for (int k = 0; k < NSCHED; k++) {
		for (int S = 2; S <= 4; S += 2)
			for (int rc = 0; rc < 2; rc++) {
				pipelined_fill(&r, false, S, scheds[k], rc, SLEEP);
				free(r.g);
			}
		pipelined_fill(&r, true, 2, scheds[k], false, SLEEP);
		free(r.g);
		/* every sleep spun whole (its spun end longer than it): still
		 * no action ends before its time */
		setenv("MESHRUN_SYNTH_SPIN_US", "5000", 1);
		pipelined_fill(&r, false, 2, scheds[k], false, SLEEP);
		unsetenv("MESHRUN_SYNTH_SPIN_US");
		free(r.g);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("exec");
	TCase *tc = tcase_create("in_process");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_dense);
	tcase_add_test(tc, test_moe);
	suite_add_tcase(s, tc);
	TCase *tf = tcase_create("fill_waits");
	tcase_set_timeout(tf, 120);
	tcase_add_test(tf, test_fill_waits);
	suite_add_tcase(s, tf);
	TCase *tp = tcase_create("prepost");
	tcase_set_timeout(tp, 120);
	tcase_add_test(tp, test_prepost);
	suite_add_tcase(s, tp);
	TCase *tl = tcase_create("landing");
	tcase_set_timeout(tl, 120);
	tcase_add_test(tl, test_landing);
	suite_add_tcase(s, tl);
	TCase *ts = tcase_create("sleep");
	tcase_set_timeout(ts, 60);
	tcase_add_test(ts, test_sleep);
	suite_add_tcase(s, ts);
	TCase *tg = tcase_create("gate");
	tcase_set_timeout(tg, 120);
	tcase_add_test(tg, test_gate_stops_and_reruns);
	suite_add_tcase(s, tg);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
