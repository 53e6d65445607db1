/* See host/pipeline/exec.h. Buffers, each one microbatch of activations
 * (mb x T x C floats), as many as pipe_stage_bufs reads off the table:
 * saved[r M + m] the stage input of slot (r, m), kept for the backward;
 * out[out_of[r M + m]] its output, until its receiver took it (the
 * buffer's next user waits for that send first); g[grad_of[r M + m]]
 * the gradient of its output, then of its input, likewise; in[m], y[m],
 * dy[m], din[m] only for the microbatches m this stage owns (NULL for the
 * others): the embedded microbatch (taken by stage 0), the pipeline's
 * output, its gradient and the gradient of the embedding. Stage 0
 * receives the other owners' inputs straight into saved[], stage S-1
 * their output gradients straight into g[]. */
#include "host/pipeline/exec.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/model/window.h"
#include "host/util/clock.h"

/* Message kinds (exec.h's (kind, idx)). */
enum { MSG_IN = 1, MSG_ACT, MSG_OUT, MSG_DOUT, MSG_GRAD, MSG_DIN };

struct pipe_exec {
	struct pipe_schedule sch;
	struct pipe_shape sh;
	int stage, first_layer;
	int *stage_dev;
	struct model *m;
	size_t nf;                   /* floats of one microbatch's activations */
	int ntok;                    /* tokens of one microbatch */
	float *mem;                  /* every buffer below */
	float **in, **saved, **out, **g, **y, **dy, **din, *tmp;
	int *out_of, *grad_of;       /* [R M]: each slot's out and g buffer */
	struct pipe_sent *out_sent, *g_sent; /* each buffer's send not yet waited */
	struct pipe_bufs nb;         /* how many of each */
	size_t mem_n;
	int poison;
	bool *gzero;                 /* [grad_slots] the buffer's next BACKWARD zeroes it */
	int gathers;                 /* layer-group gathers of the last step */
	struct pipe_slot_time *times;
	int ntimes;
};

/* A send from a reused buffer: to dev (-1: none or waited), (kind, idx). */
struct pipe_sent {
	int dev, kind, idx;
};

static int owner(const struct pipe_exec *x, int mb) { return pipe_owner(&x->sh, mb); }

/* Window slots (host/model/window.h): the non-layer tensors in 0, the
 * table's weight slot k in 1 + k (the model's window keeps the table's
 * weight_slots layer groups: model_mesh.pipe_weight_slots). Gradient
 * buffer k is the gradients beside weight slot k: the table uses one
 * slot number for both. Without FSDP axes the window holds no tensor and
 * these move nothing. */
#define WSLOT_NONLAYER 0
#define WSLOT(k) (1 + (k))
/* the layers outside the pipeline: the last slot, gathered while no
 * table slot is READY (so the per-iteration mode only) */
#define WSLOT_OUTSIDE(w) (win_slots(w) - 1)

/* The window keeps a slot's gradients beside its weights: a BACKWARD's
 * gradient buffer must be its weight slot (every table built so far). */
static int check_grad_slots(const struct pipe_exec *x, char *err, size_t errlen)
{
	for (int i = 0; i < x->sch.n; i++) {
		const struct pipe_entry *e = &x->sch.e[i];
		if (e->op == PIPE_BACKWARD && e->gslot != e->slot) {
			snprintf(err, errlen, "pipeline: the schedule puts dW of weight slot %d into "
				 "gradient buffer %d; the executor keeps them together", e->slot, e->gslot);
			return -EINVAL;
		}
	}
	return 0;
}

/* Checks that the model holds (in its own storage) the layers of every
 * repeat of this stage. */
static int check_layers(const struct pipe_exec *x, char *err, size_t errlen)
{
	for (int r = 0; r < x->sh.repeats; r++) {
		for (int j = 0; j < x->sh.layers_per_stage; j++) {
			int l = x->first_layer + pipe_layer(&x->sh, r, x->stage, j);
			const struct param_info *p = model_layer_missing(x->m, l);
			if (!p)
				continue;
			snprintf(err, errlen, "config: pipeline stage %d runs layer %d, which "
				 "'%s' does not store on it (logical_axis_rules must split "
				 "'layers' over stage alone)", x->stage, l, p->name);
			return -EINVAL;
		}
	}
	return 0;
}

