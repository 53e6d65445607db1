/* The decoder of host/model/model.h: its life cycle, its activations
 * (sets of saved layer activations), and the stage calls (embedding, a
 * range of layers, the head; forward and backward) that the one step
 * driver, the pipeline executor (host/pipeline/exec.h), runs for every
 * step, with or without a pipeline. Placement comes from the sharding
 * rules through the planner (params.c); every parallelism is a plan
 * executed by the same code: gathered weights (window.c), partial sums
 * all-reduced, statistics split, tokens sent to their experts (layer.c,
 * moe.c). */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/model/linear.h"
#include "host/model/model_int.h"
#include "host/util/mem.h"
#include "kernels/kernels.h"
#include "net/coll.h"

/* ---- allocation ---- */

/* The activations (every layer's saved ones, the layer inputs inside a
 * call, the head's) and the backward's scratch, cut out of one
 * allocation.
 *
 * Saved layer activations come in act_sets sets (model_act_set picks the
 * one the next calls use), so a pipeline stage that keeps a chunk's
 * activations from its forward to its backward (pipeline_recompute:
 * false) holds one set per chunk in flight; with recompute one set does,
 * each chunk's forward being run again right before its backward. A set
 * stores act_layers layers: all L without a pipeline (every layer its
 * own), else the most one call runs (Lps, or the layers outside the
 * pipeline if more), layer l in storage l mod act_layers (the first layer
 * of that residue and kind, dense or MoE): what a layer saved is read
 * only by the backward of the call that saved it. A call runs at most
 * call_layers layers: act_layers on a pipeline stage, one without (the
 * executor's chunks are layers), and keeps the inputs of its layers after
 * the first in call_layers - 1 slots of its set. */

struct arena {
	char *base;
	size_t used;
};

static void *take(struct arena *a, size_t bytes)
{
	void *p = a->base ? a->base + a->used : NULL;
	a->used += (bytes + 63) & ~(size_t)63;
	return p;
}

#define TAKEF(a, n) ((float *)take(a, sizeof(float) * (size_t)(n)))
#define TAKEI(a, n) ((int32_t *)take(a, sizeof(int32_t) * (size_t)(n)))

/* The dims rotary embedding turns: every head dim, or latent
 * attention's rope part */
static int rope_dim(const struct model_dims *d)
{
	return d->mla ? d->Dr : d->D;
}

/* The parts a device's rows are cut into: the batch split's two halves
 * each have their own activations and scratch (bsplit.c). */
static int parts(const struct model_dims *d)
{
	return d->bsplit > 1 ? d->bsplit : 1;
}

/* The layer whose storage layer l uses: the first of its residue mod
 * act_layers and its kind (dense or MoE). */
static int act_share(const struct model *m, int l)
{
	int q = l % m->act_layers;
	while (q < l && (q < m->d.L_dense) != (l < m->d.L_dense))
		q += m->act_layers;
	return q;
}

/* The split backward's stashes (model_w_stash): wg_sets sets of one tape
 * per layer, shared by residue and kind as the activations are (the
 * layers of one call have their own), each sized for its kind. Only the
 * bytes are counted in a sizing pass. */
static void lay_out_stash(struct model *m, struct arena *a)
{
	int L = m->d.L;
	for (int k = 0; k < m->wg_sets; k++) {
		struct wg_tape **set = a->base ? m->wg_all + (size_t)k * L : NULL;
		for (int l = 0; l < L; l++) {
			int q = act_share(m, l);
			bool moe = l >= m->d.L_dense;
			if (q < l) {
				if (set)
					set[l] = set[q];
				continue;
			}
			int cap = wg_layer_entries(m, moe);
			size_t floats = wg_layer_floats(m, moe);
			struct wg_tape *t = take(a, sizeof(*t));
			struct wg_entry *e = take(a, sizeof(*e) * (size_t)cap);
			float *mem = TAKEF(a, floats);
			if (!set)
				continue;
			*t = (struct wg_tape){ .layer = -1, .cap = cap, .e = e, .mem = mem, .mcap = floats };
			set[l] = t;
		}
	}
}

