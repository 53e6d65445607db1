/* See host/pipeline/exec.h. The table's buffers (each one microbatch of
 * activations, mb x T x C floats: t->bufs[stage] of them, then
 * t->scratch[stage] scratch ones) are one allocation; an action names
 * the ones it reads and writes. Before an action writes a buffer, the
 * last send from it is waited (the table reuses a buffer only once its
 * receiver took that send, so the wait is for a receive already done or
 * under way). Window slots: the non-layer tensors in 0, the table's
 * chunk slot k in 1 + k, the layers outside the pipeline in the last. */
#include "host/pipeline/exec.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/model/window.h"
#include "host/util/clock.h"

/* A send from a buffer not waited yet: to dev (-1: none), (kind, idx). */
struct pipe_sent {
	int dev;
	uint32_t kind, idx;
};

struct pipe_exec {
	struct pipe_table t;
	const struct pipe_action *a; /* this stage's list */
	int n, stage, first_layer;
	int *stage_dev;
	struct model *m;
	size_t nf;                   /* floats of one microbatch's activations */
	int ntok;                    /* tokens of one microbatch */
	float *mem;                  /* every buffer below */
	size_t mem_n;
	float **buf;                 /* [bufs + scratch] */
	int nbuf;
	struct pipe_sent *sent;      /* [bufs] */
	bool *gzero;                 /* [window slots] the next gradient write zeroes them */
	int poison;
	int gathers;
	struct pipe_act_time *times;
	int ntimes;
	/* the step in progress */
	const int32_t *inputs, *targets;
	struct model_step *st;
	const struct pipe_p2p *io;
};

#define WSLOT_NONLAYER 0
#define WSLOT(k) (1 + (k))
#define WSLOT_OUTSIDE(w) (win_slots(w) - 1)

static int wslot(const struct pipe_exec *x, const struct pipe_action *a)
{
	struct win *w = model_window(x->m);
	if (a->chunk == PIPE_G_NONLAYER)
		return WSLOT_NONLAYER;
	if (a->chunk == PIPE_G_OUTSIDE)
		return WSLOT_OUTSIDE(w);
	return WSLOT(a->slot);
}

/* The decoder layers [*l0, *l1) of chunk c. */
static void chunk_layers(const struct pipe_exec *x, int c, int *l0, int *l1)
{
	*l0 = x->first_layer + c * x->t.shape.layers_per_stage;
	*l1 = *l0 + x->t.shape.layers_per_stage;
}

/* The layers outside the pipeline: [0, *nb) before it, [*a0, L) after. */
static void outside(const struct pipe_exec *x, int *nb, int *a0)
{
	*nb = x->first_layer;
	*a0 = x->first_layer + x->t.nchunks * x->t.shape.layers_per_stage;
}

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
	return 0;
}

static int alloc_bufs(struct pipe_exec *x, int tok, int C)
{
	int nb = x->t.bufs[x->stage], ns = x->t.scratch[x->stage];
	x->nbuf = nb + ns;
	x->ntok = tok;
	x->nf = (size_t)tok * C;
	x->mem_n = (size_t)x->nbuf * x->nf;
	x->mem = malloc(sizeof(float) * (x->mem_n ? x->mem_n : 1));
	x->buf = calloc((size_t)x->nbuf + 1, sizeof(float *));
	x->sent = calloc((size_t)nb + 1, sizeof(*x->sent));
	x->gzero = calloc((size_t)win_slots(model_window(x->m)), sizeof(bool));
	x->times = malloc(sizeof(*x->times) * (size_t)(x->n + 1));
	if (!x->mem || !x->buf || !x->sent || !x->gzero || !x->times)
		return -ENOMEM;
	for (int b = 0; b < x->nbuf; b++)
		x->buf[b] = x->mem + (size_t)b * x->nf;
	memset(x->mem, 0, sizeof(float) * x->mem_n);
	return 0;
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
	if (!x->stage_dev || alloc_bufs(x, mb_rows * d->T, d->C))
		goto oom;
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
	free(x);
}

void pipe_exec_poison(struct pipe_exec *x, int on) { x->poison = on; }
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

static int run_recv(struct pipe_exec *x, const struct pipe_action *a)
{
	uint32_t kind, idx;
	int b = a->buf[0], rc = reuse(x, b);
	pipe_val_msg(&x->t, &a->val, &kind, &idx);
	if (!rc)
		rc = x->io->recv(x->io->ctx, x->stage_dev[a->peer], kind, idx, x->buf[b], sizeof(float) * x->nf);
	return rc;
}

/* ---- weights ---- */