/* Points n entries of p at the next n buffers of the arena *at. */
static void carve(float **p, int n, float **at, size_t nf)
{
	for (int i = 0; i < n; i++, *at += nf)
		p[i] = *at;
}

/* The buffers the table needs (pipe_stage_bufs), sized for tok tokens of
 * width C per microbatch. */
static int alloc_bufs(struct pipe_exec *x, int tok, int C)
{
	int S = x->sh.stages, M = x->sh.microbatches, RM = x->sh.repeats * M;
	struct pipe_bufs *b = &x->nb;
	x->out_of = malloc(sizeof(int) * (size_t)RM);
	x->grad_of = malloc(sizeof(int) * (size_t)RM);
	if (!x->out_of || !x->grad_of || pipe_stage_bufs(&x->sch, x->stage, b, x->out_of, x->grad_of))
		return -ENOMEM;
	size_t nbuf = (size_t)pipe_bufs_total(b);
	x->ntok = tok;
	x->nf = (size_t)tok * C;
	x->mem_n = nbuf * x->nf;
	x->mem = malloc(sizeof(float) * x->mem_n);
	/* in, y, dy, din: M each (owned ones set); saved; out; g */
	float **p = calloc(4 * (size_t)M + (size_t)RM + (size_t)b->out + (size_t)b->grad, sizeof(float *));
	x->in = p;
	x->out_sent = malloc(sizeof(*x->out_sent) * (size_t)(b->out + b->grad));
	if (!x->mem || !p || !x->out_sent)
		return -ENOMEM;
	x->g_sent = x->out_sent + b->out;
	x->y = p + M;
	x->dy = p + 2 * M;
	x->din = p + 3 * M;
	x->saved = p + 4 * M;
	x->out = x->saved + RM;
	x->g = x->out + b->out;
	float *at = x->mem;
	for (int mb = x->stage; mb < M; mb += S) {
		carve(&x->in[mb], 1, &at, x->nf);
		carve(&x->y[mb], 1, &at, x->nf);
		carve(&x->dy[mb], 1, &at, x->nf);
		carve(&x->din[mb], 1, &at, x->nf);
	}
	carve(x->saved, RM, &at, x->nf);
	carve(x->out, b->out, &at, x->nf);
	carve(x->g, b->grad, &at, x->nf);
	x->tmp = at;
	memset(x->mem, 0, sizeof(float) * x->mem_n);
	return 0;
}

int pipe_exec_new(struct pipe_exec **out, const struct pipe_shape *sh, int stage, int first_layer,
		  const int *stage_dev, struct model *m, int mb_rows, char *err, size_t errlen)
{
	const struct model_dims *d = model_dims(m);
	struct pipe_exec *x = calloc(1, sizeof(*x));
	int rc, S = sh->stages, M = sh->microbatches, RM = sh->repeats * M;
	*out = NULL;
	if (!x)
		goto oom;
	x->sh = *sh;
	x->stage = stage;
	x->first_layer = first_layer;
	x->m = m;
	if ((rc = pipe_schedule_circular(&x->sch, sh, err, errlen)) || (rc = check_layers(x, err, errlen)) ||
	    (rc = check_grad_slots(x, err, errlen)))
		goto fail;
	x->gzero = calloc((size_t)x->sch.grad_slots, sizeof(*x->gzero));
	if (!x->gzero)
		goto oom;
	x->stage_dev = malloc(sizeof(int) * (size_t)S);
	x->times = malloc(sizeof(*x->times) * (size_t)(2 * RM));
	if (!x->stage_dev || !x->times || alloc_bufs(x, mb_rows * d->T, d->C))
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
	pipe_schedule_release(&x->sch);
	free(x->stage_dev);
	free(x->gzero);
	free(x->times);
	free(x->mem);
	free(x->in);
	free(x->out_of);
	free(x->grad_of);
	free(x->out_sent);
	free(x);
}

void pipe_exec_poison(struct pipe_exec *x, int on) { x->poison = on; }

int pipe_exec_gathers(const struct pipe_exec *x) { return x->gathers; }

