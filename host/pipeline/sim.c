/* Simulating a table (see schedule.h, sim.h). Each stage runs its list in
 * order; an action starts when its stage is free and what it waits for
 * is there: a receive its send (plus the hop's cost), the expert-count
 * sum every stage, a write into a buffer the completion of the last send
 * from it (a send completes when its receive runs: the transport moves a
 * large message only into a posted buffer). The times are the longest
 * paths of that graph; a stage that can never go on is a deadlock.
 *
 * Values: the activation entering edge e of (pass, mb) or its gradient
 * (struct pipe_val). */
#include "host/pipeline/sim.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- values ---- */

static size_t nvals(const struct pipe_table *t)
{
	return 4 * (size_t)(t->nchunks + 1) * (size_t)t->shape.microbatches;
}

static int64_t vid(const struct pipe_table *t, int kind, int pass, int edge, int mb)
{
	return (((int64_t)pass * 2 + kind) * (t->nchunks + 1) + edge) * t->shape.microbatches + mb;
}

static int64_t vid_of(const struct pipe_table *t, const struct pipe_val *v)
{
	return vid(t, v->kind, v->pass, v->edge, v->mb);
}

/* The values action a of stage s reads (in buffer order: buf[0], buf[1])
 * and writes (w: the new value; inplace: written into the buffer of
 * reads[1]). Returns how many it reads. */
struct rw {
	int64_t r[2];
	int nr;
	int64_t w;      /* -1: none */
	int wbuf;       /* which buf[] the write goes to */
	bool inplace;
};

static void action_rw(const struct pipe_table *t, const struct pipe_action *a, struct rw *x)
{
	int c = a->chunk, m = a->mb, E = t->nchunks;
	memset(x, 0, sizeof(*x));
	x->w = -1;
	switch (a->op) {
	case PA_EMBED:
		x->w = vid(t, PV_ACT, a->val.pass, 0, m);
		break;
	case PA_F:
		x->r[x->nr++] = vid(t, PV_ACT, 0, c, m);
		x->w = vid(t, PV_ACT, 0, c + 1, m);
		x->wbuf = 1;
		break;
	case PA_FC:
		x->r[x->nr++] = vid(t, PV_ACT, 1, c, m);
		if (c + 1 < E) {
			x->w = vid(t, PV_ACT, 1, c + 1, m);
			x->wbuf = 1;
		}
		break;
	case PA_B:
	case PA_I:
	case PA_W:
		x->r[x->nr++] = vid(t, PV_ACT, 0, c, m);
		x->r[x->nr++] = vid(t, PV_GRAD, 0, c + 1, m);
		if (a->op != PA_W)
			x->w = vid(t, PV_GRAD, 0, c, m);
		x->wbuf = a->op == PA_B ? 1 : 2;
		x->inplace = a->op == PA_B;
		break;
	case PA_HEAD:
		x->r[x->nr++] = vid(t, PV_ACT, 0, E, m);
		x->w = vid(t, PV_GRAD, 0, E, m);
		x->wbuf = 1;
		break;
	case PA_EMBED_BACK:
		x->r[x->nr++] = vid(t, PV_GRAD, 0, 0, m);
		break;
	case PA_SEND:
		x->r[x->nr++] = vid_of(t, &a->val);
		break;
	case PA_RECV:
		x->w = vid_of(t, &a->val);
		break;
	default:
		break;
	}
}

static bool is_compute(int op)
{
	return op == PA_F || op == PA_FC || op == PA_B || op == PA_I || op == PA_W || op == PA_EMBED ||
	       op == PA_HEAD || op == PA_EMBED_BACK;
}

static double cost_of(const struct pipe_costs *c, int op)
{
	switch (op) {
	case PA_F:
	case PA_FC:
		return c->f;
	case PA_B:
		return c->b;
	case PA_I:
		return c->i;
	case PA_W:
		return c->w;
	case PA_EMBED:
		return c->embed;
	case PA_HEAD:
		return c->head;
	case PA_EMBED_BACK:
		return c->embed_back;
	case PA_SEND:
		return c->send;
	default:
		return 0;
	}
}

/* ---- the simulation ---- */

struct send_rec {
	int64_t key;      /* value id x S + receiving stage */
	int s, k;         /* where */
	bool issued, done, taken;
	double t, t_done;
};

