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
 * its own place. Receives are posted ahead of their place (prepost
 * below), into their own buffer once no action before them touches it,
 * else into a landing buffer that takes the buffer's place at the RECV:
 * a message over the rendezvous size waits for its receive to be posted,
 * so a receive posted only when the device reaches it (or, the table's
 * buffers being as few as its lifetimes allow, only once the buffer's
 * last reader ran) costs the sender a wake-up of its stream thread to
 * read the RecvReady and write the message, even when it sent long
 * before. */
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
#include "host/util/clock.h"

/* receives posted ahead at most (the transport keeps as many); landing
 * buffers for those whose table buffer is still in use: pipe_landing_bufs
 * (host/pipeline/schedule.h) */
#define PIPE_PREPOST_MAX 8

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
	/* the owner's hooks, and when the table fires them */
	struct pipe_hooks hooks;
	uint8_t *after;              /* [n] AFTER_* events once the action at k ran */
	bool *last_rs;               /* [n] a reduce-scatter that is its group's last */
	int landing_k;               /* such a reduce-scatter in flight, or -1 */
	int landing_nl;              /* such a non-layer one gone out beside it, or -1 */
	/* filling receive waits (pipe_exec_set_fill) */
	bool fill;                   /* asked for */
	bool filling;                /* this step: asked, and possible */
	bool ahead;                  /* the action running is a W run ahead */
	int *w_of_i;                 /* [n] a W's I (its index), else -1 */
	bool *ran;                   /* [n] run ahead of its place this step */
	int fills;
	/* posting receives ahead (prepost) */
	int prepost;                 /* this step: how many may be outstanding (0: none) */
	bool hold;                   /* this step: posts before a send to their stage hold their word */
	bool later;                  /* this step: the other posts' words go from the transport's thread */
	bool *posted;                /* [n] a RECV posted ahead this step */
	bool *named;                 /* [nbuf] prepost's scratch: named from k on */
	int preposts, prepost_depth;
	/* landing buffers: a receive whose table buffer is still in use is
	 * posted into one of these, which takes the table buffer's place at
	 * the RECV (the two pointers swap) */
	float *land[PIPE_LANDING];
	bool land_busy[PIPE_LANDING];
	int land_max;                /* allocated */
	int nland;                   /* this step's (MESHRUN_PIPE_LANDING) */
	int8_t *land_of;             /* [n] the landing buffer a RECV was posted into, or -1 */
	int landed_early;            /* receives posted into a landing buffer */
	/* synthetic compute (pipe_exec_set_sleep): each compute action
	 * sleeps its time instead of running the model */
	bool sleep;
	struct pipe_costs sleep_s;   /* seconds */
	int slept;                   /* this step's sleeps */
	/* two parts a layer (pipe_exec_set_parts): the F or B running on one
	 * layer, whose window slot the model's mid call waits for or
	 * reduce-scatters part B of (slot -1: none) */
	bool parts;
	int mid_k, mid_op, last_b;   /* last_b: the table's last B, or -1 */
	bool mid_last, mid_sent;     /* the B running is it; it sent a part */
	/* the table's leading gathers, started before the step
	 * (pipe_exec_prefetch) */
	int npre;
	int pre_rc;
	/* the step in progress */
	const int32_t *inputs, *targets;
	struct model_step *st;
	const struct pipe_p2p *io;
};

/* What an action completes (pipe_hooks.grads_done, landed false). */
enum { AFTER_CHUNK = 1, AFTER_HEAD = 2, AFTER_EMBED = 4 };

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

/* The weight group a window action names: chunk c, or nchunks for the
 * non-layer tensors, nchunks + 1 for the layers outside the pipeline. */
static int wgroup(const struct pipe_exec *x, const struct pipe_action *a)
{
	return a->chunk >= 0 ? a->chunk : a->chunk == PIPE_G_NONLAYER ? x->t.nchunks : x->t.nchunks + 1;
}

/* Where each group's gradients become final: after the last B or W of a
 * chunk, the last head, the last embedding backward; and which
 * reduce-scatter is a group's last. */
