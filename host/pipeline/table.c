/* The lowering (see schedule.h): from the builders' compute orders
 * (orders.c) to the whole step's lists. In order:
 *  1. the counting pass if the shape needs one, then the builder's
 *     order, every input received right before the action that reads it
 *     and every output sent right after the one that makes it. The owners'
 *     actions (embedding, head and loss, embedding backward): in the
 *     phased schedules (circular, GPipe: MaxText's passes) a microbatch's
 *     owner is stage mb mod S, which embeds its microbatches first and
 *     sends them to chunk 0's stage; otherwise the stage of chunk 0
 *     embeds a microbatch right before its first forward and back-
 *     propagates the embedding right after its last backward, and the
 *     stage of the last chunk computes the loss right after its forward
 *     (Megatron's placement: a head between other microbatches'
 *     backwards would stall the pipeline);
 *  2. the phased schedules' heads and the expert-count sum after the
 *     stage's last forward, their embedding backwards at the end;
 *  3. the weights (weight mode);
 *  4. times at unit costs, buffers and activation sets from the values'
 *     lifetimes, and the validator (sim.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/pipeline/orders.h"
#include "host/pipeline/sim.h"
#include "host/pipeline/weights.h"

struct list {
	struct pipe_action *a;
	int n, cap;
};

static int push(struct list *l, struct pipe_action a)
{
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 64;
		struct pipe_action *na = realloc(l->a, sizeof(*na) * (size_t)cap);
		if (!na)
			return -ENOMEM;
		l->a = na;
		l->cap = cap;
	}
	l->a[l->n++] = a;
	return 0;
}

static struct pipe_action bare(int op)
{
	return (struct pipe_action){ .op = (uint8_t)op, .mb = -1, .chunk = -1, .peer = -1, .slot = -1,
				     .buf = { -1, -1, -1 }, .iter = -1 };
}

static struct pipe_action xfer(int op, int kind, int pass, int edge, int mb, int peer, int iter)
{
	struct pipe_action a = bare(op);
	a.val = (struct pipe_val){ .kind = (uint8_t)kind, .pass = (uint8_t)pass, .edge = (int16_t)edge,
				   .mb = mb };
	a.mb = mb;
	a.peer = (int16_t)peer;
	a.iter = iter;
	return a;
}

struct lower {
	const struct pipe_shape *p;
	int S, E;           /* stages, chunks */
	struct list *l;     /* [S] */
	int rc;
};

static void emit(struct lower *w, int s, struct pipe_action a)
{
	if (!w->rc)
		w->rc = push(&w->l[s], a);
}

/* The stage that makes the activation entering edge e of microbatch mb
 * (edge 0: the owner's embedding), and the one that reads it (edge E:
 * the owner's head). */
static int act_maker(const struct lower *w, int e, int mb)
{
	return e == 0 ? pipe_embed_stage(w->p, mb) : pipe_chunk_stage(w->p, e - 1);
}

static int act_reader(const struct lower *w, int e, int mb)
{
	return e == w->E ? pipe_head_stage(w->p, mb) : pipe_chunk_stage(w->p, e);
}

/* An owner action of microbatch mb (pass 1: the counting pass's
 * embedding). */
static struct pipe_action owner(int op, int mb, int pass)
{
	struct pipe_action a = bare(op);
	a.mb = mb;
	a.val.pass = (uint8_t)pass;
	return a;
}

/* A compute action of stage s with its receives before and sends after.
 * A backward's gradient from the owner's head (edge E) is received in
 * step 2, when the head is placed. */