struct sim {
	struct pipe_table *t;
	const struct pipe_costs *c;
	bool check;       /* the buffers too, and every send received */
	int S;
	struct send_rec *send;
	int nsend;
	int *ptr;         /* [S] next action */
	double *clock;    /* [S] */
	bool *arrived;    /* [S] at COUNT_SUM */
	double sum_at;    /* when the last stage arrived */
	int narrived;
	int **pend;       /* check: [S][bufs] the last send from the buffer, or -1 */
	int64_t **held;   /* check: [S][bufs] the value in the buffer, or -1 */
	int **reads_left; /* check: [S][values] reads of the value still to come */
	char *err;
	size_t errlen;
};

static int cmp_send(const void *a, const void *b)
{
	const struct send_rec *x = a, *y = b;
	return x->key < y->key ? -1 : x->key > y->key;
}

static int fail(struct sim *m, int s, int k, const char *fmt, const char *what)
{
	char txt[96];
	pipe_action_text(&m->t->a[s][k], txt, sizeof(txt));
	snprintf(m->err, m->errlen, "pipeline: stage %d action %d (%s): %s%s", s, k, txt, fmt, what ? what : "");
	return -EINVAL;
}

static int index_sends(struct sim *m)
{
	struct pipe_table *t = m->t;
	int n = 0;
	for (int s = 0; s < m->S; s++)
		for (int k = 0; k < t->n[s]; k++)
			n += t->a[s][k].op == PA_SEND;
	m->send = calloc((size_t)(n ? n : 1), sizeof(*m->send));
	if (!m->send)
		return -ENOMEM;
	for (int s = 0; s < m->S; s++)
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			if (a->op != PA_SEND)
				continue;
			if (a->peer < 0 || a->peer >= m->S || a->peer == s)
				return fail(m, s, k, "sends to no other stage", NULL);
			m->send[m->nsend++] = (struct send_rec){ .key = vid_of(t, &a->val) * m->S + a->peer,
								 .s = s, .k = k };
		}
	qsort(m->send, (size_t)m->nsend, sizeof(*m->send), cmp_send);
	for (int i = 1; i < m->nsend; i++)
		if (m->send[i].key == m->send[i - 1].key)
			return fail(m, m->send[i].s, m->send[i].k, "is sent twice", NULL);
	return 0;
}

static struct send_rec *find_send(struct sim *m, int64_t key);

/* check: every receive has its send, from the stage it names, and every
 * send its receive (before running: an untaken send would otherwise show
 * as a deadlock of whatever waits for its buffer). */
static int match_sends(struct sim *m)
{
	struct pipe_table *t = m->t;
	for (int s = 0; s < m->S; s++)
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			if (a->op != PA_RECV)
				continue;
			struct send_rec *r = find_send(m, vid_of(t, &a->val) * m->S + s);
			if (!r || r->s != a->peer)
				return fail(m, s, k, a->peer >= 0 && a->peer < m->S ? "no stage sends it"
									      : "receives from no stage", NULL);
			if (r->taken)
				return fail(m, s, k, "is received twice", NULL);
			r->taken = true;
		}
	for (int i = 0; i < m->nsend; i++) {
		if (!m->send[i].taken)
			return fail(m, m->send[i].s, m->send[i].k, "no stage receives it", NULL);
		m->send[i].taken = false;
	}
	return 0;
}

