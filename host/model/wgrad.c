/* The layer backward's weight gradients, now or later (the split
 * backward of docs/training-step.md#the-split-backward). The layer code
 * computes its input gradients itself and hands each weight gradient
 * here as (weight, its input, its output gradient): in a full backward
 * (no tape) it is computed at once; in an input-gradient backward (I)
 * the call is recorded into the layer's tape in the stash in use, with
 * its operands in the tape's memory (an output gradient written there
 * in the first place through wg_out, or copied), and the
 * weight-gradient backward (W) replays the tape. A weight gradient is the same kernel call on the same bytes
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

float *wg_out(struct model *m, float *scratch, size_t n)
{
	struct wg_tape *t = m->wg;
	if (!t)
		return scratch;
	assert(t->used + n <= t->mcap);
	float *o = t->mem + t->used;
	t->used += n;
	return o;
}

const float *wg_keep_act(struct model *m, const float *buf, size_t n)
{
	struct wg_tape *t = m->wg;
	if (!t || m->wg_reads_acts)
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
	if (e->op == WG_NORM) {
		rmsnorm_backward(NULL, GP(e->id, e->l) + e->woff, e->dout, e->inp, NULL, e->rstd, e->N, e->C);
		return;
	}
	/* the step's first write of a window block it covers whole writes
	 * instead of adding to a zeroed one (win_grad_write) */
	bool first = grad_first(m, e->id, e->l, e->woff ? 0 : (size_t)e->OC * (size_t)e->C);
	linear_wgrad(GP(e->id, e->l) + e->woff, e->dout, e->inp, e->N, e->C, e->OC, !first);
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
	for (int i = 0; i < t->n; i++) {
		run(m, &t->e[i]);
		/* a dense layer's down projection, recorded first, is
		 * written (model_set_fine's layers) */
		if (t->e[i].id == P_W_DOWN && i + 1 < t->n && t->e[i + 1].id != P_W_DOWN && model_fine_down(m, l))
			model_mid(m, l, true, m->part_down);
		/* the feed-forward block's weight gradients, recorded first,
		 * are written: its part may go (model_set_parts) */
		if (model_ffn_id(t->e[i].id) && i + 1 < t->n && !model_ffn_id(t->e[i + 1].id))
			model_mid(m, l, true, m->part_ffn);
		/* wo's, wq's and wk's, recorded before wv's (gqa_backward),
		 * are written: their parts may go where the layer's weight
		 * gradients go as layer 0's */
		if (t->e[i].id == P_WK && model_fine_grads(m, l))
			model_mid(m, l, true, m->part_att);
	}
	t->layer = -1;
}

/* ---- sizes ---- */

/* Floats of the weights' output gradients (outs) and inputs (ins) a
 * tape of layer dims d holds for N rows, by part. */
static void attn_floats(const struct model_dims *d, size_t N, size_t *outs, size_t *ins)
{
	size_t C = d->C;
	if (!d->mla) {
		size_t QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
		*outs += N * QD + 2 * N * KD + N * C; /* wq, wk, wv, wo */
		*ins += N * C + N * QD;               /* ln1, the attention's output */
		return;
	}
	size_t H = d->Hq, QD = H * (d->Dn + d->Dr), VD = H * d->Dv, BD = H * (d->Dn + d->Dv);
	size_t Rq = d->Rq, Rkv = d->Rkv;
	/* wq or wq_b, wkv_b, kv_a_norm and wkv_a's key block (one buffer),
	 * wkv_a's latent block, wo; q_a_norm and wq_a */
	*outs += N * QD + N * BD + N * (Rkv + d->Dr) + N * Rkv + N * C + (Rq ? 2 * N * Rq : 0);
	/* ln1, kvn, kva and its rstd, the attention's output; qn, qa and its rstd */
	*ins += N * C + 2 * N * Rkv + N + N * VD + (Rq ? 2 * N * Rq + N : 0);
}

/* One tape of a layer of dims d (dense or moe) for N rows whose experts
 * may receive R rows, shared experts SF wide: its floats. */
static size_t tape_floats(const struct model_dims *d, size_t N, size_t R, size_t SF, bool moe, bool reads_acts)
{
	size_t C = d->C, outs = 2 * N * C, ins = 2 * (N * C + N); /* the norms */
	attn_floats(d, N, &outs, &ins);
	if (!moe) {
		outs += N * C + 2 * N * d->F;           /* down, gate, up */
		ins += N * C + N * d->F;                /* ln2, h */
	} else {
		outs += N * (size_t)d->E + R * C + 2 * R * (size_t)d->Fe; /* router, experts */
		ins += N * C + R * C + R * (size_t)d->Fe;                /* ln2, the experts' rows, eh */
		if (SF) {
			outs += N * C + 2 * N * SF;      /* shared down, gate, up */
			ins += N * SF;                   /* sh */
		}
	}
	return outs + (reads_acts ? 0 : ins);
}

size_t wg_layer_floats(const struct model *m, bool moe)
{
	/* an expert block's rows: every assignment here, or with expert
	 * parallelism what this device's experts may receive */
	size_t N = (size_t)m->N, R = m->ep > 1 ? m->rmax : N * (size_t)m->d.K;
	return tape_floats(&m->l, N, R, (size_t)m->SF, moe, m->wg_reads_acts);
}

size_t model_layer_w_stash_bytes(const struct model_dims *d, int rows, bool moe, bool reads_acts)
{
	size_t N = (size_t)rows * d->T;
	return sizeof(float) * tape_floats(d, N, N * (size_t)d->K, (size_t)d->S * d->Fe, moe, reads_acts) +
	       sizeof(struct wg_entry) * (size_t)(2 + 8 + (moe ? 1 + 3 + 3 * d->E : 3));
}

int wg_layer_entries(const struct model *m, bool moe)
{
	/* two norms, at most eight attention weights, then the feed-forward:
	 * three, or the router, the shared expert's three and three per
	 * expert block (at most one per expert) */
	return 2 + 8 + (moe ? 1 + 3 + 3 * m->d.E : 3);
}