static void emit_compute(struct lower *w, int s, struct pipe_action a)
{
	int c = a.chunk, m = a.mb, pass = a.op == PA_FC;
	bool inl = !pipe_phased(w->p);
	switch (a.op) {
	case PA_F:
	case PA_FC:
		if (inl && c == 0)  /* embedded right before its first chunk */
			emit(w, s, owner(PA_EMBED, m, pass));
		if (act_maker(w, c, m) != s)
			emit(w, s, xfer(PA_RECV, PV_ACT, pass, c, m, act_maker(w, c, m), a.iter));
		emit(w, s, a);
		if ((pass == 0 || c + 1 < w->E) && act_reader(w, c + 1, m) != s)
			emit(w, s, xfer(PA_SEND, PV_ACT, pass, c + 1, m, act_reader(w, c + 1, m), a.iter));
		if (inl && pass == 0 && c + 1 == w->E)  /* the loss right after */
			emit(w, s, owner(PA_HEAD, m, 0));
		break;
	case PA_B:
	case PA_I:
		if (c + 1 < w->E && pipe_chunk_stage(w->p, c + 1) != s)
			emit(w, s, xfer(PA_RECV, PV_GRAD, 0, c + 1, m, pipe_chunk_stage(w->p, c + 1), a.iter));
		emit(w, s, a);
		if (c == 0 && pipe_embed_stage(w->p, m) != s)
			emit(w, s, xfer(PA_SEND, PV_GRAD, 0, 0, m, pipe_embed_stage(w->p, m), a.iter));
		else if (c > 0 && pipe_chunk_stage(w->p, c - 1) != s)
			emit(w, s, xfer(PA_SEND, PV_GRAD, 0, c, m, pipe_chunk_stage(w->p, c - 1), a.iter));
		if (inl && c == 0)
			emit(w, s, owner(PA_EMBED_BACK, m, 0));
		break;
	default:
		emit(w, s, a);
	}
}

/* Step 1: the phased schedules' embeddings, the counting pass, the
 * builder's order (with the other schedules' owner actions inline). */
static int lower_main(struct lower *w, struct pipe_action *tmp)
{
	const struct pipe_shape *p = w->p;
	int S = w->S, s0 = pipe_chunk_stage(p, 0);
	bool count = pipe_needs_count_pass(p);
	for (int s = 0; s < S && !w->rc; s++) {
		for (int m = s; pipe_phased(p) && m < p->microbatches; m += S) {
			emit(w, s, owner(PA_EMBED, m, 0));
			if (s0 != s)
				emit(w, s, xfer(PA_SEND, PV_ACT, 0, 0, m, s0, -1));
		}
		if (count) {
			int n = pipe_order_count_pass(p, s, tmp);
			for (int k = 0; k < n; k++)
				emit_compute(w, s, tmp[k]);
			emit(w, s, bare(PA_COUNT_SUM));
		}
		int n = pipe_order(p, s, tmp);
		for (int k = 0; k < n; k++)
			emit_compute(w, s, tmp[k]);
	}
	return w->rc;
}

/* The owner's head of mb (with the pipeline's output received and its
 * gradient sent) or its embedding backward (the gradient received). */
static void emit_owner(struct lower *w, struct list *out, int s, int op, int mb)
{
	const struct pipe_shape *p = w->p;
	int last = pipe_chunk_stage(p, w->E - 1), first = pipe_chunk_stage(p, 0);
	struct pipe_action a = bare(op);
	a.mb = mb;
	if (op == PA_HEAD && last != s && !w->rc)
		w->rc = push(out, xfer(PA_RECV, PV_ACT, 0, w->E, mb, last, -1));
	if (op == PA_EMBED_BACK && first != s && !w->rc)
		w->rc = push(out, xfer(PA_RECV, PV_GRAD, 0, 0, mb, first, -1));
	if (!w->rc)
		w->rc = push(out, a);
	if (op == PA_HEAD && last != s && !w->rc)
		w->rc = push(out, xfer(PA_SEND, PV_GRAD, 0, w->E, mb, last, -1));
}

/* Copies list k of stage s into out, adding before each backward of the
 * last chunk the receive of its gradient from the owner's head. */
static void copy_action(struct lower *w, struct list *out, int s, const struct pipe_action *a)
{
	int c = a->chunk;
	if ((a->op == PA_B || a->op == PA_I) && c == w->E - 1 && pipe_head_stage(w->p, a->mb) != s && !w->rc)
		w->rc = push(out, xfer(PA_RECV, PV_GRAD, 0, w->E, a->mb, pipe_head_stage(w->p, a->mb), a->iter));
	if (!w->rc)
		w->rc = push(out, *a);
}