/* One set's saved activations: m->la[0 .. L) (la_all of set k). */
static void lay_out_set(struct model *m, struct arena *a, struct layer_acts *la)
{
	const struct model_dims *d = &m->l;
	size_t N = (size_t)m->N, C = d->C, QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
	/* values and the attention's output: latent attention's heads are
	 * Dv wide, grouped-query ones D */
	size_t VD = d->mla ? (size_t)d->Hkv * d->Dv : KD, OD = d->mla ? (size_t)d->Hq * d->Dv : QD;
	size_t NK = N * (size_t)m->d.K, SF = (size_t)m->SF, R = m->rmax, E = m->d.E;
	size_t att = (size_t)m->B * d->Hq * d->T * d->T;

	for (int l = 0; l < d->L; l++) {
		struct layer_acts *x = &la[l];
		int q = act_share(m, l);
		if (q < l) {  /* shares layer q's storage */
			*x = la[q];
			continue;
		}
		x->ln1 = TAKEF(a, N * C);
		x->rstd1 = TAKEF(a, N);
		x->q = TAKEF(a, N * QD);
		x->k = TAKEF(a, N * KD);
		x->v = TAKEF(a, N * VD);
		x->att = TAKEF(a, att);
		x->atty = TAKEF(a, N * OD);
		if (d->mla) {
			if (d->Rq) {
				x->qa = TAKEF(a, N * d->Rq);
				x->qrstd = TAKEF(a, N);
				x->qn = TAKEF(a, N * d->Rq);
			}
			x->kva = TAKEF(a, N * (d->Rkv + d->Dr));
			x->kvrstd = TAKEF(a, N);
			x->kvn = TAKEF(a, N * d->Rkv);
		}
		x->xmid = TAKEF(a, N * C);
		x->ln2 = TAKEF(a, N * C);
		x->rstd2 = TAKEF(a, N);
		if (l < d->L_dense) {
			x->g = TAKEF(a, N * d->F);
			x->u = TAKEF(a, N * d->F);
			x->h = TAKEF(a, N * d->F);
		} else {
			x->scores = TAKEF(a, N * E);
			x->weights = TAKEF(a, NK);
			x->idx = TAKEI(a, NK);
			x->order = TAKEI(a, NK);
			x->offsets = TAKEI(a, E + 1);
			x->counts = TAKEI(a, E);
			x->xs = TAKEF(a, NK * C);
			x->eg = TAKEF(a, R * d->Fe);
			x->eu = TAKEF(a, R * d->Fe);
			x->eh = TAKEF(a, R * d->Fe);
			x->ey = TAKEF(a, NK * C);
			if (m->ep > 1) {
				x->xr = TAKEF(a, R * C);
				x->yr = TAKEF(a, R * C);
				x->cnt_all = TAKEI(a, (size_t)m->ep * E);
				x->send_b = take(a, sizeof(size_t) * (size_t)m->ep);
				x->recv_b = take(a, sizeof(size_t) * (size_t)m->ep);
			}
			if (SF) {
				x->sg = TAKEF(a, N * SF);
				x->su = TAKEF(a, N * SF);
				x->sh = TAKEF(a, N * SF);
			}
		}
	}
}

static void lay_out(struct model *m, struct arena *a)
{
	const struct model_dims *d = &m->l;
	size_t N = (size_t)m->N, C = d->C, QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
	size_t VD = d->mla ? (size_t)d->Hkv * d->Dv : KD, OD = d->mla ? (size_t)d->Hq * d->Dv : QD;
	size_t NK = N * (size_t)m->d.K, SF = (size_t)m->SF, R = m->rmax, E = m->d.E;
	size_t big = N * (size_t)d->F;
	if (m->d.L_moe) {
		big = big > R * (size_t)d->Fe ? big : R * (size_t)d->Fe;
		big = big > N * SF ? big : N * SF;
	}

	for (int k = 0; k < m->act_sets; k++) {
		m->resid_all[k] = TAKEF(a, (size_t)(m->call_layers - 1) * N * C);
		lay_out_set(m, a, m->la_all + (size_t)k * d->L);
	}
	/* model_forward's residual stream (a model without a pipeline; with
	 * the batch split, half 0's holds both halves' rows) */
	m->stream = m->pipe_stages > 1 || m->half ? NULL : TAKEF(a, 2 * N * C * (size_t)parts(&m->d));
	m->lnf = TAKEF(a, N * C);
	m->rstdf = TAKEF(a, N);
	m->nstat = TAKEF(a, 2 * N);
	m->xstat = TAKEF(a, N * (size_t)mesh_axes_size_or1(m, m->ax_vocab));
	m->logits = TAKEF(a, N * d->V);
	m->probs = TAKEF(a, N * d->V);
	m->losses = TAKEF(a, N);
	m->cos_t = TAKEF(a, (size_t)d->T * rope_dim(d) / 2);
	m->sin_t = TAKEF(a, (size_t)d->T * rope_dim(d) / 2);
	m->dresid = TAKEF(a, N * C);
	m->dln = TAKEF(a, N * C);
	m->dbig1 = TAKEF(a, big);
	m->dbig2 = TAKEF(a, big);
	m->dbig3 = TAKEF(a, big);
	m->dq = TAKEF(a, N * QD);
	m->dk = TAKEF(a, N * KD);
	m->dv = TAKEF(a, N * VD);
	m->dqr = TAKEF(a, N * QD);
	m->dkr = TAKEF(a, N * KD);
	m->datty = TAKEF(a, N * OD);
	if (d->mla) {
		m->dkvb = TAKEF(a, N * d->Hq * (d->Dn + d->Dv));
		m->dlat = TAKEF(a, N * (d->Rkv + d->Dr));
		m->dkva = TAKEF(a, N * d->Rkv);
		m->dqn = TAKEF(a, N * d->Rq);
		m->dqa = TAKEF(a, N * d->Rq);
	}
	m->att_scratch = TAKEF(a, (size_t)d->T * d->T + (size_t)d->T * d->D);
	m->dlogits = TAKEF(a, N * d->V);
	if (m->d.L_moe) {
		m->dscores = TAKEF(a, N * E);
		m->dlogits_r = TAKEF(a, N * E);
		m->dweights = TAKEF(a, NK);
		m->dxs = TAKEF(a, NK * C);
		m->dey = TAKEF(a, NK * C);
		if (m->ep > 1) {
			m->dxr = TAKEF(a, R * C);
			m->dyr = TAKEF(a, R * C);
		}
		m->counts_all = TAKEI(a, (size_t)d->L_moe * E);
		/* a pipeline sums the counts over `stage` too */
		uint32_t cax = m->rows | (m->pipe_stages > 1 ? 1u << AX_STAGE : 0);
		m->counts_tmp = TAKEI(a, (size_t)d->L_moe * E * (size_t)mesh_axes_size_or1(m, cax));
	}
	lay_out_stash(m, a);
}

