/* The decoder of host/model.h on one device's rows and shards. Placement
 * comes from the sharding rules through the planner (host/plan.h): every
 * parameter has a plan (storage spec, gathered axes, gradient-sum axes) and
 * every linear layer one (what its output and input gradient are partial
 * over). This file executes the plans: it gathers weights per layer
 * before use and reduce-scatters their gradients after (FSDP), all-reduces
 * partial sums where the plans say, splits norm statistics, softmax and
 * cross-entropy over split dimensions, and sends tokens to their experts.
 * No parallelism has a code path of its own. */
#include "host/model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/model/linear.h"
#include "host/mesh/plan.h"
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

#define MAX_GGROUPS 8

struct model {
	struct model_dims d;        /* the whole model */
	struct model_dims l;        /* what this device computes on */
	int SF;                     /* shared-expert hidden here */
	int El;                     /* local experts */
	/* placement */
	const struct mesh *mesh;
	int coord[AX_COUNT];
	uint32_t rows, ax_emb, ax_vocab, ax_exp, ax_moe_out;
	int v0, c0, e0;             /* first vocab row, embedding column, expert here */
	int v0e, Ve;                /* the embedding table's rows here */
	int ep;                     /* devices experts are spread over */
	int *ep_blk;                /* [ep] expert block of each of them */
	bool ep_permute;            /* ep_blk is not the identity */
	struct plan_param pp[P_COUNT];
	struct plan_linear pl[P_COUNT];
	const char *lin_name[P_COUNT]; /* planned linear layers, by id */
	int lin_w[P_COUNT];            /* and the weight each multiplies by */
	struct mesh_members gg[MAX_GGROUPS];   /* gather groups */
	int ngg;
	/* FSDP windows: compute-shaped gathered weights and their gradients,
	 * the non-layer ones (embed, norms, head) for the whole step, one
	 * layer's at a time */
	float *win, *gwin;
	size_t woff[P_COUNT];       /* offset of each gathered tensor's block */
	size_t win_nl, win_layer;   /* floats of the non-layer part, of one layer */
	size_t shard_nl, shard_layer; /* the same, this device's shards of them */
	/* at most one gather in flight (layer l+1 lands in grecv while layer
	 * l computes from the window, and moves into the window when l is
	 * done) and one reduce-scatter */
	float *gsend, *grecv, *ssend, *srecv;
	void *gh[MAX_GGROUPS], *sh[MAX_GGROUPS];
	int sl;                     /* layer whose gradients are in flight, or NONE */
	float *nstat;               /* [2N] split-norm / split-softmax statistics */
	float *xstat;               /* [ngather * N] gathered maxima */
	size_t rmax;                /* rows an expert device may receive */
	struct model_step *st;      /* the step in progress */
	int hook_rc;
	int B, N;
	struct param_info p[P_COUNT];
	int pidx[P_COUNT];          /* index into the table or -1 */
	struct param_info table[MODEL_MAX_PARAMS];
	int ntable;
	struct model_bucket bucket[MODEL_MAX_PARAMS];
	int nbucket;
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
	int32_t *counts_tmp;        /* [replicas, L_moe, E] */
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

/* which layers a stacked parameter has a slice for */
enum stack_kind { STACK_NONE, STACK_ALL, STACK_DENSE, STACK_MOE };

static enum stack_kind stack_kind(int id)
{
	switch (id) {
	case P_EMBED: case P_FINAL_NORM: case P_LM_HEAD:
		return STACK_NONE;
	case P_W_GATE: case P_W_UP: case P_W_DOWN:
		return STACK_DENSE;
	case P_ROUTER: case P_ROUTER_BIAS: case P_E_GATE: case P_E_UP: case P_E_DOWN:
	case P_S_GATE: case P_S_UP: case P_S_DOWN:
		return STACK_MOE;
	default:
		return STACK_ALL;
	}
}

/* The slice of stacked parameter id that layer l uses, or -1. */
static int layer_slot(const struct model *m, int id, int l)
{
	switch (stack_kind(id)) {
	case STACK_ALL:
		return l;
	case STACK_DENSE:
		return l < m->d.L_dense ? l : -1;
	case STACK_MOE:
		return l >= m->d.L_dense ? l - m->d.L_dense : -1;
	default:
		return -1;
	}
}

static void add_param(struct model *m, int id, const char *name, enum param_opt opt, bool decay,
		      int ndim, const int *shape, const char *const *axes)
{
	struct param_info *p = &m->p[id];
	size_t n = 1;
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = ndim;
	for (int i = 0; i < ndim; i++) {
		p->shape[i] = p->global_shape[i] = shape[i];
		p->axes[i] = axes[i];
		n *= (size_t)shape[i];
	}
	p->numel = n;
	p->opt = opt;
	p->decay = decay;
	p->stacked = !strcmp(axes[0], "layers");
	if (ndim >= 2) {
		p->mat_rows = shape[ndim - 2];
		p->mat_cols = shape[ndim - 1];
	}
	m->pidx[id] = n ? 0 : -1;
}

#define AXES(...) (const char *const[]){ __VA_ARGS__ }
#define PARAM(id, name, opt, decay, shape, axes) \
	add_param(m, id, name, opt, decay, (int)(sizeof(shape) / sizeof(int)), shape, axes)

/* The whole model's tensors, global shapes. */
static void build_table(struct model *m)
{
	const struct model_dims *d = &m->d;
	int L = d->L, Ld = d->L_dense, Lm = d->L_moe, QD = d->Hq * d->D, KD = d->Hkv * d->D;
	int SF = d->S * d->Fe;
	int s_embed[] = { d->V, d->C };
	int s_norm[] = { L, d->C };
	int s_q[] = { L, QD, d->C }, s_k[] = { L, KD, d->C }, s_o[] = { L, d->C, QD };
	int s_up[] = { Ld, d->F, d->C }, s_down[] = { Ld, d->C, d->F };
	int s_router[] = { Lm, d->E, d->C }, s_rbias[] = { Lm, d->E };
	int s_eup[] = { Lm, d->E, d->Fe, d->C }, s_edown[] = { Lm, d->E, d->C, d->Fe };
	int s_sup[] = { Lm, SF, d->C }, s_sdown[] = { Lm, d->C, SF };
	int s_fnorm[] = { d->C };

	PARAM(P_EMBED, "embed", OPT_ADAMW, true, s_embed, AXES("vocab", "embed"));
	PARAM(P_ATTN_NORM, "attn_norm", OPT_ADAMW, false, s_norm, AXES("layers", "norm"));
	PARAM(P_WQ, "wq", OPT_MUON, true, s_q, AXES("layers", "q_heads", "embed"));
	PARAM(P_WK, "wk", OPT_MUON, true, s_k, AXES("layers", "kv_heads", "embed"));
	PARAM(P_WV, "wv", OPT_MUON, true, s_k, AXES("layers", "kv_heads", "embed"));
	PARAM(P_WO, "wo", OPT_MUON, true, s_o, AXES("layers", "embed", "q_heads"));
	PARAM(P_MLP_NORM, "mlp_norm", OPT_ADAMW, false, s_norm, AXES("layers", "norm"));
	PARAM(P_W_GATE, "w_gate", OPT_MUON, true, s_up, AXES("layers", "mlp", "embed"));
	PARAM(P_W_UP, "w_up", OPT_MUON, true, s_up, AXES("layers", "mlp", "embed"));
	PARAM(P_W_DOWN, "w_down", OPT_MUON, true, s_down, AXES("layers", "embed", "mlp"));
	PARAM(P_ROUTER, "router", OPT_ADAMW, true, s_router, AXES("layers", "exp", "embed_moe"));
	PARAM(P_ROUTER_BIAS, "router_bias", OPT_NONE, false, s_rbias, AXES("layers", "exp"));
	PARAM(P_E_GATE, "e_gate", OPT_MUON, true, s_eup, AXES("layers", "exp", "mlp_moe", "embed_moe"));
	PARAM(P_E_UP, "e_up", OPT_MUON, true, s_eup, AXES("layers", "exp", "mlp_moe", "embed_moe"));
	PARAM(P_E_DOWN, "e_down", OPT_MUON, true, s_edown, AXES("layers", "exp", "embed_moe", "mlp_moe"));
	PARAM(P_S_GATE, "s_gate", OPT_MUON, true, s_sup, AXES("layers", "mlp", "embed"));
	PARAM(P_S_UP, "s_up", OPT_MUON, true, s_sup, AXES("layers", "mlp", "embed"));
	PARAM(P_S_DOWN, "s_down", OPT_MUON, true, s_sdown, AXES("layers", "embed", "mlp"));
	PARAM(P_FINAL_NORM, "final_norm", OPT_ADAMW, false, s_fnorm, AXES("norm"));
	if (!d->tied) {
		int s_head[] = { d->V, d->C };
		PARAM(P_LM_HEAD, "lm_head", OPT_ADAMW, true, s_head, AXES("vocab", "embed"));
	} else {
		m->pidx[P_LM_HEAD] = -1;
	}
	if (!d->router_bias)
		m->pidx[P_ROUTER_BIAS] = -1;
}

/* Offsets in the one allocation, ordered by gradient-sum axes so that each
 * bucket is one contiguous range; the table keeps the declaration order. */
static void lay_out_params(struct model *m, size_t align)
{
	bool done[P_COUNT] = { false };
	m->numel = 0;
	m->ntable = m->nbucket = 0;
	for (int id = 0; id < P_COUNT; id++)
		if (m->pidx[id] >= 0)
			m->pidx[id] = m->ntable++;
	for (int id = 0; id < P_COUNT; id++) {
		if (m->pidx[id] < 0 || done[id])
			continue;
		uint32_t axes = m->p[id].gsum;
		struct model_bucket *b = &m->bucket[m->nbucket++];
		b->axes = axes;
		b->offset = m->numel;
		for (int j = id; j < P_COUNT; j++) {
			if (m->pidx[j] < 0 || done[j] || m->p[j].gsum != axes)
				continue;
			m->p[j].offset = m->numel;
			m->numel += m->p[j].numel;
			done[j] = true;
		}
		b->numel = m->numel - b->offset;
		b->padded = align > 1 ? (b->numel + align - 1) / align * align : b->numel;
		m->numel = b->offset + b->padded;
	}
	for (int id = 0; id < P_COUNT; id++)
		if (m->pidx[id] >= 0)
			m->table[m->pidx[id]] = m->p[id];
}

int model_param_table(const struct model_dims *d, struct param_info *out, int max)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->d = *d;
	build_table(m);
	lay_out_params(m, 1);
	int n = m->ntable;
	memcpy(out, m->table, sizeof(*out) * (size_t)(n < max ? n : max));
	free(m);
	return n;
}

