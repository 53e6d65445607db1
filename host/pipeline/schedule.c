/* The circular pipeline schedule as a table (see schedule.h for the
 * contract). The builder walks the forward pass, then the backward pass
 * in reverse, and asks the weight mode what to gather and release around
 * each stage's slot; every number in the table comes from pipe_active. */
#include "host/pipeline/schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tables past this many slots (T x S) are a typo, not a pipeline. */
#define PIPE_MAX_SLOTS (1 << 22)

int pipe_shape_check(const struct pipe_shape *p, char *err, size_t errlen)
{
	const char *why = NULL;
	if (p->stages < 1 || p->stages > 4096)
		why = "stages must be in [1, 4096]";
	else if (p->delay != 1 && p->delay != 2)
		why = "delay must be 1 or 2";
	else if (p->microbatches < 1 || p->microbatches % p->stages)
		why = "microbatches must be a positive multiple of the stages";
	else if (p->delay == 2 && p->microbatches < 2 * p->stages)
		why = "a delay of 2 needs at least 2 x stages microbatches";
	else if (p->repeats < 1 || p->layers_per_stage < 1)
		why = "repeats and layers per stage must be >= 1";
	else if (p->wmode < 0 || p->wmode >= PIPE_W_COUNT)
		why = "unknown weight mode";
	else if ((long long)p->repeats * p->microbatches > PIPE_MAX_SLOTS ||
		 (long long)pipe_iterations(p) * p->stages > PIPE_MAX_SLOTS)
		why = "the table would be too large";
	if (!why)
		return 0;
	snprintf(err, errlen, "pipeline: S=%d M=%d R=%d Lps=%d d=%d: %s", p->stages,
		 p->microbatches, p->repeats, p->layers_per_stage, p->delay, why);
	return -EINVAL;
}

int pipe_iterations(const struct pipe_shape *p)
{
	return p->repeats * p->microbatches + p->delay * (p->stages - 1);
}

bool pipe_active(const struct pipe_shape *p, int i, int s, int *mb, int *repeat)
{
	int k = i - p->delay * s;
	if (k < 0 || k >= p->repeats * p->microbatches)
		return false;
	*mb = k % p->microbatches;
	*repeat = k / p->microbatches;
	return true;
}

int pipe_weight_slots(const struct pipe_shape *p)
{
	switch (p->wmode) {
	case PIPE_W_ONCE:
		return p->repeats;
	case PIPE_W_REPEAT:
		return p->repeats < 2 ? p->repeats : 2;
	default:
		return 1;
	}
}

int pipe_layer(const struct pipe_shape *p, int repeat, int stage, int j)
{
	return (repeat * p->stages + stage) * p->layers_per_stage + j;
}

/* ---- building ---- */

struct builder {
	struct pipe_schedule *s;
	const struct pipe_shape *p;
	int cap;
	int rc;
};

static struct pipe_entry entry(enum pipe_op op, enum pipe_pass pass, int iter, int stage)
{
	return (struct pipe_entry){
		.op = op, .pass = pass, .iter = iter, .stage = stage, .mb = -1,
		.repeat = -1, .slot = -1, .gslot = -1, .peer = -1, .peer_iter = -1,
	};
}

static void push(struct builder *b, struct pipe_entry e)
{
	struct pipe_schedule *s = b->s;
	if (b->rc)
		return;
	if (s->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 256;
		struct pipe_entry *ne = realloc(s->e, sizeof(*ne) * (size_t)cap);
		if (!ne) {
			b->rc = -ENOMEM;
			return;
		}
		s->e = ne;
		b->cap = cap;
	}
	s->e[s->n++] = e;
}

/* A weight entry: W[repeat, stage] (or dW) in slot. */
static void weight_op(struct builder *b, enum pipe_op op, enum pipe_pass pass, int i, int s,
		      int repeat, int slot)
{
	struct pipe_entry e = entry(op, pass, i, s);
	e.repeat = repeat;
	e.slot = slot;
	push(b, e);
}

/* The weight slot (and gradient buffer) repeat r uses. */
static int slot_of(const struct pipe_shape *p, int r)
{
	switch (p->wmode) {
	case PIPE_W_ONCE:
		return r;
	case PIPE_W_REPEAT:
		return r % 2;
	default:
		return 0;
	}
}