static struct send_rec *find_send(struct sim *m, int64_t key)
{
	int lo = 0, hi = m->nsend - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (m->send[mid].key == key)
			return &m->send[mid];
		if (m->send[mid].key < key)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/* The send of action k of stage s (a send), or the one it receives. */
static struct send_rec *send_at(struct sim *m, int s, int k)
{
	const struct pipe_action *a = &m->t->a[s][k];
	return find_send(m, vid_of(m->t, &a->val) * m->S + (a->op == PA_SEND ? a->peer : s));
}

/* check: the reads of action k find their values. */
static int check_reads(struct sim *m, int s, int k, const struct rw *x)
{
	const struct pipe_action *a = &m->t->a[s][k];
	for (int i = 0; i < x->nr; i++) {
		int b = a->buf[i];
		if (b < 0 || b >= m->t->bufs[s])
			return fail(m, s, k, "reads no buffer", NULL);
		if (m->held[s][b] != x->r[i])
			return fail(m, s, k, "its input is not in its buffer (not made here, not received, or "
				    "overwritten)", NULL);
		m->reads_left[s][x->r[i]]--;
	}
	return 0;
}

/* check: action k writes x->w into its buffer, which must hold nothing
 * still read. */
static int check_write(struct sim *m, int s, int k, const struct rw *x)
{
	const struct pipe_action *a = &m->t->a[s][k];
	int b = a->buf[x->wbuf];
	if (x->w < 0)
		return 0;
	if (b < 0 || b >= m->t->bufs[s])
		return fail(m, s, k, "writes no buffer", NULL);
	int64_t old = m->held[s][b];
	if (!x->inplace && old >= 0 && m->reads_left[s][old] > 0)
		return fail(m, s, k, "overwrites a value still to be read", NULL);
	m->held[s][b] = x->w;
	return 0;
}

/* The time the buffer action k writes is free (its last send taken), or
 * -1 when that send has not been received yet. */
static double write_ready(struct sim *m, int s, int k, const struct rw *x)
{
	const struct pipe_action *a = &m->t->a[s][k];
	if (!m->check || x->w < 0 || x->inplace)
		return 0;
	int b = a->buf[x->wbuf];
	if (b < 0 || b >= m->t->bufs[s] || m->pend[s][b] < 0)
		return 0;
	const struct send_rec *r = &m->send[m->pend[s][b]];
	return r->done ? r->t_done : -1;
}

/* Runs action k of stage s if it can start; 1 if it ran, 0 if it waits,
 * or a negative error. */
static int step(struct sim *m, int s, int k)
{
	struct pipe_action *a = &m->t->a[s][k];
	struct rw x;
	double t0 = m->clock[s];
	int rc;
	action_rw(m->t, a, &x);
	double wr = write_ready(m, s, k, &x);
	if (wr < 0)
		return 0;
	t0 = wr > t0 ? wr : t0;
	if (a->op == PA_RECV) {
		struct send_rec *r = send_at(m, s, k);
		if (!r || m->t->a[r->s][r->k].peer != s || r->s != a->peer) {
			if (a->peer < 0 || a->peer >= m->S)
				return fail(m, s, k, "receives from no stage", NULL);
			return fail(m, s, k, "no stage sends it", NULL);
		}
		if (!r->issued)
			return 0;
		double ta = r->t + m->c->hop;
		t0 = ta > t0 ? ta : t0;
		r->done = true;
		r->t_done = t0;
		r->taken = true;
	} else if (a->op == PA_COUNT_SUM) {
		if (!m->arrived[s]) {
			m->arrived[s] = true;
			m->narrived++;
			m->sum_at = t0 > m->sum_at ? t0 : m->sum_at;
		}
		if (m->narrived < m->S)
			return 0;
		t0 = m->sum_at;
	}
	if (m->check && ((rc = check_reads(m, s, k, &x)) || (rc = check_write(m, s, k, &x))))
		return rc;
	if (a->op == PA_SEND) {
		struct send_rec *r = send_at(m, s, k);
		r->issued = true;
		r->t = t0;
		if (m->check)
			m->pend[s][a->buf[0]] = (int)(r - m->send);
	}
	a->t0 = t0;
	a->t1 = t0 + cost_of(m->c, a->op);
	m->clock[s] = a->t1;
	return 1;
}

static int deadlock(struct sim *m)
{
	char txt[96];
	size_t at = (size_t)snprintf(m->err, m->errlen, "pipeline: the lists deadlock:");
	for (int s = 0; s < m->S && at < m->errlen; s++) {
		if (m->ptr[s] >= m->t->n[s])
			continue;
		pipe_action_text(&m->t->a[s][m->ptr[s]], txt, sizeof(txt));
		at += (size_t)snprintf(m->err + at, m->errlen - at, " stage %d waits at action %d (%s);", s,
				       m->ptr[s], txt);
	}
	if (at > 0 && at < m->errlen && m->err[at - 1] == ';')
		m->err[at - 1] = 0;
	return -EINVAL;
}

static int run(struct sim *m)
{
	bool progress = true;
	int rc;
	while (progress) {
		progress = false;
		for (int s = 0; s < m->S; s++)
			while (m->ptr[s] < m->t->n[s]) {
				if ((rc = step(m, s, m->ptr[s])) < 0)
					return rc;
				if (!rc)
					break;
				m->ptr[s]++;
				progress = true;
			}
	}
	for (int s = 0; s < m->S; s++)
		if (m->ptr[s] < m->t->n[s])
			return deadlock(m);
	for (int i = 0; m->check && i < m->nsend; i++)
		if (!m->send[i].taken)
			return fail(m, m->send[i].s, m->send[i].k, "no stage receives it", NULL);
	return 0;
}

static void finish_times(struct sim *m)
{
	struct pipe_table *t = m->t;
	double first = -1, last = 0, period = 0;
	for (int s = 0; s < m->S; s++) {
		double f = -1, l = 0;
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			if (!is_compute(a->op))
				continue;
			if (f < 0)
				f = a->t0;
			l = a->t1;
		}
		if (f < 0)
			continue;
		first = first < 0 || f < first ? f : first;
		last = l > last ? l : last;
		period = l - f > period ? l - f : period;
	}
	t->makespan = first < 0 ? 0 : last - first;
	t->period = period;
	t->costs = *m->c;
}

