/* See host/pipeline/exec.h. The table's buffers (each one microbatch of
 * activations, mb x T x C floats: t->bufs[stage] of them, then
 * t->scratch[stage] scratch ones) are one allocation; an action names
 * the ones it reads and writes. Before an action writes a buffer, the
 * last send from it is waited (the table reuses a buffer only once its
 * receiver took that send, so the wait is for a receive already done or
 * under way). Window slots: the non-layer tensors in 0, the table's
 * chunk slot k in 1 + k, the layers outside the pipeline in the last.
 * The one departure from table order: a W run ahead in a receive's wait
 * (pipe_exec_set_fill; fill_wait below), marked so the loop skips it at
 * its own place. Receives are posted ahead of their place
 * (exec_post.c). The weights' side of each action (the window's slots,
 * gathers and reduce-scatters, the owner's hooks) is exec_win.c's.
 *
 * The executor's rooms: exec.c (this file: building the executor, the
 * step's loop, the actions) -> exec_win.c (weights and hooks) and
 * exec_post.c (receives posted ahead), which call nothing of exec.c; all
 * share exec_int.h. */
#include "host/pipeline/exec.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "host/model/window.h"
#include "host/pipeline/exec_int.h"
#include "host/util/clock.h"

/* Checks that the model holds (in its own storage) the layers of every
 * chunk of this stage, and has the table's activation sets and window. */
static int check_model(const struct pipe_exec *x, char *err, size_t errlen)
{
	for (int c = 0; c < x->t.nchunks; c++) {
		int l0, l1;
		if (pipe_chunk_stage(&x->t.shape, c) != x->stage)
			continue;
		chunk_layers(x, c, &l0, &l1);
		for (int l = l0; l < l1; l++) {
			const struct param_info *p = model_layer_missing(x->m, l);
			if (!p)
				continue;
			snprintf(err, errlen, "config: pipeline stage %d runs layer %d, which '%s' does not store on "
				 "it (logical_axis_rules must split 'layers' over stage alone)", x->stage, l, p->name);
			return -EINVAL;
		}
	}
	if (model_act_sets(x->m) < x->t.act_sets[x->stage]) {
		snprintf(err, errlen, "pipeline: stage %d needs %d sets of saved activations, the model has %d",
			 x->stage, x->t.act_sets[x->stage], model_act_sets(x->m));
		return -EINVAL;
	}
	if (model_w_stashes(x->m) < x->t.w_stashes[x->stage]) {
		snprintf(err, errlen, "pipeline: stage %d needs %d stashes of the split backward, the model has %d",
			 x->stage, x->t.w_stashes[x->stage], model_w_stashes(x->m));
		return -EINVAL;
	}
	return 0;
}

static int alloc_bufs(struct pipe_exec *x, int tok, int C)
{
	int nb = x->t.bufs[x->stage], ns = x->t.scratch[x->stage];
	x->nbuf = nb + ns;
	x->ntok = tok;
	x->nf = (size_t)tok * C;
	x->land_max = pipe_landing_bufs(&x->t, x->stage, sizeof(float) * x->nf);
	x->mem_n = (size_t)(x->nbuf + x->land_max) * x->nf;
	x->mem = malloc(sizeof(float) * (x->mem_n ? x->mem_n : 1));
	x->buf = calloc((size_t)x->nbuf + 1, sizeof(float *));
	x->sent = calloc((size_t)nb + 1, sizeof(*x->sent));
	x->gzero = calloc((size_t)win_slots(model_window(x->m)), sizeof(bool));
	x->times = malloc(sizeof(*x->times) * (size_t)(x->n + 1));
	if (!x->mem || !x->buf || !x->sent || !x->gzero || !x->times)
		return -ENOMEM;
	for (int b = 0; b < x->nbuf; b++)
		x->buf[b] = x->mem + (size_t)b * x->nf;
	for (int i = 0; i < x->land_max; i++)
		x->land[i] = x->mem + (size_t)(x->nbuf + i) * x->nf;
	memset(x->mem, 0, sizeof(float) * x->mem_n);
	return 0;
}