/* Where the window finds layer l of parameter i (its id) here. */
static int win_slice(const void *ctx, int i, int l)
{
	return layer_slot(ctx, i, l);
}

/* The window over the gathered tensors, by parameter id; lays it out
 * (buffers: win_alloc). */
static int make_window(struct model *m)
{
	struct win_tensor t[P_COUNT];
	struct win_layout lo = { .lcap = 1, .windows = 1, .slice = win_slice, .ctx = m };
	for (int id = 0; id < P_COUNT; id++)
		t[id] = (struct win_tensor){ .p = m->pidx[id] >= 0 ? &m->p[id] : NULL, .pp = &m->pp[id] };
	/* a pipeline stage gathers the layers it runs in one iteration at
	 * once (or those outside the pipeline before it, or after it), and
	 * holds as many groups as its schedule's weight slots */
	if (m->pipe_stages > 1 && m->pipe_repeats >= 1) {
		int P = m->pipe_layers > 0 ? m->pipe_layers : m->d.L;
		int before = m->pipe_first, after = m->d.L - m->pipe_first - P;
		lo.lcap = P / (m->pipe_stages * m->pipe_repeats);
		lo.lcap = before > lo.lcap ? before : lo.lcap;
		lo.lcap = after > lo.lcap ? after : lo.lcap;
		lo.lcap = lo.lcap > 1 ? lo.lcap : 1;
		lo.windows = m->pipe_weight_slots > 1 ? m->pipe_weight_slots : 1;
		/* the layers outside hold one more (the table's first gather
		 * may be READY beside them) */
		lo.windows += before > 0 || after > 0;
	}
	m->win = win_new(m->mesh, m->device, t, P_COUNT, &lo);
	return m->win ? 0 : -ENOMEM;
}

/* The table, the plans and the layout; no buffers. NULL with *rc
 * (-EINVAL, -ENOMEM) and err. */
static struct model *model_make(const struct model_dims *d, const struct model_mesh *mm, int *rc,
				char *err, size_t errlen)
{
	struct model *m = params_make(d, mm, rc, err, errlen);
	if (m) {
		m->attn = d->mla ? &attn_mla : &attn_gqa;
		m->act_sets = mm && mm->pipe_act_sets > 1 ? mm->pipe_act_sets : 1;
		m->wg_sets = mm && mm->pipe_w_stashes > 0 ? mm->pipe_w_stashes : 0;
		m->wg_reads_acts = mm && mm->pipe_w_reads_acts;
	}
	if (m && make_window(m)) {
		snprintf(err, errlen, "model: out of memory for the plans");
		*rc = -ENOMEM;
		model_free(m);
		return NULL;
	}
	return m;
}

struct model *model_plan_new(const struct model_dims *d, const struct model_mesh *mm,
			     char *err, size_t errlen)
{
	int rc;
	return model_make(d, mm, &rc, err, errlen);
}

/* Layers whose saved activations a device stores: on a stage of a
 * pipeline, the most one call runs: Lps = P / (S R) pipelined layers, or
 * the layers outside the pipeline before it or after it (each run in one
 * call by a microbatch's owner); else L. */
static int act_layers(const struct model *m)
{
	int SR = m->pipe_stages * (m->pipe_repeats > 1 ? m->pipe_repeats : 1);
	int P = m->pipe_layers > 0 ? m->pipe_layers : m->d.L;
	if (m->pipe_stages < 2 || P % SR)
		return m->d.L;
	int before = m->pipe_first, after = m->d.L - m->pipe_first - P, n = P / SR;
	n = before > n ? before : n;
	return after > n ? after : n;
}

/* The rotary tables and the attention's score scale, as Hugging Face
 * computes them (docs/deepseek.md#yarn): YaRN multiplies cos and sin by
 * mscale(f, mscale) / mscale(f, mscale_all_dim) when both are set, else
 * by mscale(f, 1), and latent attention's scale 1/sqrt(Dn + Dr) by
 * mscale(f, mscale_all_dim)^2 when that is set; Llama's scale stays
 * 1/sqrt(D). */
static void rope_tables(struct model *m)
{
	const struct model_dims *d = &m->d;
	int D = rope_dim(d);
	m->att_scale = 1.0f / sqrtf((float)d->D);
	if (!d->yarn) {
		rope_table(m->cos_t, m->sin_t, d->T, D, d->theta);
		return;
	}
	float f = d->rope_factor, mult = rope_yarn_mscale(f, 1.0f);
	if (d->mscale && d->mscale_all_dim)
		mult = rope_yarn_mscale(f, d->mscale) / rope_yarn_mscale(f, d->mscale_all_dim);
	rope_table_yarn(m->cos_t, m->sin_t, d->T, D, d->theta, f, d->rope_orig, d->beta_fast, d->beta_slow,
			mult);
	if (d->mla && d->mscale_all_dim) {
		double ms = rope_yarn_mscale(f, d->mscale_all_dim);
		m->att_scale = (float)(ms * ms / sqrt((double)d->D));
	}
}