static void sim_free(struct sim *m)
{
	for (int s = 0; s < m->S; s++) {
		if (m->pend)
			free(m->pend[s]);
		if (m->held)
			free(m->held[s]);
		if (m->reads_left)
			free(m->reads_left[s]);
	}
	free(m->pend);
	free(m->held);
	free(m->reads_left);
	free(m->send);
	free(m->ptr);
	free(m->clock);
	free(m->arrived);
}

/* check: per stage, the last send from each buffer, what each buffer
 * holds, and how often each value is still read. */
static int check_state(struct sim *m)
{
	struct pipe_table *t = m->t;
	size_t nv = nvals(t);
	m->pend = calloc((size_t)m->S, sizeof(*m->pend));
	m->held = calloc((size_t)m->S, sizeof(*m->held));
	m->reads_left = calloc((size_t)m->S, sizeof(*m->reads_left));
	if (!m->pend || !m->held || !m->reads_left)
		return -ENOMEM;
	for (int s = 0; s < m->S; s++) {
		int nb = t->bufs[s] > 0 ? t->bufs[s] : 1;
		m->pend[s] = malloc(sizeof(int) * (size_t)nb);
		m->held[s] = malloc(sizeof(int64_t) * (size_t)nb);
		m->reads_left[s] = calloc(nv, sizeof(int));
		if (!m->pend[s] || !m->held[s] || !m->reads_left[s])
			return -ENOMEM;
		for (int b = 0; b < nb; b++) {
			m->pend[s][b] = -1;
			m->held[s][b] = -1;
		}
		for (int k = 0; k < t->n[s]; k++) {
			struct rw x;
			action_rw(t, &t->a[s][k], &x);
			for (int i = 0; i < x.nr; i++)
				m->reads_left[s][x.r[i]]++;
		}
	}
	return 0;
}

static int simulate(struct pipe_table *t, const struct pipe_costs *c, bool check, char *err, size_t errlen)
{
	struct sim m = { .t = t, .c = c, .check = check, .S = t->shape.stages, .err = err, .errlen = errlen };
	int rc;
	m.ptr = calloc((size_t)m.S, sizeof(int));
	m.clock = calloc((size_t)m.S, sizeof(double));
	m.arrived = calloc((size_t)m.S, sizeof(bool));
	if (!m.ptr || !m.clock || !m.arrived)
		rc = -ENOMEM;
	else if (!(rc = index_sends(&m)) && (!check || (!(rc = match_sends(&m)) && !(rc = check_state(&m)))))
		rc = run(&m);
	if (!rc)
		finish_times(&m);
	sim_free(&m);
	if (rc == -ENOMEM)
		snprintf(err, errlen, "pipeline: out of memory simulating the schedule");
	return rc;
}

int pipe_sim_times(struct pipe_table *t, const struct pipe_costs *c, char *err, size_t errlen)
{
	return simulate(t, c, false, err, errlen);
}

/* ---- the lists' structure ---- */

struct seen {
	int8_t f, b, i, w, fc;
};

/* The validator's static checks of stage s: each compute on its chunk's
 * stage; each (mb, chunk) forwarded once and back-propagated once (B, or
 * I then W); the counting pass before the count sum, every backward
 * after it; the weights: a compute reads a gathered slot, a slot is
 * gathered when free, released when held, and its gradients leave before
 * it is released. */
static int check_stage_walk(struct sim *m, int s, struct seen *sn, int *held, int *grads, int *sums_out,
			    int *nl_out, int *out_out);

static int check_stage(struct sim *m, int s, struct seen *sn)
{
	struct pipe_table *t = m->t;
	const struct pipe_shape *p = &t->shape;
	int sums = 0, W = t->weight_slots, rc = 0;
	int out_held = 0, nl_held = 0;
	int *held = malloc(sizeof(int) * (size_t)W), *grads = calloc((size_t)W, sizeof(int));
	if (!held || !grads) {
		free(held);
		free(grads);
		return -ENOMEM;
	}
	for (int i = 0; i < W; i++)
		held[i] = -1;
	rc = check_stage_walk(m, s, sn, held, grads, &sums, &nl_held, &out_held);
	for (int i = 0; !rc && i < W; i++)
		if (held[i] >= 0)
			rc = fail(m, s, t->n[s] - 1, "the step ends with weights still gathered", NULL);
	if (!rc && (nl_held || out_held))
		rc = fail(m, s, t->n[s] - 1, "the step ends with weights still gathered", NULL);
	if (!rc && p->moe && sums != 1)
		rc = fail(m, s, t->n[s] ? t->n[s] - 1 : 0, "the stage does not sum the expert counts once", NULL);
	free(held);
	free(grads);
	return rc;
}