size_t param_global_index(const struct param_info *p, size_t i)
{
	size_t g = 0, stride = 1;
	for (int k = p->ndim - 1; k >= 0; k--) {
		size_t c = i % (size_t)p->shape[k];
		i /= (size_t)p->shape[k];
		g += (c + (size_t)p->goff[k]) * stride;
		stride *= (size_t)p->global_shape[k];
	}
	return g;
}

/* ---- placement ---- */

static int mesh_axes_size_or1(const struct model *m, uint32_t mask)
{
	return m->mesh ? mesh_axes_size(m->mesh, mask) : 1;
}

/* Index of this device's block over axes in the order listed. */
static int block_index(const struct mesh *ms, const int *coord, const int *axes, int n)
{
	int idx = 0;
	for (int k = 0; k < n; k++)
		idx = idx * ms->size[axes[k]] + coord[axes[k]];
	return idx;
}

/* One activation's spec: [batch, length, dim] with the given logical name
 * for dim, of size n (unit: heads). */
static int act_axes(struct plan_axes *out, uint32_t *rows, const struct model_mesh *mm,
		    const char *name, const char *logical, int n, int unit, char *err, size_t errlen)
{
	struct shard_spec s;
	int shape[3] = { mm->mesh->num_devices, 1, n };
	int units[3] = { 1, 1, unit };
	const char *const names[3] = { "activation_batch", "activation_length", logical };
	int rc = shard_resolve(mm->rules, mm->mesh, name, 3, shape, units, names, &s, err, errlen);
	if (rc)
		return rc;
	if (s.axes[1]) {
		snprintf(err, errlen, "sharding: '%s' splits activation_length over context or sequence "
			 "axes, which are not implemented yet", name);
		return -EINVAL;
	}
	plan_axes_of(out, &s, 2);
	if (*rows == UINT32_MAX)
		*rows = s.axes[0];
	else if (*rows != s.axes[0]) {
		snprintf(err, errlen, "sharding: the rules split activation_batch differently in '%s'", name);
		return -EINVAL;
	}
	return 0;
}

/* The config key behind a logical dimension, for messages. */
static const char *dim_key(const char *msg)
{
	static const char *const keys[][2] = {
		{ "('q_heads',", "base_num_query_heads" }, { "('kv_heads',", "base_num_kv_heads" },
		{ "('mlp',", "base_mlp_dim" }, { "('mlp_moe',", "base_moe_mlp_dim (or base_mlp_dim)" },
		{ "('embed',", "base_emb_dim" }, { "('embed_moe',", "base_emb_dim" },
		{ "('vocab',", "vocab_size" }, { "('exp',", "num_experts" },
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strstr(msg, keys[i][0]))
			return keys[i][1];
	return NULL;
}

static int plan_one(struct model *m, const struct model_mesh *mm, int id, uint32_t rows,
		    char *err, size_t errlen)
{
	struct param_info *p = &m->p[id];
	if (m->pidx[id] < 0)
		return 0;
	int rc = plan_param(&m->pp[id], mm->rules, mm->mesh, p->name, p->ndim, p->global_shape, p->axes,
			    m->d.D, rows, err, errlen);
	const char *key = rc ? dim_key(err) : NULL;
	size_t used = strlen(err);
	if (key && used < errlen)
		snprintf(err + used, errlen - used, " (key '%s')", key);
	return rc;
}