/* Each W's I, for filling receive waits with W's. */
static int mark_w(struct pipe_exec *x)
{
	x->w_of_i = malloc(sizeof(int) * (size_t)(x->n + 1));
	x->ran = calloc((size_t)x->n + 1, sizeof(bool));
	x->posted = calloc((size_t)x->n + 1, sizeof(bool));
	x->named = calloc((size_t)x->nbuf + 1, sizeof(bool));
	x->land_of = malloc((size_t)x->n + 1);
	if (!x->w_of_i || !x->ran || !x->posted || !x->named || !x->land_of)
		return -ENOMEM;
	for (int k = 0; k < x->n; k++) {
		const struct pipe_action *a = &x->a[k];
		x->w_of_i[k] = -1;
		for (int i = k - 1; a->op == PA_W && i >= 0 && x->w_of_i[k] < 0; i--)
			if (x->a[i].op == PA_I && x->a[i].mb == a->mb && x->a[i].chunk == a->chunk)
				x->w_of_i[k] = i;
	}
	return 0;
}

/* Where the stage_sums hook goes (struct pipe_hooks): before the last
 * compute action of a stage of a pipeline with no owner action, when no
 * action from it on moves anything between stages; else -1. */
static int sums_point(const struct pipe_exec *x)
{
	int last = -1;
	for (int k = 0; k < x->n; k++) {
		int op = x->a[k].op;
		if (op == PA_EMBED || op == PA_HEAD || op == PA_EMBED_BACK)
			return -1;
		if (op == PA_F || op == PA_FC || op == PA_B || op == PA_I || op == PA_W)
			last = k;
	}
	for (int k = last; last >= 0 && k < x->n; k++)
		if (x->a[k].op == PA_SEND || x->a[k].op == PA_RECV)
			return -1;
	return x->t.shape.stages > 1 ? last : -1;
}

int pipe_exec_sums_at(const struct pipe_exec *x)
{
	return x->sums_at;
}

/* Whether action a is where the gate goes: it moves something between
 * stages or writes gradients. */
static bool gate_point(const struct pipe_action *a)
{
	return a->op == PA_SEND || a->op == PA_RECV || a->op == PA_B || a->op == PA_I || a->op == PA_W ||
	       a->op == PA_HEAD || a->op == PA_EMBED_BACK || a->op == PA_COUNT_SUM ||
	       a->op == PA_REDUCE_SCATTER;
}

/* Whether stage's list ends (simulated) before another stage's, by more
 * than a hundredth of the longest, and runs a chunk's forward before its
 * gate (a stage whose list begins with a receive, or with its own
 * embedding and then a receive, has nothing to run ahead). */
static bool ends_early(const struct pipe_table *t, int stage)
{
	int k = 0, op;
	while (k < t->n[stage] && !gate_point(&t->a[stage][k]) && (op = t->a[stage][k].op) != PA_F && op != PA_FC)
		k++;
	if (k == t->n[stage] || gate_point(&t->a[stage][k]))
		return false;
	double end = 0, mine = 0;
	for (int s = 0; s < t->shape.stages; s++)
		for (int k = 0; k < t->n[s]; k++) {
			double e = t->a[s][k].t1;
			end = e > end ? e : end;
			if (s == stage && e > mine)
				mine = e;
		}
	return t->shape.stages > 1 && mine < end * 0.99;
}

bool pipe_exec_ends_early(const struct pipe_exec *x)
{
	return x->ends_early;
}

void pipe_exec_set_gate(struct pipe_exec *x, int (*gate)(void *ctx), void *ctx)
{
	x->gate = gate;
	x->gate_ctx = ctx;
}

