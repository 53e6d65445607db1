/* The decoder of host/model.h on one device's rows. Every linear layer goes
 * through linear_forward/linear_backward (host/linear.h), the one entry
 * point the sharded-matmul planner takes over. */
#include "host/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/linear.h"
#include "kernels/kernels.h"

enum {
	P_EMBED, P_ATTN_NORM, P_WQ, P_WK, P_WV, P_WO, P_MLP_NORM,
	P_W_GATE, P_W_UP, P_W_DOWN,
	P_ROUTER, P_ROUTER_BIAS, P_E_GATE, P_E_UP, P_E_DOWN,
	P_S_GATE, P_S_UP, P_S_DOWN,
	P_FINAL_NORM, P_LM_HEAD, P_COUNT
};

/* Saved activations of one layer (pointers into one allocation). */
struct layer_acts {
	float *ln1, *rstd1, *q, *k, *v, *att, *atty, *xmid, *ln2, *rstd2;
	/* dense */
	float *g, *u, *h;
	/* moe */
	float *scores, *weights, *xs, *eg, *eu, *eh, *ey, *sg, *su, *sh;
	int32_t *idx, *order, *offsets, *counts;
	/* expert parallelism: rows received for this device's experts (from
	 * each source device, by expert), their outputs, and the exchange */
	float *xr, *yr;
	int32_t *cnt_all;           /* [ep, E] every device's per-expert counts */
	size_t *send_b, *recv_b;    /* [ep] bytes of rows to/from each device */
};

struct model {
	struct model_dims d;        /* the whole model */
	struct model_dims l;        /* this device's part (tensor parallelism) */
	int tp, tpr;
	int ep, epr, El;            /* expert parallelism: El of E experts here */
	int tt, ttr;                /* tensor-transpose: the embedding split over tt */
	int mp, mpr;                /* the one model-parallel split: tp, ep or tt */
	float *nstat;               /* [N] split-norm statistics */
	size_t rmax;                /* rows an expert device may receive */
	struct model_step *st;      /* hooks of the step in progress */
	int hook_rc;
	int B, N;
	struct param_info p[P_COUNT];
	int pidx[P_COUNT];          /* index into the table or -1 */
	struct param_info table[MODEL_MAX_PARAMS];
	int ntable;
	size_t numel;
	float *params, *grads;
	/* activations */
	float *resid;               /* [L+1, N, C] */
	struct layer_acts *la;
	float *lnf, *rstdf, *logits, *probs, *losses;
	float *cos_t, *sin_t;
	/* backward scratch */
	float *dresid, *dln, *dbig1, *dbig2, *dbig3, *dq, *dk, *dv, *dqr, *dkr, *datty,
	      *att_scratch, *dlogits, *dscores, *dweights, *dxs, *dey, *dlogits_r, *dxr, *dyr;
	int32_t *counts_all;        /* [L_moe, E] */
	void *act_mem;
	size_t act_bytes;
};

/* ---- dims ---- */

int model_dims_from_cfg(struct model_dims *d, const struct cfg *c, char *err, size_t errlen)
{
	memset(d, 0, sizeof(*d));
#define NEED(cond, ...) do { if (!(cond)) { snprintf(err, errlen, "config: " __VA_ARGS__); return -EINVAL; } } while (0)
	NEED(c->vocab_size >= 2 && c->vocab_size <= (1 << 24), "key 'vocab_size' must be in [2, 2^24], got %lld", c->vocab_size);
	NEED(c->base_emb_dim >= 1 && c->base_emb_dim <= 65536, "key 'base_emb_dim' must be in [1, 65536], got %lld", c->base_emb_dim);
	NEED(c->max_target_length >= 1 && c->max_target_length <= 65536, "key 'max_target_length' must be in [1, 65536], got %lld", c->max_target_length);
	NEED(c->base_num_decoder_layers >= 1 && c->base_num_decoder_layers <= 1024, "key 'base_num_decoder_layers' must be in [1, 1024], got %lld", c->base_num_decoder_layers);
	NEED(c->base_num_query_heads >= 1, "key 'base_num_query_heads' must be >= 1, got %lld", c->base_num_query_heads);
	NEED(c->base_num_kv_heads >= 1 && c->base_num_query_heads % c->base_num_kv_heads == 0,
	     "key 'base_num_kv_heads' (%lld) must divide 'base_num_query_heads' (%lld)",
	     c->base_num_kv_heads, c->base_num_query_heads);
	if (c->head_dim == 0)
		NEED(c->base_emb_dim % c->base_num_query_heads == 0,
		     "key 'base_num_query_heads' (%lld) must divide 'base_emb_dim' (%lld) when 'head_dim' is 0",
		     c->base_num_query_heads, c->base_emb_dim);
	d->D = c->head_dim ? (int)c->head_dim : (int)(c->base_emb_dim / c->base_num_query_heads);
	NEED(d->D >= 2 && d->D % 2 == 0, "head dim must be even for RoPE, got %d (keys 'head_dim', 'base_emb_dim')", d->D);
	NEED(c->base_mlp_dim >= 1, "key 'base_mlp_dim' must be >= 1, got %lld", c->base_mlp_dim);
	NEED(c->num_experts >= 1 && c->num_experts <= 1024, "key 'num_experts' must be in [1, 1024], got %lld", c->num_experts);
	NEED(c->per_device_batch_size >= 1, "key 'per_device_batch_size' must be >= 1, got %lld", c->per_device_batch_size);
	d->V = (int)c->vocab_size;
	d->C = (int)c->base_emb_dim;
	d->T = (int)c->max_target_length;
	d->L = (int)c->base_num_decoder_layers;
	d->Hq = (int)c->base_num_query_heads;
	d->Hkv = (int)c->base_num_kv_heads;
	d->F = (int)c->base_mlp_dim;
	d->eps = (float)c->normalization_layer_epsilon;
	d->theta = (float)c->rope_max_timescale;
	d->tied = c->logits_via_embedding;
	if (c->num_experts > 1) {
		NEED(c->num_experts_per_tok >= 1 && c->num_experts_per_tok <= c->num_experts,
		     "key 'num_experts_per_tok' must be in [1, num_experts=%lld], got %lld",
		     c->num_experts, c->num_experts_per_tok);
		NEED(c->first_num_dense_layers >= 0 && c->first_num_dense_layers < c->base_num_decoder_layers,
		     "key 'first_num_dense_layers' must be in [0, layers), got %lld", c->first_num_dense_layers);
		NEED(c->shared_experts >= 0 && c->shared_experts <= 64, "key 'shared_experts' must be in [0, 64], got %lld", c->shared_experts);
		NEED(c->base_moe_mlp_dim >= 0, "key 'base_moe_mlp_dim' must be >= 0, got %lld", c->base_moe_mlp_dim);
		d->E = (int)c->num_experts;
		d->K = (int)c->num_experts_per_tok;
		d->L_dense = (int)c->first_num_dense_layers;
		d->L_moe = d->L - d->L_dense;
		d->Fe = c->base_moe_mlp_dim ? (int)c->base_moe_mlp_dim : d->F;
		d->S = (int)c->shared_experts;
		if (!strcmp(c->routed_score_func, "softmax"))
			d->moe_score = MOE_SOFTMAX;
		else if (!strcmp(c->routed_score_func, "sigmoid"))
			d->moe_score = MOE_SIGMOID;
		else
			NEED(0, "key 'routed_score_func' must be softmax or sigmoid, got '%s'", c->routed_score_func);
		d->norm_topk = c->norm_topk_prob;
		d->router_bias = c->routed_bias;
		d->routed_scale = (float)c->routed_scaling_factor;
		d->lb_weight = (float)c->load_balance_loss_weight;
	} else {
		d->E = 1;
		d->L_dense = d->L;
	}
#undef NEED
	return 0;
}

