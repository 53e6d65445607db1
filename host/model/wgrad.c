/* The layer backward's weight gradients, now or later (the split
 * backward of docs/training-step.md#the-split-backward). The layer code
 * computes its input gradients itself and hands each weight gradient
 * here as (weight, its input, its output gradient): in a full backward
 * (no tape) it is computed at once; in an input-gradient backward (I)
 * the two operands are copied into the layer's tape in the stash in use
 * and the call recorded, and the weight-gradient backward (W) replays
 * the tape. A weight gradient is the same kernel call on the same bytes
 * either way, so I then W gives B's gradients bit for bit. */
#include <assert.h>
#include <string.h>

#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "kernels/kernels.h"

/* Copies n floats into the tape's memory. */
static const float *copy_in(struct wg_tape *t, const float *buf, size_t n)
{
	assert(t->used + n <= t->mcap);  /* wg_layer_floats is the bound */
	float *c = t->mem + t->used;
	memcpy(c, buf, n * sizeof(float));
	t->used += n;
	return c;
}

const float *wg_keep(struct model *m, const float *buf, size_t n)
{
	return m->wg ? copy_in(m->wg, buf, n) : buf;
}

const float *wg_keep_act(struct model *m, const float *buf, size_t n)
{
	struct wg_tape *t = m->wg;
	if (!t)
		return buf;
	for (int i = 0; i < t->nmemo; i++)
		if (t->memo[i].src == buf && t->memo[i].n == n)
			return t->memo[i].copy;
	const float *c = copy_in(t, buf, n);
	if (t->nmemo < WG_MEMO)
		t->memo[t->nmemo++] = (struct wg_memo){ buf, n, c };
	return c;
}

static void run(struct model *m, const struct wg_entry *e)
{
	float *dw = GP(e->id, e->l) + e->woff;
	if (e->op == WG_NORM)
		rmsnorm_backward(NULL, dw, e->dout, e->inp, NULL, e->rstd, e->N, e->C);
	else
		linear_backward(NULL, dw, e->dout, e->inp, NULL, e->N, e->C, e->OC);
}

static void add(struct model *m, const struct wg_entry *e)
{
	struct wg_tape *t = m->wg;
	if (!t) {
		run(m, e);
		return;
	}
	assert(t->n < t->cap);  /* wg_layer_entries is the bound */
	t->e[t->n++] = *e;
}

void wg_linear(struct model *m, int id, int l, size_t woff, const float *dout, const float *inp,
	       int N, int C, int OC)
{
	add(m, &(struct wg_entry){ .op = WG_LINEAR, .id = id, .l = l, .woff = woff, .dout = dout,
				   .inp = inp, .N = N, .C = C, .OC = OC });
}

void wg_norm(struct model *m, int id, int l, const float *dout, const float *x, const float *rstd,
	     int N, int C)
{
	add(m, &(struct wg_entry){ .op = WG_NORM, .id = id, .l = l, .dout = dout, .inp = x, .rstd = rstd,
				   .N = N, .C = C });
}

void wg_record(struct model *m, struct wg_tape *t, int l)
{
	m->wg = t;
	if (!t)
		return;
	assert(t->layer < 0);  /* its W has run (or it is new) */
	t->layer = l;
	t->n = 0;
	t->used = 0;
	t->nmemo = 0;
}

void wg_replay(struct model *m, struct wg_tape *t, int l)
{
	assert(t->layer == l);  /* this stash holds layer l's I */
	for (int i = 0; i < t->n; i++)
		run(m, &t->e[i]);
	t->layer = -1;
}

/* ---- sizes ---- */

/* Rows an expert block's operands span at most: every assignment here,
 * or with expert parallelism what this device's experts may receive. */
static size_t expert_rows(const struct model *m)
{
	return m->ep > 1 ? m->rmax : (size_t)m->N * m->d.K;
}

/* What each attention kind keeps, in floats (local dims). */
static size_t attn_floats(const struct model *m)
{
	const struct model_dims *d = &m->l;
	size_t N = (size_t)m->N, C = d->C;
	if (!d->mla) {
		size_t QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
		/* ln1; wq, wk, wv output gradients; wo's input and output gradient */
		return N * C + N * QD + 2 * N * KD + N * QD + N * C;
	}
	size_t H = d->Hq, QD = H * (d->Dn + d->Dr), VD = H * d->Dv, BD = H * (d->Dn + d->Dv);
	size_t Rq = d->Rq, Rkv = d->Rkv, f = N * C + N * QD;   /* ln1; wq or wq_b's gradient */
	if (Rq)  /* wq_b's input, q_a_norm's input, rstd and gradient, wq_a's gradient */
		f += N * Rq + N * Rq + N + N * Rq + N * Rq;
	/* wkv_b's input and gradient, kv_a_norm's input, rstd and gradient,
	 * wkv_a's two gradients, wo's input and gradient */
	return f + N * Rkv + N * BD + N * Rkv + N + N * Rkv + N * Rkv + N * d->Dr + N * VD + N * C;
}

size_t wg_layer_floats(const struct model *m, bool moe)
{
	const struct model_dims *d = &m->l;
	size_t N = (size_t)m->N, C = d->C;
	/* the two norms: input, rstd, output gradient each */
	size_t f = 2 * (N * C + N + N * C) + attn_floats(m);
	if (!moe)  /* ln2, h; gate, up and down output gradients */
		return f + N * C + 3 * N * d->F + N * C;
	size_t R = expert_rows(m), SF = (size_t)m->SF;
	f += N * C + N * (size_t)d->E;          /* ln2; the router's gradient */
	f += 2 * R * C + 3 * R * (size_t)d->Fe; /* experts: rows in, dY; eh, dg, du */
	if (SF)
		f += 3 * N * SF + N * C;         /* shared: sh, dg, du; dy */
	return f;
}

int wg_layer_entries(const struct model *m, bool moe)
{
	/* two norms, at most eight attention weights, then the feed-forward:
	 * three, or the router, the shared expert's three and three per
	 * expert block (at most one per expert) */
	return 2 + 8 + (moe ? 1 + 3 + 3 * m->d.E : 3);
}