static int run_weights(struct pipe_exec *x, const struct pipe_action *a)
{
	struct win *w = model_window(x->m);
	int k = wslot(x, a), l0 = WIN_NONLAYER, l1 = 0, nb, a0;
	switch (a->op) {
	case PA_GATHER:
		x->gzero[k] = true;
		if (a->chunk == PIPE_G_OUTSIDE) {
			outside(x, &nb, &a0);
			l0 = nb ? 0 : a0;
			l1 = nb ? nb : model_dims(x->m)->L;
		} else if (a->chunk >= 0) {
			chunk_layers(x, a->chunk, &l0, &l1);
		}
		return win_gather_start(w, k, l0, l1);
	case PA_RELEASE:
		win_release(w, k);
		return 0;
	default:
		/* the gradients are packed and sent: the next write starts from 0 */
		x->gzero[k] = true;
		return win_scatter_start(w, k);
	}
}

/* Waits for window slot k; when grads, zeroes its gradients first if a
 * gather or reduce-scatter left them to be. */
static int use_slot(struct pipe_exec *x, int k, bool grads)
{
	struct win *w = model_window(x->m);
	int rc = win_wait(w, k);
	if (!rc && grads && x->gzero[k]) {
		win_zero_grads(w, k);
		x->gzero[k] = false;
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

/* The owner's embedding of mb, through the layers before the pipeline. */
static int run_embed(struct pipe_exec *x, const struct pipe_action *a)
{
	int nb, a0, rc;
	float *out = x->buf[a->buf[0]];
	outside(x, &nb, &a0);
	model_count_experts(x->m, x->t.count_pass && a->val.pass == 0 ? MODEL_COUNTS_KEEP : MODEL_COUNTS_ADD);
	model_act_set(x->m, 0);
	if ((rc = reuse(x, a->buf[0])) || (rc = use_slot(x, WSLOT_NONLAYER, false)))
		return rc;
	if (!nb)
		return model_embed_forward(x->m, out, tokens(x, x->inputs, a->mb));
	if ((rc = use_slot(x, WSLOT_OUTSIDE(model_window(x->m)), false)) ||
	    (rc = model_embed_forward(x->m, scratch(x, 0), tokens(x, x->inputs, a->mb))))
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
	if ((rc = reuse(x, a->buf[1])) || (rc = use_slot(x, WSLOT_NONLAYER, true)) ||
	    (a0 < L && (rc = use_slot(x, WSLOT_OUTSIDE(w), true))) ||
	    (a0 < L && (rc = model_layers_forward(x->m, a0, L, zz, y))) ||
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
	if ((rc = use_slot(x, WSLOT_NONLAYER, true)))
		return rc;
	if (nb && ((rc = use_slot(x, WSLOT_OUTSIDE(model_window(x->m)), true)) ||
		   (rc = model_embed_forward(x->m, scratch(x, 0), in)) ||
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
	if ((a->buf[1] >= 0 && (rc = reuse(x, a->buf[1]))) || (rc = use_slot(x, WSLOT(a->slot), false)))
		return rc;
	return model_layers_forward(x->m, l0, l1, out, x->buf[a->buf[0]]);
}

/* A chunk's backward (B), recomputing its forward first when the table
 * does; or its split halves (I, W). */
static int run_backward(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0, l1, rc;
	float *in = x->buf[a->buf[0]], *g = x->buf[a->buf[1]];
	chunk_layers(x, a->chunk, &l0, &l1);
	model_count_experts(x->m, MODEL_COUNTS_KEEP);
	model_act_set(x->m, a->aset);
	if ((a->op == PA_I && (rc = reuse(x, a->buf[2]))) || (rc = use_slot(x, WSLOT(a->slot), a->op != PA_I)))
		return rc;
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
	double t0 = util_now_s();
	int rc;
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
		rc = run_weights(x, a);
	}
	if (timed(a->op))
		x->times[x->ntimes++] = (struct pipe_act_time){ .op = a->op, .mb = a->mb, .chunk = a->chunk,
								.t0 = t0, .t1 = util_now_s() };
	return rc;
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
	for (int b = 0; b < x->t.bufs[x->stage]; b++)
		x->sent[b].dev = -1;
	model_step_begin(x->m, st);
	st->loss_sum = 0;
	model_zero_counts(x->m);
	for (int k = 0; k < x->n && !rc; k++)
		rc = run_action(x, &x->a[k]);
	if (!rc)
		rc = win_scatter_finish(w);
	int frc = io ? io->flush(io->ctx) : 0;
	x->gathers = win_gathers(w);
	int erc = model_step_end(x->m);
	return rc ? rc : frc ? frc : erc;
}