int pipe_exec_new(struct pipe_exec **out, struct pipe_table *t, int stage, int first_layer,
		  const int *stage_dev, struct model *m, int mb_rows, char *err, size_t errlen)
{
	const struct model_dims *d = model_dims(m);
	struct pipe_exec *x = calloc(1, sizeof(*x));
	int rc, S = t->shape.stages;
	*out = NULL;
	if (!x) {
		pipe_table_free(t);
		goto oom;
	}
	x->t = *t;
	memset(t, 0, sizeof(*t));
	x->stage = stage;
	x->first_layer = first_layer;
	x->m = m;
	x->a = x->t.a[stage];
	x->n = x->t.n[stage];
	if ((rc = check_model(x, err, errlen)))
		goto fail;
	x->stage_dev = malloc(sizeof(int) * (size_t)S);
	if (!x->stage_dev || alloc_bufs(x, mb_rows * d->T, d->C) || exec_mark_events(x) ||
	    mark_w(x))
		goto oom;
	exec_mark_hold(x);
	x->sums_at = sums_point(x);
	x->ends_early = ends_early(&x->t, stage);
	memcpy(x->stage_dev, stage_dev, sizeof(int) * (size_t)S);
	*out = x;
	return 0;
oom:
	snprintf(err, errlen, "pipeline: out of memory");
	rc = -ENOMEM;
fail:
	pipe_exec_free(x);
	return rc;
}

void pipe_exec_free(struct pipe_exec *x)
{
	if (!x)
		return;
	pipe_table_free(&x->t);
	free(x->stage_dev);
	free(x->mem);
	free(x->buf);
	free(x->sent);
	free(x->gzero);
	free(x->times);
	free(x->after);
	free(x->last_rs);
	free(x->w_of_i);
	free(x->ran);
	free(x->posted);
	free(x->named);
	free(x->land_of);
	free(x);
}

void pipe_exec_poison(struct pipe_exec *x, int on) { x->poison = on; }
int pipe_exec_slept(const struct pipe_exec *x) { return x->slept; }

void pipe_exec_set_sleep(struct pipe_exec *x, const struct pipe_costs *c)
{
	x->sleep = c != NULL;
	x->sleep_s = c ? *c : (struct pipe_costs){ 0 };
}
void pipe_exec_set_fill(struct pipe_exec *x, bool on) { x->fill = on; }

int pipe_exec_fills(const struct pipe_exec *x) { return x->fills; }
int pipe_exec_preposts(const struct pipe_exec *x) { return x->preposts; }
int pipe_exec_prepost_depth(const struct pipe_exec *x) { return x->prepost_depth; }
int pipe_exec_landed(const struct pipe_exec *x) { return x->landed_early; }
int pipe_exec_landing_bufs(const struct pipe_exec *x) { return x->land_max; }
int pipe_exec_gathers(const struct pipe_exec *x) { return x->gathers; }
const struct pipe_table *pipe_exec_table(const struct pipe_exec *x) { return &x->t; }

const struct pipe_act_time *pipe_exec_times(const struct pipe_exec *x, int *n)
{
	*n = x->ntimes;
	return x->times;
}

/* ---- transfers ---- */

/* Before buffer b is written: the send that read it last, waited. */
static int reuse(struct pipe_exec *x, int b)
{
	struct pipe_sent *ps = &x->sent[b];
	int dev = ps->dev;
	if (dev < 0 || b >= x->t.bufs[x->stage])
		return 0;
	ps->dev = -1;
	return x->io->wait_send(x->io->ctx, dev, ps->kind, ps->idx);
}

static int run_send(struct pipe_exec *x, const struct pipe_action *a)
{
	uint32_t kind, idx;
	int b = a->buf[0], rc;
	pipe_val_msg(&x->t, &a->val, &kind, &idx);
	if (x->sent[b].dev >= 0 && (rc = reuse(x, b)))  /* one send in flight a buffer */
		return rc;
	x->sent[b] = (struct pipe_sent){ .dev = x->stage_dev[a->peer], .kind = kind, .idx = idx };
	return x->io->send(x->io->ctx, x->stage_dev[a->peer], kind, idx, x->buf[b], sizeof(float) * x->nf);
}

/* A receive posted into a landing buffer lands there, which then takes
 * the table buffer's place (the send that read that buffer last waited
 * first, so its memory is free to land the next one). */