/* Weight entries of stage s before its forward slot at iteration i. */
static void weights_before_forward(struct builder *b, int i, int s, bool on, int m, int r)
{
	const struct pipe_shape *p = b->p;
	enum pipe_pass f = PIPE_PASS_FWD;
	if (p->wmode == PIPE_W_ITER && on)
		weight_op(b, PIPE_GATHER, f, i, s, r, 0);
	if (p->wmode == PIPE_W_ONCE && i == 0)
		for (int k = 0; k < p->repeats; k++)
			weight_op(b, PIPE_GATHER, f, i, s, k, k);
	if (p->wmode != PIPE_W_REPEAT)
		return;
	if (i == 0) {
		weight_op(b, PIPE_GATHER, f, i, s, 0, 0);
		if (p->repeats > 1)
			weight_op(b, PIPE_GATHER, f, i, s, 1, 1);
	}
	/* the switch to W[r,s]: W[r-1,s]'s slot takes W[r+1,s]; at the last
	 * switch nothing follows, and W[R-2,s] stays for the backward pass */
	if (on && m == 0 && r >= 1 && r + 1 < p->repeats) {
		weight_op(b, PIPE_RELEASE, f, i, s, r - 1, (r - 1) % 2);
		weight_op(b, PIPE_GATHER, f, i, s, r + 1, (r + 1) % 2);
	}
}

/* Weight entries of stage s after its backward slot at iteration i. */
static void weights_after_backward(struct builder *b, int i, int s, bool on, int m, int r)
{
	const struct pipe_shape *p = b->p;
	enum pipe_pass w = PIPE_PASS_BWD;
	if (p->wmode == PIPE_W_ITER && on) {
		weight_op(b, PIPE_REDUCE_SCATTER, w, i, s, r, 0);
		weight_op(b, PIPE_RELEASE, w, i, s, r, 0);
	}
	if (p->wmode == PIPE_W_ONCE && i == 0) {
		for (int k = 0; k < p->repeats; k++)
			weight_op(b, PIPE_REDUCE_SCATTER, w, i, s, k, k);
		for (int k = 0; k < p->repeats; k++)
			weight_op(b, PIPE_RELEASE, w, i, s, k, k);
	}
	/* microbatch 0 is the last slot of repeat r in reverse order */
	if (p->wmode == PIPE_W_REPEAT && on && m == 0) {
		weight_op(b, PIPE_REDUCE_SCATTER, w, i, s, r, r % 2);
		weight_op(b, PIPE_RELEASE, w, i, s, r, r % 2);
		if (r >= 2)
			weight_op(b, PIPE_GATHER, w, i, s, r - 2, r % 2);
	}
}

/* A transfer entry of microbatch m, repeat r. */
static void transfer(struct builder *b, enum pipe_op op, enum pipe_pass pass, int i, int s,
		     int m, int r, int peer, int peer_iter)
{
	struct pipe_entry e = entry(op, pass, i, s);
	e.mb = m;
	e.repeat = r;
	e.peer = peer;
	e.peer_iter = peer_iter;
	push(b, e);
}

static void forward_slot(struct builder *b, int i, int s)
{
	const struct pipe_shape *p = b->p;
	int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
	int hop = M - d * (S - 1); /* iterations from stage S-1 back to stage 0 */
	enum pipe_pass f = PIPE_PASS_FWD;
	int m = -1, r = -1;
	bool on = pipe_active(p, i, s, &m, &r);

	weights_before_forward(b, i, s, on, m, r);
	if (!on)
		return;
	if (s == 0 && r == 0)
		transfer(b, PIPE_TAKE_INPUT, f, i, s, m, r, -1, -1);
	else if (s == 0)
		transfer(b, PIPE_RECV, f, i, s, m, r, S - 1, i - hop);
	else
		transfer(b, PIPE_RECV, f, i, s, m, r, s - 1, i - d);

	struct pipe_entry e = entry(PIPE_FORWARD, f, i, s);
	e.mb = m;
	e.repeat = r;
	e.slot = slot_of(p, r);
	push(b, e);

	if (s == S - 1 && r == R - 1)
		transfer(b, PIPE_GIVE_OUTPUT, f, i, s, m, r, -1, -1);
	else if (s == S - 1)
		transfer(b, PIPE_SEND, f, i, s, m, r, 0, i + hop);
	else
		transfer(b, PIPE_SEND, f, i, s, m, r, s + 1, i + d);
	if (p->wmode == PIPE_W_ITER)
		weight_op(b, PIPE_RELEASE, f, i, s, r, 0);
}