static int lin(struct model *m, int id, const char *name, int wid, int out_dim, int in_dim,
	       const struct plan_axes *x_in, const struct plan_axes *y_out, char *err, size_t errlen)
{
	if (m->pidx[wid] < 0)
		return 0;
	m->lin_name[id] = name;
	m->lin_w[id] = wid;
	return plan_linear(&m->pl[id], name, &m->pp[wid], out_dim, in_dim, x_in, y_out, err, errlen);
}

static int add_gather_group(struct model *m, uint32_t axes, int dev)
{
	for (int k = 0; k < m->ngg; k++)
		if (m->gg[k].axes == axes)
			return 0;
	if (m->ngg == MAX_GGROUPS)
		return -ENOSPC;
	int rc = mesh_members_init(m->mesh, dev, axes, &m->gg[m->ngg]);
	if (!rc)
		m->ngg++;
	return rc;
}

/* Plans every tensor and linear layer for this device and sets the local
 * dims; fills the table's storage shapes and offsets. */
static int plan_model(struct model *m, const struct model_mesh *mm, char *err, size_t errlen)
{
	const struct model_dims *d = &m->d;
	const struct mesh *ms = mm->mesh;
	struct plan_axes a_emb, a_heads, a_kv, a_mlp, a_mlpe, a_mlps, a_vocab, none = { 0 };
	uint32_t rows = UINT32_MAX;
	int rc;

	m->mesh = ms;
	mesh_coords(ms, mm->device, m->coord);
	if ((rc = act_axes(&a_emb, &rows, mm, "activation", "activation_embed", d->C, 1, err, errlen)))
		return rc;
	/* the weights first: a split that does not divide is reported on them */
	for (int id = 0; id < P_COUNT; id++)
		if ((rc = plan_one(m, mm, id, rows, err, errlen)))
			return rc;
	if ((rc = act_axes(&a_heads, &rows, mm, "q", "activation_heads", d->Hq * d->D, d->D, err, errlen)) ||
	    (rc = act_axes(&a_kv, &rows, mm, "k", "activation_heads", d->Hkv * d->D, d->D, err, errlen)) ||
	    (rc = act_axes(&a_vocab, &rows, mm, "logits", "activation_vocab", d->V, 1, err, errlen)))
		return rc;
	if (d->L_dense && (rc = act_axes(&a_mlp, &rows, mm, "mlp hidden", "activation_mlp", d->F, 1, err, errlen)))
		return rc;
	if (d->L_moe && ((rc = act_axes(&a_mlpe, &rows, mm, "expert hidden", "activation_mlp", d->Fe, 1, err, errlen)) ||
			 (d->S && (rc = act_axes(&a_mlps, &rows, mm, "shared expert hidden", "activation_mlp",
						 d->S * d->Fe, 1, err, errlen)))))
		return rc;
	if (plan_axes_mask(&a_heads) != plan_axes_mask(&a_kv)) {
		snprintf(err, errlen, "sharding: query and kv heads must split over the same axes");
		return -EINVAL;
	}
	m->rows = rows;
	m->ax_emb = plan_axes_mask(&a_emb);
	m->ax_vocab = plan_axes_mask(&a_vocab);

	/* experts: their `exp` axes carry the tokens (all_to_all), so what
	 * splits the rows there is the rest of the batch axes */
	m->ep = 1;
	uint32_t rows_exp = rows;
	int exp_axes[AX_COUNT], nexp = 0;
	if (d->L_moe) {
		/* the weights' plans above resolved exp already */
		m->ax_exp = m->pp[P_E_GATE].spec.axes[1];
		if (m->ax_exp & ~rows) {
			char a[96];
			plan_mask_text(m->ax_exp & ~rows, a, sizeof(a));
			snprintf(err, errlen, "sharding: experts ('exp') are split over %s, which does not "
				 "split the batch (activation_batch), so tokens cannot travel to them", a);
			return -EINVAL;
		}
		rows_exp = rows & ~m->ax_exp;
		m->ep = mesh_axes_size(ms, m->ax_exp);
		for (int id = P_E_GATE; id <= P_E_DOWN; id++)
			if ((rc = plan_one(m, mm, id, rows_exp, err, errlen)))
				return rc;
		nexp = m->pp[P_E_GATE].spec.naxes[1];
		memcpy(exp_axes, m->pp[P_E_GATE].spec.axis[1], sizeof(int) * (size_t)nexp);
	}
	if ((rc = plan_param_slice(&m->pp[P_ATTN_NORM], ms, 1, &a_emb, err, errlen)) ||
	    (rc = plan_param_slice(&m->pp[P_MLP_NORM], ms, 1, &a_emb, err, errlen)) ||
	    (rc = plan_param_slice(&m->pp[P_FINAL_NORM], ms, 0, &a_emb, err, errlen)))
		return rc;
	for (int id = 0; id < P_COUNT; id++) {
		if (m->pidx[id] < 0 || !m->pp[id].gather || !m->pp[id].slice)
			continue;
		snprintf(err, errlen, "sharding: tensor '%s' is both gathered and sliced", m->p[id].name);
		return -EINVAL;
	}

	/* the embedding lookup is a matmul of one-hot rows by the table: a
	 * split vocabulary gives partial rows */
	struct plan_axes a_ev;
	a_ev.n = plan_kept_axes(&m->pp[P_EMBED], 0, a_ev.axis);
	int head = d->tied ? P_EMBED : P_LM_HEAD;
	if ((rc = lin(m, P_EMBED, "embedding", P_EMBED, 1, 0, &a_ev, &a_emb, err, errlen)) ||
	    (rc = lin(m, P_LM_HEAD, "output projection", head, 0, 1, &a_emb, &a_vocab, err, errlen)) ||
	    (rc = lin(m, P_WQ, "q projection", P_WQ, 1, 2, &a_emb, &a_heads, err, errlen)) ||
	    (rc = lin(m, P_WK, "k projection", P_WK, 1, 2, &a_emb, &a_kv, err, errlen)) ||
	    (rc = lin(m, P_WV, "v projection", P_WV, 1, 2, &a_emb, &a_kv, err, errlen)) ||
	    (rc = lin(m, P_WO, "attention output", P_WO, 1, 2, &a_heads, &a_emb, err, errlen)))
		return rc;
	if (d->L_dense &&
	    ((rc = lin(m, P_W_GATE, "mlp gate", P_W_GATE, 1, 2, &a_emb, &a_mlp, err, errlen)) ||
	     (rc = lin(m, P_W_UP, "mlp up", P_W_UP, 1, 2, &a_emb, &a_mlp, err, errlen)) ||
	     (rc = lin(m, P_W_DOWN, "mlp down", P_W_DOWN, 1, 2, &a_mlp, &a_emb, err, errlen))))
		return rc;
	if (d->L_moe &&
	    ((rc = lin(m, P_ROUTER, "router", P_ROUTER, 1, 2, &a_emb, &none, err, errlen)) ||
	     (rc = lin(m, P_E_GATE, "expert gate", P_E_GATE, 2, 3, &a_emb, &a_mlpe, err, errlen)) ||
	     (rc = lin(m, P_E_UP, "expert up", P_E_UP, 2, 3, &a_emb, &a_mlpe, err, errlen)) ||
	     (rc = lin(m, P_E_DOWN, "expert down", P_E_DOWN, 2, 3, &a_mlpe, &a_emb, err, errlen))))
		return rc;
	if (d->L_moe && d->S &&
	    ((rc = lin(m, P_S_GATE, "shared gate", P_S_GATE, 1, 2, &a_emb, &a_mlps, err, errlen)) ||
	     (rc = lin(m, P_S_UP, "shared up", P_S_UP, 1, 2, &a_emb, &a_mlps, err, errlen)) ||
	     (rc = lin(m, P_S_DOWN, "shared down", P_S_DOWN, 1, 2, &a_mlps, &a_emb, err, errlen))))
		return rc;
	m->ax_moe_out = m->pl[P_E_DOWN].reduce;
	if (d->L_moe && d->S && (m->pl[P_S_DOWN].reduce != m->ax_moe_out ||
				 m->pl[P_S_GATE].dx_reduce != m->pl[P_E_GATE].dx_reduce)) {
		snprintf(err, errlen, "sharding: shared and routed experts must split their hidden over the same axes");
		return -EINVAL;
	}

	/* what this device computes on */
	m->l.C = d->C / mesh_axes_size(ms, m->ax_emb);
	m->l.Hq = d->Hq / mesh_axes_size(ms, plan_axes_mask(&a_heads));
	m->l.Hkv = d->Hkv / mesh_axes_size(ms, plan_axes_mask(&a_heads));
	m->l.V = d->V / mesh_axes_size(ms, m->ax_vocab);
	if (d->L_dense)
		m->l.F = d->F / mesh_axes_size(ms, plan_axes_mask(&a_mlp));
	if (d->L_moe) {
		m->l.Fe = d->Fe / mesh_axes_size(ms, plan_axes_mask(&a_mlpe));
		m->SF = d->S ? d->S * d->Fe / mesh_axes_size(ms, plan_axes_mask(&a_mlps)) : 0;
		m->El = d->E / m->ep;
	}
	m->c0 = block_index(ms, m->coord, a_emb.axis, a_emb.n) * m->l.C;
	m->v0 = block_index(ms, m->coord, a_vocab.axis, a_vocab.n) * m->l.V;
	m->e0 = block_index(ms, m->coord, exp_axes, nexp) * m->El;
	m->Ve = m->pp[P_EMBED].cshape[0];
	m->v0e = block_index(ms, m->coord, a_ev.axis, a_ev.n) * m->Ve;
	if (m->ep > 1) {
		struct mesh_members eg;
		m->ep_blk = malloc(sizeof(int) * (size_t)m->ep);
		if (!m->ep_blk || mesh_members_init(ms, mm->device, m->ax_exp, &eg))
			return -ENOMEM;
		for (int r = 0; r < eg.n; r++) {
			m->ep_blk[r] = block_index(ms, eg.coord[r], exp_axes, nexp);
			m->ep_permute |= m->ep_blk[r] != r;
		}
		mesh_members_free(&eg);
	}

	/* storage shapes of this device's shards */
	for (int id = 0; id < P_COUNT; id++) {
		struct param_info *p = &m->p[id];
		const struct plan_param *pp = &m->pp[id];
		if (m->pidx[id] < 0)
			continue;
		int off[SHARD_MAX_DIMS];
		plan_block_offsets(pp, ms, pp->spec.used, m->coord, off);
		p->numel = pp->spec.local_numel;
		p->split = pp->spec.used;
		p->gsum = pp->gsum;
		for (int k = 0; k < p->ndim; k++) {
			p->shape[k] = pp->spec.local[k];
			p->goff[k] = off[k];
		}
		if (p->ndim >= 2)
			p->mat_split = pp->spec.axes[p->ndim - 2] | pp->spec.axes[p->ndim - 1];
		if (pp->gather && (rc = add_gather_group(m, pp->gather, mm->device)))
			return rc;
	}
	return 0;
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

/* floats of one slice of a stacked tensor (or the whole tensor) */
static size_t per_slice(const struct param_info *p)
{
	return p->stacked ? p->numel / (size_t)p->shape[0] : p->numel;
}

static size_t per_cslice(const struct plan_param *pp, const struct param_info *p)
{
	return p->stacked ? pp->cnumel / (size_t)pp->cshape[0] : pp->cnumel;
}

/* Window offsets: the non-layer gathered tensors, then one slice of every
 * stacked one; and the sizes of this device's shards of them, which the
 * gather and reduce-scatter buffers are cut to. */
static void lay_out_windows(struct model *m)
{
	size_t off[2] = { 0, 0 }, part[2] = { 0, 0 };
	for (int id = 0; id < P_COUNT; id++) {
		const struct param_info *p = &m->p[id];
		if (m->pidx[id] < 0 || !m->pp[id].gather)
			continue;
		m->woff[id] = off[p->stacked];
		off[p->stacked] += per_cslice(&m->pp[id], p);
		part[p->stacked] += per_slice(p);
	}
	m->win_nl = off[0];
	m->win_layer = off[1];
	m->shard_nl = part[0];
	m->shard_layer = part[1];
}

#define NONE_LAYER (-2)

/* The largest gathered window (whole: what a gather receives and a
 * reduce-scatter sends) and the largest shard (part), non-layer or one
 * layer. */
static void window_sizes(const struct model *m, size_t *whole, size_t *part)
{
	*whole = m->win_nl > m->win_layer ? m->win_nl : m->win_layer;
	*part = m->shard_nl > m->shard_layer ? m->shard_nl : m->shard_layer;
}

static void lay_out(struct model *m, struct arena *a)
{
	const struct model_dims *d = &m->l;
	size_t N = (size_t)m->N, C = d->C, QD = (size_t)d->Hq * d->D, KD = (size_t)d->Hkv * d->D;
	size_t NK = N * (size_t)m->d.K, SF = (size_t)m->SF, R = m->rmax, E = m->d.E;
	size_t att = (size_t)m->B * d->Hq * d->T * d->T;
	size_t big = N * (size_t)d->F;
	if (m->d.L_moe) {
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
	m->lnf = TAKEF(a, N * C);
	m->rstdf = TAKEF(a, N);
	m->nstat = TAKEF(a, 2 * N);
	m->xstat = TAKEF(a, N * (size_t)mesh_axes_size_or1(m, m->ax_vocab));
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
	/* a gather sends this device's shards and receives every member's:
	 * the compute-shaped size; a reduce-scatter the other way round */
	size_t whole, part;
	window_sizes(m, &whole, &part);
	m->win = TAKEF(a, m->win_nl + m->win_layer);
	m->gwin = TAKEF(a, m->win_nl + m->win_layer);
	m->gsend = TAKEF(a, part);
	m->grecv = TAKEF(a, whole);
	m->ssend = TAKEF(a, whole);
	m->srecv = TAKEF(a, part);
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
		m->counts_tmp = TAKEI(a, (size_t)d->L_moe * E * (size_t)mesh_axes_size_or1(m, m->rows));
	}
}

/* The table, the plans and the layout; no buffers. */
static struct model *model_make(const struct model_dims *d, const struct model_mesh *mm,
				char *err, size_t errlen)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "model: out of memory");
		return NULL;
	}
	m->d = *d;
	m->l = *d;
	m->El = d->E;
	m->SF = d->S * d->Fe;
	m->ep = 1;
	m->Ve = d->V;
	build_table(m);
	if (mm && mm->mesh->num_devices > 1) {
		int rc = plan_model(m, mm, err, errlen);
		if (rc == -ENOMEM || rc == -ENOSPC)
			snprintf(err, errlen, "model: out of memory for the plans");
		if (rc) {
			model_free(m);
			return NULL;
		}
	}
	lay_out_params(m, mm && mm->bucket_align > 1 ? (size_t)mm->bucket_align : 1);
	lay_out_windows(m);
	return m;
}