static int check_stage_walk(struct sim *m, int s, struct seen *sn, int *held, int *grads, int *sums_out,
			    int *nl_out, int *out_out)
{
	struct pipe_table *t = m->t;
	const struct pipe_shape *p = &t->shape;
	int M = p->microbatches, E = t->nchunks, sums = 0, W = t->weight_slots;
	int out_held = 0, nl_held = 0;
	for (int k = 0; k < t->n[s]; k++) {
		const struct pipe_action *a = &t->a[s][k];
		int c = a->chunk, mb = a->mb;
		bool chunk_op = a->op == PA_F || a->op == PA_FC || a->op == PA_B || a->op == PA_I || a->op == PA_W;
		if (a->op >= PA_COUNT)
			return fail(m, s, k, "is no action", NULL);
		if (chunk_op || a->op == PA_EMBED || a->op == PA_HEAD || a->op == PA_EMBED_BACK)
			if (mb < 0 || mb >= M)
				return fail(m, s, k, "names no microbatch of the step", NULL);
		if (chunk_op) {
			if (c < 0 || c >= E || pipe_chunk_stage(p, c) != s)
				return fail(m, s, k, "runs a chunk this stage does not hold", NULL);
			struct seen *x = &sn[(size_t)mb * E + c];
			if (a->slot < 0 || a->slot >= W || held[a->slot] != c)
				return fail(m, s, k, "its chunk's weights are not gathered in its slot", NULL);
			switch (a->op) {
			case PA_F:
				if (x->f++)
					return fail(m, s, k, "runs twice", NULL);
				if (p->moe && !t->count_pass && sums)
					return fail(m, s, k, "counts experts after the count sum", NULL);
				break;
			case PA_FC:
				if (x->fc++ || sums)
					return fail(m, s, k, sums ? "counts after the count sum" : "runs twice", NULL);
				break;
			case PA_B:
			case PA_I:
				if (!x->f || (a->op == PA_B ? x->b++ || x->i : x->i++ || x->b))
					return fail(m, s, k, x->f ? "runs twice" : "comes before its F", NULL);
				if (p->moe && !sums)
					return fail(m, s, k, "comes before the count sum", NULL);
				grads[a->slot] |= a->op == PA_B;
				break;
			case PA_W:
				if (!x->i || x->w++)
					return fail(m, s, k, x->i ? "runs twice" : "comes before its I", NULL);
				grads[a->slot] = 1;
				break;
			}
		}
		switch (a->op) {
		case PA_COUNT_SUM:
			sums++;
			break;
		case PA_EMBED_BACK:
			if (p->moe && !sums)
				return fail(m, s, k, "comes before the count sum", NULL);
			/* fall through */
		case PA_EMBED:
		case PA_HEAD:
			if (!nl_held)
				return fail(m, s, k, "the non-layer weights are not gathered", NULL);
			if ((a->op == PA_HEAD ? pipe_head_stage(p, mb) : pipe_embed_stage(p, mb)) != s)
				return fail(m, s, k, "runs a microbatch another stage owns", NULL);
			if (p->outside != PIPE_OUT_NONE && !out_held &&
			    (p->outside == PIPE_OUT_AFTER) == (a->op == PA_HEAD))
				return fail(m, s, k, "the layers outside the pipeline are not gathered", NULL);
			break;
		case PA_GATHER:
		case PA_RELEASE:
		case PA_REDUCE_SCATTER: {
			int *h = c == PIPE_G_NONLAYER ? &nl_held : c == PIPE_G_OUTSIDE ? &out_held : NULL;
			if (h) {
				if ((a->op == PA_GATHER) == (*h != 0))
					return fail(m, s, k, a->op == PA_GATHER ? "gathers it twice" : "it is not gathered",
						    NULL);
				if (a->op != PA_REDUCE_SCATTER)
					*h = a->op == PA_GATHER;
				break;
			}
			if (a->slot < 0 || a->slot >= t->weight_slots || c < 0 || c >= E)
				return fail(m, s, k, "names no slot or chunk of the table", NULL);
			if (a->op == PA_GATHER) {
				if (held[a->slot] >= 0)
					return fail(m, s, k, "gathers into a slot in use", NULL);
				held[a->slot] = c;
				grads[a->slot] = 0;
			} else if (held[a->slot] != c) {
				return fail(m, s, k, "its slot does not hold that chunk", NULL);
			} else if (a->op == PA_REDUCE_SCATTER) {
				grads[a->slot] = 0;
			} else {
				if (grads[a->slot])
					return fail(m, s, k, "releases gradients not reduce-scattered", NULL);
				held[a->slot] = -1;
			}
			break;
		}
		default:
			break;
		}
	}
	*sums_out = sums;
	*nl_out = nl_held;
	*out_out = out_held;
	return 0;
}