static void backward_slot(struct builder *b, int i, int s)
{
	const struct pipe_shape *p = b->p;
	int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
	int hop = M - d * (S - 1);
	enum pipe_pass w = PIPE_PASS_BWD;
	int m = -1, r = -1;
	bool on = pipe_active(p, i, s, &m, &r);

	if (on) {
		if (p->wmode == PIPE_W_ITER)
			weight_op(b, PIPE_GATHER, w, i, s, r, 0);
		/* the gradient of the output comes from whoever took the output */
		if (s == S - 1 && r == R - 1)
			transfer(b, PIPE_TAKE_DOUT, w, i, s, m, r, -1, -1);
		else if (s == S - 1)
			transfer(b, PIPE_RECV_GRAD, w, i, s, m, r, 0, i + hop);
		else
			transfer(b, PIPE_RECV_GRAD, w, i, s, m, r, s + 1, i + d);

		struct pipe_entry e = entry(PIPE_BACKWARD, w, i, s);
		e.mb = m;
		e.repeat = r;
		e.slot = e.gslot = slot_of(p, r);
		push(b, e);

		if (s == 0 && r == 0)
			transfer(b, PIPE_GIVE_DIN, w, i, s, m, r, -1, -1);
		else if (s == 0)
			transfer(b, PIPE_SEND_GRAD, w, i, s, m, r, S - 1, i - hop);
		else
			transfer(b, PIPE_SEND_GRAD, w, i, s, m, r, s - 1, i - d);
	}
	weights_after_backward(b, i, s, on, m, r);
}

int pipe_schedule_circular(struct pipe_schedule *out, const struct pipe_shape *p,
			   char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	int rc = pipe_shape_check(p, err, errlen);
	if (rc)
		return rc;
	out->shape = *p;
	out->iterations = pipe_iterations(p);
	out->weight_slots = out->grad_slots = pipe_weight_slots(p);

	struct builder b = { .s = out, .p = p };
	int T = out->iterations;
	for (int i = 0; i < T && !b.rc; i++)
		for (int s = 0; s < p->stages; s++)
			forward_slot(&b, i, s);
	for (int i = T - 1; i >= 0 && !b.rc; i--)
		for (int s = 0; s < p->stages; s++)
			backward_slot(&b, i, s);
	if (b.rc) {
		pipe_schedule_release(out);
		snprintf(err, errlen, "pipeline: out of memory building the schedule");
		return b.rc;
	}
	return 0;
}

void pipe_schedule_release(struct pipe_schedule *s)
{
	free(s->e);
	s->e = NULL;
	s->n = 0;
}

/* ---- reading ---- */

/* Most of `count` live at once over iterations 0..T-1, given +1 at each
 * start and -1 after each end (diff has T + 1 cells). */
static int max_running(const int *diff, int T)
{
	int run = 0, best = 0;
	for (int t = 0; t < T; t++) {
		run += diff[t];
		if (run > best)
			best = run;
	}
	return best;
}

/* Per-stage counts of one stage, walked in table order. */
static void stage_stats(const struct pipe_schedule *sc, int s, struct pipe_stats *st)
{
	int live_w = 0, saved = 0, gathers = 0, rs = 0, active = 0;
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		if (e->stage != s)
			continue;
		switch (e->op) {
		case PIPE_GATHER:
			gathers++;
			if (++live_w > st->max_weights)
				st->max_weights = live_w;
			break;
		case PIPE_RELEASE:
			live_w--;
			break;
		case PIPE_REDUCE_SCATTER:
			rs++;
			break;
		case PIPE_FORWARD:
			active++;
			if (++saved > st->saved_inputs)
				st->saved_inputs = saved;
			break;
		case PIPE_BACKWARD:
			saved--;
			if (e->gslot + 1 > st->max_grads)
				st->max_grads = e->gslot + 1;
			break;
		default:
			break;
		}
	}
	if (gathers > st->gathers)
		st->gathers = gathers;
	if (rs > st->reduce_scatters)
		st->reduce_scatters = rs;
	if (active > st->active)
		st->active = active;
}