const struct pipe_slot_time *pipe_exec_times(const struct pipe_exec *x, int *n)
{
	*n = x->ntimes;
	return x->times;
}

/* A transfer to or from stage `to` (a device of this group), or a copy
 * when that is this device. */
static int xfer_send(struct pipe_exec *x, const struct pipe_p2p *io, int to, int kind, int idx,
		     const float *buf, float *self_dst)
{
	if (to == x->stage) {
		if (self_dst != buf)
			memcpy(self_dst, buf, sizeof(float) * x->nf);
		return 0;
	}
	return io->send(io->ctx, x->stage_dev[to], (uint32_t)kind, (uint32_t)idx, buf,
			sizeof(float) * x->nf);
}

static int xfer_recv(struct pipe_exec *x, const struct pipe_p2p *io, int from, int kind, int idx, float *buf)
{
	if (from == x->stage)
		return 0;  /* xfer_send copied it */
	return io->recv(io->ctx, x->stage_dev[from], (uint32_t)kind, (uint32_t)idx, buf,
			sizeof(float) * x->nf);
}

static int slot_of(const struct pipe_exec *x, const struct pipe_entry *e)
{
	return e->repeat * x->sh.microbatches + e->mb;
}

/* Before a reused buffer is written: the send that read it last, waited
 * (pipe_stage_bufs reuses it only after the receiver took that send). */
static int reuse(const struct pipe_p2p *io, struct pipe_sent *ps)
{
	int rc = 0, dev = ps->dev;
	ps->dev = -1;
	if (dev >= 0)
		rc = io->wait_send(io->ctx, dev, (uint32_t)ps->kind, (uint32_t)ps->idx);
	return rc;
}

/* xfer_send from a reused buffer, remembering the send in *ps. */
static int send_from(struct pipe_exec *x, const struct pipe_p2p *io, int to, int kind, int idx,
		     const float *buf, float *self_dst, struct pipe_sent *ps)
{
	if (to != x->stage)
		*ps = (struct pipe_sent){ .dev = x->stage_dev[to], .kind = kind, .idx = idx };
	return xfer_send(x, io, to, kind, idx, buf, self_dst);
}

/* At the start of a step: the last step's flush waited every send. */
static void forget_sends(struct pipe_exec *x)
{
	for (int b = 0; b < x->nb.out + x->nb.grad; b++)
		x->out_sent[b].dev = -1;
}

static void layer_range(const struct pipe_exec *x, int repeat, int *l0, int *l1)
{
	*l0 = x->first_layer + pipe_layer(&x->sh, repeat, x->stage, 0);
	*l1 = *l0 + x->sh.layers_per_stage;
}

static void stamp(struct pipe_exec *x, const struct pipe_entry *e, double t0)
{
	x->times[x->ntimes++] = (struct pipe_slot_time){ .iter = e->iter, .mb = e->mb, .repeat = e->repeat,
							 .pass = e->pass, .t0 = t0, .t1 = util_now_s() };
}

/* A weight entry (either pass); 0 or the step's error. */
static int run_weights(struct pipe_exec *x, const struct pipe_entry *e)
{
	struct win *w = model_window(x->m);
	int l0, l1;
	switch (e->op) {
	case PIPE_GATHER:
		layer_range(x, e->repeat, &l0, &l1);
		return win_gather_start(w, WSLOT(e->slot), l0, l1);
	case PIPE_RELEASE:
		win_release(w, WSLOT(e->slot));
		return 0;
	case PIPE_REDUCE_SCATTER:
		/* dW[repeat, stage] is complete: packed and sent, its buffer
		 * free again (the next BACKWARD into it starts from zero) */
		x->gzero[e->slot] = true;
		return win_scatter_start(w, WSLOT(e->slot));
	default:
		return 0;
	}
}