/* Every (mb, chunk) forwarded and back-propagated (and counted). */
static int check_complete(struct sim *m, const struct seen *sn)
{
	const struct pipe_table *t = m->t;
	for (int mb = 0; mb < t->shape.microbatches; mb++)
		for (int c = 0; c < t->nchunks; c++) {
			const struct seen *x = &sn[(size_t)mb * t->nchunks + c];
			const char *why = !x->f ? "no forward" : !(x->b || (x->i && x->w)) ? "no backward" :
					  t->count_pass && !x->fc ? "no counting forward" : NULL;
			if (why) {
				snprintf(m->err, m->errlen, "pipeline: microbatch %d of chunk %d has %s (stage %d)", mb,
					 c, why, pipe_chunk_stage(&t->shape, c));
				return -EINVAL;
			}
		}
	return 0;
}

/* Buffers "live exactly as long as needed": no more of them than values
 * live at once (a value lives from its write until its last reader on
 * the stage ran and every send of it was taken). */
static int check_buffer_count(struct pipe_table *t, char *err, size_t errlen);
struct life;

int pipe_table_simulate(struct pipe_table *t, const struct pipe_costs *c, bool check, char *err, size_t errlen)
{
	if (check) {
		struct sim m = { .t = t, .S = t->shape.stages, .err = err, .errlen = errlen };
		struct seen *sn = calloc((size_t)t->shape.microbatches * (size_t)t->nchunks, sizeof(*sn));
		int rc = sn ? 0 : -ENOMEM;
		for (int s = 0; s < m.S && !rc; s++)
			rc = check_stage(&m, s, sn);
		if (!rc)
			rc = check_complete(&m, sn);
		free(sn);
		if (rc == -ENOMEM)
			snprintf(err, errlen, "pipeline: out of memory checking the schedule");
		if (rc)
			return rc;
	}
	int rc = simulate(t, c, check, err, errlen);
	if (!rc && check)
		rc = check_buffer_count(t, err, errlen);
	return rc;
}

/* ---- buffers ---- */

/* Per stage: each value's last read position, the time its sends from
 * the stage were all taken (from the times), and the buffers. */
struct life {
	int *last;        /* [values] last read position, -1 */
	double *sent;     /* [values] */
	int64_t *val;     /* [cap] value held, -1 free */
	int *vbuf;        /* [values] buffer of a held value */
	int nbuf, cap;
};

static int life_init(struct life *l, const struct pipe_table *t, int s, const struct sim *m)
{
	size_t nv = nvals(t);
	l->last = malloc(sizeof(int) * nv);
	l->sent = calloc(nv, sizeof(double));
	l->vbuf = malloc(sizeof(int) * nv);
	l->cap = 16;
	l->val = malloc(sizeof(int64_t) * (size_t)l->cap);
	if (!l->last || !l->sent || !l->vbuf || !l->val)
		return -ENOMEM;
	for (size_t i = 0; i < nv; i++)
		l->last[i] = l->vbuf[i] = -1;
	for (int k = 0; k < t->n[s]; k++) {
		struct rw x;
		const struct pipe_action *a = &t->a[s][k];
		action_rw(t, a, &x);
		for (int i = 0; i < x.nr; i++)
			l->last[x.r[i]] = k;
		if (a->op == PA_SEND) {
			const struct send_rec *r = find_send((struct sim *)m, vid_of(t, &a->val) * m->S + a->peer);
			double done = r && r->done ? r->t_done : 1e300;
			if (done > l->sent[x.r[0]])
				l->sent[x.r[0]] = done;
		}
	}
	return 0;
}

static void life_free(struct life *l)
{
	free(l->last);
	free(l->sent);
	free(l->vbuf);
	free(l->val);
}

/* Whether the value held in buffer b is dead before action k (at t0):
 * its last reader ran before k, and its sends were taken strictly before
 * t0 (so a write never waits for a receive that waits for this stage,
 * which would be a cycle the lists without buffers do not have). */
static bool dead(const struct life *l, int b, int k, double t0)
{
	int64_t v = l->val[b];
	return v < 0 || (l->last[v] < k && l->sent[v] < t0);
}