static int run_recv(struct pipe_exec *x, const struct pipe_action *a)
{
	uint32_t kind, idx;
	int b = a->buf[0], rc = reuse(x, b), l = x->land_of[a - x->a];
	float *into = l >= 0 ? x->land[l] : x->buf[b];
	pipe_val_msg(&x->t, &a->val, &kind, &idx);
	if (!rc)
		rc = x->io->recv(x->io->ctx, x->stage_dev[a->peer], kind, idx, into, sizeof(float) * x->nf);
	if (!rc && l >= 0) {
		x->land[l] = x->buf[b];
		x->buf[b] = into;
		x->land_busy[l] = false;
	}
	return rc;
}

/* ---- compute ---- */

static float *scratch(const struct pipe_exec *x, int i)
{
	return x->buf[x->t.bufs[x->stage] + i];
}

static const int32_t *tokens(const struct pipe_exec *x, const int32_t *all, int mb)
{
	return all + (size_t)mb * x->ntok;
}

/* Synthetic compute: in place of the model's, once the action's waits
 * are done (its window slots, the send from the buffer it writes), the
 * device sleeps its time, to an absolute deadline from that moment (a
 * signal or a late wake-up cannot shorten it). */
static double synth_s(const struct pipe_exec *x, const struct pipe_action *a)
{
	const struct pipe_costs *c = &x->sleep_s;
	return a->op == PA_F || a->op == PA_FC ? c->f : a->op == PA_B ? c->b : a->op == PA_I ? c->i :
	       a->op == PA_W ? c->w : a->op == PA_EMBED ? c->embed : a->op == PA_HEAD ? c->head :
	       c->embed_back;
}

/* The device thread's spun end of each sleep, set with its timer slack
 * (pipe_exec_step): a sleep ends on time, as compute does. */
static _Thread_local uint64_t spin_ns;

/* Sleeps to *d + s seconds (monotonic ns; *d the deadline reached, after). */
static int sleep_until(uint64_t *d, double s)
{
	*d += (uint64_t)llround(s * 1e9);
	return util_sleep_until_ns(*d, spin_ns);
}

static int sleep_s(double s)
{
	uint64_t d = util_now_ns();
	return s > 0 ? sleep_until(&d, s) : 0;
}

static int synth(struct pipe_exec *x, const struct pipe_action *a)
{
	x->slept++;
	return sleep_s(synth_s(x, a));
}

/* Synthetic compute of an F or B of one layer in parts: its time split
 * as the layer's matmul FLOPs are (model_part_steps), each step's sleep
 * then its mid call, as the model makes them; with one wake-up's
 * lateness, as the action in one sleep: step j ends s x its share after
 * step j - 1, plus what the mid call between took (its waits). */
static int synth_parts(struct pipe_exec *x, const struct pipe_action *a, int l)
{
	double s = synth_s(x, a), share[MODEL_PART_STEPS], late = 0;
	unsigned mask[MODEL_PART_STEPS];
	bool bw = a->op == PA_B || a->op == PA_W;
	int n = a->op == PA_W ? model_part_steps_w(x->m, l, share, mask) : model_part_steps(x->m, l, bw, share, mask),
	    rc = 0;
	uint64_t d = util_now_ns(), t0;
	x->slept++;
	for (int j = 0; j < n && !rc; j++) {
		rc = s > 0 ? sleep_until(&d, s * share[j] + late) : 0;
		late = 0;
		if (rc || !mask[j])
			continue;
		t0 = util_now_ns();
		rc = exec_mid(x, l, bw, mask[j]);
		late = (double)(util_now_ns() - t0) * 1e-9;
	}
	return rc;
}

/* Whether action a (on one layer, l0) runs in two parts: its slot k. */
static bool in_parts(struct pipe_exec *x, const struct pipe_action *a, int l0, int l1, int k)
{
	x->mid_k = x->parts && l1 - l0 == 1 ? k : -1;
	x->mid_op = a->op;
	x->mid_last = a->op == PA_W ? exec_w_sends(x, (int)(a - x->a)) : x->last_b >= 0 && a == &x->a[x->last_b];
	x->mid_sent = false;
	return x->mid_k >= 0;
}

