/* The weights of a table (see schedule.h, enum pipe_wmode): where each
 * stage gathers, releases and reduce-scatters the non-layer tensors, the
 * layers outside the pipeline and its chunks. An action's "unit" is the
 * action with the receives right before it and the sends right after
 * it; gathers go before a unit, releases and reduce-scatters after it.
 *
 * Uses: the non-layer group by every owner action (gathered first and
 * returned last by a stage that has any); the outside group by the owners' actions
 * that run those layers (gathered before the first, returned after the
 * last); a chunk by its F, Fc, B, I and W, of which B and W add to its
 * gradients. */
#include "host/pipeline/weights.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct wl {
	const struct pipe_shape *p;
	struct pipe_action *in;
	int n;
	struct pipe_action *out;
	int nout, cap, rc;
	/* the chunk groups */
	int E;
	int *use_of;     /* [n] the chunk the action at k uses, or -1 */
	int *nextuse;    /* [n] the next action index using the same chunk, or n */
	int *slot_of;    /* [E] slot holding the chunk, or -1 */
	int slot_chunk[2];
	bool *ready;     /* [E] used since gathered (READY) */
	bool *grads;     /* [E] gradients not yet reduce-scattered */
};

static void put(struct wl *w, struct pipe_action a)
{
	if (w->rc)
		return;
	if (w->nout == w->cap) {
		int cap = w->cap ? 2 * w->cap : 64;
		struct pipe_action *na = realloc(w->out, sizeof(*na) * (size_t)cap);
		if (!na) {
			w->rc = -ENOMEM;
			return;
		}
		w->out = na;
		w->cap = cap;
	}
	w->out[w->nout++] = a;
}

static void wop(struct wl *w, int op, int group, int slot)
{
	struct pipe_action a = { .op = (uint8_t)op, .chunk = (int16_t)group, .mb = -1, .peer = -1,
				 .slot = (int16_t)slot, .buf = { -1, -1, -1 }, .iter = -1 };
	put(w, a);
}

static bool chunk_use(int op)
{
	return op == PA_F || op == PA_FC || op == PA_B || op == PA_I || op == PA_W;
}

static bool grad_use(int op)
{
	return op == PA_B || op == PA_W;
}

static bool owner_op(int op)
{
	return op == PA_EMBED || op == PA_HEAD || op == PA_EMBED_BACK;
}

/* Whether the owner action at op runs the layers outside the pipeline,
 * and whether it adds to their gradients. */
static bool outside_use(const struct pipe_shape *p, int op)
{
	if (p->outside == PIPE_OUT_BEFORE)
		return op == PA_EMBED || op == PA_EMBED_BACK;
	return p->outside == PIPE_OUT_AFTER && op == PA_HEAD;
}

/* ---- the chunk groups in the two-slot modes ---- */

/* The first chunk used at or after action k that no slot holds, or -1. */
static int next_missing(const struct wl *w, int k)
{
	for (int j = k; j < w->n; j++)
		if (w->use_of[j] >= 0 && w->slot_of[w->use_of[j]] < 0)
			return w->use_of[j];
	return -1;
}

/* The next use of chunk c at or after action k (w->n: none). */
static int next_use_from(const struct wl *w, int c, int k)
{
	for (int j = k; j < w->n; j++)
		if (w->use_of[j] == c)
			return j;
	return w->n;
}

static void gather_chunk(struct wl *w, int c, int slot)
{
	w->slot_of[c] = slot;
	w->slot_chunk[slot] = c;
	w->ready[c] = false;
	wop(w, PA_GATHER, c, slot);
}

static void drop_chunk(struct wl *w, int c)
{
	int slot = w->slot_of[c];
	if (w->grads[c])
		wop(w, PA_REDUCE_SCATTER, c, slot);
	w->grads[c] = false;
	wop(w, PA_RELEASE, c, slot);
	w->slot_of[c] = -1;
	w->slot_chunk[slot] = -1;
}