static int take_buf(struct life *l, int k, double t0, int64_t v)
{
	int b = 0;
	while (b < l->nbuf && !dead(l, b, k, t0))
		b++;
	if (b == l->nbuf) {
		if (l->nbuf == l->cap) {
			int64_t *nv = realloc(l->val, sizeof(int64_t) * (size_t)(2 * l->cap));
			if (!nv)
				return -ENOMEM;
			l->val = nv;
			l->cap *= 2;
		}
		l->val[l->nbuf++] = -1;
	}
	if (l->val[b] >= 0 && l->vbuf[l->val[b]] == b)
		l->vbuf[l->val[b]] = -1;
	l->val[b] = v;
	l->vbuf[v] = b;
	return b;
}

static int assign_stage(struct pipe_table *t, int s, const struct sim *m)
{
	struct life l = { 0 };
	int rc = life_init(&l, t, s, m);
	for (int k = 0; k < t->n[s] && !rc; k++) {
		struct pipe_action *a = &t->a[s][k];
		struct rw x;
		action_rw(t, a, &x);
		for (int i = 0; i < x.nr; i++)
			a->buf[i] = l.vbuf[x.r[i]];
		if (x.w < 0)
			continue;
		if (x.inplace) {
			int b = a->buf[1];
			l.vbuf[x.r[1]] = -1;
			l.val[b] = x.w;
			l.vbuf[x.w] = b;
			continue;
		}
		int b = take_buf(&l, k, a->t0, x.w);
		if (b < 0)
			rc = b;
		a->buf[x.wbuf] = b;
	}
	t->bufs[s] = l.nbuf;
	life_free(&l);
	return rc;
}

/* Activation sets: with recompute (or on one device, where every layer
 * has its own storage) set 0; else each (mb, chunk) one from its F to
 * its B (or W), the lowest free, above set 0 when set 0 is needed for
 * the owners' layers and the counting pass. */
static int assign_sets(struct pipe_table *t, int s)
{
	const struct pipe_shape *p = &t->shape;
	bool shared = p->recompute || p->one_device;
	int base = shared ? 0 : (p->outside != PIPE_OUT_NONE || t->count_pass), peak = 0;
	int E = t->nchunks, cap = p->microbatches * E + 1;
	int *live = malloc(sizeof(int) * (size_t)cap);
	if (!live)
		return -ENOMEM;
	for (int i = 0; i < cap; i++)
		live[i] = -1;
	for (int k = 0; k < t->n[s]; k++) {
		struct pipe_action *a = &t->a[s][k];
		int key = a->mb * E + a->chunk;
		a->aset = 0;
		if (shared || (a->op != PA_F && a->op != PA_B && a->op != PA_I && a->op != PA_W))
			continue;
		int j = 0;
		if (a->op == PA_F) {
			while (j < cap - 1 && live[j] >= 0)
				j++;
			live[j] = key;
			peak = j + 1 > peak ? j + 1 : peak;
		} else {
			while (j < cap - 1 && live[j] != key)
				j++;
			if (a->op == PA_B || a->op == PA_W)
				live[j] = -1;
		}
		a->aset = (int16_t)(base + j);
	}
	t->act_sets[s] = base + peak > 0 ? base + peak : 1;
	free(live);
	return 0;
}

/* Stashes of the split backward: each (mb, chunk) one from its I to its
 * W, the lowest free; the peak is the stage's w_stashes. */
static int assign_wsets(struct pipe_table *t, int s)
{
	int E = t->nchunks, cap = t->shape.microbatches * E + 1, peak = 0;
	int *live = malloc(sizeof(int) * (size_t)cap);
	if (!live)
		return -ENOMEM;
	for (int i = 0; i < cap; i++)
		live[i] = -1;
	for (int k = 0; k < t->n[s]; k++) {
		struct pipe_action *a = &t->a[s][k];
		int key = a->mb * E + a->chunk, j = 0;
		a->wset = 0;
		if (a->op != PA_I && a->op != PA_W)
			continue;
		while (j < cap - 1 && live[j] != (a->op == PA_I ? -1 : key))
			j++;
		live[j] = a->op == PA_I ? key : -1;
		peak = a->op == PA_I && j + 1 > peak ? j + 1 : peak;
		a->wset = (int16_t)j;
	}
	t->w_stashes[s] = peak;
	free(live);
	return 0;
}

/* Scratch: the recomputed forward's output; the owners' layers' input
 * or output; the counting pass's last output. */