/* The rows every buffer is sized for: B sequences. */
static void size_rows(struct model *m, int B)
{
	const struct model_dims *d = &m->d;
	m->rmax = (size_t)m->ep * (size_t)B * d->T * (size_t)(d->L_moe ? d->K : 1);
	m->B = B;
	m->N = B * d->T;
	if (m->rmax == 0)
		m->rmax = 1;
	m->act_layers = act_layers(m);
	m->call_layers = m->pipe_stages > 1 ? m->act_layers : 1;
}

/* The sets' tables of saved activations (lay_out fills them). */
static int alloc_sets(struct model *m)
{
	m->la_all = calloc((size_t)m->d.L * (size_t)m->act_sets, sizeof(*m->la_all));
	m->resid_all = calloc((size_t)m->act_sets, sizeof(*m->resid_all));
	m->wg_all = calloc((size_t)m->d.L * (size_t)m->wg_sets + 1, sizeof(*m->wg_all));
	return m->la_all && m->resid_all && m->wg_all ? 0 : -ENOMEM;
}

static void free_sets(struct model *m)
{
	free(m->la_all);
	free(m->resid_all);
	free(m->wg_all);
	m->la_all = NULL;
	m->resid_all = NULL;
	m->wg_all = NULL;
}

size_t model_activation_bytes(struct model *m, int B)
{
	if (m->act_mem)
		return m->act_bytes;
	struct arena a = { 0 };
	size_rows(m, B / parts(&m->d));
	if (!alloc_sets(m)) {
		lay_out(m, &a);
		m->half = parts(&m->d) > 1;  /* the second half's, if any */
		if (m->half)
			lay_out(m, &a);
		m->half = 0;
	}
	free_sets(m);
	return a.used;
}

/* The batch split: what keeps a device's rows from being cut in two
 * halves staggered through the layers, as a config error in err (the
 * keys' own checks are model_dims_from_cfg's). */
static int split_refusal(const struct model *m, int B, char *err, size_t errlen)
{
	if (B % 2) {
		snprintf(err, errlen, "config: key 'batch_split_factor' (2) must divide the %d rows a device "
			 "computes", B);
		return -EINVAL;
	}
	if (m->pipe_stages > 1) {
		snprintf(err, errlen, "config: key '%s' does not run beside pipeline parallelism "
			 "(ici_/dcn_pipeline_parallelism=%d)",
			 m->d.bsplit_sched ? "use_batch_split_schedule" : "batch_split_factor", m->pipe_stages);
		return -EINVAL;
	}
	return 0;
}

/* The second half of a batch-split model: a copy of m (half 0, laid out
 * for B/2 rows) with its own activations, scratch and rotary tables,
 * sharing the rest (weights, window, plans, one set of expert counts).
 * 0 or -ENOMEM. */
static int split_open(struct model *m)
{
	struct model *h = malloc(sizeof(*h));
	if (!h)
		return -ENOMEM;
	*h = *m;
	h->half = 1;
	h->la_all = NULL;
	h->resid_all = NULL;
	h->cnt2 = NULL;
	if (m->ep > 1 && m->d.L_moe &&
	    !(m->cnt2 = malloc(sizeof(int32_t) * 2 * (size_t)m->d.E * (size_t)(m->ep + 1))))
		goto oom;
	struct arena a = { 0 };
	if (alloc_sets(h))
		goto oom;
	lay_out(h, &a);  /* sizing pass */
	h->act_bytes = a.used;
	if (!(h->act_mem = aligned_alloc(64, a.used)))
		goto oom;
	memset(h->act_mem, 0, a.used);
	a = (struct arena){ .base = h->act_mem };
	lay_out(h, &a);
	model_act_set(h, 0);
	rope_tables(h);
	/* the second half's forward adds its counts to the first's */
	h->counts_all = m->counts_all;
	h->counts_tmp = m->counts_tmp;
	h->counts_how = MODEL_COUNTS_ADD;
	m->other = h;
	m->stagger = h->stagger = m->d.bsplit_sched;
	m->fwd_left = m->bwd_early = -1;
	m->act_bytes += h->act_bytes;
	return 0;
oom:
	free(m->cnt2);
	m->cnt2 = NULL;
	free_sets(h);
	free(h);
	return -ENOMEM;
}

static void split_free(struct model *m)
{
	if (!m->other)
		return;
	free(m->cnt2);
	m->cnt2 = NULL;
	free(m->other->act_mem);
	free_sets(m->other);
	free(m->other);
	m->other = NULL;
}

/* The bytes of params and of grads. */
static size_t m_pbytes(const struct model *m)
{
	return ((m->numel * sizeof(float)) + 63) & ~(size_t)63;
}