static int free_slot(const struct wl *w)
{
	for (int k = 0; k < pipe_weight_slots(w->p); k++)
		if (w->slot_chunk[k] < 0)
			return k;
	return -1;
}

/* Into every free slot, the next chunks the stage will use from k on. */
static void prefetch(struct wl *w, int k)
{
	int slot, c;
	while ((slot = free_slot(w)) >= 0 && (c = next_missing(w, k)) >= 0)
		gather_chunk(w, c, slot);
}

/* Before action k uses chunk c (one ahead: one READY chunk; per repeat:
 * two): make room, as Belady would, and fetch the next one. */
static void before_use(struct wl *w, int k, int c)
{
	if (w->slot_of[c] < 0) {  /* not fetched ahead: only when slots ran out */
		int slot = free_slot(w);
		if (slot < 0) {
			int o = w->slot_chunk[0] == c ? w->slot_chunk[1] : w->slot_chunk[0];
			drop_chunk(w, o);
			slot = free_slot(w);
		}
		gather_chunk(w, c, slot);
	}
	for (int s = 0; s < 2; s++) {
		int o = w->slot_chunk[s];
		if (o < 0 || o == c || s >= pipe_weight_slots(w->p))
			continue;
		if (w->p->wmode == PIPE_W_AHEAD) {
			if (w->ready[o])
				drop_chunk(w, o);
			continue;
		}
		int n = next_missing(w, k);
		if (n >= 0 && next_use_from(w, n, k) < next_use_from(w, o, k))
			drop_chunk(w, o);
	}
	prefetch(w, k);
}

static void after_use(struct wl *w, int k, int c, int op)
{
	w->ready[c] = true;
	w->grads[c] |= grad_use(op);
	if (w->nextuse[k] < w->n)
		return;
	drop_chunk(w, c);
	prefetch(w, k + 1);
}

/* ---- one stage ---- */

/* [k0, k1): the unit of the owner or compute action at k. */
static void unit_of(const struct pipe_action *a, int n, int k, int *k0, int *k1)
{
	*k0 = k;
	while (*k0 > 0 && a[*k0 - 1].op == PA_RECV)
		--*k0;
	*k1 = k + 1;
	while (*k1 < n && a[*k1].op == PA_SEND)
		++*k1;
}

static int index_uses(struct wl *w)
{
	w->use_of = malloc(sizeof(int) * (size_t)(w->n + 1));
	w->nextuse = malloc(sizeof(int) * (size_t)(w->n + 1));
	w->slot_of = malloc(sizeof(int) * (size_t)w->E);
	w->ready = calloc((size_t)w->E, sizeof(bool));
	w->grads = calloc((size_t)w->E, sizeof(bool));
	int *last = malloc(sizeof(int) * (size_t)w->E);
	if (!w->use_of || !w->nextuse || !w->slot_of || !w->ready || !w->grads || !last) {
		free(last);
		return -ENOMEM;
	}
	for (int c = 0; c < w->E; c++)
		w->slot_of[c] = last[c] = -1;
	w->slot_chunk[0] = w->slot_chunk[1] = -1;
	for (int k = 0; k < w->n; k++) {
		w->use_of[k] = chunk_use(w->in[k].op) ? w->in[k].chunk : -1;
		w->nextuse[k] = w->n;
		if (w->use_of[k] < 0)
			continue;
		if (last[w->use_of[k]] >= 0)
			w->nextuse[last[w->use_of[k]]] = k;
		last[w->use_of[k]] = k;
	}
	free(last);
	return 0;
}