struct model *model_plan_new(const struct model_dims *d, const struct model_mesh *mm,
			     char *err, size_t errlen)
{
	return model_make(d, mm, err, errlen);
}

struct model *model_new(const struct model_dims *d, int B, const struct model_mesh *mm,
			char *err, size_t errlen)
{
	struct model *m = model_make(d, mm, err, errlen);
	if (!m)
		return NULL;
	m->rmax = (size_t)m->ep * (size_t)B * d->T * (size_t)(d->L_moe ? d->K : 1);
	m->B = B;
	m->N = B * d->T;
	if (m->rmax == 0)
		m->rmax = 1;
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

int model_linears(const struct model *m, struct model_linear_info *out, int max)
{
	int n = 0;
	for (int id = 0; id < P_COUNT; id++) {
		if (!m->lin_name[id] || m->pidx[m->lin_w[id]] < 0)
			continue;
		if (n < max) {
			const struct plan_param *w = &m->pp[m->lin_w[id]];
			out[n] = (struct model_linear_info){
				.name = m->lin_name[id], .weight = m->p[m->lin_w[id]].name,
				.gather = w->gather, .reduce = m->pl[id].reduce,
				.dx_reduce = id == P_EMBED ? 0 : m->pl[id].dx_reduce,
				.dw_scatter = m->pl[id].dw_scatter, .gsum = w->gsum,
			};
		}
		n++;
	}
	return n;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	free(m->act_mem);
	free(m->params);
	free(m->grads);
	free(m->la);
	free(m->ep_blk);
	for (int k = 0; k < m->ngg; k++)
		mesh_members_free(&m->gg[k]);
	free(m);
}

const struct model_dims *model_dims(const struct model *m) { return &m->d; }
int model_num_params(const struct model *m) { return m->ntable; }
const struct param_info *model_param(const struct model *m, int i) { return &m->table[i]; }
float *model_params(struct model *m) { return m->params; }
float *model_grads(struct model *m) { return m->grads; }
size_t model_numel(const struct model *m) { return m->numel; }
const int32_t *model_expert_counts(const struct model *m) { return m->counts_all; }
uint32_t model_rows_axes(const struct model *m) { return m->rows; }

int model_plan_rows(const struct model_mesh *mm, int C, uint32_t *rows, char *err, size_t errlen)
{
	struct plan_axes a;
	*rows = UINT32_MAX;
	return act_axes(&a, rows, mm, "activation", "activation_embed", C, 1, err, errlen);
}
const struct mesh *model_mesh(const struct model *m) { return m->mesh; }

const struct plan_param *model_param_plan(const struct model *m, int i)
{
	for (int id = 0; m->mesh && id < P_COUNT; id++)
		if (m->pidx[id] == i)
			return &m->pp[id];
	return NULL;
}
size_t model_window_numel(const struct model *m)
{
	size_t whole, part;
	window_sizes(m, &whole, &part);
	return 2 * (m->win_nl + m->win_layer) + 2 * whole + 2 * part;
}

int model_buckets(const struct model *m, struct model_bucket *out, int max)
{
	memcpy(out, m->bucket, sizeof(*out) * (size_t)(m->nbucket < max ? m->nbucket : max));
	return m->nbucket;
}

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

/* ---- executing the plans ---- */

/* Sums buf over axes (partial sums the plan named). A failure is
 * remembered and reported after the pass. */
static void psum(struct model *m, uint32_t axes, float *buf, size_t n)
{
	if (axes && !m->hook_rc)
		m->hook_rc = m->st->comm->all_reduce(m->st->comm->ctx, axes, buf, n);
}

/* Where gathered parameter id's compute-shaped block lives: the
 * non-layer part, or the one layer's. */
static float *window(struct model *m, bool grads, int id)
{
	return (grads ? m->gwin : m->win) + (m->p[id].stacked ? m->win_nl : 0) + m->woff[id];
}

/* Compute-shaped weights (or gradients, grads) of parameter id for layer l:
 * the gathered window, or this device's storage (a slice of it for a
 * replicated norm under a split embedding). */
/* Storage slice of id for group g. */
static float *storage(struct model *m, float *buf, int id, int g)
{
	const struct param_info *p = &m->p[id];
	return buf + p->offset + (p->stacked ? per_slice(p) * (size_t)layer_slot(m, id, g) : 0);
}

static float *wsel(struct model *m, bool grads, int id, int l)
{
	if (m->pidx[id] < 0)
		return NULL;
	if (m->pp[id].gather)
		return window(m, grads, id);
	float *b = storage(m, grads ? m->grads : m->params, id, l);
	if (m->pp[id].slice)
		b += m->c0;
	return b;
}

#define WP(id, l) wsel(m, false, id, l)
#define GP(id, l) wsel(m, true, id, l)

/* Is id gathered and in group g (-1: the non-layer tensors, else layer g)? */
static bool in_group(const struct model *m, int id, int g, uint32_t axes, bool grads)
{
	const struct param_info *p = &m->p[id];
	if (m->pidx[id] < 0 || m->pp[id].gather != axes || (grads && p->opt == OPT_NONE))
		return false;
	return g < 0 ? !p->stacked : p->stacked && layer_slot(m, id, g) >= 0;
}

/* Moves member r's blocks of group g's tensors between the packed buffer
 * (pack floats per member) and the window. */
static void place_blocks(struct model *m, const struct mesh_members *gg, int g, bool grads,
			 float *packed, size_t pack, bool into_window)
{
	for (int r = 0; r < gg->n; r++) {
		size_t off = 0;
		for (int id = 0; id < P_COUNT; id++) {
			if (!in_group(m, id, g, gg->axes, grads))
				continue;
			const struct param_info *p = &m->p[id];
			const struct plan_param *pp = &m->pp[id];
			int o[SHARD_MAX_DIMS], k = p->stacked ? 1 : 0;
			plan_block_offsets(pp, m->mesh, gg->axes, gg->coord[r], o);
			plan_copy_block(window(m, grads, id), pp->cshape + k,
					packed + (size_t)r * pack + off, p->shape + k, o + k, p->ndim - k,
					into_window);
			off += per_slice(p);
		}
	}
}

/* Floats group g packs for gather group gg (per member). */
static size_t pack_size(const struct model *m, const struct mesh_members *gg, int g, bool grads)
{
	size_t pack = 0;
	for (int id = 0; id < P_COUNT; id++)
		if (in_group(m, id, g, gg->axes, grads))
			pack += per_slice(&m->p[id]);
	return pack;
}

/* A collective that finished (or failed): the first failure is kept. */
static void wait_handle(struct model *m, void **h)
{
	if (!*h)
		return;
	const struct model_comm *c = m->st->comm;
	int rc = c->wait(c->ctx, *h);
	*h = NULL;
	if (!m->hook_rc)
		m->hook_rc = rc;
}

/* FSDP: starts all-gathering group g's sharded weights (layer g, or the
 * non-layer tensors for -1) into grecv; without async hooks it gathers at
 * once. The previous group's gather must be finished. */
static void gather_start(struct model *m, int g)
{
	const struct model_comm *c = m->st->comm;
	size_t soff = 0, roff = 0;
	for (int k = 0; k < m->ngg && !m->hook_rc; k++) {
		const struct mesh_members *gg = &m->gg[k];
		size_t pack = 0;
		float *send = m->gsend + soff, *recv = m->grecv + roff;
		for (int id = 0; id < P_COUNT; id++) {
			if (!in_group(m, id, g, gg->axes, false))
				continue;
			size_t n = per_slice(&m->p[id]);
			memcpy(send + pack, storage(m, m->params, id, g), n * sizeof(float));
			pack += n;
		}
		if (!pack)
			continue;
		if (c->start_all_gather)
			m->hook_rc = c->start_all_gather(c->ctx, gg->axes, recv, send, pack * sizeof(float),
							 &m->gh[k]);
		else
			m->hook_rc = c->all_gather(c->ctx, gg->axes, recv, send, pack * sizeof(float));
		soff += pack;
		roff += pack * (size_t)gg->n;
	}
}

/* Waits for group g's gather and places the blocks in its window. */
static void gather_finish(struct model *m, int g)
{
	size_t roff = 0;
	for (int k = 0; k < m->ngg; k++) {
		const struct mesh_members *gg = &m->gg[k];
		size_t pack = pack_size(m, gg, g, false);
		wait_handle(m, &m->gh[k]);
		if (!pack || m->hook_rc)
			continue;
		place_blocks(m, gg, g, false, m->grecv + roff, pack, true);
		roff += pack * (size_t)gg->n;
	}
}

/* Zeroes group g's gradient window. */
static void zero_grad_window(struct model *m, int g)
{
	for (int id = 0; id < P_COUNT; id++)
		if (m->pidx[id] >= 0 && m->pp[id].gather && in_group(m, id, g, m->pp[id].gather, true))
			memset(window(m, true, id), 0, per_cslice(&m->pp[id], &m->p[id]) * sizeof(float));
}

/* Waits for the reduce-scatter in flight and adds its parts to this
 * device's gradient shards. */
static void scatter_finish(struct model *m)
{
	int g = m->sl;
	size_t roff = 0;
	if (g == NONE_LAYER)
		return;
	m->sl = NONE_LAYER;
	for (int k = 0; k < m->ngg; k++) {
		const struct mesh_members *gg = &m->gg[k];
		wait_handle(m, &m->sh[k]);
		for (int id = 0; id < P_COUNT && !m->hook_rc; id++) {
			if (!in_group(m, id, g, gg->axes, true))
				continue;
			size_t n = per_slice(&m->p[id]);
			float *dst = storage(m, m->grads, id, g);
			for (size_t i = 0; i < n; i++)
				dst[i] += m->srecv[roff + i];
			roff += n;
		}
	}
}

/* FSDP, the transpose of the gather: reduce-scatters group g's window
 * gradients to their shards, in the background (the previous group's
 * is finished first: one in flight). */
static void scatter_start(struct model *m, int g)
{
	const struct model_comm *c = m->st->comm;
	size_t soff = 0, roff = 0;
	scatter_finish(m);
	for (int k = 0; k < m->ngg && !m->hook_rc; k++) {
		const struct mesh_members *gg = &m->gg[k];
		size_t pack = pack_size(m, gg, g, true);
		if (!pack)
			continue;
		float *send = m->ssend + soff, *recv = m->srecv + roff;
		place_blocks(m, gg, g, true, send, pack, false);
		if (c->start_reduce_scatter)
			m->hook_rc = c->start_reduce_scatter(c->ctx, gg->axes, recv, send, pack, &m->sh[k]);
		else
			m->hook_rc = c->reduce_scatter(c->ctx, gg->axes, recv, send, pack);
		soff += pack * (size_t)gg->n;
		roff += pack;
	}
	m->sl = g;
}

/* After a failure: every collective in flight is waited for (its buffers
 * are ours), none started. */
static void drain(struct model *m)
{
	for (int k = 0; k < m->ngg; k++) {
		wait_handle(m, &m->gh[k]);
		wait_handle(m, &m->sh[k]);
	}
	m->sl = NONE_LAYER;
}

/* ---- forward ---- */

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
			int n = a->cnt_all[src * E + m->e0 + j];
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
	const struct model_comm *c = m->st->comm;
	if (!m->hook_rc)
		m->hook_rc = c->all_to_all(c->ctx, m->ax_exp, out, recv_b, in, send_b);
}