int model_open(struct model **out, const struct model_dims *d, int B, const struct model_mesh *mm,
	       char *err, size_t errlen)
{
	int rc;
	struct model *m = model_make(d, mm, &rc, err, errlen);
	*out = NULL;
	if (!m)
		return rc;
	if (parts(d) > 1 && (rc = split_refusal(m, B, err, errlen))) {
		model_free(m);
		return rc;
	}
	size_rows(m, B / parts(d));
	struct arena a = { 0 };
	size_t pbytes = m_pbytes(m);
	if (alloc_sets(m))
		goto oom;
	lay_out(m, &a);                 /* sizing pass */
	m->act_bytes = a.used;
	/* zeroed and populated on the loading threads (host/util/mem.h) */
	m->params = util_big_alloc(pbytes);
	m->grads = util_big_alloc(pbytes);
	m->act_mem = aligned_alloc(64, a.used);
	if (!m->params || !m->grads || !m->act_mem)
		goto oom;
	if (win_alloc(m->win, m->params, m->grads)) {
		snprintf(err, errlen, "model: out of memory: %zu bytes for the gathered FSDP window",
			 model_window_numel(m) * sizeof(float));
		model_free(m);
		return -ENOMEM;
	}
	memset(m->act_mem, 0, a.used);
	a.base = m->act_mem;
	a.used = 0;
	lay_out(m, &a);
	model_act_set(m, 0);
	if (m->wg_sets)
		model_w_stash(m, 0);
	rope_tables(m);
	if (parts(d) > 1 && split_open(m))
		goto oom;
	*out = m;
	return 0;
oom:
	/* the bytes asked for: what does not fit is the model, not the config */
	snprintf(err, errlen, "model: out of memory: %zu bytes asked for (parameters and gradients "
		 "%zu each, activations %zu for %d sequences of %d tokens)",
		 2 * pbytes + m->act_bytes * parts(d), pbytes, m->act_bytes * parts(d), B, d->T);
	model_free(m);
	return -ENOMEM;
}

struct model *model_new(const struct model_dims *d, int B, const struct model_mesh *mm,
			char *err, size_t errlen)
{
	struct model *m;
	return model_open(&m, d, B, mm, err, errlen) ? NULL : m;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	split_free(m);
	win_free(m->win);
	free(m->act_mem);
	util_big_free(m->params, m_pbytes(m));
	util_big_free(m->grads, m_pbytes(m));
	free(m->la_all);
	free(m->resid_all);
	free(m->wg_all);
	params_free(m);
	free(m);
}

float *model_params(struct model *m) { return m->params; }
float *model_grads(struct model *m) { return m->grads; }
size_t model_numel(const struct model *m) { return m->numel; }
const int32_t *model_expert_counts(const struct model *m) { return m->counts_all; }
size_t model_window_numel(const struct model *m) { return win_numel(m->win); }
struct win *model_window(struct model *m) { return m->win; }

/* Grouped-query attention in four parts (model_set_parts): where each
 * projection is gathered and its block on a member is above the comm's
 * direct-exchange size (a smaller part's collective would take the
 * direct exchange, which sums in another order than the ring the whole
 * attention block's takes: another bit). */
static bool fine_parts(const struct model *m)
{
	static const int proj[] = { P_WQ, P_WK, P_WV, P_WO };
	if (m->l.mla)
		return false;
	for (size_t j = 0; j < sizeof(proj) / sizeof(proj[0]); j++)
		if (m->pidx[proj[j]] < 0 || !m->pp[proj[j]].gather ||
		    param_slice_numel(&m->p[proj[j]]) * sizeof(float) <= COLL_DIRECT_MAX_DEFAULT)
			return false;
	return true;
}

/* Each tensor's part (model_set_parts): in every layer (part), in layer
 * 0 (part0), and of the gradients of a stage's last W's layer (partw:
 * layer 0's with the down projection a part of its own, 5, sent as soon
 * as the W has written it; part_down). */
static bool part_maps(const struct model *m, signed char *part, signed char *part0, signed char *partw)
{
	bool fine = fine_parts(m);
	int ffn = fine ? 4 : 1;
	for (int id = 0; id < P_COUNT; id++)
		part[id] = model_ffn_id(id) ? ffn : 0;
	/* only layer 0's: the step's first forward and last backward, the
	 * boundary; the other layers' attention blocks move as one part,
	 * under compute either way (each part is a collective more) */
	memcpy(part0, part, P_COUNT);
	if (fine) {
		part0[P_WK] = 1;
		part0[P_WV] = 2;
		part0[P_WO] = 3;
	}
	memcpy(partw, part0, P_COUNT);
	if (fine)
		partw[P_W_DOWN] = 5;
	return fine;
}

int model_set_parts(struct model *m, bool on, int (*mid)(void *ctx, int l, bool backward, unsigned parts),
		    void *ctx)
{
	signed char part[P_COUNT], part0[P_COUNT], partw[P_COUNT];
	bool fine = part_maps(m, part, part0, partw);
	m->mid = on ? mid : NULL;
	m->mid_ctx = on ? ctx : NULL;
	/* the down projection's part (5) is the feed-forward block's too:
	 * empty but where win_set_fine cuts it apart */
	m->part_down = fine ? 1u << 5 : 0;
	m->part_ffn = 1u << (fine ? 4 : 1) | m->part_down;
	m->part_att = fine ? 1u << 3 | 1u << 0 | 1u << 1 : 0;
	m->fine_l = -1;
	return m->win ? win_set_parts(m->win, on ? part : NULL, part0) : 0;
}

void model_set_fine(struct model *m, int l)
{
	signed char part[P_COUNT], part0[P_COUNT], partw[P_COUNT];
	bool fine = part_maps(m, part, part0, partw) && m->mid;
	m->fine_l = fine ? l : -1;
	if (m->win)
		win_set_fine(m->win, m->fine_l, fine ? partw : NULL);
}