void pipe_schedule_stats(const struct pipe_schedule *sc, struct pipe_stats *st)
{
	const struct pipe_shape *p = &sc->shape;
	int T = sc->iterations, S = p->stages;
	memset(st, 0, sizeof(*st));
	for (int s = 0; s < S; s++)
		stage_stats(sc, s, st);

	/* circular hops: stage 0 holds an activation from the iteration after
	 * stage S-1 sent it through the one that uses it; stage S-1 holds a
	 * gradient from the reverse iteration after stage 0 sent it */
	int *fwd = calloc((size_t)T + 1, sizeof(int));
	int *bwd = calloc((size_t)T + 1, sizeof(int));
	if (!fwd || !bwd) {
		st->max_circ = st->max_circ_grad = -1;
		free(fwd);
		free(bwd);
		return;
	}
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		if (e->op == PIPE_RECV && e->stage == 0) {
			fwd[e->peer_iter + 1]++;
			fwd[e->iter + 1]--;
		} else if (e->op == PIPE_RECV_GRAD && e->stage == S - 1 && e->peer == 0) {
			/* reverse time: index T-1-i */
			bwd[T - e->peer_iter]++;
			bwd[T - e->iter]--;
		}
	}
	st->max_circ = max_running(fwd, T);
	st->max_circ_grad = max_running(bwd, T);
	free(fwd);
	free(bwd);
}

int pipe_owner(const struct pipe_shape *p, int mb)
{
	return mb % p->stages;
}

/* The lowest buffer free at pass time t among *n (one more if none). */
static int buf_take(int *free_at, int *n, int t)
{
	int b = 0;
	while (b < *n && free_at[b] > t)
		b++;
	if (b == *n)
		(*n)++;
	free_at[b] = INT_MAX;  /* busy until its send says when it frees */
	return b;
}

/* When a buffer sent at pass time t to stage `to` (taken there at pass
 * time taken) is free again; INT_MAX: not in this pass. */
static int buf_free_at(int s, int to, int t, int taken)
{
	if (to == s)
		return t + 1;  /* a copy */
	return taken < 0 ? INT_MAX : taken + 1;
}

int pipe_stage_bufs(const struct pipe_schedule *sc, int s, struct pipe_bufs *b, int *out_of,
		    int *grad_of)
{
	const struct pipe_shape *p = &sc->shape;
	int M = p->microbatches, RM = p->repeats * M, T = sc->iterations;
	int *fo = malloc(sizeof(int) * (size_t)RM), *fg = malloc(sizeof(int) * (size_t)RM);
	int ob = -1, gb = -1;  /* the buffer of the slot in progress */
	memset(b, 0, sizeof(*b));
	if (!fo || !fg) {
		free(fo);
		free(fg);
		return -ENOMEM;
	}
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		int slot = e->repeat * M + e->mb, rt = T - 1 - e->iter;
		if (e->stage != s)
			continue;
		switch (e->op) {
		case PIPE_FORWARD:
			b->saved++;
			ob = buf_take(fo, &b->out, e->iter);
			if (out_of)
				out_of[slot] = ob;
			break;
		case PIPE_SEND:
			fo[ob] = buf_free_at(s, e->peer, e->iter, e->peer_iter);
			break;
		case PIPE_GIVE_OUTPUT:
			fo[ob] = buf_free_at(s, pipe_owner(p, e->mb), e->iter, -1);
			break;
		case PIPE_TAKE_DOUT:
		case PIPE_RECV_GRAD:
			gb = buf_take(fg, &b->grad, rt);
			if (grad_of)
				grad_of[slot] = gb;
			break;
		case PIPE_SEND_GRAD:
			fg[gb] = buf_free_at(s, e->peer, rt, T - 1 - e->peer_iter);
			break;
		case PIPE_GIVE_DIN:
			fg[gb] = buf_free_at(s, pipe_owner(p, e->mb), rt, -1);
			break;
		default:
			break;
		}
	}
	b->owned = M / p->stages;
	b->scratch = 1;
	free(fo);
	free(fg);
	return 0;
}

int pipe_bufs_total(const struct pipe_bufs *b)
{
	return b->saved + b->out + b->grad + 4 * b->owned + b->scratch;
}

const char *pipe_op_name(enum pipe_op op)
{
	static const char *const names[PIPE_OP_COUNT] = {
		"take_input", "recv", "forward", "send", "give_output",
		"take_dout", "recv_grad", "backward", "send_grad", "give_din",
		"gather", "release", "reduce_scatter",
	};
	return op >= 0 && op < PIPE_OP_COUNT ? names[op] : "?";
}

const char *pipe_wmode_name(enum pipe_wmode m)
{
	static const char *const names[PIPE_W_COUNT] = {
		"per iteration", "pipeline_fsdp_ag_once", "pipeline_fsdp_ag_per_repeat",
	};
	return m >= 0 && m < PIPE_W_COUNT ? names[m] : "?";
}