/* Expert parallelism: lays the expert-sorted rows out by destination
 * device (the devices of the expert group in rank order, each holding one
 * block of El experts), learns every device's per-expert counts, and sends
 * each device the rows of its experts. */
static void ep_dispatch(struct model *m, struct layer_acts *a, int C)
{
	int E = m->d.E, El = m->El, NK = m->N * m->d.K;
	if (m->ep_permute) {
		/* rows in the order of the group's members, not of the blocks */
		int32_t *tmp = (int32_t *)m->dweights; /* free during forward: NK ints */
		size_t r = 0;
		for (int x = 0; x < m->ep; x++) {
			int b = m->ep_blk[x];
			int lo = a->offsets[b * El], hi = a->offsets[(b + 1) * El];
			memcpy(tmp + r, a->order + lo, sizeof(int32_t) * (size_t)(hi - lo));
			r += (size_t)(hi - lo);
		}
		memcpy(a->order, tmp, sizeof(int32_t) * (size_t)NK);
	}
	moe_gather(a->xs, a->ln2, a->order, NK, m->d.K, C);
	const struct model_comm *c = m->st->comm;
	if (!m->hook_rc)
		m->hook_rc = c->all_gather(c->ctx, m->ax_exp, a->cnt_all, a->counts, sizeof(int32_t) * E);
	if (m->hook_rc)
		return;
	for (int x = 0; x < m->ep; x++) {
		size_t sr = 0, rr = 0;
		for (int j = 0; j < El; j++) {
			sr += (size_t)a->counts[m->ep_blk[x] * El + j];
			rr += (size_t)a->cnt_all[x * E + m->e0 + j];
		}
		a->send_b[x] = sr * (size_t)C * sizeof(float);
		a->recv_b[x] = rr * (size_t)C * sizeof(float);
	}
	ep_exchange(m, a->xr, a->recv_b, a->xs, a->send_b);
}