static int mark_events(struct pipe_exec *x)
{
	int G = x->t.nchunks + 2, *last = malloc(sizeof(int) * (size_t)(x->t.nchunks + G + 2));
	x->after = calloc((size_t)x->n + 1, 1);
	x->last_rs = calloc((size_t)x->n + 1, sizeof(bool));
	if (!last || !x->after || !x->last_rs) {
		free(last);
		return -ENOMEM;
	}
	int *rs = last + x->t.nchunks, head = -1, eback = -1;
	for (int i = 0; i < x->t.nchunks + G; i++)
		last[i] = -1;
	for (int k = 0; k < x->n; k++) {
		const struct pipe_action *a = &x->a[k];
		if (a->op == PA_B || a->op == PA_W)
			last[a->chunk] = k;
		else if (a->op == PA_HEAD)
			head = k;
		else if (a->op == PA_EMBED_BACK)
			eback = k;
		else if (a->op == PA_REDUCE_SCATTER)
			rs[wgroup(x, a)] = k;
	}
	for (int c = 0; c < x->t.nchunks; c++)
		if (last[c] >= 0)
			x->after[last[c]] |= AFTER_CHUNK;
	if (head >= 0)
		x->after[head] |= AFTER_HEAD;
	if (eback >= 0)
		x->after[eback] |= AFTER_EMBED;
	for (int g = 0; g < G; g++)
		if (rs[g] >= 0)
			x->last_rs[rs[g]] = true;
	x->landing_k = x->landing_nl = -1;
	free(last);
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
	if (!x->stage_dev || alloc_bufs(x, mb_rows * d->T, d->C) || mark_events(x) ||
	    mark_w(x))
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

/* Inside a layer's F or B in parts (model_set_parts): an F waits for
 * the gather of parts (up to the highest); a B sends the reduce-scatter
 * of parts (their gradients are written): at its first call (the
 * feed-forward block's), at later ones only in the table's last B (the
 * others' go at their RS, under the next B, no wait inside for the one
 * in flight). A recomputed forward in a B, or a multi-layer action, no. */
static int exec_mid(void *ctx, int l, bool backward, unsigned parts)
{
	struct pipe_exec *x = ctx;
	struct win *w = model_window(x->m);
	(void)l;
	if (x->mid_k < 0 || !parts)
		return 0;
	if (!backward && (x->mid_op == PA_F || x->mid_op == PA_FC))
		return win_wait_part(w, x->mid_k, 31 - __builtin_clz(parts));
	if (backward && x->mid_op == PA_B && (x->mid_last || !x->mid_sent)) {
		x->mid_sent = true;
		return win_scatter_parts(w, x->mid_k, parts);
	}
	return 0;
}

int pipe_exec_set_parts(struct pipe_exec *x, enum pipe_parts mode, char *err, size_t errlen)
{
	int rc;
	bool fits = x->t.shape.stages == 1, on;
	x->mid_k = x->last_b = -1;
	for (int k = 0; k < x->n; k++) {
		fits &= x->a[k].op != PA_I && x->a[k].op != PA_W;
		x->last_b = x->a[k].op == PA_B ? k : x->last_b;
	}
	if (mode == PIPE_PARTS_ON && !fits) {
		snprintf(err, errlen, "config: key 'fsdp_layer_parts' needs no pipeline: set "
			 "'ici_pipeline_parallelism' and 'dcn_pipeline_parallelism' to 1");
		return -EINVAL;
	}
	/* auto: where it applies, an FSDP window that gathers layers */
	on = mode == PIPE_PARTS_ON || (mode == PIPE_PARTS_AUTO && fits && win_moves(model_window(x->m), true));
	if ((rc = model_set_parts(x->m, on, exec_mid, x))) {
		snprintf(err, errlen, "pipeline: out of memory");
		return rc;
	}
	x->parts = on;
	return 0;
}
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

/* ---- the owner's hooks ---- */

static int grads_done(struct pipe_exec *x, int l0, int l1, bool landed)
{
	return x->hooks.grads_done ? x->hooks.grads_done(x->hooks.ctx, l0, l1, landed) : 0;
}

/* The layers outside the pipeline that the owner action op runs (before
 * the pipeline: the embedding's; after it: the head's): [*l0, *l1), empty
 * when *l0 == *l1. */
static void outside_of(const struct pipe_exec *x, bool head, int *l0, int *l1)
{
	int nb, a0;
	outside(x, &nb, &a0);
	*l0 = head ? a0 : 0;
	*l1 = head ? model_dims(x->m)->L : nb;
}

/* grads_done(landed) for the window group a reduce-scatter names. */
static int group_landed(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0, l1, nb, a0, rc;
	if (a->chunk == PIPE_G_NONLAYER)
		return (rc = grads_done(x, PIPE_HOOK_HEAD, 0, true)) ? rc : grads_done(x, PIPE_HOOK_EMBED, 0, true);
	if (a->chunk >= 0) {
		chunk_layers(x, a->chunk, &l0, &l1);
	} else {
		outside(x, &nb, &a0);
		l0 = nb ? 0 : a0;
		l1 = nb ? nb : model_dims(x->m)->L;
	}
	return grads_done(x, l0, l1, true);
}

/* The groups whose gradients the action at k completed (grads_done,
 * landed false), in the order they are told: at most 2. */
static int completed(const struct pipe_exec *x, int k, int *l0, int *l1)
{
	int n = 0, o0, o1;
	uint8_t ev = x->after[k];
	if (ev & AFTER_CHUNK) {
		chunk_layers(x, x->a[k].chunk, &l0[n], &l1[n]);
		n++;
	}
	for (int head = 1; head >= 0; head--) {
		if (!(ev & (head ? AFTER_HEAD : AFTER_EMBED)))
			continue;
		l0[n] = head ? PIPE_HOOK_HEAD : PIPE_HOOK_EMBED;
		l1[n++] = 0;
		outside_of(x, head, &o0, &o1);
		if (o0 < o1) {
			l0[n] = o0;
			l1[n++] = o1;
		}
	}
	return n;
}

/* The groups whose weights action a reads (its compute, or a gather of
 * them): at most 2. */
static int reads(const struct pipe_exec *x, const struct pipe_action *a, int *l0, int *l1)
{
	int n = 0, nb, a0, L = model_dims(x->m)->L;
	outside(x, &nb, &a0);
	switch (a->op) {
	case PA_EMBED:
	case PA_EMBED_BACK:
	case PA_HEAD: {
		bool head = a->op == PA_HEAD;
		l0[n] = head ? PIPE_HOOK_HEAD : PIPE_HOOK_EMBED;
		l1[n++] = 0;
		if (head ? a0 < L : nb > 0) {
			l0[n] = head ? a0 : 0;
			l1[n++] = head ? L : nb;
		}
		return n;
	}
	case PA_F:
	case PA_FC:
	case PA_B:
	case PA_I:
	case PA_W:
		chunk_layers(x, a->chunk, &l0[0], &l1[0]);
		return 1;
	case PA_GATHER:
		/* a gather that moves nothing reads nothing */
		if (!win_moves(model_window(x->m), a->chunk != PIPE_G_NONLAYER))
			return 0;
		if (a->chunk == PIPE_G_NONLAYER) {
			l0[0] = PIPE_HOOK_HEAD;
			l0[1] = PIPE_HOOK_EMBED;
			l1[0] = l1[1] = 0;
			return 2;
		}
		if (a->chunk == PIPE_G_OUTSIDE) {
			l0[0] = nb ? 0 : a0;
			l1[0] = nb ? nb : L;
		} else {
			chunk_layers(x, a->chunk, &l0[0], &l1[0]);
		}
		return 1;
	default:
		return 0;
	}
}

static int before_action(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0[2], l1[2], n = x->hooks.weights_needed ? reads(x, a, l0, l1) : 0, rc;
	for (int i = 0; i < n; i++)
		if ((rc = x->hooks.weights_needed(x->hooks.ctx, l0[i], l1[i], a->op == PA_GATHER)))
			return rc;
	return 0;
}

static int after_action(struct pipe_exec *x, int k)
{
	int l0[4], l1[4], n = x->after[k] && x->hooks.grads_done ? completed(x, k, l0, l1) : 0, rc;
	for (int i = 0; i < n; i++)
		if ((rc = grads_done(x, l0[i], l1[i], false)))
			return rc;
	return 0;
}

/* The group of the last reduce-scatter of its group, landed. */
static int landed(struct pipe_exec *x)
{
	int k = x->landing_k, j = x->landing_nl, rc;
	x->landing_k = x->landing_nl = -1;
	if (k >= 0 && (rc = group_landed(x, &x->a[k])))
		return rc;
	return j >= 0 ? group_landed(x, &x->a[j]) : 0;
}

void pipe_exec_set_hooks(struct pipe_exec *x, const struct pipe_hooks *h)
{
	x->hooks = h ? *h : (struct pipe_hooks){ 0 };
}

static int run_weights(struct pipe_exec *x, const struct pipe_action *a);

/* The table's leading gathers: the actions before its first other. */
static int leading(const struct pipe_exec *x)
{
	int k = 0;
	while (k < x->n && x->a[k].op == PA_GATHER)
		k++;
	return k;
}

int pipe_exec_first_reads(const struct pipe_exec *x, int *l0, int *l1, int *by, int max)
{
	int n = 0, a[2], b[2];
	for (int k = 0; k < leading(x); k++)
		for (int i = 0, c = reads(x, &x->a[k], a, b); i < c; i++, n++)
			if (n < max) {
				l0[n] = a[i];
				l1[n] = b[i];
				if (by)
					by[n] = k;
			}
	return n;
}

int pipe_exec_prefetch(struct pipe_exec *x, const struct model_comm *comm, int upto)
{
	struct win *w = model_window(x->m);
	int n = leading(x) < upto ? leading(x) : upto, rc = 0;
	if (x->npre >= n || !w || (!win_moves(w, false) && !win_moves(w, true)))
		return 0;
	x->pre_rc = x->npre ? x->pre_rc : 0;
	win_begin(w, comm, &x->pre_rc);
	/* each waits for what it reads as in the step (ZeRO-1's gathers) */
	for (int k = x->npre; k < n && !rc; k++)
		if (!(rc = before_action(x, &x->a[k])))
			rc = run_weights(x, &x->a[k]);
	x->npre = n;
	return rc;
}

int pipe_exec_prefetch_drop(struct pipe_exec *x)
{
	struct win *w = model_window(x->m);
	if (!x->npre)
		return 0;
	x->npre = 0;
	return win_end(w);
}

int pipe_exec_grad_order(const struct pipe_exec *x, int *l0, int *l1, int max)
{
	int n = 0, a[4], b[4];
	for (int k = 0; k < x->n; k++)
		for (int i = 0, c = completed(x, k, a, b); i < c; i++, n++)
			if (n < max) {
				l0[n] = a[i];
				l1[n] = b[i];
			}
	return n;
}

/* ---- weights ---- */

static int run_weights(struct pipe_exec *x, const struct pipe_action *a)
{
	struct win *w = model_window(x->m);
	int k = wslot(x, a), l0 = WIN_NONLAYER, l1 = 0, nb, a0, rc;
	/* a W run ahead left its slot's gather (of no weights) unwaited */
	if (x->filling && a->chunk >= 0 && a->op != PA_GATHER && (rc = win_wait(w, k)))
		return rc;
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
	default: {
		/* the gradients are packed and sent: the next write starts from 0 */
		x->gzero[k] = true;
		/* the non-layer group's goes out beside a layer group's in
		 * flight (both land at the next finish); else the one in
		 * flight lands first: its group may be final now */
		bool beside = win_scatter_beside(w, k);
		if (!beside && ((rc = win_scatter_finish(w)) || (rc = landed(x))))
			return rc;
		if ((rc = win_scatter_start(w, k)))
			return rc;
		if (x->last_rs[a - x->a])
			*(beside ? &x->landing_nl : &x->landing_k) = (int)(a - x->a);
		return 0;
	}
	}
}