/* The end of an F or B in two parts (in_parts), rc its waits' and the
 * model's result (the model has run unless in sleep mode): sleep mode
 * sleeps the two parts here; then slot k is left READY (a layer whose
 * forward read no part B weight). */
static int run_parts(struct pipe_exec *x, const struct pipe_action *a, int l0, int k, int rc)
{
	if (!rc && x->sleep)
		rc = synth_parts(x, a, l0);
	x->mid_k = -1;
	if (!rc && (a->op == PA_F || a->op == PA_FC))
		rc = exec_use_slot(x, k, false);
	return rc;
}

/* The owner's embedding of mb, through the layers before the pipeline. */
static int run_embed(struct pipe_exec *x, const struct pipe_action *a)
{
	int nb, a0, rc;
	float *out = x->buf[a->buf[0]];
	outside(x, &nb, &a0);
	model_count_experts(x->m, x->t.count_pass && a->val.pass == 0 ? MODEL_COUNTS_KEEP : MODEL_COUNTS_ADD);
	model_act_set(x->m, 0);
	if ((rc = reuse(x, a->buf[0])) || (rc = exec_use_slot(x, WSLOT_NONLAYER, false)) ||
	    (nb && (rc = exec_use_slot(x, WSLOT_OUTSIDE(model_window(x->m)), false))))
		return rc;
	if (x->sleep)
		return synth(x, a);
	if (!nb)
		return model_embed_forward(x->m, out, tokens(x, x->inputs, a->mb));
	if ((rc = model_embed_forward(x->m, scratch(x, 0), tokens(x, x->inputs, a->mb))))
		return rc;
	return model_layers_forward(x->m, 0, nb, out, scratch(x, 0));
}

/* The owner's layers after the pipeline, head, loss and their backward. */
static int run_head(struct pipe_exec *x, const struct pipe_action *a)
{
	struct win *w = model_window(x->m);
	int nb, a0, L = model_dims(x->m)->L, rc;
	float *y = x->buf[a->buf[0]], *dy = x->buf[a->buf[1]];
	double l = 0;
	outside(x, &nb, &a0);
	float *zz = a0 < L ? scratch(x, 0) : y;  /* the head's input */
	model_count_experts(x->m, MODEL_COUNTS_KEEP);
	model_act_set(x->m, 0);
	if ((rc = reuse(x, a->buf[1])) || (rc = exec_use_slot(x, WSLOT_NONLAYER, true)) ||
	    (a0 < L && (rc = exec_use_slot(x, WSLOT_OUTSIDE(w), true))))
		return rc;
	if (x->sleep)
		return synth(x, a);  /* no loss: st->loss_sum stays 0 */
	if ((a0 < L && (rc = model_layers_forward(x->m, a0, L, zz, y))) ||
	    (rc = model_head_forward(x->m, &l, zz, tokens(x, x->targets, a->mb))) ||
	    (rc = model_head_backward(x->m, dy, zz, tokens(x, x->targets, a->mb))) ||
	    (a0 < L && (rc = model_layers_backward(x->m, a0, L, dy, y))))
		return rc;
	x->st->loss_sum += l;
	return 0;
}

/* The owner's layers before the pipeline (their forward recomputed from
 * the embedding, itself recomputed) and the embedding, backward. */
static int run_embed_back(struct pipe_exec *x, const struct pipe_action *a)
{
	int nb, a0, rc;
	float *din = x->buf[a->buf[0]];
	const int32_t *in = tokens(x, x->inputs, a->mb);
	outside(x, &nb, &a0);
	model_count_experts(x->m, MODEL_COUNTS_KEEP);
	model_act_set(x->m, 0);
	if ((rc = exec_use_slot(x, WSLOT_NONLAYER, true)) ||
	    (nb && (rc = exec_use_slot(x, WSLOT_OUTSIDE(model_window(x->m)), true))))
		return rc;
	if (x->sleep)
		return synth(x, a);
	if (nb && ((rc = model_embed_forward(x->m, scratch(x, 0), in)) ||
		   (rc = model_layers_forward(x->m, 0, nb, scratch(x, 1), scratch(x, 0))) ||
		   (rc = model_layers_backward(x->m, 0, nb, din, scratch(x, 0)))))
		return rc;
	return model_embed_backward(x->m, din, in);
}