/* RMSNorm over the embedding, which may be split over devices. */
static void norm_forward(struct model *m, float *out, float *rstd, const float *x, const float *w)
{
	if (!m->ax_emb) {
		rmsnorm_forward(out, rstd, x, w, m->N, m->l.C, m->d.eps);
		return;
	}
	rmsnorm_partial_sumsq(m->nstat, x, m->N, m->l.C);
	psum(m, m->ax_emb, m->nstat, (size_t)m->N);
	rmsnorm_forward_split(out, rstd, x, w, m->nstat, m->N, m->l.C, m->d.C, m->d.eps);
}

static void norm_backward(struct model *m, float *dx, float *dw, const float *dout, const float *x,
			  const float *w, const float *rstd)
{
	if (!m->ax_emb) {
		rmsnorm_backward(dx, dw, dout, x, w, rstd, m->N, m->l.C);
		return;
	}
	rmsnorm_backward_partial(m->nstat, dout, x, w, m->N, m->l.C);
	psum(m, m->ax_emb, m->nstat, (size_t)m->N);
	rmsnorm_backward_split(dx, dw, dout, x, w, rstd, m->nstat, m->N, m->l.C, m->d.C);
}

static void layer_forward(struct model *m, int l)
{
	const struct model_dims *d = &m->l;
	struct layer_acts *a = &m->la[l];
	int N = m->N, C = d->C, QD = d->Hq * d->D, KD = d->Hkv * d->D;
	float *x = m->resid + (size_t)l * N * C, *xo = x + (size_t)N * C;
	float *tmp = m->dln; /* dln is free during forward */

	gather_finish(m, l);
	if (l + 1 < d->L)     /* the next layer's weights arrive meanwhile */
		gather_start(m, l + 1);
	norm_forward(m, a->ln1, a->rstd1, x, WP(P_ATTN_NORM, l));
	linear_forward(a->q, a->ln1, WP(P_WQ, l), N, C, QD);
	linear_forward(a->k, a->ln1, WP(P_WK, l), N, C, KD);
	linear_forward(a->v, a->ln1, WP(P_WV, l), N, C, KD);
	psum(m, m->pl[P_WQ].reduce, a->q, (size_t)N * QD);
	psum(m, m->pl[P_WK].reduce, a->k, (size_t)N * KD);
	psum(m, m->pl[P_WV].reduce, a->v, (size_t)N * KD);
	rope_forward(a->q, a->q, m->cos_t, m->sin_t, m->B, d->T, d->Hq, d->D);
	rope_forward(a->k, a->k, m->cos_t, m->sin_t, m->B, d->T, d->Hkv, d->D);
	attention_forward(a->atty, a->att, a->q, a->k, a->v, m->B, d->T, d->Hq, d->Hkv, d->D);
	linear_forward(tmp, a->atty, WP(P_WO, l), N, QD, C);
	psum(m, m->pl[P_WO].reduce, tmp, (size_t)N * C);
	residual_forward(a->xmid, x, tmp, N * C);
	norm_forward(m, a->ln2, a->rstd2, a->xmid, WP(P_MLP_NORM, l));

	if (l < d->L_dense) {
		linear_forward(a->g, a->ln2, WP(P_W_GATE, l), N, C, d->F);
		linear_forward(a->u, a->ln2, WP(P_W_UP, l), N, C, d->F);
		psum(m, m->pl[P_W_GATE].reduce, a->g, (size_t)N * d->F);
		psum(m, m->pl[P_W_UP].reduce, a->u, (size_t)N * d->F);
		swiglu_forward(a->h, a->g, a->u, N, d->F);
		linear_forward(tmp, a->h, WP(P_W_DOWN, l), N, d->F, C);
		psum(m, m->pl[P_W_DOWN].reduce, tmp, (size_t)N * C);
		residual_forward(xo, a->xmid, tmp, N * C);
		return;
	}

	/* MoE: route, run each expert on its rows, combine */
	int lm = l - d->L_dense, E = d->E, K = d->K, Fe = d->Fe, NK = N * K;
	float *logits = m->dlogits_r; /* scratch in forward */
	linear_forward(logits, a->ln2, WP(P_ROUTER, l), N, C, E);
	psum(m, m->pl[P_ROUTER].reduce, logits, (size_t)N * E);
	moe_router_forward(a->weights, a->idx, a->scores, logits, WP(P_ROUTER_BIAS, l), N, E, K,
			   (enum moe_score)d->moe_score, d->norm_topk, d->routed_scale);
	moe_sort(a->order, a->offsets, a->idx, N, E, K);
	for (int e = 0; e < E; e++)
		a->counts[e] = a->offsets[e + 1] - a->offsets[e];
	/* expert parallelism: rows travel to the device owning their expert */
	float *X = a->xs, *Y = a->ey;
	if (m->ep > 1) {
		ep_dispatch(m, a, C);
		X = a->xr;
		Y = a->yr;
	} else {
		moe_gather(a->xs, a->ln2, a->order, NK, K, C);
	}
	float *wg = WP(P_E_GATE, l), *wu = WP(P_E_UP, l), *wd = WP(P_E_DOWN, l);
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
	psum(m, m->pl[P_E_GATE].reduce, a->eg, rows * Fe);
	psum(m, m->pl[P_E_UP].reduce, a->eu, rows * Fe);
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
		int SF = m->SF;
		linear_forward(a->sg, a->ln2, WP(P_S_GATE, l), N, C, SF);
		linear_forward(a->su, a->ln2, WP(P_S_UP, l), N, C, SF);
		psum(m, m->pl[P_S_GATE].reduce, a->sg, (size_t)N * SF);
		psum(m, m->pl[P_S_UP].reduce, a->su, (size_t)N * SF);
		swiglu_forward(a->sh, a->sg, a->su, N, SF);
		linear_forward_acc(tmp, a->sh, WP(P_S_DOWN, l), N, SF, C);
	}
	psum(m, m->ax_moe_out, tmp, (size_t)N * C);
	residual_forward(xo, a->xmid, tmp, N * C);
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
	return xent_split_finish(m->losses, m->probs, mx, st, N, V);
}