static void assign_scratch(struct pipe_table *t, int s)
{
	const struct pipe_shape *p = &t->shape;
	int need = 0;
	for (int k = 0; k < t->n[s]; k++) {
		const struct pipe_action *a = &t->a[s][k];
		if ((p->recompute && (a->op == PA_B || a->op == PA_I)) ||
		    (p->outside == PIPE_OUT_BEFORE && a->op == PA_EMBED) ||
		    (p->outside == PIPE_OUT_AFTER && a->op == PA_HEAD) ||
		    (a->op == PA_FC && a->chunk == t->nchunks - 1))
			need = need > 1 ? need : 1;
		if (p->outside == PIPE_OUT_BEFORE && a->op == PA_EMBED_BACK)
			need = 2;
	}
	t->scratch[s] = need;
}

int pipe_assign_buffers(struct pipe_table *t)
{
	struct sim m = { .t = t, .S = t->shape.stages };
	char err[8];
	int rc = 0;
	/* when each send is taken, from the times the table has */
	struct pipe_costs c = t->costs;
	m.c = &c;
	m.err = err;
	m.errlen = sizeof(err);
	m.ptr = calloc((size_t)m.S, sizeof(int));
	m.clock = calloc((size_t)m.S, sizeof(double));
	m.arrived = calloc((size_t)m.S, sizeof(bool));
	if (!m.ptr || !m.clock || !m.arrived)
		rc = -ENOMEM;
	else if (!(rc = index_sends(&m)))
		rc = run(&m);
	for (int s = 0; s < m.S && !rc; s++) {
		if (!(rc = assign_stage(t, s, &m)) && !(rc = assign_sets(t, s)))
			rc = assign_wsets(t, s);
		assign_scratch(t, s);
	}
	sim_free(&m);
	return rc;
}

/* The first action of stage s starting after time x (t->n[s]: none). */
static int after_time(const struct pipe_table *t, int s, double x)
{
	int lo = 0, hi = t->n[s];
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (t->a[s][mid].t0 > x)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* The most values stage s holds at once: each from its write until it
 * is dead (the rule of take_buf), a value written in place continuing
 * the one it replaced. */
static int peak_live(const struct pipe_table *t, int s, const struct life *l, int *diff, int *effd)
{
	int n = t->n[s], peak = 0, run = 0;
	size_t nv = nvals(t);
	for (size_t v = 0; v < nv; v++)
		effd[v] = -1;
	memset(diff, 0, sizeof(int) * (size_t)(n + 2));
	for (int k = n - 1; k >= 0; k--) {
		struct rw x;
		action_rw(t, &t->a[s][k], &x);
		if (x.w < 0)
			continue;
		int d = l->last[x.w] + 1, ts = l->sent[x.w] > 0 ? after_time(t, s, l->sent[x.w]) : 0;
		d = d > ts ? d : ts;
		d = d > k + 1 ? d : k + 1;
		d = d > effd[x.w] ? d : effd[x.w];
		if (x.inplace) {
			effd[x.r[1]] = d;
			continue;
		}
		diff[k]++;
		diff[d < n + 1 ? d : n + 1]--;
	}
	for (int k = 0; k <= n; k++) {
		run += diff[k];
		peak = run > peak ? run : peak;
	}
	return peak;
}

static int check_buffer_count(struct pipe_table *t, char *err, size_t errlen)
{
	struct sim m = { .t = t, .S = t->shape.stages, .c = &t->costs, .err = err, .errlen = errlen };
	int rc = 0, nmax = 0;
	for (int s = 0; s < m.S; s++)
		nmax = t->n[s] > nmax ? t->n[s] : nmax;
	int *diff = malloc(sizeof(int) * (size_t)(nmax + 2)), *effd = malloc(sizeof(int) * nvals(t));
	m.ptr = calloc((size_t)m.S, sizeof(int));
	m.clock = calloc((size_t)m.S, sizeof(double));
	m.arrived = calloc((size_t)m.S, sizeof(bool));
	if (!m.ptr || !m.clock || !m.arrived || !diff || !effd)
		rc = -ENOMEM;
	else if (!(rc = index_sends(&m)))
		rc = run(&m);
	for (int s = 0; s < m.S && !rc; s++) {
		struct life l = { 0 };
		if (!(rc = life_init(&l, t, s, &m))) {
			int peak = peak_live(t, s, &l, diff, effd);
			if (peak != t->bufs[s]) {
				snprintf(err, errlen, "pipeline: stage %d allocates %d buffers, but at most %d values "
					 "live at once", s, t->bufs[s], peak);
				rc = -EINVAL;
			}
		}
		life_free(&l);
	}
	free(diff);
	free(effd);
	sim_free(&m);
	return rc;
}