/* A chunk's forward (F, or the counting pass's Fc). */
static int run_forward(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0, l1, rc;
	bool counting = a->op == PA_FC;
	float *out = a->buf[1] >= 0 ? x->buf[a->buf[1]] : scratch(x, 0);
	chunk_layers(x, a->chunk, &l0, &l1);
	model_count_experts(x->m, counting || !x->t.count_pass ? MODEL_COUNTS_ADD : MODEL_COUNTS_KEEP);
	model_act_set(x->m, a->aset);
	if (in_parts(x, a, l0, l1, WSLOT(a->slot))) {
		/* part A's gather only: part B's is waited for between the blocks */
		rc = a->buf[1] >= 0 ? reuse(x, a->buf[1]) : 0;
		if (!rc)
			rc = win_wait_first(model_window(x->m), WSLOT(a->slot));
		if (!rc && !x->sleep)
			rc = model_layers_forward(x->m, l0, l1, out, x->buf[a->buf[0]]);
		return run_parts(x, a, l0, WSLOT(a->slot), rc);
	}
	if ((a->buf[1] >= 0 && (rc = reuse(x, a->buf[1]))) || (rc = exec_use_slot(x, WSLOT(a->slot), false)))
		return rc;
	if (x->sleep)
		return synth(x, a);
	return model_layers_forward(x->m, l0, l1, out, x->buf[a->buf[0]]);
}

/* A chunk's backward (B), recomputing its forward first when the table
 * does; or its split halves (I, recomputing likewise; W, from the stash
 * its I filled, which holds everything W reads when the forward is
 * recomputed, and else the output gradients beside the activations the
 * table keeps to the W). */
static int run_backward(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0, l1, rc;
	float *in = x->buf[a->buf[0]], *g = x->buf[a->buf[1]];
	chunk_layers(x, a->chunk, &l0, &l1);
	model_count_experts(x->m, MODEL_COUNTS_KEEP);
	model_act_set(x->m, a->aset);
	if (a->op != PA_B)
		model_w_stash(x->m, a->wset);
	/* a W run ahead computes on the model's own weights and gradients
	 * (the window gathers no layer: fill_wait), before its slot is
	 * gathered */
	if ((a->op == PA_I && (rc = reuse(x, a->buf[2]))) ||
	    (!x->ahead && (rc = exec_use_slot(x, WSLOT(a->slot), a->op != PA_I))))
		return rc;
	if (a->op == PA_B && in_parts(x, a, l0, l1, WSLOT(a->slot))) {
		if (!x->sleep && x->t.shape.recompute)
			rc = model_layers_forward(x->m, l0, l1, scratch(x, 0), in);
		if (!x->sleep && !rc)
			rc = model_layers_backward(x->m, l0, l1, g, in);
		return run_parts(x, a, l0, WSLOT(a->slot), rc);
	}
	/* a W in parts: the feed-forward block's gradients go at its call */
	if (a->op == PA_W && !x->ahead && in_parts(x, a, l0, l1, WSLOT(a->slot)))
		return run_parts(x, a, l0, WSLOT(a->slot),
				 x->sleep ? 0 : model_layers_backward_weight(x->m, l0, l1, g, in));
	if (x->sleep)
		return synth(x, a);
	if (x->t.shape.recompute && a->op != PA_W &&
	    (rc = model_layers_forward(x->m, l0, l1, scratch(x, 0), in)))
		return rc;
	if (a->op == PA_I)
		return model_layers_backward_input(x->m, l0, l1, x->buf[a->buf[2]], g, in);
	if (a->op == PA_W)
		return model_layers_backward_weight(x->m, l0, l1, g, in);
	return model_layers_backward(x->m, l0, l1, g, in);
}