/* Runs the forward over all N rows; returns the sum of token losses. */
static double forward_all(struct model *m, const int32_t *inputs, const int32_t *targets)
{
	const struct model_dims *d = &m->d;
	int N = m->N, C = m->l.C;

	gather_start(m, -1);
	gather_finish(m, -1);
	gather_start(m, 0);
	/* this device's rows of the table (all of them unless split) */
	embedding_forward_range(m->resid, inputs, WP(P_EMBED, 0), m->v0e, m->Ve, N, C);
	psum(m, m->pl[P_EMBED].reduce, m->resid, (size_t)N * C);
	for (int l = 0; l < d->L; l++)
		layer_forward(m, l);
	float *xL = m->resid + (size_t)d->L * N * C;
	norm_forward(m, m->lnf, m->rstdf, xL, WP(P_FINAL_NORM, 0));
	linear_forward(m->logits, m->lnf, WP(head_id(m), 0), N, C, m->l.V);
	psum(m, m->pl[P_LM_HEAD].reduce, m->logits, (size_t)N * m->l.V);
	return xent_forward(m, targets);
}

double model_forward(struct model *m, const int32_t *inputs, const int32_t *targets, int rows)
{
	struct model_step st = { 0 };
	m->st = &st;
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
	float *dres = m->dresid, *dln = m->dln;

	/* the last layer's weights are still in the window from the forward;
	 * below it each layer's arrives while the one above it computes */
	if (l != d->L - 1)
		gather_finish(m, l);
	if (l >= 1)
		gather_start(m, l - 1);
	zero_grad_window(m, l);
	memset(dln, 0, sizeof(float) * (size_t)N * C);
	if (l < d->L_dense) {
		float *dh = m->dbig1, *dg = m->dbig2, *du = m->dbig3;
		size_t nf = (size_t)N * d->F;
		memset(dh, 0, nf * sizeof(float));
		linear_backward(dh, GP(P_W_DOWN, l), dres, a->h, WP(P_W_DOWN, l), N, d->F, C);
		psum(m, m->pl[P_W_DOWN].dx_reduce, dh, nf);
		memset(dg, 0, nf * sizeof(float));
		memset(du, 0, nf * sizeof(float));
		swiglu_backward(dg, du, dh, a->g, a->u, N, d->F);
		linear_backward(dln, GP(P_W_GATE, l), dg, a->ln2, WP(P_W_GATE, l), N, C, d->F);
		linear_backward(dln, GP(P_W_UP, l), du, a->ln2, WP(P_W_UP, l), N, C, d->F);
		psum(m, m->pl[P_W_GATE].dx_reduce, dln, (size_t)N * C);
	} else {
		int lm = l - d->L_dense, E = d->E, K = d->K, Fe = d->Fe, NK = N * K;
		if (d->S) {
			int SF = m->SF;
			size_t ns = (size_t)N * SF;
			float *dh = m->dbig1, *dg = m->dbig2, *du = m->dbig3;
			memset(dh, 0, ns * sizeof(float));
			linear_backward(dh, GP(P_S_DOWN, l), dres, a->sh, WP(P_S_DOWN, l), N, SF, C);
			psum(m, m->pl[P_S_DOWN].dx_reduce, dh, ns);
			memset(dg, 0, ns * sizeof(float));
			memset(du, 0, ns * sizeof(float));
			swiglu_backward(dg, du, dh, a->sg, a->su, N, SF);
			linear_backward(dln, GP(P_S_GATE, l), dg, a->ln2, WP(P_S_GATE, l), N, C, SF);
			linear_backward(dln, GP(P_S_UP, l), du, a->ln2, WP(P_S_UP, l), N, C, SF);
		}
		memset(m->dey, 0, sizeof(float) * (size_t)NK * C);
		memset(m->dweights, 0, sizeof(float) * (size_t)NK);
		moe_combine_backward(m->dey, m->dweights, dres, a->ey, a->weights, a->order, NK, K, C);
		/* the expert outputs were partial over the hidden's axes and
		 * split over the embedding's: so are the weights' gradients */
		psum(m, m->ax_moe_out | m->ax_emb, m->dweights, (size_t)NK);
		float *wg = WP(P_E_GATE, l), *wu = WP(P_E_UP, l), *wd = WP(P_E_DOWN, l);
		float *gg = GP(P_E_GATE, l), *gu = GP(P_E_UP, l), *gd = GP(P_E_DOWN, l);
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
		psum(m, m->pl[P_E_DOWN].dx_reduce, deh, rows * Fe);
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
		/* experts and shared experts gave partial sums over their
		 * hidden's axes; the router below adds its whole gradient once */
		psum(m, m->pl[P_E_GATE].dx_reduce, dln, (size_t)N * C);
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
		linear_backward(dln, GP(P_ROUTER, l), m->dlogits_r, a->ln2, WP(P_ROUTER, l), N, C, E);
	}
	norm_backward(m, dres, GP(P_MLP_NORM, l), dln, a->xmid, WP(P_MLP_NORM, l), a->rstd2);

	/* attention block: dres now holds dL/d(xmid) */
	memset(m->datty, 0, sizeof(float) * (size_t)N * QD);
	linear_backward(m->datty, GP(P_WO, l), dres, a->atty, WP(P_WO, l), N, QD, C);
	psum(m, m->pl[P_WO].dx_reduce, m->datty, (size_t)N * QD);
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
	linear_backward(dln, GP(P_WQ, l), m->dqr, a->ln1, WP(P_WQ, l), N, C, QD);
	linear_backward(dln, GP(P_WK, l), m->dkr, a->ln1, WP(P_WK, l), N, C, KD);
	linear_backward(dln, GP(P_WV, l), m->dv, a->ln1, WP(P_WV, l), N, C, KD);
	psum(m, m->pl[P_WQ].dx_reduce, dln, (size_t)N * C);
	norm_backward(m, dres, GP(P_ATTN_NORM, l), dln, x, WP(P_ATTN_NORM, l), a->rstd1);
	scatter_start(m, l);
}