/* The weights of a chunk action at k, before (pre) or after it. */
static void chunk_weights(struct wl *w, int k, bool pre)
{
	int c = w->use_of[k], op = w->in[k].op;
	enum pipe_wmode m = w->p->wmode;
	if (m == PIPE_W_ITER) {
		if (pre)
			wop(w, PA_GATHER, c, 0);
		else {
			if (grad_use(op))
				wop(w, PA_REDUCE_SCATTER, c, 0);
			wop(w, PA_RELEASE, c, 0);
		}
	} else if (m == PIPE_W_ONCE) {
		w->grads[c] |= !pre && grad_use(op);
		if (!pre && w->nextuse[k] == w->n) {
			if (w->grads[c])
				wop(w, PA_REDUCE_SCATTER, c, w->slot_of[c]);
			wop(w, PA_RELEASE, c, w->slot_of[c]);
		}
	} else if (pre) {
		before_use(w, k, c);
	} else {
		after_use(w, k, c, op);
	}
}

static int lower_stage(struct wl *w)
{
	const struct pipe_shape *p = w->p;
	int first_out = -1, last_out = -1, last_own = -1, k0, k1, rc;
	bool out_grads = false, owns = false;
	if ((rc = index_uses(w)))
		return rc;
	for (int k = 0; k < w->n; k++)
		if (owner_op(w->in[k].op)) {
			owns = true;
			last_own = k;
		}
	for (int k = 0; k < w->n; k++)
		if (owner_op(w->in[k].op) && outside_use(p, w->in[k].op)) {
			first_out = first_out < 0 ? k : first_out;
			last_out = k;
			out_grads |= w->in[k].op != PA_EMBED;
		}
	if (owns)  /* only a stage with owner actions reads them */
		wop(w, PA_GATHER, PIPE_G_NONLAYER, 0);
	if (p->wmode == PIPE_W_ONCE)
		for (int c = 0, slot = 0; c < w->E; c++)
			if (next_use_from(w, c, 0) < w->n) {
				w->slot_of[c] = slot;
				wop(w, PA_GATHER, c, slot++);
			}
	if (p->wmode == PIPE_W_REPEAT || p->wmode == PIPE_W_AHEAD)
		prefetch(w, 0);
	for (int k = 0; k < w->n;) {
		int op = w->in[k].op;
		if (op != PA_RECV && !chunk_use(op) && !owner_op(op)) {
			put(w, w->in[k++]);
			continue;
		}
		int at = k;
		while (w->in[at].op == PA_RECV)
			at++;
		unit_of(w->in, w->n, at, &k0, &k1);
		if (at == first_out)
			wop(w, PA_GATHER, PIPE_G_OUTSIDE, 0);
		if (w->use_of[at] >= 0) {
			chunk_weights(w, at, true);
			w->in[at].slot = (int16_t)(p->wmode == PIPE_W_ITER ? 0 : w->slot_of[w->use_of[at]]);
		}
		for (int j = k0; j < k1; j++)
			put(w, w->in[j]);
		if (w->use_of[at] >= 0)
			chunk_weights(w, at, false);
		if (at == last_out) {
			if (out_grads)
				wop(w, PA_REDUCE_SCATTER, PIPE_G_OUTSIDE, 0);
			wop(w, PA_RELEASE, PIPE_G_OUTSIDE, 0);
		}
		/* the non-layer group is done after the stage's last owner
		 * action: its reduce-scatter goes out there, under the W's a
		 * zero-bubble table still runs after it (zb_h1, zbv: e then
		 * W of the last microbatch), not after the table's end */
		if (at == last_own) {
			wop(w, PA_REDUCE_SCATTER, PIPE_G_NONLAYER, 0);
			wop(w, PA_RELEASE, PIPE_G_NONLAYER, 0);
		}
		k = k1;
	}
	return w->rc;
}

int pipe_lower_weights(struct pipe_table *t)
{
	int rc = 0;
	for (int s = 0; s < t->shape.stages && !rc; s++) {
		struct wl w = { .p = &t->shape, .in = t->a[s], .n = t->n[s], .E = t->nchunks };
		rc = lower_stage(&w);
		free(w.use_of);
		free(w.nextuse);
		free(w.slot_of);
		free(w.ready);
		free(w.grads);
		if (rc) {
			free(w.out);
			break;
		}
		free(t->a[s]);
		t->a[s] = w.out;
		t->n[s] = w.nout;
	}
	return rc;
}