/* ---- parameter table ---- */

static void add_param(struct model *m, int id, const char *name, enum param_opt opt, bool decay,
		      int ndim, const int *shape, const char *const *axes, int shard_dim)
{
	struct param_info *p = &m->p[id];
	size_t n = 1;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = ndim;
	p->shard_dim = m->mp > 1 ? shard_dim : -1;
	p->nshard = p->shard_dim >= 0 ? m->mp : 1;
	p->shard_idx = p->shard_dim >= 0 ? m->mpr : 0;
	for (int i = 0; i < ndim; i++) {
		p->shape[i] = shape[i];
		p->global_shape[i] = shape[i] * (i == p->shard_dim ? p->nshard : 1);
		p->axes[i] = axes[i];
		n *= (size_t)shape[i];
	}
	p->numel = n;
	p->opt = opt;
	p->decay = decay;
	if (ndim >= 2) {
		p->mat_rows = shape[ndim - 2];
		p->mat_cols = shape[ndim - 1];
	}
	m->pidx[id] = -1;
	if (n == 0)
		return;
	p->offset = m->numel;
	m->numel += n;
	m->pidx[id] = m->ntable;
	m->table[m->ntable++] = *p;
}

#define SHAPE(...) (const int[]){ __VA_ARGS__ }
#define AXES(...) (const char *const[]){ __VA_ARGS__ }
#define NDIM(...) (int)(sizeof((int[]){ __VA_ARGS__ }) / sizeof(int))
#define PARAM(id, name, opt, decay, shape, axes, sd) \
	add_param(m, id, name, opt, decay, (int)(sizeof(shape) / sizeof(int)), shape, axes, sd)

/* split dimension of a weight: the embedding dimension under
 * tensor-transpose parallelism (ttd), else the tensor-parallel one (tpd;
 * none under expert parallelism) */
#define TPD(k) (m->tp > 1 ? (k) : -1)
#define SD(tpd, ttd) (m->tt > 1 ? (ttd) : (tpd))

static void build_table(struct model *m)
{
	const struct model_dims *d = &m->l; /* local shapes */
	int L = d->L, Ld = d->L_dense, Lm = d->L_moe, QD = d->Hq * d->D, KD = d->Hkv * d->D;
	int SF = d->S * d->Fe;
	int s_embed[] = { d->V, d->C };
	int s_norm[] = { L, d->C };
	int s_q[] = { L, QD, d->C }, s_k[] = { L, KD, d->C }, s_o[] = { L, d->C, QD };
	int s_up[] = { Ld, d->F, d->C }, s_down[] = { Ld, d->C, d->F };
	int s_router[] = { Lm, d->E, d->C }, s_rbias[] = { Lm, d->E };
	int s_eup[] = { Lm, m->El, d->Fe, d->C }, s_edown[] = { Lm, m->El, d->C, d->Fe };
	/* expert weights split over experts (ep) or over their hidden (tp) */
	int sd_eup = m->ep > 1 ? 1 : 2, sd_edown = m->ep > 1 ? 1 : 3;
	int s_sup[] = { Lm, SF, d->C }, s_sdown[] = { Lm, d->C, SF };
	int s_fnorm[] = { d->C };

	PARAM(P_EMBED, "embed", OPT_ADAMW, true, s_embed, AXES("vocab", "embed"), SD(-1, 1));
	PARAM(P_ATTN_NORM, "attn_norm", OPT_ADAMW, false, s_norm, AXES("layers", "norm"), SD(-1, 1));
	PARAM(P_WQ, "wq", OPT_MUON, true, s_q, AXES("layers", "q_heads", "embed"), SD(TPD(1), 2));
	PARAM(P_WK, "wk", OPT_MUON, true, s_k, AXES("layers", "kv_heads", "embed"), SD(TPD(1), 2));
	PARAM(P_WV, "wv", OPT_MUON, true, s_k, AXES("layers", "kv_heads", "embed"), SD(TPD(1), 2));
	PARAM(P_WO, "wo", OPT_MUON, true, s_o, AXES("layers", "embed", "q_heads"), SD(TPD(2), 1));
	PARAM(P_MLP_NORM, "mlp_norm", OPT_ADAMW, false, s_norm, AXES("layers", "norm"), SD(-1, 1));
	PARAM(P_W_GATE, "w_gate", OPT_MUON, true, s_up, AXES("layers", "mlp", "embed"), SD(TPD(1), 2));
	PARAM(P_W_UP, "w_up", OPT_MUON, true, s_up, AXES("layers", "mlp", "embed"), SD(TPD(1), 2));
	PARAM(P_W_DOWN, "w_down", OPT_MUON, true, s_down, AXES("layers", "embed", "mlp"), SD(TPD(2), 1));
	PARAM(P_ROUTER, "router", OPT_ADAMW, true, s_router, AXES("layers", "exp", "embed_moe"), SD(-1, 2));
	PARAM(P_ROUTER_BIAS, "router_bias", OPT_NONE, false, s_rbias, AXES("layers", "exp"), -1);
	PARAM(P_E_GATE, "e_gate", OPT_MUON, true, s_eup, AXES("layers", "exp", "mlp_moe", "embed_moe"), SD(sd_eup, 3));
	PARAM(P_E_UP, "e_up", OPT_MUON, true, s_eup, AXES("layers", "exp", "mlp_moe", "embed_moe"), SD(sd_eup, 3));
	PARAM(P_E_DOWN, "e_down", OPT_MUON, true, s_edown, AXES("layers", "exp", "embed_moe", "mlp_moe"), SD(sd_edown, 2));
	PARAM(P_S_GATE, "s_gate", OPT_MUON, true, s_sup, AXES("layers", "mlp", "embed"), SD(TPD(1), 2));
	PARAM(P_S_UP, "s_up", OPT_MUON, true, s_sup, AXES("layers", "mlp", "embed"), SD(TPD(1), 2));
	PARAM(P_S_DOWN, "s_down", OPT_MUON, true, s_sdown, AXES("layers", "embed", "mlp"), SD(TPD(2), 1));
	PARAM(P_FINAL_NORM, "final_norm", OPT_ADAMW, false, s_fnorm, AXES("norm"), SD(-1, 0));
	if (!d->tied) {
		int s_head[] = { d->V, d->C };
		PARAM(P_LM_HEAD, "lm_head", OPT_ADAMW, true, s_head, AXES("vocab", "embed"), SD(-1, 1));
	} else {
		m->pidx[P_LM_HEAD] = -1;
	}
}