/* One forward-pass entry of this stage. */
static int run_fwd(struct pipe_exec *x, const struct pipe_entry *e, const struct pipe_p2p *io)
{
	int k = slot_of(x, e), ob = x->out_of[k], l0, l1, rc = 0;
	double t0;
	switch (e->op) {
	case PIPE_TAKE_INPUT:
		/* another owner's input lands in the saved input at once */
		if (!x->in[e->mb]) {
			rc = xfer_recv(x, io, owner(x, e->mb), MSG_IN, e->mb, x->saved[k]);
			break;
		}
		rc = xfer_recv(x, io, owner(x, e->mb), MSG_IN, e->mb, x->in[e->mb]);
		memcpy(x->saved[k], x->in[e->mb], sizeof(float) * x->nf);
		break;
	case PIPE_RECV:
		rc = xfer_recv(x, io, e->peer, MSG_ACT, e->peer_iter, x->saved[k]);
		break;
	case PIPE_FORWARD:
		layer_range(x, e->repeat, &l0, &l1);
		t0 = util_now_s();
		if (!(rc = win_wait(model_window(x->m), WSLOT(e->slot))) &&
		    !(rc = reuse(io, &x->out_sent[ob])))
			rc = model_layers_forward(x->m, l0, l1, x->out[ob], x->saved[k]);
		stamp(x, e, t0);
		break;
	case PIPE_SEND:
		rc = send_from(x, io, e->peer, MSG_ACT, e->iter, x->out[ob], NULL, &x->out_sent[ob]);
		break;
	case PIPE_GIVE_OUTPUT:
		rc = send_from(x, io, owner(x, e->mb), MSG_OUT, e->mb, x->out[ob], x->y[e->mb],
			       &x->out_sent[ob]);
		break;
	default:
		break;
	}
	return rc;
}

/* One backward-pass entry of this stage. */
static int run_bwd(struct pipe_exec *x, const struct pipe_entry *e, const struct pipe_p2p *io)
{
	int k = slot_of(x, e), gb = x->grad_of[k], l0, l1, rc = 0;
	double t0;
	switch (e->op) {
	case PIPE_TAKE_DOUT:
		if ((rc = reuse(io, &x->g_sent[gb])))
			break;
		if (!x->dy[e->mb]) {  /* another owner's: straight into g */
			rc = xfer_recv(x, io, owner(x, e->mb), MSG_DOUT, e->mb, x->g[gb]);
			break;
		}
		if ((rc = xfer_recv(x, io, owner(x, e->mb), MSG_DOUT, e->mb, x->dy[e->mb])))
			break;
		memcpy(x->g[gb], x->dy[e->mb], sizeof(float) * x->nf);
		break;
	case PIPE_RECV_GRAD:
		if (!(rc = reuse(io, &x->g_sent[gb])))
			rc = xfer_recv(x, io, e->peer, MSG_GRAD, e->peer_iter, x->g[gb]);
		break;
	case PIPE_BACKWARD:
		layer_range(x, e->repeat, &l0, &l1);
		t0 = util_now_s();
		/* recompute the slot's forward from its saved input, then back;
		 * dW accumulates into buffer gslot (the gradients beside weight
		 * slot gslot) until a REDUCE_SCATTER entry sends it */
		if (!(rc = win_wait(model_window(x->m), WSLOT(e->slot)))) {
			if (x->gzero[e->gslot])
				win_zero_grads(model_window(x->m), WSLOT(e->gslot));
			x->gzero[e->gslot] = false;
			rc = model_layers_forward(x->m, l0, l1, x->tmp, x->saved[k]);
		}
		if (!rc)
			rc = model_layers_backward(x->m, l0, l1, x->g[gb], x->saved[k]);
		stamp(x, e, t0);
		break;
	case PIPE_SEND_GRAD:
		rc = send_from(x, io, e->peer, MSG_GRAD, e->iter, x->g[gb], NULL, &x->g_sent[gb]);
		break;
	case PIPE_GIVE_DIN:
		rc = send_from(x, io, owner(x, e->mb), MSG_DIN, e->mb, x->g[gb], x->din[e->mb],
			       &x->g_sent[gb]);
		break;
	default:
		break;
	}
	return rc;
}

/* The layers outside the pipeline, run by a microbatch's owner: [0, *nb)
 * after the embedding (the pipeline's first layer is first_layer), and
 * [*a0, L) before the head. */
static void outside(const struct pipe_exec *x, int *nb, int *a0)
{
	const struct pipe_shape *sh = &x->sh;
	*nb = x->first_layer;
	*a0 = x->first_layer + sh->stages * sh->repeats * sh->layers_per_stage;
}