/* Step 2, MaxText's passes: after the stage's last forward (and its
 * send), the count sum and the heads of its microbatches; at the end
 * their embedding backwards. */
static int place_owners_phased(struct lower *w)
{
	const struct pipe_shape *p = w->p;
	for (int s = 0; s < w->S && !w->rc; s++) {
		struct list *in = &w->l[s], out = { 0 };
		int lastf = -1;
		for (int k = 0; k < in->n; k++)
			if (in->a[k].op == PA_F)
				lastf = k;
		while (lastf + 1 < in->n && in->a[lastf + 1].op == PA_SEND)
			lastf++;
		for (int k = 0; k < in->n; k++) {
			copy_action(w, &out, s, &in->a[k]);
			if (k != lastf)
				continue;
			if (p->moe && !w->rc)
				w->rc = push(&out, bare(PA_COUNT_SUM));
			for (int m = s; m < p->microbatches; m += w->S)
				emit_owner(w, &out, s, PA_HEAD, m);
		}
		for (int m = s; m < p->microbatches; m += w->S)
			emit_owner(w, &out, s, PA_EMBED_BACK, m);
		free(in->a);
		*in = out;
	}
	return w->rc;
}

/* Steps 1 and 2 into t's lists. */
static int lower(struct pipe_table *t)
{
	const struct pipe_shape *p = &t->shape;
	struct lower w = { .p = p, .S = p->stages, .E = pipe_nchunks(p) };
	int rc;
	struct pipe_action *tmp = malloc(sizeof(*tmp) * (size_t)pipe_order_max(p));
	w.l = calloc((size_t)w.S, sizeof(*w.l));
	if (!tmp || !w.l)
		rc = -ENOMEM;
	else if (!(rc = lower_main(&w, tmp)))
		rc = pipe_phased(p) ? place_owners_phased(&w) : 0;
	for (int s = 0; w.l && s < w.S; s++) {
		t->n[s] = w.l[s].n;
		t->a[s] = w.l[s].a;
	}
	free(tmp);
	free(w.l);
	return rc;
}

int pipe_table_build(struct pipe_table *t, const struct pipe_shape *p, char *err, size_t errlen)
{
	int S = p->stages, rc;
	memset(t, 0, sizeof(*t));
	if ((rc = pipe_shape_check(p, err, errlen)))
		return rc;
	t->shape = *p;
	t->nchunks = pipe_nchunks(p);
	t->count_pass = pipe_needs_count_pass(p);
	t->iterations = p->sched == PIPE_CIRCULAR ? pipe_iterations(p) : 0;
	t->weight_slots = pipe_weight_slots(p);
	t->weight_windows = pipe_weight_windows(p);
	t->n = calloc((size_t)S, sizeof(int));
	t->a = calloc((size_t)S, sizeof(*t->a));
	t->bufs = calloc((size_t)S, sizeof(int));
	t->scratch = calloc((size_t)S, sizeof(int));
	t->act_sets = calloc((size_t)S, sizeof(int));
	struct pipe_costs unit = pipe_costs_unit();
	if (!t->n || !t->a || !t->bufs || !t->scratch || !t->act_sets)
		rc = -ENOMEM;
	if (!rc && (rc = lower(t)) == 0 && (rc = pipe_lower_weights(t)) == 0 &&
	    (rc = pipe_sim_times(t, &unit, err, errlen)) == 0 && (rc = pipe_assign_buffers(t)) == 0)
		rc = pipe_table_simulate(t, &unit, true, err, errlen);
	if (rc == -ENOMEM)
		snprintf(err, errlen, "pipeline: out of memory building the schedule");
	if (rc)
		pipe_table_free(t);
	return rc;
}

void pipe_table_free(struct pipe_table *t)
{
	for (int s = 0; t->a && s < t->shape.stages; s++)
		free(t->a[s]);
	free(t->a);
	free(t->n);
	free(t->bufs);
	free(t->scratch);
	free(t->act_sets);
	memset(t, 0, sizeof(*t));
}