/* MoE expert counts between forward and backward, summed over every
 * device with other rows (exact integers, added in rank order), so the
 * load-balance loss is that of the global batch. */
static void sum_counts(struct model *m)
{
	const struct model_comm *c = m->st->comm;
	int n = m->d.L_moe * m->d.E, reps = mesh_axes_size_or1(m, m->rows);
	if (!m->rows || m->hook_rc)
		return;
	m->hook_rc = c->all_gather(c->ctx, m->rows, m->counts_tmp, m->counts_all, sizeof(int32_t) * (size_t)n);
	for (int i = 0; !m->hook_rc && i < n; i++) {
		int32_t s = 0;
		for (int r = 0; r < reps; r++)
			s += m->counts_tmp[(size_t)r * n + i];
		m->counts_all[i] = s;
	}
}

int model_forward_backward(struct model *m, const int32_t *inputs, const int32_t *targets,
			   struct model_step *st)
{
	const struct model_dims *d = &m->d;
	int N = m->N, C = m->l.C, V = m->l.V;
	m->st = st;
	m->hook_rc = 0;
	m->sl = NONE_LAYER;
	st->loss_sum = forward_all(m, inputs, targets);
	st->aux = 0;
	if (d->L_moe)
		sum_counts(m);
	if (m->hook_rc) {
		drain(m);
		return m->hook_rc;
	}
	float loss_scale = st->loss_scale;

	zero_grad_window(m, -1);
	memset(m->dlogits, 0, sizeof(float) * (size_t)N * V);
	xent_split_backward(m->dlogits, m->probs, targets, m->v0, loss_scale, N, V);
	memset(m->dln, 0, sizeof(float) * (size_t)N * C);
	linear_backward(m->dln, GP(head_id(m), 0), m->dlogits, m->lnf, WP(head_id(m), 0), N, C, V);
	psum(m, m->pl[P_LM_HEAD].dx_reduce, m->dln, (size_t)N * C);
	memset(m->dresid, 0, sizeof(float) * (size_t)N * C);
	norm_backward(m, m->dresid, GP(P_FINAL_NORM, 0), m->dln, m->resid + (size_t)d->L * N * C,
		      WP(P_FINAL_NORM, 0), m->rstdf);
	for (int l = d->L - 1; l >= 0; l--)
		layer_backward(m, l, st);
	embedding_backward_range(GP(P_EMBED, 0), m->dresid, inputs, m->v0e, m->Ve, N, C);
	scatter_start(m, -1);
	scatter_finish(m);
	if (m->hook_rc)
		drain(m);
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