int model_part_steps(const struct model *m, int l, bool backward, double *share, unsigned *mask)
{
	const struct model_dims *d = &m->l;
	double b = model_ffn_share(m, l), C = d->C, T = d->T;
	double q = C * d->Hq * d->D, k = C * d->Hkv * d->D, core = T * d->Hq * d->D, att = 2 * q + 2 * k + core;
	if (backward ? !model_fine_grads(m, l) : !m->part_att || l != 0) {  /* two: the blocks */
		share[0] = backward ? b : 1 - b;
		share[1] = 1 - share[0];
		mask[0] = m->part_ffn;
		mask[1] = 0;
		return 2;
	}
	/* the attention block's (1 - b) cut as its FLOPs are */
	double f = att > 0 ? (1 - b) / att : 0;
	if (!backward) {
		/* wq's projection, wk's, wv's and the scores, wo's, the MLP */
		double sh[5] = { q * f, k * f, (k + core) * f, q * f, b };
		unsigned mk[5] = { 1u << 1, 1u << 2, 1u << 3, m->part_ffn, 0 };
		memcpy(share, sh, sizeof(sh));
		memcpy(mask, mk, sizeof(mk));
		return 5;
	}
	/* the MLP; wo, the scores, wq, wk; wv */
	double sh[3] = { b, (q + core + q + k) * f, k * f };
	unsigned mk[3] = { m->part_ffn, m->part_att, 0 };
	memcpy(share, sh, sizeof(sh));
	memcpy(mask, mk, sizeof(mk));
	return 3;
}

/* The feed-forward block's share of layer l's matmul FLOPs, with the
 * attention's scores and values (scores) or without (a W's weight
 * gradients alone). */
static double ffn_share(const struct model *m, int l, bool scores)
{
	const struct model_dims *d = &m->l;
	double C = d->C, T = scores ? d->T : 0, att, ffn;
	if (d->mla)
		att = (d->Rq ? C * d->Rq + (double)d->Rq * d->Hq * (d->Dn + d->Dr) : C * d->Hq * (d->Dn + d->Dr)) +
		      C * (d->Rkv + d->Dr) + (double)d->Rkv * d->Hq * (d->Dn + d->Dv) + (double)d->Hq * d->Dv * C +
		      T / 2 * d->Hq * (d->Dn + d->Dr + d->Dv);
	else
		att = C * d->Hq * d->D * 2 + C * d->Hkv * d->D * 2 + T / 2 * d->Hq * d->D * 2;
	if (l < d->L_dense)
		ffn = 3 * C * d->F;
	else
		ffn = 3 * C * ((double)d->K * d->Fe + (d->S ? m->SF : 0)) + C * d->E;
	return att + ffn > 0 ? ffn / (att + ffn) : 0;
}

double model_ffn_share(const struct model *m, int l)
{
	return ffn_share(m, l, true);
}

int model_part_steps_w(const struct model *m, int l, double *share, unsigned *mask)
{
	const struct model_dims *d = &m->l;
	double q = (double)d->C * d->Hq * d->D, k = (double)d->C * d->Hkv * d->D, b = ffn_share(m, l, false);
	int n = 0;
	if (model_fine_down(m, l)) {
		/* the down projection's weight gradient, a third of the
		 * dense MLP's (recorded first: ffn_backward) */
		share[n] = b / 3;
		mask[n++] = m->part_down;
		b -= b / 3;
	}
	share[n] = b;
	mask[n++] = m->part_ffn;
	b = 1 - ffn_share(m, l, false);
	if (!model_fine_grads(m, l)) {
		share[n] = b;
		mask[n++] = 0;
		return n;
	}
	/* the attention's weight gradients as the tape runs them: wo's,
	 * wq's and wk's, then mid with their parts; wv's */
	share[n] = b * (2 * q + k) / (2 * q + 2 * k);
	mask[n++] = m->part_att;
	share[n] = b - share[n - 1];
	mask[n++] = 0;
	return n;
}
int model_act_sets(const struct model *m) { return m->act_sets; }

size_t model_layer_act_bytes(const struct model_dims *d, int rows, bool moe)
{
	size_t N = (size_t)rows * d->T, C = d->C, QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
	size_t f = 3 * N * C + 2 * N + 2 * N * QD + 2 * N * KD + (size_t)rows * d->Hq * d->T * d->T;
	if (!moe)
		return sizeof(float) * (f + 3 * N * (size_t)d->F);
	size_t NK = N * (size_t)d->K, E = d->E;
	f += N * E + NK + 2 * NK * C + 3 * NK * (size_t)d->Fe + 3 * N * (size_t)d->Fe * (size_t)d->S;
	return sizeof(float) * f + sizeof(int32_t) * (2 * NK + 2 * E + 1);
}

void model_act_set(struct model *m, int k)
{
	assert(k >= 0 && k < m->act_sets);
	struct layer_acts *la = m->la_all + (size_t)k * m->d.L;
	if (m->other && la != m->la) {
		bsplit_flush(m);  /* what is left to finish is in the set in use */
		model_act_set(m->other, k);
	}
	m->la = la;
	m->resid = m->resid_all[k];
}

/* ---- stage calls ---- */