static int count_sum(struct pipe_exec *x)
{
	uint32_t axes = model_rows_axes(x->m) | (x->t.shape.stages > 1 ? 1u << AX_STAGE : 0);
	model_count_experts(x->m, MODEL_COUNTS_KEEP);
	return model_sum_counts(x->m, axes);
}

static bool timed(int op)
{
	return op != PA_SEND && op != PA_RECV && op != PA_GATHER && op != PA_RELEASE &&
	       op != PA_REDUCE_SCATTER && op != PA_COUNT_SUM;
}

static int run_action(struct pipe_exec *x, const struct pipe_action *a)
{
	int rc = exec_before(x, a);
	if (rc)
		return rc;
	double t0 = util_now_s(), c0 = timed(a->op) ? util_thread_cpu_s() : 0;
	/* the first chunk action has started: the held gathers go */
	if (x->held && a == &x->a[x->hold_at] && (rc = exec_start_held(x)))
		return rc;
	switch (a->op) {
	case PA_EMBED:
		rc = run_embed(x, a);
		break;
	case PA_F:
	case PA_FC:
		rc = run_forward(x, a);
		break;
	case PA_B:
	case PA_I:
	case PA_W:
		rc = run_backward(x, a);
		break;
	case PA_HEAD:
		rc = run_head(x, a);
		break;
	case PA_EMBED_BACK:
		rc = run_embed_back(x, a);
		break;
	case PA_COUNT_SUM:
		rc = count_sum(x);
		break;
	case PA_SEND:
		rc = run_send(x, a);
		break;
	case PA_RECV:
		rc = run_recv(x, a);
		break;
	default:
		rc = exec_weights(x, a);
	}
	if (timed(a->op)) {
		/* the CPU read inside the wall's reads, so a span's CPU is never
		 * more than its wall: an interrupt's work (a softirq receiving
		 * TCP) between the two reads is charged to this thread */
		double cpu = util_thread_cpu_s() - c0;
		x->times[x->ntimes++] = (struct pipe_act_time){ .op = a->op, .mb = a->mb, .chunk = a->chunk,
								.t0 = t0, .t1 = util_now_s(), .cpu = cpu };
	}
	return rc ? rc : exec_after(x, (int)(a - x->a));
}

/* ---- filling receive waits ---- */

/* Before the receive at k: while it has not arrived and a W is owed,
 * runs that W. */
static int fill_wait(struct pipe_exec *x, int k)
{
	const struct pipe_action *a = &x->a[k];
	uint32_t kind, idx;
	int b = a->buf[0], rc = reuse(x, b), j;
	pipe_val_msg(&x->t, &a->val, &kind, &idx);
	while (!rc && (j = exec_owed_w(x, k)) >= 0) {
		rc = x->io->probe(x->io->ctx, x->stage_dev[a->peer], kind, idx, x->buf[b], sizeof(float) * x->nf,
				  PIPE_RR_NOW);
		if (rc)
			return rc < 0 ? rc : 0;
		x->ahead = true;
		rc = run_action(x, &x->a[j]);
		x->ahead = false;
		x->ran[j] = true;
		x->fills++;
	}
	return rc;
}

/* Whether the environment sets name to 0 (an A/B switch that is on
 * unless turned off). */
static bool env_zero(const char *name)
{
	const char *v = getenv(name);
	return v && *v && !atoi(v);
}