/* Layers [l0, l1) outside the pipeline into the window (weights split
 * over the rows' axes; nothing moves without them), between the passes
 * of the table, whose weight slots are all free then; their gradients
 * zeroed. */
static int outside_gather(struct pipe_exec *x, int l0, int l1)
{
	struct win *w = model_window(x->m);
	int rc = win_gather_start(w, WSLOT_OUTSIDE(w), l0, l1);
	if (!rc && !(rc = win_wait(w, WSLOT_OUTSIDE(w))))
		win_zero_grads(w, WSLOT_OUTSIDE(w));
	return rc;
}

/* Done with them: their gradients (if grads) reduce-scattered. */
static int outside_release(struct pipe_exec *x, bool grads, int rc)
{
	struct win *w = model_window(x->m);
	if (grads && !rc)
		rc = win_scatter_start(w, WSLOT_OUTSIDE(w));
	win_release(w, WSLOT_OUTSIDE(w));
	return rc;
}

/* The owner's part: embed its microbatches, run the layers before the
 * pipeline on them and send them to stage 0. Every forward of the step
 * adds its expert counts (head_all sums them). */
static int embed_all(struct pipe_exec *x, const int32_t *inputs, const struct pipe_p2p *io)
{
	int rc = 0, nb, a0;
	outside(x, &nb, &a0);
	model_zero_counts(x->m);
	model_count_experts(x->m, MODEL_COUNTS_ADD);
	if (nb && (rc = outside_gather(x, 0, nb)))
		return outside_release(x, false, rc);
	for (int mb = x->stage; mb < x->sh.microbatches && !rc; mb += x->sh.stages) {
		const int32_t *in = inputs + (size_t)mb * x->ntok;
		/* the embedding lands in tmp (free outside the backward pass) */
		if (!(rc = model_embed_forward(x->m, nb ? x->tmp : x->in[mb], in)) && nb)
			rc = model_layers_forward(x->m, 0, nb, x->in[mb], x->tmp);
		if (!rc)
			rc = xfer_send(x, io, 0, MSG_IN, mb, x->in[mb], x->in[mb]);
	}
	return nb ? outside_release(x, false, rc) : rc;
}

/* Between the passes, every forward of the step done: each MoE layer's
 * expert counts over the whole batch (a pipelined layer's are on its
 * stage, the others' spread over the owners), as one device counts them;
 * recomputed forwards leave them alone. */
static int count_experts(struct pipe_exec *x)
{
	model_count_experts(x->m, MODEL_COUNTS_KEEP);
	return model_sum_counts(x->m, model_rows_axes(x->m) | 1u << AX_STAGE);
}

/* The owner's part after the forward pass: the layers after the pipeline,
 * the loss and their backward for each of its microbatches (one after
 * the other, so nothing is recomputed), the gradient sent to stage S-1. */
static int head_all(struct pipe_exec *x, const int32_t *targets, const struct pipe_p2p *io,
		    double *loss)
{
	int rc, last = x->sh.stages - 1, nb, a0, L = model_dims(x->m)->L;
	outside(x, &nb, &a0);
	*loss = 0;
	if ((rc = count_experts(x)) || (a0 < L && (rc = outside_gather(x, a0, L))))
		return a0 < L ? outside_release(x, false, rc) : rc;
	for (int mb = x->stage; mb < x->sh.microbatches && !rc; mb += x->sh.stages) {
		double l = 0;
		const int32_t *tg = targets + (size_t)mb * x->ntok;
		float *z = a0 < L ? x->tmp : x->y[mb];  /* the head's input */
		if ((rc = xfer_recv(x, io, last, MSG_OUT, mb, x->y[mb])) ||
		    (a0 < L && (rc = model_layers_forward(x->m, a0, L, z, x->y[mb]))) ||
		    (rc = model_head_forward(x->m, &l, z, tg)) ||
		    (rc = model_head_backward(x->m, x->dy[mb], z, tg)) ||
		    (a0 < L && (rc = model_layers_backward(x->m, a0, L, x->dy[mb], x->y[mb]))))
			break;
		*loss += l;
		rc = xfer_send(x, io, last, MSG_DOUT, mb, x->dy[mb], x->dy[mb]);
	}
	return a0 < L ? outside_release(x, true, rc) : rc;
}