/* Waits for window slot k; when grads, zeroes its gradients first if a
 * gather or reduce-scatter left them to be (sleep mode: as writes do). */
static int use_slot(struct pipe_exec *x, int k, bool grads)
{
	struct win *w = model_window(x->m);
	int rc = win_wait(w, k);
	if (!rc && grads && x->gzero[k]) {
		win_zero_grads(w, k);
		if (x->sleep)
			win_grads_written(w, k);
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
	bool bw = a->op == PA_B;
	int n = model_part_steps(x->m, l, bw, share, mask), rc = 0;
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
	x->mid_last = x->last_b >= 0 && a == &x->a[x->last_b];
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
	if (!rc && a->op != PA_B)
		rc = use_slot(x, k, false);
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
	if ((rc = reuse(x, a->buf[0])) || (rc = use_slot(x, WSLOT_NONLAYER, false)) ||
	    (nb && (rc = use_slot(x, WSLOT_OUTSIDE(model_window(x->m)), false))))
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
	if ((rc = reuse(x, a->buf[1])) || (rc = use_slot(x, WSLOT_NONLAYER, true)) ||
	    (a0 < L && (rc = use_slot(x, WSLOT_OUTSIDE(w), true))))
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
	if ((rc = use_slot(x, WSLOT_NONLAYER, true)) ||
	    (nb && (rc = use_slot(x, WSLOT_OUTSIDE(model_window(x->m)), true))))
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
	if ((a->buf[1] >= 0 && (rc = reuse(x, a->buf[1]))) || (rc = use_slot(x, WSLOT(a->slot), false)))
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
	    (!x->ahead && (rc = use_slot(x, WSLOT(a->slot), a->op != PA_I))))
		return rc;
	if (a->op == PA_B && in_parts(x, a, l0, l1, WSLOT(a->slot))) {
		if (!x->sleep && x->t.shape.recompute)
			rc = model_layers_forward(x->m, l0, l1, scratch(x, 0), in);
		if (!x->sleep && !rc)
			rc = model_layers_backward(x->m, l0, l1, g, in);
		return run_parts(x, a, l0, WSLOT(a->slot), rc);
	}
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

/* The actions that compute (or sleep): the gaps between them are the
 * executor's. */
static bool compute_op(int op)
{
	return op == PA_F || op == PA_FC || op == PA_B || op == PA_I || op == PA_W || op == PA_EMBED ||
	       op == PA_HEAD || op == PA_EMBED_BACK;
}

static bool timed(int op)
{
	return op != PA_SEND && op != PA_RECV && op != PA_GATHER && op != PA_RELEASE &&
	       op != PA_REDUCE_SCATTER && op != PA_COUNT_SUM;
}

static int run_action(struct pipe_exec *x, const struct pipe_action *a)
{
	int rc = before_action(x, a);
	if (rc)
		return rc;
	double t0 = util_now_s(), c0 = timed(a->op) ? util_thread_cpu_s() : 0;
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
	if (timed(a->op)) {
		/* the CPU read inside the wall's reads, so a span's CPU is never
		 * more than its wall: an interrupt's work (a softirq receiving
		 * TCP) between the two reads is charged to this thread */
		double cpu = util_thread_cpu_s() - c0;
		x->times[x->ntimes++] = (struct pipe_act_time){ .op = a->op, .mb = a->mb, .chunk = a->chunk,
								.t0 = t0, .t1 = util_now_s(), .cpu = cpu };
	}
	return rc ? rc : after_action(x, (int)(a - x->a));
}

/* ---- filling receive waits ---- */

/* The W the device may run ahead of the receive at k: the first W not
 * run yet (W's keep their order), if its I has run and it completes no
 * group (its grads_done hook stays in place); else -1. */
static int owed_w(const struct pipe_exec *x, int k)
{
	for (int j = k + 1; j < x->n; j++) {
		if (x->a[j].op != PA_W || x->ran[j])
			continue;
		return x->w_of_i[j] < k && !x->after[j] ? j : -1;
	}
	return -1;
}

/* Before the receive at k: while it has not arrived and a W is owed,
 * runs that W. */
static int fill_wait(struct pipe_exec *x, int k)
{
	const struct pipe_action *a = &x->a[k];
	uint32_t kind, idx;
	int b = a->buf[0], rc = reuse(x, b), j;
	pipe_val_msg(&x->t, &a->val, &kind, &idx);
	while (!rc && (j = owed_w(x, k)) >= 0) {
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

/* ---- posting receives ahead ---- */

/* Whether a SEND to stage p is in the actions [from, to). */
static bool sends_to(const struct pipe_exec *x, int from, int to, int p)
{
	for (int i = from; i < to; i++)
		if (x->a[i].op == PA_SEND && x->a[i].peer == p)
			return true;
	return false;
}

/* Before the action at k: posts the receives after it (at j > k, up to
 * x->prepost of them outstanding: posted and not yet reached) whose
 * buffer nothing from k up to them names and no send from it is in
 * flight, so each message can land while the device computes and the
 * sender, finding its receive posted, writes it at once from its own
 * thread (a rendezvous send whose receive is not posted yet waits for
 * the RecvReady, which a thread of the sender's must wake to read). The
 * receive at j then takes the posted one; the one at k posts itself. */
static int prepost(struct pipe_exec *x, int k)
{
	int out = 0, rc, g = k, k0 = k;
	/* the receives before the next compute are taken in this gap: they
	 * do not count against the bound (so the gap's posts can all come
	 * before its sends) */
	while (g < x->n && !compute_op(x->a[g].op))
		g++;
	while (k0 > x->npre && !compute_op(x->a[k0 - 1].op))
		k0--;
	bool sends_left = false;
	for (int i = k; i < g; i++)
		sends_left |= x->a[i].op == PA_SEND;
	for (int j = g + 1; j < x->n; j++)
		out += x->posted[j];
	memset(x->named, 0, sizeof(bool) * (size_t)x->nbuf);
	for (int j = k; j < x->n && out < x->prepost; j++) {
		const struct pipe_action *a = &x->a[j];
		int b = a->buf[0];
		int l = -1;
		bool free_now = a->op == PA_RECV && !x->named[b] && x->sent[b].dev < 0;
		for (int i = 0; a->op == PA_RECV && !free_now && l < 0 && i < x->nland; i++)
			if (!x->land_busy[i])
				l = i;
		/* a receive from a stage this gap sends to is posted before
		 * that send, and then only (a send above p2p_handoff_bytes
		 * leaves its sealing to the link's stream thread: a post on
		 * its link after it sealed it on this thread in the
		 * RecvReady's flush, or waited for the link while the stream
		 * thread sealed it, 0.2-1.2 ms before the next compute); one
		 * from another stage after the gap's sends, which it would
		 * only delay; later receives wait for it (posts keep table
		 * order) */
		if (a->op == PA_RECV && j > k && !x->posted[j] &&
		    (sends_to(x, k0, k, a->peer) || (sends_left && !sends_to(x, k, g, a->peer))))
			break;
		if (a->op == PA_RECV && j > k && !x->posted[j] && (free_now || l >= 0)) {
			uint32_t kind, idx;
			pipe_val_msg(&x->t, &a->val, &kind, &idx);
			/* its RecvReady rides on the gap's send to its stage
			 * when there is one (no write of its own) */
			rc = x->io->probe(x->io->ctx, x->stage_dev[a->peer], kind, idx,
					  free_now ? x->buf[b] : x->land[l], sizeof(float) * x->nf,
					  x->hold && sends_to(x, k, g, a->peer) ? PIPE_RR_RIDE :
					  x->later ? PIPE_RR_LATER : PIPE_RR_NOW);
			if (rc < 0)
				return rc;
			if (!free_now) {
				x->land_of[j] = (int8_t)l;
				x->land_busy[l] = true;
				x->landed_early++;
			}
			x->posted[j] = true;
			x->preposts++;
			out++;
			if (out > x->prepost_depth)
				x->prepost_depth = out;
		}
		for (int i = 0; i < 3; i++)
			if (a->buf[i] >= 0)
				x->named[a->buf[i]] = true;
	}
	return 0;
}

/* Whether this step fills receive waits: asked for, a transport that
 * probes, and a window that moves no layer weights (so a W needs none
 * of the window's collectives). */
static bool can_fill(const struct pipe_exec *x)
{
	return x->fill && x->io && x->io->probe && !win_moves(model_window(x->m), true) &&
	       pipe_split_backward(x->t.shape.sched);
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
	x->filling = can_fill(x);
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
	/* the leading gathers a prefetch started are in flight already */
	bool recvd = false;  /* a receive ran since the last compute */
	for (int k = x->npre; k < x->n && !rc; k++) {
		if (x->ran[k])
			continue;
		if (x->filling && x->a[k].op == PA_RECV)
			rc = fill_wait(x, k);
		/* which receives prepost posts where in a gap: before the
		 * gap's sends to their stage, the others after the sends;
		 * none once a receive of the gap ran (the compute after it
		 * is often what a waiting stage waits for: a post there,
		 * into the landing buffer that receive just freed, waits for
		 * the next gap) (bench/results/pipeline.md, inter10) */
		if (!rc && x->prepost && !recvd)
			rc = prepost(x, k);
		if (!rc)
			rc = run_action(x, &x->a[k]);
		recvd = x->a[k].op == PA_RECV || (recvd && !compute_op(x->a[k].op));
	}
	x->npre = 0;
	if (!rc && !(rc = win_scatter_finish(w)))
		rc = landed(x);
	int frc = io ? io->flush(io->ctx) : 0;
	x->gathers = win_gathers(w);
	int erc = model_step_end(x->m);
	return rc ? rc : frc ? frc : erc;
}