int pipe_exec_step(struct pipe_exec *x, const int32_t *inputs, const int32_t *targets,
		   struct model_step *st, const struct pipe_p2p *io)
{
	struct win *w = model_window(x->m);
	int rc = 0;
	if (x->poison) {
		for (size_t i = 0; i < x->mem_n; i++)
			x->mem[i] = NAN;
		win_poison(w);
	}
	x->inputs = inputs;
	x->targets = targets;
	x->st = st;
	x->io = io;
	x->ntimes = 0;
	x->slept = 0;
	/* synthetic compute: the device thread's sleeps end at their
	 * deadline, not up to the default 50 us timer slack after it, nor
	 * a wake-up after it: their last 100 us spun (MESHRUN_SYNTH_SPIN_US=n
	 * spins n us instead, 0 none: to measure against) */
	const char *sp = getenv("MESHRUN_SYNTH_SPIN_US");
	spin_ns = 1000u * (uint64_t)(sp && *sp ? atoi(sp) : 100);
	if (x->sleep)
		prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
	for (int b = 0; b < x->t.bufs[x->stage]; b++)
		x->sent[b].dev = -1;
	x->landing_k = x->landing_nl = -1;
	x->filling = exec_can_fill(x);
	x->fills = 0;
	memset(x->ran, 0, sizeof(bool) * (size_t)x->n);
	/* (MESHRUN_PIPE_PREPOST=n: at most n outstanding, 0 each receive
	 * posted at its place, 1 the next one only; to measure against) */
	const char *pp = getenv("MESHRUN_PIPE_PREPOST");
	x->prepost = io && io->probe && !x->filling ? pp && *pp ? atoi(pp) : PIPE_PREPOST_MAX : 0;
	x->preposts = x->prepost_depth = x->landed_early = 0;
	/* (MESHRUN_PIPE_RR_HOLD=0: every post writes its RecvReady at
	 * once, as before; MESHRUN_PIPE_RR_LATER=0: the posts that hold
	 * none write it from the device thread; to measure against) */
	x->hold = !env_zero("MESHRUN_PIPE_RR_HOLD");
	x->later = !env_zero("MESHRUN_PIPE_RR_LATER");
	const char *pl = getenv("MESHRUN_PIPE_LANDING");
	x->nland = pl && *pl ? atoi(pl) : x->land_max;
	x->nland = x->nland < 0 ? 0 : x->nland > x->land_max ? x->land_max : x->nland;
	memset(x->land_of, -1, (size_t)x->n);
	memset(x->land_busy, 0, sizeof(x->land_busy));
	memset(x->posted, 0, sizeof(bool) * (size_t)x->n);
	model_step_begin(x->m, st);
	st->loss_sum = 0;
	model_zero_counts(x->m);
	/* the leading gathers a prefetch started are in flight already;
	 * the held ones start with the first chunk action */
	bool recvd = false;  /* a receive ran since the last compute */
	/* (not while filling: it runs W's ahead of their place) */
	int sums = x->filling || !x->hooks.stage_sums ? -1 : x->sums_at;
	x->held = x->hold_at >= 0;
	bool gated = x->gate != NULL;  /* the gate not asked yet */
	bool stopped = false;          /* by the gate */
	for (int k = x->npre; k < x->n && !rc; k++) {
		if (gated && gate_point(&x->a[k])) {
			gated = false;
			if ((rc = x->gate(x->gate_ctx))) {
				stopped = true;
				break;
			}
		}
		if (k == sums)
			rc = x->hooks.stage_sums(x->hooks.ctx);
		if (rc || x->ran[k] || (x->held && k >= x->lead && k < x->lead_end))
			continue;
		if (x->filling && x->a[k].op == PA_RECV)
			rc = fill_wait(x, k);
		/* which receives prepost posts where in a gap: before the
		 * gap's sends to their stage, the others after the sends;
		 * none once a receive of the gap ran (the compute after it
		 * is often what a waiting stage waits for: a post there,
		 * into the landing buffer that receive just freed, waits for
		 * the next gap) (bench/results/pipeline.md, inter10) */
		if (!rc && x->prepost && !recvd && !gated)
			rc = exec_prepost(x, k);
		if (!rc)
			rc = run_action(x, &x->a[k]);
		recvd = x->a[k].op == PA_RECV || (recvd && !compute_op(x->a[k].op));
	}
	x->npre = 0;
	x->gate = NULL;  /* one step's */
	if (!rc && !(rc = win_scatter_finish(w)))
		rc = exec_landed(x);
	else if (stopped)  /* nothing of it stays */
		win_end(w);
	int frc = io ? io->flush(io->ctx) : 0;
	x->gathers = win_gathers(w);
	int erc = model_step_end(x->m);
	return rc ? rc : frc ? frc : erc;
}