/* The owner's part after the backward pass: the layers before the
 * pipeline (their forward recomputed from the embedding, itself
 * recomputed into tmp; y[mb] is free and takes the output) and the
 * embedding's backward. */
static int embed_back_all(struct pipe_exec *x, const int32_t *inputs, const struct pipe_p2p *io)
{
	int rc = 0, nb, a0;
	outside(x, &nb, &a0);
	if (nb && (rc = outside_gather(x, 0, nb)))
		return outside_release(x, false, rc);
	for (int mb = x->stage; mb < x->sh.microbatches && !rc; mb += x->sh.stages) {
		const int32_t *in = inputs + (size_t)mb * x->ntok;
		if ((rc = xfer_recv(x, io, 0, MSG_DIN, mb, x->din[mb])))
			break;
		if (nb && ((rc = model_embed_forward(x->m, x->tmp, in)) ||
			   (rc = model_layers_forward(x->m, 0, nb, x->y[mb], x->tmp)) ||
			   (rc = model_layers_backward(x->m, 0, nb, x->din[mb], x->tmp))))
			break;
		rc = model_embed_backward(x->m, x->din[mb], in);
	}
	return nb ? outside_release(x, true, rc) : rc;
}

/* This stage's forward entries before its first non-GATHER one (the
 * gathers it starts first): run early, queued behind the non-layer
 * gather, so they arrive while the embedding runs. *n: how many ran. */
static int early_gathers(struct pipe_exec *x, int *n)
{
	int rc = 0;
	*n = 0;
	for (int i = 0; i < x->sch.n && !rc; i++) {
		const struct pipe_entry *e = &x->sch.e[i];
		if (e->stage != x->stage)
			continue;
		if (e->op != PIPE_GATHER || e->pass != PIPE_PASS_FWD)
			break;
		rc = run_weights(x, e);
		++*n;
	}
	return rc;
}

int pipe_exec_step(struct pipe_exec *x, const int32_t *inputs, const int32_t *targets,
		   struct model_step *st, const struct pipe_p2p *io)
{
	int rc, early = 0, seen = 0;
	if (x->poison) {
		for (size_t i = 0; i < x->mem_n; i++)
			x->mem[i] = NAN;
		win_poison(model_window(x->m));
	}
	x->ntimes = 0;
	for (int k = 0; k < x->sch.grad_slots; k++)
		x->gzero[k] = true;
	forget_sends(x);
	model_step_begin(x->m, st);
	/* the non-layer tensors stay gathered for the whole step */
	struct win *w = model_window(x->m);
	if (!(rc = win_gather_start(w, WSLOT_NONLAYER, WIN_NONLAYER, 0)) &&
	    !(rc = early_gathers(x, &early)) && !(rc = win_wait(w, WSLOT_NONLAYER))) {
		win_zero_grads(w, WSLOT_NONLAYER);
		rc = embed_all(x, inputs, io);
	}
	for (int pass = PIPE_PASS_FWD; pass <= PIPE_PASS_BWD && !rc; pass++) {
		if (pass == PIPE_PASS_BWD)
			rc = head_all(x, targets, io, &st->loss_sum);
		for (int i = 0; i < x->sch.n && !rc; i++) {
			const struct pipe_entry *e = &x->sch.e[i];
			if (e->stage != x->stage || (int)e->pass != pass || seen++ < early)
				continue;
			if (e->op == PIPE_GATHER || e->op == PIPE_RELEASE || e->op == PIPE_REDUCE_SCATTER)
				rc = run_weights(x, e);
			else
				rc = pass == PIPE_PASS_FWD ? run_fwd(x, e, io) : run_bwd(x, e, io);
		}
	}
	if (!rc)
		rc = embed_back_all(x, inputs, io);
	if (!rc && !(rc = win_scatter_start(w, WSLOT_NONLAYER)))
		rc = win_scatter_finish(w);
	if (!rc)
		win_release(w, WSLOT_NONLAYER);
	int frc = io->flush(io->ctx);
	x->gathers = win_gathers(w);
	int erc = model_step_end(x->m);
	return rc ? rc : frc ? frc : erc;
}