int model_param_table(const struct model_dims *d, struct param_info *out, int max)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->d = *d;
	m->l = *d;             /* whole tensors: no split of any kind */
	m->tp = m->ep = m->tt = m->mp = 1;
	m->El = d->E;
	build_table(m);
	int n = m->ntable;
	memcpy(out, m->table, sizeof(*out) * (size_t)(n < max ? n : max));
	free(m);
	return n;
}

/* Pointer to layer l's slice of stacked parameter id in buf (params/grads). */
static float *pl(const struct model *m, float *buf, int id, int l)
{
	const struct param_info *p = &m->p[id];
	if (m->pidx[id] < 0)
		return NULL;
	size_t per = p->numel / (size_t)p->shape[0];
	return buf + p->offset + per * (size_t)l;
}

static float *pp(const struct model *m, float *buf, int id)
{
	return m->pidx[id] < 0 ? NULL : buf + m->p[id].offset;
}

/* ---- allocation ---- */

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

static void lay_out(struct model *m, struct arena *a)
{
	const struct model_dims *d = &m->l;
	size_t N = (size_t)m->N, C = d->C, QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
	size_t NK = N * (size_t)d->K, SF = (size_t)d->S * d->Fe, R = m->rmax;
	size_t att = (size_t)m->B * d->Hq * d->T * d->T;
	size_t big = N * (size_t)d->F;
	if (d->L_moe) {
		big = big > R * (size_t)d->Fe ? big : R * (size_t)d->Fe;
		big = big > N * SF ? big : N * SF;
	}

	m->resid = TAKEF(a, (d->L + 1) * N * C);
	for (int l = 0; l < d->L; l++) {
		struct layer_acts *x = &m->la[l];
		x->ln1 = TAKEF(a, N * C);
		x->rstd1 = TAKEF(a, N);
		x->q = TAKEF(a, N * QD);
		x->k = TAKEF(a, N * KD);
		x->v = TAKEF(a, N * KD);
		x->att = TAKEF(a, att);
		x->atty = TAKEF(a, N * QD);
		x->xmid = TAKEF(a, N * C);
		x->ln2 = TAKEF(a, N * C);
		x->rstd2 = TAKEF(a, N);
		if (l < d->L_dense) {
			x->g = TAKEF(a, N * d->F);
			x->u = TAKEF(a, N * d->F);
			x->h = TAKEF(a, N * d->F);
		} else {
			x->scores = TAKEF(a, N * d->E);
			x->weights = TAKEF(a, NK);
			x->idx = TAKEI(a, NK);
			x->order = TAKEI(a, NK);
			x->offsets = TAKEI(a, d->E + 1);
			x->counts = TAKEI(a, d->E);
			x->xs = TAKEF(a, NK * C);
			x->eg = TAKEF(a, R * d->Fe);
			x->eu = TAKEF(a, R * d->Fe);
			x->eh = TAKEF(a, R * d->Fe);
			x->ey = TAKEF(a, NK * C);
			if (m->ep > 1) {
				x->xr = TAKEF(a, R * C);
				x->yr = TAKEF(a, R * C);
				x->cnt_all = TAKEI(a, (size_t)m->ep * d->E);
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
	m->lnf = TAKEF(a, N * C);
	m->rstdf = TAKEF(a, N);
	m->nstat = TAKEF(a, N);
	m->logits = TAKEF(a, N * d->V);
	m->probs = TAKEF(a, N * d->V);
	m->losses = TAKEF(a, N);
	m->cos_t = TAKEF(a, (size_t)d->T * d->D / 2);
	m->sin_t = TAKEF(a, (size_t)d->T * d->D / 2);
	m->dresid = TAKEF(a, N * C);
	m->dln = TAKEF(a, N * C);
	m->dbig1 = TAKEF(a, big);
	m->dbig2 = TAKEF(a, big);
	m->dbig3 = TAKEF(a, big);
	m->dq = TAKEF(a, N * QD);
	m->dk = TAKEF(a, N * KD);
	m->dv = TAKEF(a, N * KD);
	m->dqr = TAKEF(a, N * QD);
	m->dkr = TAKEF(a, N * KD);
	m->datty = TAKEF(a, N * QD);
	m->att_scratch = TAKEF(a, (size_t)d->T * d->T + (size_t)d->T * d->D);
	m->dlogits = TAKEF(a, N * d->V);
	if (d->L_moe) {
		m->dscores = TAKEF(a, N * d->E);
		m->dlogits_r = TAKEF(a, N * d->E);
		m->dweights = TAKEF(a, NK);
		m->dxs = TAKEF(a, NK * C);
		m->dey = TAKEF(a, NK * C);
		if (m->ep > 1) {
			m->dxr = TAKEF(a, R * C);
			m->dyr = TAKEF(a, R * C);
		}
		m->counts_all = TAKEI(a, (size_t)d->L_moe * d->E);
	}
}

struct model *model_new(const struct model_dims *d, int B, int tp, int tpr, int ep, int epr,
			int tt, int ttr, char *err, size_t errlen)
{
	const char *bad = NULL;
	int badv = 0;
	if (tt > 1 && (tp > 1 || ep > 1 || d->C % tt)) {
		snprintf(err, errlen, "config: tensor_transpose parallelism %d needs 'base_emb_dim' (%d) "
			 "divisible by it, and no tensor or expert parallelism at the same time", tt, d->C);
		return NULL;
	}
	if (ep > 1 && (tp > 1 || !d->L_moe || d->E % ep)) {
		snprintf(err, errlen, "config: expert parallelism %d needs an MoE model whose "
			 "'num_experts' (%d) it divides, and no tensor parallelism at the same time",
			 ep, d->E);
		return NULL;
	}
	if (tp > 1) {
		if (d->Hq % tp)
			bad = "base_num_query_heads", badv = d->Hq;
		else if (d->Hkv % tp)
			bad = "base_num_kv_heads", badv = d->Hkv;
		else if (d->L_dense && d->F % tp)
			bad = "base_mlp_dim", badv = d->F;
		else if (d->L_moe && d->Fe % tp)
			bad = "base_moe_mlp_dim", badv = d->Fe;
	}
	if (bad) {
		snprintf(err, errlen, "config: key '%s' (%d) is split over the tensor axis and must be "
			 "divisible by its size %d", bad, badv, tp);
		return NULL;
	}
	struct model *m = calloc(1, sizeof(*m));
	if (!m)
		goto oom;
	m->d = *d;
	m->l = *d;
	m->tp = tp > 1 ? tp : 1;
	m->tpr = tp > 1 ? tpr : 0;
	m->ep = ep > 1 ? ep : 1;
	m->epr = ep > 1 ? epr : 0;
	m->El = d->E / m->ep;
	m->tt = tt > 1 ? tt : 1;
	m->ttr = tt > 1 ? ttr : 0;
	m->mp = m->tp > 1 ? m->tp : (m->ep > 1 ? m->ep : m->tt);
	m->mpr = m->tp > 1 ? m->tpr : (m->ep > 1 ? m->epr : m->ttr);
	m->l.C /= m->tt;
	m->rmax = (size_t)m->ep * (size_t)B * d->T * (size_t)(d->L_moe ? d->K : 1);
	m->l.Hq /= m->tp;
	m->l.Hkv /= m->tp;
	m->l.F /= m->tp;
	if (d->L_moe)
		m->l.Fe /= m->tp;
	m->B = B;
	m->N = B * d->T;
	if (m->rmax == 0)
		m->rmax = 1;
	build_table(m);
	m->la = calloc((size_t)d->L, sizeof(*m->la));
	m->params = aligned_alloc(64, ((m->numel * sizeof(float)) + 63) & ~(size_t)63);
	m->grads = aligned_alloc(64, ((m->numel * sizeof(float)) + 63) & ~(size_t)63);
	if (!m->la || !m->params || !m->grads)
		goto oom;
	memset(m->params, 0, m->numel * sizeof(float));
	memset(m->grads, 0, m->numel * sizeof(float));
	struct arena a = { 0 };
	lay_out(m, &a);                 /* sizing pass */
	m->act_bytes = a.used;
	m->act_mem = aligned_alloc(64, a.used);
	if (!m->act_mem)
		goto oom;
	memset(m->act_mem, 0, a.used);
	a.base = m->act_mem;
	a.used = 0;
	lay_out(m, &a);
	rope_table(m->cos_t, m->sin_t, d->T, d->D, d->theta);
	return m;
oom:
	snprintf(err, errlen, "model: out of memory for %d sequences of %d tokens", B, d->T);
	model_free(m);
	return NULL;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	free(m->act_mem);
	free(m->params);
	free(m->grads);
	free(m->la);
	free(m);
}

const struct model_dims *model_dims(const struct model *m) { return &m->d; }
int model_num_params(const struct model *m) { return m->ntable; }
const struct param_info *model_param(const struct model *m, int i) { return &m->table[i]; }
float *model_params(struct model *m) { return m->params; }
float *model_grads(struct model *m) { return m->grads; }
size_t model_numel(const struct model *m) { return m->numel; }
const int32_t *model_expert_counts(const struct model *m) { return m->counts_all; }

const struct param_info *model_param_by_name(const struct model *m, const char *name)
{
	for (int i = 0; i < m->ntable; i++)
		if (!strcmp(m->table[i].name, name))
			return &m->table[i];
	return NULL;
}

/* ---- init ---- */

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* N(0,1) for element i of a tensor: Box-Muller on two counter-based
 * uniforms; a pure function of (key, i). */
static float normal_at(uint64_t key, size_t i)
{
	uint64_t a = splitmix64(key ^ (2 * (uint64_t)i));
	uint64_t b = splitmix64(key ^ (2 * (uint64_t)i + 1));
	double u1 = ((a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
	double u2 = (b >> 11) * (1.0 / 9007199254740992.0);
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void model_expert_range(const struct model *m, size_t *first, size_t *end)
{
	*first = *end = 0;
	if (m->pidx[P_E_GATE] < 0)
		return;
	*first = m->p[P_E_GATE].offset;
	*end = m->p[P_E_DOWN].offset + m->p[P_E_DOWN].numel;
}

size_t param_global_index(const struct param_info *p, size_t i)
{
	if (p->shard_dim < 0)
		return i;
	size_t g = 0, stride = 1;
	for (int k = p->ndim - 1; k >= 0; k--) {
		size_t c = i % (size_t)p->shape[k];
		i /= (size_t)p->shape[k];
		if (k == p->shard_dim)
			c += (size_t)p->shard_idx * p->shape[k];
		g += c * stride;
		stride *= (size_t)p->global_shape[k];
	}
	return g;
}

void model_init(struct model *m, uint64_t seed, float std)
{
	for (int t = 0; t < m->ntable; t++) {
		const struct param_info *p = &m->table[t];
		float *w = m->params + p->offset;
		if (!strcmp(p->axes[p->ndim - 1], "norm")) {
			for (size_t i = 0; i < p->numel; i++)
				w[i] = 1.0f;
		} else if (p->opt == OPT_NONE) {
			memset(w, 0, p->numel * sizeof(float));
		} else {
			uint64_t key = splitmix64(seed ^ name_hash(p->name));
			for (size_t i = 0; i < p->numel; i++)
				w[i] = std * normal_at(key, param_global_index(p, i));
		}
	}
}

/* ---- forward ---- */

/* Sums buf over the tensor-parallel group (partial sums of a row-parallel
 * matmul). A failure is remembered and reported after the pass. */
static void tp_sum(struct model *m, float *buf, size_t n)
{
	if (m->tp > 1 && !m->hook_rc)
		m->hook_rc = m->st->tp_allreduce(m->st->ctx, buf, n);
}

/* Blocks of rows one local expert processes: rows [bs, bs + bn) of the
 * expert input (sorted by expert; with expert parallelism, by source device
 * then expert), local expert bj. Returns the count. */
static int expert_blocks(const struct model *m, const struct layer_acts *a, int *bs, int *bn, int *bj)
{
	int E = m->d.E, nb = 0, r = 0;
	if (m->ep <= 1) {
		for (int e = 0; e < E; e++) {
			bs[nb] = a->offsets[e];
			bn[nb] = a->offsets[e + 1] - a->offsets[e];
			bj[nb++] = e;
		}
		return nb;
	}
	for (int src = 0; src < m->ep; src++)
		for (int j = 0; j < m->El; j++) {
			int n = a->cnt_all[src * E + m->epr * m->El + j];
			bs[nb] = r;
			bn[nb] = n;
			bj[nb++] = j;
			r += n;
		}
	return nb;
}

static void ep_exchange(struct model *m, void *out, const size_t *recv_b, const void *in,
			const size_t *send_b)
{
	if (!m->hook_rc)
		m->hook_rc = m->st->ep_all_to_all(m->st->ctx, out, recv_b, in, send_b);
}

/* Learns every device's per-expert counts, then sends each device the rows
 * (sorted by expert, so contiguous) of the experts it owns. */
static void ep_dispatch(struct model *m, struct layer_acts *a, int C)
{
	int E = m->d.E, El = m->El;
	if (!m->hook_rc)
		m->hook_rc = m->st->ep_all_gather(m->st->ctx, a->cnt_all, a->counts, E);
	if (m->hook_rc)
		return;
	for (int x = 0; x < m->ep; x++) {
		size_t sr = 0, rr = 0;
		for (int j = 0; j < El; j++) {
			sr += (size_t)a->counts[x * El + j];
			rr += (size_t)a->cnt_all[x * E + m->epr * El + j];
		}
		a->send_b[x] = sr * (size_t)C * sizeof(float);
		a->recv_b[x] = rr * (size_t)C * sizeof(float);
	}
	ep_exchange(m, a->xr, a->recv_b, a->xs, a->send_b);
}

/* Sums buf over the tensor-transpose group (partial sums of a contraction
 * over the split embedding dimension). */
static void tt_sum(struct model *m, float *buf, size_t n)
{
	if (m->tt > 1 && !m->hook_rc)
		m->hook_rc = m->st->tt_allreduce(m->st->ctx, buf, n);
}

/* RMSNorm over the embedding, which tensor-transpose splits over devices. */
static void norm_forward(struct model *m, float *out, float *rstd, const float *x, const float *w)
{
	if (m->tt <= 1) {
		rmsnorm_forward(out, rstd, x, w, m->N, m->l.C, m->d.eps);
		return;
	}
	rmsnorm_partial_sumsq(m->nstat, x, m->N, m->l.C);
	tt_sum(m, m->nstat, (size_t)m->N);
	rmsnorm_forward_split(out, rstd, x, w, m->nstat, m->N, m->l.C, m->d.C, m->d.eps);
}

static void norm_backward(struct model *m, float *dx, float *dw, const float *dout, const float *x,
			  const float *w, const float *rstd)
{
	if (m->tt <= 1) {
		rmsnorm_backward(dx, dw, dout, x, w, rstd, m->N, m->l.C);
		return;
	}
	rmsnorm_backward_partial(m->nstat, dout, x, w, m->N, m->l.C);
	tt_sum(m, m->nstat, (size_t)m->N);
	rmsnorm_backward_split(dx, dw, dout, x, w, rstd, m->nstat, m->N, m->l.C, m->d.C);
}

static void layer_forward(struct model *m, int l)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, QD = d->Hq * d->D, KD = d->Hkv * d->D;
	float *x = m->resid + (size_t)l * N * C, *xo = x + (size_t)N * C;
	float *P = m->params, *tmp = m->dln; /* dln is free during forward */

	norm_forward(m, a->ln1, a->rstd1, x, pl(m, P, P_ATTN_NORM, l));
	linear_forward(a->q, a->ln1, pl(m, P, P_WQ, l), N, C, QD);
	linear_forward(a->k, a->ln1, pl(m, P, P_WK, l), N, C, KD);
	linear_forward(a->v, a->ln1, pl(m, P, P_WV, l), N, C, KD);
	/* tensor-transpose: contractions over the split embedding are partial */
	tt_sum(m, a->q, (size_t)N * QD);
	tt_sum(m, a->k, (size_t)N * KD);
	tt_sum(m, a->v, (size_t)N * KD);
	rope_forward(a->q, a->q, m->cos_t, m->sin_t, m->B, d->T, d->Hq, d->D);
	rope_forward(a->k, a->k, m->cos_t, m->sin_t, m->B, d->T, d->Hkv, d->D);
	attention_forward(a->atty, a->att, a->q, a->k, a->v, m->B, d->T, d->Hq, d->Hkv, d->D);
	linear_forward(tmp, a->atty, pl(m, P, P_WO, l), N, QD, C);
	tp_sum(m, tmp, (size_t)N * C);
	residual_forward(a->xmid, x, tmp, N * C);
	norm_forward(m, a->ln2, a->rstd2, a->xmid, pl(m, P, P_MLP_NORM, l));

	if (l < d->L_dense) {
		linear_forward(a->g, a->ln2, pl(m, P, P_W_GATE, l), N, C, d->F);
		linear_forward(a->u, a->ln2, pl(m, P, P_W_UP, l), N, C, d->F);
		tt_sum(m, a->g, (size_t)N * d->F);
		tt_sum(m, a->u, (size_t)N * d->F);
		swiglu_forward(a->h, a->g, a->u, N, d->F);
		linear_forward(tmp, a->h, pl(m, P, P_W_DOWN, l), N, d->F, C);
		tp_sum(m, tmp, (size_t)N * C);
		residual_forward(xo, a->xmid, tmp, N * C);
		return;
	}

	/* MoE: route, run each expert on its rows, combine */
	int lm = l - d->L_dense, E = d->E, K = d->K, Fe = d->Fe, NK = N * K;
	float *logits = m->dlogits_r; /* scratch in forward */
	linear_forward(logits, a->ln2, pl(m, P, P_ROUTER, lm), N, C, E);
	tt_sum(m, logits, (size_t)N * E);
	moe_router_forward(a->weights, a->idx, a->scores, logits,
			   d->router_bias ? pl(m, P, P_ROUTER_BIAS, lm) : NULL, N, E, K,
			   (enum moe_score)d->moe_score, d->norm_topk, d->routed_scale);
	moe_sort(a->order, a->offsets, a->idx, N, E, K);
	moe_gather(a->xs, a->ln2, a->order, NK, K, C);
	for (int e = 0; e < E; e++)
		a->counts[e] = a->offsets[e + 1] - a->offsets[e];
	/* expert parallelism: rows travel to the device owning their expert */
	float *X = a->xs, *Y = a->ey;
	if (m->ep > 1) {
		ep_dispatch(m, a, C);
		X = a->xr;
		Y = a->yr;
	}
	float *wg = pl(m, P, P_E_GATE, lm), *wu = pl(m, P, P_E_UP, lm), *wd = pl(m, P, P_E_DOWN, lm);
	int bs[1024], bn[1024], bj[1024], nb = m->hook_rc ? 0 : expert_blocks(m, a, bs, bn, bj);
	size_t wsz = (size_t)Fe * C;
	size_t rows = 0;
	for (int b = 0; b < nb; b++) {
		size_t rf = (size_t)bs[b] * Fe, rc = (size_t)bs[b] * C;
		int ne = bn[b], j = bj[b];
		rows += (size_t)ne;
		if (!ne)
			continue;
		linear_forward(a->eg + rf, X + rc, wg + j * wsz, ne, C, Fe);
		linear_forward(a->eu + rf, X + rc, wu + j * wsz, ne, C, Fe);
	}
	tt_sum(m, a->eg, rows * Fe);
	tt_sum(m, a->eu, rows * Fe);
	for (int b = 0; b < nb; b++) {
		size_t rf = (size_t)bs[b] * Fe, rc = (size_t)bs[b] * C;
		int ne = bn[b], j = bj[b];
		if (!ne)
			continue;
		swiglu_forward(a->eh + rf, a->eg + rf, a->eu + rf, ne, Fe);
		linear_forward(Y + rc, a->eh + rf, wd + j * wsz, ne, Fe, C);
	}
	if (m->ep > 1)  /* and the outputs come back */
		ep_exchange(m, a->ey, a->send_b, a->yr, a->recv_b);
	memcpy(m->counts_all + (size_t)lm * E, a->counts, sizeof(int32_t) * E);
	memset(tmp, 0, sizeof(float) * (size_t)N * C);
	moe_combine(tmp, a->ey, a->weights, a->order, NK, K, C);
	if (d->S) {
		int SF = d->S * Fe;
		linear_forward(a->sg, a->ln2, pl(m, P, P_S_GATE, lm), N, C, SF);
		linear_forward(a->su, a->ln2, pl(m, P, P_S_UP, lm), N, C, SF);
		tt_sum(m, a->sg, (size_t)N * SF);
		tt_sum(m, a->su, (size_t)N * SF);
		swiglu_forward(a->sh, a->sg, a->su, N, SF);
		linear_forward_acc(tmp, a->sh, pl(m, P, P_S_DOWN, lm), N, SF, C);
	}
	tp_sum(m, tmp, (size_t)N * C);
	residual_forward(xo, a->xmid, tmp, N * C);
}

static float *head_weight(struct model *m, float *buf)
{
	return m->d.tied ? pp(m, buf, P_EMBED) : pp(m, buf, P_LM_HEAD);
}

/* Runs the forward over all N rows; returns the sum of token losses. */
static double forward_all(struct model *m, const int32_t *inputs, const int32_t *targets)
{
	const struct model_dims *d = &m->d;
	int N = m->N, C = m->l.C;

	embedding_forward(m->resid, inputs, pp(m, m->params, P_EMBED), N, C);
	for (int l = 0; l < d->L; l++)
		layer_forward(m, l);
	float *xL = m->resid + (size_t)d->L * N * C;
	norm_forward(m, m->lnf, m->rstdf, xL, pp(m, m->params, P_FINAL_NORM));
	linear_forward(m->logits, m->lnf, head_weight(m, m->params), N, C, d->V);
	tt_sum(m, m->logits, (size_t)N * d->V);
	double mean = softmax_xent_forward(m->losses, m->probs, m->logits, targets, N, d->V);
	return mean * N;
}

double model_forward(struct model *m, const int32_t *inputs, const int32_t *targets, int rows)
{
	forward_all(m, inputs, targets);
	double s = 0;
	for (int i = 0; i < rows * m->d.T; i++)
		s += m->losses[i];
	return s;
}

/* ---- backward ---- */

/* dresid holds dL/d(output of layer l); on return dL/d(input of layer l). */
static void layer_backward(struct model *m, int l, struct model_step *st)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, QD = d->Hq * d->D, KD = d->Hkv * d->D;
	float *x = m->resid + (size_t)l * N * C;
	float *P = m->params, *G = m->grads, *dres = m->dresid, *dln = m->dln;

	memset(dln, 0, sizeof(float) * (size_t)N * C);
	if (l < d->L_dense) {
		float *dh = m->dbig1, *dg = m->dbig2, *du = m->dbig3;
		size_t nf = (size_t)N * d->F;
		memset(dh, 0, nf * sizeof(float));
		linear_backward(dh, pl(m, G, P_W_DOWN, l), dres, a->h, pl(m, P, P_W_DOWN, l), N, d->F, C);
		tt_sum(m, dh, nf);
		memset(dg, 0, nf * sizeof(float));
		memset(du, 0, nf * sizeof(float));
		swiglu_backward(dg, du, dh, a->g, a->u, N, d->F);
		linear_backward(dln, pl(m, G, P_W_GATE, l), dg, a->ln2, pl(m, P, P_W_GATE, l), N, C, d->F);
		linear_backward(dln, pl(m, G, P_W_UP, l), du, a->ln2, pl(m, P, P_W_UP, l), N, C, d->F);
		tp_sum(m, dln, (size_t)N * C);
	} else {
		int lm = l - d->L_dense, E = d->E, K = d->K, Fe = d->Fe, NK = N * K;
		if (d->S) {
			int SF = d->S * Fe;
			size_t ns = (size_t)N * SF;
			float *dh = m->dbig1, *dg = m->dbig2, *du = m->dbig3;
			memset(dh, 0, ns * sizeof(float));
			linear_backward(dh, pl(m, G, P_S_DOWN, lm), dres, a->sh, pl(m, P, P_S_DOWN, lm), N, SF, C);
			tt_sum(m, dh, ns);
			memset(dg, 0, ns * sizeof(float));
			memset(du, 0, ns * sizeof(float));
			swiglu_backward(dg, du, dh, a->sg, a->su, N, SF);
			linear_backward(dln, pl(m, G, P_S_GATE, lm), dg, a->ln2, pl(m, P, P_S_GATE, lm), N, C, SF);
			linear_backward(dln, pl(m, G, P_S_UP, lm), du, a->ln2, pl(m, P, P_S_UP, lm), N, C, SF);
		}
		memset(m->dey, 0, sizeof(float) * (size_t)NK * C);
		memset(m->dweights, 0, sizeof(float) * (size_t)NK);
		moe_combine_backward(m->dey, m->dweights, dres, a->ey, a->weights, a->order, NK, K, C);
		tt_sum(m, m->dweights, (size_t)NK);
		float *wg = pl(m, P, P_E_GATE, lm), *wu = pl(m, P, P_E_UP, lm), *wd = pl(m, P, P_E_DOWN, lm);
		float *gg = pl(m, G, P_E_GATE, lm), *gu = pl(m, G, P_E_UP, lm), *gd = pl(m, G, P_E_DOWN, lm);
		float *deh = m->dbig1, *deg = m->dbig2, *deu = m->dbig3;
		float *X = a->xs, *dY = m->dey, *dX = m->dxs;
		size_t wsz = (size_t)Fe * C, R = m->rmax;
		if (m->ep > 1) {
			/* output gradients go to the experts' devices, input
			 * gradients come back: the forward exchange reversed */
			ep_exchange(m, m->dyr, a->recv_b, m->dey, a->send_b);
			X = a->xr;
			dY = m->dyr;
			dX = m->dxr;
		}
		memset(deh, 0, sizeof(float) * R * Fe);
		memset(deg, 0, sizeof(float) * R * Fe);
		memset(deu, 0, sizeof(float) * R * Fe);
		memset(dX, 0, sizeof(float) * (m->ep > 1 ? R : (size_t)NK) * C);
		int bs[1024], bn[1024], bj[1024], nb = m->hook_rc ? 0 : expert_blocks(m, a, bs, bn, bj);
		size_t rows = 0;
		for (int b = 0; b < nb; b++) {
			size_t rf = (size_t)bs[b] * Fe, rc = (size_t)bs[b] * C;
			int ne = bn[b], j = bj[b];
			rows += (size_t)ne;
			if (ne)
				linear_backward(deh + rf, gd + j * wsz, dY + rc, a->eh + rf, wd + j * wsz, ne, Fe, C);
		}
		tt_sum(m, deh, rows * Fe);
		for (int b = 0; b < nb; b++) {
			size_t rf = (size_t)bs[b] * Fe, rc = (size_t)bs[b] * C;
			int ne = bn[b], j = bj[b];
			if (!ne)
				continue;
			swiglu_backward(deg + rf, deu + rf, deh + rf, a->eg + rf, a->eu + rf, ne, Fe);
			linear_backward(dX + rc, gg + j * wsz, deg + rf, X + rc, wg + j * wsz, ne, C, Fe);
			linear_backward(dX + rc, gu + j * wsz, deu + rf, X + rc, wu + j * wsz, ne, C, Fe);
		}
		if (m->ep > 1)
			ep_exchange(m, m->dxs, a->send_b, m->dxr, a->recv_b);
		moe_gather_backward(dln, m->dxs, a->order, NK, K, C);
		/* experts and shared experts gave partial sums (their hidden is
		 * split over the tensor axis), and so did the routing weights'
		 * gradients; the router below is replicated and adds its whole
		 * gradient once */
		tp_sum(m, dln, (size_t)N * C);
		tp_sum(m, m->dweights, (size_t)NK);
		/* router: through the top-k weights and the load-balance loss */
		memset(m->dlogits_r, 0, sizeof(float) * (size_t)N * E);
		moe_router_backward(m->dlogits_r, m->dweights, a->scores, a->idx, N, E, K,
				    (enum moe_score)d->moe_score, d->norm_topk, d->routed_scale);
		/* load-balance loss of the global batch of Ng tokens, with the
		 * counts summed over replicas: L = E/(k Ng^2) sum_n sum_e C_e p(n,e);
		 * the kernels normalise by the local N, hence (N/Ng)^2 */
		const int32_t *cnt = m->counts_all + (size_t)lm * E;
		double ng = st->global_tokens, r2 = ((double)N / ng) * ((double)N / ng);
		st->aux += (double)E / ((double)K * ng * ng) * moe_aux_loss_dot(a->scores, cnt, N, E);
		if (st->lb_weight != 0.0f) {
			memset(m->dscores, 0, sizeof(float) * (size_t)N * E);
			moe_aux_loss_backward(m->dscores, a->scores, cnt, (float)(st->lb_weight * r2), N, E, K);
			moe_scores_backward(m->dlogits_r, m->dscores, a->scores, N, E,
					    (enum moe_score)d->moe_score);
		}
		linear_backward(dln, pl(m, G, P_ROUTER, lm), m->dlogits_r, a->ln2, pl(m, P, P_ROUTER, lm), N, C, E);
	}
	norm_backward(m, dres, pl(m, G, P_MLP_NORM, l), dln, a->xmid, pl(m, P, P_MLP_NORM, l), a->rstd2);

	/* attention block: dres now holds dL/d(xmid) */
	memset(m->datty, 0, sizeof(float) * (size_t)N * QD);
	linear_backward(m->datty, pl(m, G, P_WO, l), dres, a->atty, pl(m, P, P_WO, l), N, QD, C);
	tt_sum(m, m->datty, (size_t)N * QD);
	memset(m->dq, 0, sizeof(float) * (size_t)N * QD);
	memset(m->dk, 0, sizeof(float) * (size_t)N * KD);
	memset(m->dv, 0, sizeof(float) * (size_t)N * KD);
	attention_backward(m->dq, m->dk, m->dv, m->att_scratch, m->datty, a->q, a->k, a->v, a->att,
			   m->B, d->T, d->Hq, d->Hkv, d->D);
	memset(m->dqr, 0, sizeof(float) * (size_t)N * QD);
	memset(m->dkr, 0, sizeof(float) * (size_t)N * KD);
	rope_backward(m->dqr, m->dq, m->cos_t, m->sin_t, m->B, d->T, d->Hq, d->D);
	rope_backward(m->dkr, m->dk, m->cos_t, m->sin_t, m->B, d->T, d->Hkv, d->D);
	memset(dln, 0, sizeof(float) * (size_t)N * C);
	linear_backward(dln, pl(m, G, P_WQ, l), m->dqr, a->ln1, pl(m, P, P_WQ, l), N, C, QD);
	linear_backward(dln, pl(m, G, P_WK, l), m->dkr, a->ln1, pl(m, P, P_WK, l), N, C, KD);
	linear_backward(dln, pl(m, G, P_WV, l), m->dv, a->ln1, pl(m, P, P_WV, l), N, C, KD);
	tp_sum(m, dln, (size_t)N * C);
	norm_backward(m, dres, pl(m, G, P_ATTN_NORM, l), dln, x, pl(m, P, P_ATTN_NORM, l), a->rstd1);
}

int model_forward_backward(struct model *m, const int32_t *inputs, const int32_t *targets,
			   struct model_step *st)
{
	const struct model_dims *d = &m->d;
	int N = m->N, C = m->l.C;
	m->st = st;
	m->hook_rc = 0;
	st->loss_sum = forward_all(m, inputs, targets);
	st->aux = 0;
	if (m->hook_rc)
		return m->hook_rc;
	if (d->L_moe && st->counts) {
		int rc = st->counts(st->ctx, m->counts_all, d->L_moe * d->E);
		if (rc)
			return rc;
	}
	float loss_scale = st->loss_scale;

	float *G = m->grads;
	memset(m->dlogits, 0, sizeof(float) * (size_t)N * d->V);
	softmax_xent_backward(m->dlogits, m->probs, targets, loss_scale, N, d->V);
	memset(m->dln, 0, sizeof(float) * (size_t)N * C);
	linear_backward(m->dln, head_weight(m, G), m->dlogits, m->lnf, head_weight(m, m->params), N, C, d->V);
	memset(m->dresid, 0, sizeof(float) * (size_t)N * C);
	norm_backward(m, m->dresid, pp(m, G, P_FINAL_NORM), m->dln, m->resid + (size_t)d->L * N * C,
		      pp(m, m->params, P_FINAL_NORM), m->rstdf);
	for (int l = d->L - 1; l >= 0; l--)
		layer_backward(m, l, st);
	embedding_backward(pp(m, G, P_EMBED), m->dresid, inputs, N, C);
	return m->hook_rc;
}

double model_flops_per_token(const struct model_dims *d)
{
	double C = d->C, QD = (double)d->Hq * d->D, KD = (double)d->Hkv * d->D;
	double attn = C * QD * 2 + C * KD * 2;
	double dense = 3.0 * C * d->F;
	double moe = C * d->E + 3.0 * C * d->Fe * (d->K + d->S);
	double mat = d->L * attn + d->L_dense * dense + d->L_moe * moe + (double)d->V * C;
	return 6.0 * mat + 12.0 * d->L * d->T * QD;
}