void model_step_begin(struct model *m, struct model_step *st)
{
	m->st = st;
	m->hook_rc = 0;
	/* no weight backward is pending from an earlier (failed) step */
	for (size_t i = 0; i < (size_t)m->wg_sets * m->d.L; i++)
		m->wg_all[i]->layer = -1;
	st->aux = 0;
	if (m->other) {
		m->other->st = st;
		m->other->hook_rc = 0;
		bsplit_step_begin(m);
	}
	win_begin(m->win, st->comm, &m->hook_rc);
}

int model_step_end(struct model *m)
{
	if (m->other)  /* after a failure exchanges may still be in flight */
		bsplit_step_end(m);
	return win_end(m->win);
}

/* Half k of a batch-split model m (m itself for k = 0, or unsplit). */
static struct model *half_of(struct model *m, int k)
{
	return k ? m->other : m;
}

/* Floats of a half's rows of width C (the whole device's rows unsplit). */
static size_t half_nc(const struct model *m)
{
	return (size_t)m->N * m->l.C;
}

int model_embed_forward(struct model *m, float *x0, const int32_t *inputs)
{
	for (int k = 0; k < parts(&m->d); k++) {
		struct model *h = half_of(m, k);
		int N = h->N, C = h->l.C;
		half_enter(m, h);
		/* this device's rows of the table (all of them unless split) */
		embedding_forward_range(x0 + k * half_nc(m), inputs + (size_t)k * N, WP(P_EMBED, 0), m->v0e,
					m->Ve, N, C);
		psum(h, m->pl[P_EMBED].reduce, x0 + k * half_nc(m), (size_t)N * C);
		half_leave(m, h);
	}
	return m->hook_rc;
}

int model_embed_backward(struct model *m, const float *dx0, const int32_t *inputs)
{
	for (int k = 0; k < parts(&m->d); k++)
		embedding_backward_range(GP(P_EMBED, 0), dx0 + k * half_nc(m), inputs + (size_t)k * m->N, m->v0e,
					 m->Ve, m->N, m->l.C);
	return m->hook_rc;
}

/* Layer l's input: the call's x for its first layer, else the set's slot
 * for it. */
static float *layer_input(struct model *m, int l, int l0, const float *x)
{
	return l == l0 ? (float *)x : m->resid + (size_t)(l - l0 - 1) * m->N * m->l.C;
}

int model_layers_forward(struct model *m, int l0, int l1, float *y, const float *x)
{
	assert(0 <= l0 && l0 < l1 && l1 <= m->d.L && l1 - l0 <= m->call_layers);
	if (m->other)
		return bsplit_layers_forward(m, l0, l1, y, x);
	for (int l = l0; l < l1; l++)
		layer_forward(m, l, l + 1 == l1 ? y : layer_input(m, l + 1, l0, x), layer_input(m, l, l0, x));
	return m->hook_rc;
}

int model_layers_backward(struct model *m, int l0, int l1, float *d, const float *x)
{
	assert(0 <= l0 && l0 < l1 && l1 <= m->d.L && l1 - l0 <= m->call_layers);
	if (m->other)
		return bsplit_layers_backward(m, l0, l1, d, x);
	for (int l = l1 - 1; l >= l0; l--)
		layer_backward(m, l, d, layer_input(m, l, l0, x));
	return m->hook_rc;
}

int model_w_stashes(const struct model *m) { return m->wg_sets; }

void model_w_stash(struct model *m, int k)
{
	assert(k >= 0 && k < m->wg_sets);
	m->wg_set = m->wg_all + (size_t)k * m->d.L;
}

int model_layers_backward_input(struct model *m, int l0, int l1, float *dx, const float *dy, const float *x)
{
	assert(0 <= l0 && l0 < l1 && l1 <= m->d.L && l1 - l0 <= m->call_layers && m->wg_set);
	if (dx != dy)
		memcpy(dx, dy, sizeof(float) * (size_t)m->N * m->l.C);
	for (int l = l1 - 1; l >= l0; l--) {
		wg_record(m, m->wg_set[l], l);
		layer_backward(m, l, dx, layer_input(m, l, l0, x));
	}
	wg_record(m, NULL, 0);
	return m->hook_rc;
}

int model_layers_backward_weight(struct model *m, int l0, int l1, const float *dy, const float *x)
{
	/* what they fed is in the tapes (copies, or with pipe_w_reads_acts
	 * the pointers the input backward was given) */
	(void)dy, (void)x;
	assert(0 <= l0 && l0 < l1 && l1 <= m->d.L && l1 - l0 <= m->call_layers && m->wg_set);
	for (int l = l1 - 1; l >= l0; l--)
		wg_replay(m, m->wg_set[l], l);
	return m->hook_rc;
}

static int head_id(const struct model *m)
{
	return m->d.tied ? P_EMBED : P_LM_HEAD;
}

/* Cross-entropy over the (possibly split) vocabulary; returns the sum of
 * the token losses. */
static double xent_forward(struct model *m, const int32_t *targets)
{
	int N = m->N, V = m->l.V;
	if (!m->ax_vocab)
		return softmax_xent_forward(m->losses, m->probs, m->logits, targets, N, V) * N;
	const struct model_comm *c = m->st->comm;
	float *mx = m->nstat;
	xent_split_max(mx, m->logits, N, V);
	if (!m->hook_rc)
		m->hook_rc = c->all_gather(c->ctx, m->ax_vocab, m->xstat, mx, sizeof(float) * (size_t)N);
	if (m->hook_rc)
		return 0;
	int n = mesh_axes_size(m->mesh, m->ax_vocab);
	for (int i = 0; i < N; i++)
		for (int r = 0; r < n; r++)
			mx[i] = fmaxf(mx[i], m->xstat[(size_t)r * N + i]);
	float *st = m->xstat;  /* the gathered maxima are consumed */
	xent_split_sums(st, m->probs, m->logits, mx, targets, m->v0, N, V);
	psum(m, m->ax_vocab, st, 2 * (size_t)N);
	if (m->hook_rc)
		return 0;
	return xent_split_finish(m->losses, m->probs, mx, st, targets, N, V);
}

static double head_forward(struct model *m, const float *x, const int32_t *targets)
{
	int N = m->N, C = m->l.C;
	norm_forward(m, m->lnf, m->rstdf, x, WP(P_FINAL_NORM, 0));
	linear_forward(m->logits, m->lnf, WP(head_id(m), 0), N, C, m->l.V);
	psum(m, m->pl[P_LM_HEAD].reduce, m->logits, (size_t)N * m->l.V);
	return xent_forward(m, targets);
}

int model_head_forward(struct model *m, double *loss_sum, const float *x, const int32_t *targets)
{
	*loss_sum = 0;
	if (m->other)
		bsplit_flush(m);  /* the last layer's second half */
	for (int k = 0; k < parts(&m->d); k++) {
		struct model *h = half_of(m, k);
		half_enter(m, h);
		*loss_sum += head_forward(h, x + k * half_nc(m), targets + (size_t)k * m->N);
		half_leave(m, h);
	}
	return m->hook_rc;
}

static void head_backward(struct model *m, float *dx, const float *x, const int32_t *targets)
{
	int N = m->N, C = m->l.C, V = m->l.V;
	memset(m->dlogits, 0, sizeof(float) * (size_t)N * V);
	xent_split_backward(m->dlogits, m->probs, targets, m->v0, m->st->loss_scale, N, V);
	memset(m->dln, 0, sizeof(float) * (size_t)N * C);
	linear_backward(m->dln, GP(head_id(m), 0), m->dlogits, m->lnf, WP(head_id(m), 0), N, C, V);
	psum(m, m->pl[P_LM_HEAD].dx_reduce, m->dln, (size_t)N * C);
	memset(dx, 0, sizeof(float) * (size_t)N * C);
	norm_backward(m, dx, GP(P_FINAL_NORM, 0), m->dln, x, WP(P_FINAL_NORM, 0), m->rstdf);
}

int model_head_backward(struct model *m, float *dx, const float *x, const int32_t *targets)
{
	for (int k = 0; k < parts(&m->d); k++) {
		struct model *h = half_of(m, k);
		half_enter(m, h);
		head_backward(h, dx + k * half_nc(m), x + k * half_nc(m), targets + (size_t)k * m->N);
		half_leave(m, h);
	}
	return m->hook_rc;
}

/* ---- forward only ---- */

int model_forward(struct model *m, const int32_t *inputs, const int32_t *targets,
		  struct model_step *st)
{
	struct win *w = m->win;
	float *x = m->stream, *y = m->stream + half_nc(m) * parts(&m->d);
	assert(x);  /* a model without a pipeline */
	model_step_begin(m, st);
	model_act_set(m, 0);
	win_gather_start(w, 0, WIN_NONLAYER, 0);
	win_wait(w, 0);
	model_embed_forward(m, x, inputs);
	for (int l = 0; l < m->d.L; l++) {
		win_gather_start(w, 1, l, l + 1);
		win_wait(w, 1);
		model_layers_forward(m, l, l + 1, y, x);
		win_release(w, 1);
		float *t = x;
		x = y;
		y = t;
	}
	model_head_forward(m, &st->loss_sum, x, targets);
	return model_step_end(m);
}

void model_count_experts(struct model *m, enum model_counts how)
{
	m->counts_how = how;
	/* the batch split's second half adds its counts to the first's */
	if (m->other)
		m->other->counts_how = how == MODEL_COUNTS_SET ? MODEL_COUNTS_ADD : how;
}

void model_zero_counts(struct model *m)
{
	if (m->counts_all)
		memset(m->counts_all, 0, sizeof(int32_t) * (size_t)m->d.L_moe * m->d.E);
}

/* MoE expert counts between forward and backward, summed over every
 * device with other rows (exact integers, added in rank order), so the
 * load-balance loss is that of the global batch. */
int model_sum_counts(struct model *m, uint32_t axes)
{
	const struct model_comm *c = m->st->comm;
	int n = m->d.L_moe * m->d.E, reps = mesh_axes_size_or1(m, axes);
	if (m->other)
		bsplit_flush(m);  /* the last layer's second half records its counts */
	if (!m->d.L_moe || !axes || m->hook_rc)
		return m->hook_rc;
	m->hook_rc = c->all_gather(c->ctx, axes, m->counts_tmp, m->counts_all, sizeof(int32_t) * (size_t)n);
	for (int i = 0; !m->hook_rc && i < n; i++) {
		int32_t s = 0;
		for (int r = 0; r < reps; r++)
			s += m->counts_tmp[(size_t)r * n + i];
		m->counts_all[i] = s;
	}
	return m->hook_rc;
}
