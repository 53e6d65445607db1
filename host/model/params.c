/* The model's parameters: dims from the config, the parameter table and
 * its layout in the one allocation (ordered into gradient buckets), the
 * placement of every tensor and the plan of every linear layer on a mesh
 * (host/mesh/plan.h), and the deterministic init. No buffers but the
 * struct; nothing here runs the model. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/model/model_int.h"
#include "host/util/mix.h"
#include "kernels/kernels.h"

/* ---- dims ---- */

#define NEED(cond, ...) do { if (!(cond)) { snprintf(err, errlen, "config: " __VA_ARGS__); return -EINVAL; } } while (0)

/* DeepSeek-V3's group-limited routing (n_routing_groups,
 * topk_routing_group; -1: none, all groups). A group's score is the sum
 * of its two best experts, so a group holds at least two. */
static int routing_groups_from_cfg(struct model_dims *d, const struct cfg *c, char *err, size_t errlen)
{
	long long G = c->n_routing_groups, T = c->topk_routing_group;
	if (G == -1) {
		NEED(T == -1, "key 'topk_routing_group' (%lld) needs 'n_routing_groups' (-1: no groups)", T);
		return 0;
	}
	NEED(G >= 1 && d->E % G == 0,
	     "key 'n_routing_groups' (%lld) must divide 'num_experts' (%d) into groups", G, d->E);
	NEED(G == 1 || d->E / G >= 2,
	     "key 'n_routing_groups' (%lld) leaves %lld expert per group of 'num_experts' (%d): a group's score sums its best two",
	     G, d->E / G, d->E);
	if (T == -1)
		T = G;
	NEED(T >= 1 && T <= G, "key 'topk_routing_group' must be in [1, n_routing_groups=%lld] or -1, got %lld",
	     G, c->topk_routing_group);
	NEED(d->K <= T * (d->E / G),
	     "key 'num_experts_per_tok' (%d) is more than the %lld experts of the 'topk_routing_group'=%lld groups allowed (%lld per group)",
	     d->K, T * (d->E / G), T, d->E / G);
	d->groups = (int)G;
	d->topk_groups = (int)T;
	return 0;
}

int model_dims_from_cfg(struct model_dims *d, const struct cfg *c, char *err, size_t errlen)
{
	memset(d, 0, sizeof(*d));
	NEED(c->vocab_size >= 2 && c->vocab_size <= (1 << 24), "key 'vocab_size' must be in [2, 2^24], got %lld", c->vocab_size);
	NEED(c->base_emb_dim >= 1 && c->base_emb_dim <= 65536, "key 'base_emb_dim' must be in [1, 65536], got %lld", c->base_emb_dim);
	NEED(c->max_target_length >= 1 && c->max_target_length <= 65536, "key 'max_target_length' must be in [1, 65536], got %lld", c->max_target_length);
	NEED(c->base_num_decoder_layers >= 1 && c->base_num_decoder_layers <= 1024, "key 'base_num_decoder_layers' must be in [1, 1024], got %lld", c->base_num_decoder_layers);
	NEED(c->base_num_query_heads >= 1, "key 'base_num_query_heads' must be >= 1, got %lld", c->base_num_query_heads);
	NEED(c->base_num_kv_heads >= 1 && c->base_num_query_heads % c->base_num_kv_heads == 0,
	     "key 'base_num_kv_heads' (%lld) must divide 'base_num_query_heads' (%lld)",
	     c->base_num_kv_heads, c->base_num_query_heads);
	if (!strcmp(c->attention_type, "mla")) {
		NEED(c->base_num_kv_heads == c->base_num_query_heads,
		     "key 'base_num_kv_heads' (%lld) must equal 'base_num_query_heads' (%lld) with attention_type mla",
		     c->base_num_kv_heads, c->base_num_query_heads);
		NEED(c->q_lora_rank >= 0 && c->q_lora_rank <= 65536, "key 'q_lora_rank' must be in [0, 65536], got %lld", c->q_lora_rank);
		NEED(c->kv_lora_rank >= 1 && c->kv_lora_rank <= 65536, "key 'kv_lora_rank' must be in [1, 65536], got %lld", c->kv_lora_rank);
		NEED(c->qk_nope_head_dim >= 1 && c->qk_nope_head_dim <= 4096, "key 'qk_nope_head_dim' must be in [1, 4096], got %lld", c->qk_nope_head_dim);
		NEED(c->qk_rope_head_dim >= 2 && c->qk_rope_head_dim <= 4096 && c->qk_rope_head_dim % 2 == 0,
		     "key 'qk_rope_head_dim' must be even and in [2, 4096], got %lld", c->qk_rope_head_dim);
		NEED(c->v_head_dim >= 1 && c->v_head_dim <= 4096, "key 'v_head_dim' must be in [1, 4096], got %lld", c->v_head_dim);
		d->mla = true;
		d->Rq = (int)c->q_lora_rank;
		d->Rkv = (int)c->kv_lora_rank;
		d->Dn = (int)c->qk_nope_head_dim;
		d->Dr = (int)c->qk_rope_head_dim;
		d->Dv = (int)c->v_head_dim;
		d->D = d->Dn + d->Dr;
	} else {
		NEED(!strcmp(c->attention_type, "global"), "key 'attention_type' must be global or mla, got '%s'",
		     c->attention_type);
		if (c->head_dim == 0)
			NEED(c->base_emb_dim % c->base_num_query_heads == 0,
			     "key 'base_num_query_heads' (%lld) must divide 'base_emb_dim' (%lld) when 'head_dim' is 0",
			     c->base_num_query_heads, c->base_emb_dim);
		d->D = c->head_dim ? (int)c->head_dim : (int)(c->base_emb_dim / c->base_num_query_heads);
		NEED(d->D >= 2 && d->D % 2 == 0, "head dim must be even for RoPE, got %d (keys 'head_dim', 'base_emb_dim')", d->D);
	}
	if (!strcmp(c->rope_type, "yarn")) {
		NEED(c->rope_factor >= 1 && c->rope_factor <= 1e6, "key 'rope_factor' must be in [1, 1e6], got %g", c->rope_factor);
		NEED(c->original_max_position_embeddings >= 1,
		     "key 'original_max_position_embeddings' must be >= 1, got %lld", c->original_max_position_embeddings);
		NEED(c->beta_fast > 0 && c->beta_slow > 0, "keys 'beta_fast' (%g) and 'beta_slow' (%g) must be > 0",
		     c->beta_fast, c->beta_slow);
		NEED(c->mscale >= 0 && c->mscale_all_dim >= 0, "keys 'mscale' (%g) and 'mscale_all_dim' (%g) must be >= 0",
		     c->mscale, c->mscale_all_dim);
		d->yarn = true;
		d->rope_factor = (float)c->rope_factor;
		d->rope_orig = (int)c->original_max_position_embeddings;
		d->beta_fast = (float)c->beta_fast;
		d->beta_slow = (float)c->beta_slow;
		d->mscale = (float)c->mscale;
		d->mscale_all_dim = (float)c->mscale_all_dim;
	} else {
		NEED(!strcmp(c->rope_type, "default"), "key 'rope_type' must be default or yarn, got '%s'", c->rope_type);
	}
	NEED(c->base_mlp_dim >= 1, "key 'base_mlp_dim' must be >= 1, got %lld", c->base_mlp_dim);
	NEED(c->num_experts >= 1 && c->num_experts <= 1024, "key 'num_experts' must be in [1, 1024], got %lld", c->num_experts);
	NEED(c->per_device_batch_size >= 1, "key 'per_device_batch_size' must be >= 1, got %lld", c->per_device_batch_size);
	d->V = (int)c->vocab_size;
	d->C = (int)c->base_emb_dim;
	d->T = (int)c->max_target_length;
	d->L = (int)c->base_num_decoder_layers;
	d->Hq = (int)c->base_num_query_heads;
	d->Hkv = d->mla ? d->Hq : (int)c->base_num_kv_heads;
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
		int rc = routing_groups_from_cfg(d, c, err, errlen);
		if (rc)
			return rc;
	} else {
		d->E = 1;
		d->L_dense = d->L;
		NEED(c->n_routing_groups == -1 && c->topk_routing_group == -1,
		     "keys 'n_routing_groups' and 'topk_routing_group' route experts: they need num_experts > 1 (got %lld, %lld)",
		     c->n_routing_groups, c->topk_routing_group);
	}
	/* DeepSeek's batch split (docs/deepseek.md#batch-split): the factor
	 * cuts each device's batch into halves that compute their own
	 * products; the schedule staggers them through the MoE layers */
	NEED(c->batch_split_factor >= 1, "key 'batch_split_factor' must be >= 1, got %lld", c->batch_split_factor);
	NEED(c->batch_split_factor <= 2, "key 'batch_split_factor' must be 1 or 2 (the batch in two halves), "
	     "got %lld", c->batch_split_factor);
	if (c->use_batch_split_schedule || c->batch_split_factor > 1) {
		/* the key the user asked for the split with */
		const char *key = c->use_batch_split_schedule ? "use_batch_split_schedule" : "batch_split_factor";
		NEED(d->L_moe > 0, "keys '%s' and 'num_experts' (%lld): the batch split cuts the MoE layers' rows "
		     "and overlaps their expert exchange; a dense model has none", key, c->num_experts);
		NEED(c->per_device_batch_size % c->batch_split_factor == 0, "key 'batch_split_factor' (%lld) "
		     "must divide 'per_device_batch_size' (%lld)", c->batch_split_factor, c->per_device_batch_size);
		/* the halves stagger through a device's consecutive layer calls
		 * (docs/deepseek.md#batch-split); a pipeline sends a chunk's
		 * output to the next stage as soon as it is made and interleaves
		 * microbatches' backwards, and the zero-bubble schedules split
		 * each backward into I and W actions */
		int S = c->ici[AX_STAGE] * c->dcn[AX_STAGE];
		bool zb = !strcmp(c->pipeline_schedule, "zb_h1") || !strcmp(c->pipeline_schedule, "zbv");
		NEED(S <= 1 || !zb || c->batch_split_factor == 1, "keys '%s' and 'pipeline_schedule' (%s): the batch "
		     "split does not run with a backward split into input and weight gradients", key,
		     c->pipeline_schedule);
		NEED(S <= 1 || c->batch_split_factor == 1, "key '%s' does not run beside pipeline parallelism "
		     "(ici_/dcn_pipeline_parallelism=%d)", key, S);
		d->bsplit = (int)c->batch_split_factor;
		d->bsplit_sched = c->use_batch_split_schedule;
	}
	NEED(!strcmp(c->checkpoint_dtype, "f32") || !strcmp(c->checkpoint_dtype, "bf16"),
	     "key 'checkpoint_dtype' must be f32 or bf16, got '%s'", c->checkpoint_dtype);
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

/* The pipeline's layer order (model.h, model_mesh): storage index of
 * layer l in a stack of n, and back. */
static bool stage_order(const struct model *m, int n)
{
	return m->pipe_stages > 1 && m->pipe_repeats > 1 && n % (m->pipe_stages * m->pipe_repeats) == 0;
}

/* Block b of S*R (a chunk of lps layers) is repeat *r of stage *s: b =
 * r*S + s in the circle; in ZB-V's V (R = 2) block s goes down on stage
 * s and block 2S-1-s comes back up on it. */
static void block_place(const struct model *m, int b, int *s, int *r)
{
	int S = m->pipe_stages;
	if (m->pipe_v) {
		*r = b >= S;
		*s = b < S ? b : 2 * S - 1 - b;
	} else {
		*r = b / S;
		*s = b % S;
	}
}

static int stack_index(const struct model *m, int l, int n)
{
	if (!stage_order(m, n))
		return l;
	int S = m->pipe_stages, R = m->pipe_repeats, lps = n / (S * R), s, r;
	block_place(m, l / lps, &s, &r);
	return (s * R + r) * lps + l % lps;
}

int model_stack_layer(const struct model *m, int q, int n)
{
	if (!stage_order(m, n))
		return q;
	int S = m->pipe_stages, R = m->pipe_repeats, lps = n / (S * R), s = q / lps / R, r = q / lps % R;
	int b = m->pipe_v ? (r ? 2 * S - 1 - s : s) : r * S + s;
	return b * lps + q % lps;
}

int layer_slot(const struct model *m, int id, int l)
{
	int k;
	switch (stack_kind(id)) {
	case STACK_ALL:
		k = l;
		break;
	case STACK_DENSE:
		k = l < m->d.L_dense ? l : -1;
		break;
	case STACK_MOE:
		k = l >= m->d.L_dense ? l - m->d.L_dense : -1;
		break;
	default:
		return -1;
	}
	/* storage split over `layers` (a pipeline stage's block) starts at goff[0] */
	return k < 0 ? -1 : stack_index(m, k, m->p[id].global_shape[0]) - m->p[id].goff[0];
}

const struct param_info *model_layer_missing(const struct model *m, int l)
{
	for (int id = 0; id < P_COUNT; id++) {
		int first, count;
		if (m->pidx[id] < 0)
			continue;
		param_layers(m, id, &first, &count);
		int q = layer_slot(m, id, l);
		if (l >= first && l < first + count && (q < 0 || q >= m->p[id].shape[0]))
			return &m->table[m->pidx[id]];
	}
	return NULL;
}

int model_param_slice(const struct model *m, int i, int l)
{
	for (int id = 0; id < P_COUNT; id++) {
		int first, count;
		if (m->pidx[id] != i)
			continue;
		param_layers(m, id, &first, &count);
		if (l < first || l >= first + count)
			return -1;
		int q = layer_slot(m, id, l);
		return q >= 0 && q < m->p[id].shape[0] ? q : -1;
	}
	return -1;
}

void param_layers(const struct model *m, int id, int *first, int *count)
{
	*first = *count = 0;
	switch (stack_kind(id)) {
	case STACK_ALL:
		*count = m->d.L;
		break;
	case STACK_DENSE:
		*count = m->d.L_dense;
		break;
	case STACK_MOE:
		*first = m->d.L_dense;
		*count = m->d.L_moe;
		break;
	default:
		break;
	}
}

/* The head a tensor's heads dimension splits into whole: latent
 * attention's value heads (wkv_b: no-rope key and value, wo: value) are
 * not its query heads. */
static int head_unit(const struct model *m, int id)
{
	if (m->d.mla && id == P_WKV_B)
		return m->d.Dn + m->d.Dv;
	if (m->d.mla && id == P_WO)
		return m->d.Dv;
	return m->d.D;
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
	p->head_dim = head_unit(m, id);
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

/* Latent attention's tensors (docs/deepseek.md), Hugging Face's shapes
 * [out, in]: the down-projections read the embedding, their outputs (the
 * latents) stay whole; the up-projections write heads. */
static void mla_table(struct model *m)
{
	const struct model_dims *d = &m->d;
	int L = d->L, H = d->Hq, QD = H * (d->Dn + d->Dr);
	int s_q[] = { L, QD, d->C }, s_qa[] = { L, d->Rq, d->C }, s_qn[] = { L, d->Rq };
	int s_qb[] = { L, QD, d->Rq }, s_kva[] = { L, d->Rkv + d->Dr, d->C }, s_kvn[] = { L, d->Rkv };
	int s_kvb[] = { L, H * (d->Dn + d->Dv), d->Rkv }, s_o[] = { L, d->C, H * d->Dv };

	if (d->Rq) {
		PARAM(P_WQ_A, "wq_a", OPT_MUON, true, s_qa, AXES("layers", "q_lora_up_proj", "embed"));
		PARAM(P_Q_A_NORM, "q_a_norm", OPT_ADAMW, false, s_qn, AXES("layers", "norm"));
		PARAM(P_WQ_B, "wq_b", OPT_MUON, true, s_qb, AXES("layers", "q_heads", "q_lora"));
	} else {
		PARAM(P_WQ, "wq", OPT_MUON, true, s_q, AXES("layers", "q_heads", "embed"));
	}
	PARAM(P_WKV_A, "wkv_a", OPT_MUON, true, s_kva, AXES("layers", "kv_lora_up_proj", "embed"));
	PARAM(P_KV_A_NORM, "kv_a_norm", OPT_ADAMW, false, s_kvn, AXES("layers", "norm"));
	PARAM(P_WKV_B, "wkv_b", OPT_MUON, true, s_kvb, AXES("layers", "kv_heads", "kv_lora"));
	PARAM(P_WO, "wo", OPT_MUON, true, s_o, AXES("layers", "embed", "q_heads"));
}

/* The whole model's tensors, global shapes. */
static void build_table(struct model *m)
{
	const struct model_dims *d = &m->d;
	for (int id = 0; id < P_COUNT; id++)
		m->pidx[id] = -1;
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
	if (d->mla)
		mla_table(m);
	else {
		PARAM(P_WQ, "wq", OPT_MUON, true, s_q, AXES("layers", "q_heads", "embed"));
		PARAM(P_WK, "wk", OPT_MUON, true, s_k, AXES("layers", "kv_heads", "embed"));
		PARAM(P_WV, "wv", OPT_MUON, true, s_k, AXES("layers", "kv_heads", "embed"));
		PARAM(P_WO, "wo", OPT_MUON, true, s_o, AXES("layers", "embed", "q_heads"));
	}
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

/* Flat index in the whole tensor of element i of this device's shard. */
static size_t param_global_index(const struct model *m, const struct param_info *p, size_t i)
{
	size_t g = 0, stride = 1;
	for (int k = p->ndim - 1; k >= 0; k--) {
		size_t c = i % (size_t)p->shape[k];
		i /= (size_t)p->shape[k];
		c += (size_t)p->goff[k];
		if (k == 0 && p->stacked)  /* the layer stored there */
			c = (size_t)model_stack_layer(m, (int)c, p->global_shape[0]);
		g += c * stride;
		stride *= (size_t)p->global_shape[k];
	}
	return g;
}

/* ---- placement ---- */

int mesh_axes_size_or1(const struct model *m, uint32_t mask)
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
		{ "('q_lora',", "q_lora_rank" }, { "('kv_lora',", "kv_lora_rank" },
		{ "('q_lora_up_proj',", "q_lora_rank" }, { "('kv_lora_up_proj',", "kv_lora_rank (+ qk_rope_head_dim)" },
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strstr(msg, keys[i][0]))
			return keys[i][1];
	return NULL;
}

/* Whether stacked parameter id holds a layer a pipeline does not run
 * (it runs data-parallel over `stage`, so every stage needs it whole). */
static bool outside_pipeline(const struct model *m, int id)
{
	int first, count;
	if (m->pipe_stages <= 1 || m->pipe_layers <= 0)
		return false;
	param_layers(m, id, &first, &count);
	return count && (first < m->pipe_first || first + count > m->pipe_first + m->pipe_layers);
}

static int plan_one(struct model *m, const struct model_mesh *mm, int id, uint32_t rows,
		    char *err, size_t errlen)
{
	struct param_info *p = &m->p[id];
	const char *axes[MODEL_MAX_DIMS];
	if (m->pidx[id] < 0)
		return 0;
	memcpy(axes, p->axes, sizeof(axes));
	if (outside_pipeline(m, id))
		axes[0] = NULL;  /* `layers` not split: stored whole on every stage */
	int rc = plan_param(&m->pp[id], mm->rules, mm->mesh, p->name, p->ndim, p->global_shape, axes,
			    p->head_dim, rows, err, errlen);
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

/* The activations the plans line up with: their specs and where the
 * experts' blocks lie. */
struct act_plan {
	struct plan_axes emb, heads, kv, ao, mlp, mlpe, mlps, vocab, ev, none;
	uint32_t rows;
	int exp_axes[AX_COUNT], nexp;
};

/* Every weight's plan and the activations' specs (each must split the
 * rows alike); the weights first, so that a split that does not divide
 * is reported on them. */
static int plan_tensors(struct model *m, const struct model_mesh *mm, struct act_plan *a,
			char *err, size_t errlen)
{
	const struct model_dims *d = &m->d;
	int rc;

	a->rows = UINT32_MAX;
	if ((rc = act_axes(&a->emb, &a->rows, mm, "activation", "activation_embed", d->C, 1, err, errlen)))
		return rc;
	for (int id = 0; id < P_COUNT; id++)
		if ((rc = plan_one(m, mm, id, a->rows, err, errlen)))
			return rc;
	/* latent attention: k is [no-rope key | value] per head out of
	 * wkv_b, and the attention's output (wo's input) value heads */
	int kvd = d->mla ? d->Dn + d->Dv : d->D, aod = d->mla ? d->Dv : d->D;
	if ((rc = act_axes(&a->heads, &a->rows, mm, "q", "activation_heads", d->Hq * d->D, d->D, err, errlen)) ||
	    (rc = act_axes(&a->kv, &a->rows, mm, "k", "activation_heads", d->Hkv * kvd, kvd, err, errlen)) ||
	    (rc = act_axes(&a->ao, &a->rows, mm, "attention", "activation_heads", d->Hq * aod, aod, err, errlen)) ||
	    (rc = act_axes(&a->vocab, &a->rows, mm, "logits", "activation_vocab", d->V, 1, err, errlen)))
		return rc;
	if (d->L_dense &&
	    (rc = act_axes(&a->mlp, &a->rows, mm, "mlp hidden", "activation_mlp", d->F, 1, err, errlen)))
		return rc;
	if (d->L_moe &&
	    ((rc = act_axes(&a->mlpe, &a->rows, mm, "expert hidden", "activation_mlp", d->Fe, 1, err, errlen)) ||
	     (d->S && (rc = act_axes(&a->mlps, &a->rows, mm, "shared expert hidden", "activation_mlp",
				     d->S * d->Fe, 1, err, errlen)))))
		return rc;
	if (plan_axes_mask(&a->heads) != plan_axes_mask(&a->kv)) {
		snprintf(err, errlen, "sharding: query and kv heads must split over the same axes");
		return -EINVAL;
	}
	m->rows = a->rows;
	m->ax_emb = plan_axes_mask(&a->emb);
	m->ax_vocab = plan_axes_mask(&a->vocab);
	return 0;
}

/* Experts: their `exp` axes carry the tokens (all_to_all), so what
 * splits the rows there is the rest of the batch axes. */
static int plan_experts(struct model *m, const struct model_mesh *mm, struct act_plan *a,
			char *err, size_t errlen)
{
	int rc;
	m->ep = 1;
	if (!m->d.L_moe)
		return 0;
	/* the weights' plans resolved exp already */
	m->ax_exp = m->pp[P_E_GATE].spec.axes[1];
	if (m->ax_exp & ~a->rows) {
		char t[96];
		plan_mask_text(m->ax_exp & ~a->rows, t, sizeof(t));
		snprintf(err, errlen, "sharding: experts ('exp') are split over %s, which does not "
			 "split the batch (activation_batch), so tokens cannot travel to them", t);
		return -EINVAL;
	}
	m->ep = mesh_axes_size(mm->mesh, m->ax_exp);
	for (int id = P_E_GATE; id <= P_E_DOWN; id++)
		if ((rc = plan_one(m, mm, id, a->rows & ~m->ax_exp, err, errlen)))
			return rc;
	a->nexp = m->pp[P_E_GATE].spec.naxes[1];
	memcpy(a->exp_axes, m->pp[P_E_GATE].spec.axis[1], sizeof(int) * (size_t)a->nexp);
	return 0;
}

/* Norm weights are replicated and used in slices of a split embedding;
 * a tensor cannot be both gathered and sliced. */
static int plan_slices(struct model *m, const struct act_plan *a, char *err, size_t errlen)
{
	const struct mesh *ms = m->mesh;
	int rc;
	if ((rc = plan_param_slice(&m->pp[P_ATTN_NORM], ms, 1, &a->emb, err, errlen)) ||
	    (rc = plan_param_slice(&m->pp[P_MLP_NORM], ms, 1, &a->emb, err, errlen)) ||
	    (rc = plan_param_slice(&m->pp[P_FINAL_NORM], ms, 0, &a->emb, err, errlen)))
		return rc;
	for (int id = 0; id < P_COUNT; id++) {
		if (m->pidx[id] < 0 || !m->pp[id].gather || !m->pp[id].slice)
			continue;
		snprintf(err, errlen, "sharding: tensor '%s' is both gathered and sliced", m->p[id].name);
		return -EINVAL;
	}
	return 0;
}

static int plan_linears(struct model *m, struct act_plan *a, char *err, size_t errlen)
{
	const struct model_dims *d = &m->d;
	int rc, head = d->tied ? P_EMBED : P_LM_HEAD;

	/* the embedding lookup is a matmul of one-hot rows by the table: a
	 * split vocabulary gives partial rows */
	a->ev.n = plan_kept_axes(&m->pp[P_EMBED], 0, a->ev.axis);
	if ((rc = lin(m, P_EMBED, "embedding", P_EMBED, 1, 0, &a->ev, &a->emb, err, errlen)) ||
	    (rc = lin(m, P_LM_HEAD, "output projection", head, 0, 1, &a->emb, &a->vocab, err, errlen)) ||
	    (rc = lin(m, P_WQ, "q projection", P_WQ, 1, 2, &a->emb, &a->heads, err, errlen)) ||
	    (rc = lin(m, P_WK, "k projection", P_WK, 1, 2, &a->emb, &a->kv, err, errlen)) ||
	    (rc = lin(m, P_WV, "v projection", P_WV, 1, 2, &a->emb, &a->kv, err, errlen)) ||
	    /* latent attention: the latents are whole on every device */
	    (rc = lin(m, P_WQ_A, "q down projection", P_WQ_A, 1, 2, &a->emb, &a->none, err, errlen)) ||
	    (rc = lin(m, P_WQ_B, "q up projection", P_WQ_B, 1, 2, &a->none, &a->heads, err, errlen)) ||
	    (rc = lin(m, P_WKV_A, "kv down projection", P_WKV_A, 1, 2, &a->emb, &a->none, err, errlen)) ||
	    (rc = lin(m, P_WKV_B, "kv up projection", P_WKV_B, 1, 2, &a->none, &a->kv, err, errlen)) ||
	    (rc = lin(m, P_WO, "attention output", P_WO, 1, 2, &a->ao, &a->emb, err, errlen)))
		return rc;
	if (d->L_dense &&
	    ((rc = lin(m, P_W_GATE, "mlp gate", P_W_GATE, 1, 2, &a->emb, &a->mlp, err, errlen)) ||
	     (rc = lin(m, P_W_UP, "mlp up", P_W_UP, 1, 2, &a->emb, &a->mlp, err, errlen)) ||
	     (rc = lin(m, P_W_DOWN, "mlp down", P_W_DOWN, 1, 2, &a->mlp, &a->emb, err, errlen))))
		return rc;
	if (d->L_moe &&
	    ((rc = lin(m, P_ROUTER, "router", P_ROUTER, 1, 2, &a->emb, &a->none, err, errlen)) ||
	     (rc = lin(m, P_E_GATE, "expert gate", P_E_GATE, 2, 3, &a->emb, &a->mlpe, err, errlen)) ||
	     (rc = lin(m, P_E_UP, "expert up", P_E_UP, 2, 3, &a->emb, &a->mlpe, err, errlen)) ||
	     (rc = lin(m, P_E_DOWN, "expert down", P_E_DOWN, 2, 3, &a->mlpe, &a->emb, err, errlen))))
		return rc;
	if (d->L_moe && d->S &&
	    ((rc = lin(m, P_S_GATE, "shared gate", P_S_GATE, 1, 2, &a->emb, &a->mlps, err, errlen)) ||
	     (rc = lin(m, P_S_UP, "shared up", P_S_UP, 1, 2, &a->emb, &a->mlps, err, errlen)) ||
	     (rc = lin(m, P_S_DOWN, "shared down", P_S_DOWN, 1, 2, &a->mlps, &a->emb, err, errlen))))
		return rc;
	m->ax_moe_out = m->pl[P_E_DOWN].reduce;
	if (d->L_moe && d->S && (m->pl[P_S_DOWN].reduce != m->ax_moe_out ||
				 m->pl[P_S_GATE].dx_reduce != m->pl[P_E_GATE].dx_reduce)) {
		snprintf(err, errlen, "sharding: shared and routed experts must split their hidden over the same axes");
		return -EINVAL;
	}
	return 0;
}

/* What this device computes on, and where its blocks start. */
static int plan_local(struct model *m, const struct act_plan *a)
{
	const struct model_dims *d = &m->d;
	const struct mesh *ms = m->mesh;

	m->l.C = d->C / mesh_axes_size(ms, m->ax_emb);
	m->l.Hq = d->Hq / mesh_axes_size(ms, plan_axes_mask(&a->heads));
	m->l.Hkv = d->Hkv / mesh_axes_size(ms, plan_axes_mask(&a->heads));
	m->l.V = d->V / mesh_axes_size(ms, m->ax_vocab);
	if (d->L_dense)
		m->l.F = d->F / mesh_axes_size(ms, plan_axes_mask(&a->mlp));
	if (d->L_moe) {
		m->l.Fe = d->Fe / mesh_axes_size(ms, plan_axes_mask(&a->mlpe));
		m->SF = d->S ? d->S * d->Fe / mesh_axes_size(ms, plan_axes_mask(&a->mlps)) : 0;
		m->El = d->E / m->ep;
	}
	m->c0 = block_index(ms, m->coord, a->emb.axis, a->emb.n) * m->l.C;
	m->v0 = block_index(ms, m->coord, a->vocab.axis, a->vocab.n) * m->l.V;
	m->e0 = block_index(ms, m->coord, a->exp_axes, a->nexp) * m->El;
	m->Ve = m->pp[P_EMBED].cshape[0];
	m->v0e = block_index(ms, m->coord, a->ev.axis, a->ev.n) * m->Ve;
	if (m->ep > 1) {
		struct mesh_members eg;
		m->ep_blk = malloc(sizeof(int) * (size_t)m->ep);
		if (!m->ep_blk || mesh_members_init(ms, m->device, m->ax_exp, &eg))
			return -ENOMEM;
		for (int r = 0; r < eg.n; r++) {
			m->ep_blk[r] = block_index(ms, eg.coord[r], a->exp_axes, a->nexp);
			m->ep_permute |= m->ep_blk[r] != r;
		}
		mesh_members_free(&eg);
	}
	return 0;
}

/* Storage shapes of this device's shards. */
static void plan_storage(struct model *m)
{
	for (int id = 0; id < P_COUNT; id++) {
		struct param_info *p = &m->p[id];
		const struct plan_param *pp = &m->pp[id];
		if (m->pidx[id] < 0)
			continue;
		int off[SHARD_MAX_DIMS];
		plan_block_offsets(pp, m->mesh, pp->spec.used, m->coord, off);
		p->numel = pp->spec.local_numel;
		p->split = pp->spec.used;
		p->gsum = pp->gsum;
		for (int k = 0; k < p->ndim; k++) {
			p->shape[k] = pp->spec.local[k];
			p->goff[k] = off[k];
		}
		if (p->ndim >= 2)
			p->mat_split = pp->spec.axes[p->ndim - 2] | pp->spec.axes[p->ndim - 1];
	}
}

/* Plans every tensor and linear layer for this device and sets the local
 * dims; fills the table's storage shapes. */
static int plan_model(struct model *m, const struct model_mesh *mm, char *err, size_t errlen)
{
	struct act_plan a = { 0 };
	int rc;

	m->mesh = mm->mesh;
	m->device = mm->device;
	m->pipe_stages = mm->pipe_stages;
	m->pipe_repeats = mm->pipe_repeats;
	m->pipe_v = mm->pipe_v;
	m->pipe_first = mm->pipe_first;
	m->pipe_layers = mm->pipe_layers;
	m->pipe_weight_slots = mm->pipe_weight_slots;
	mesh_coords(mm->mesh, mm->device, m->coord);
	if ((rc = plan_tensors(m, mm, &a, err, errlen)) || (rc = plan_experts(m, mm, &a, err, errlen)) ||
	    (rc = plan_slices(m, &a, err, errlen)) || (rc = plan_linears(m, &a, err, errlen)) ||
	    (rc = plan_local(m, &a)))
		return rc;
	plan_storage(m);
	return 0;
}

struct model *params_make(const struct model_dims *d, const struct model_mesh *mm, int *rc,
			  char *err, size_t errlen)
{
	struct model *m = calloc(1, sizeof(*m));
	*rc = 0;
	if (!m) {
		snprintf(err, errlen, "model: out of memory: %zu bytes for the model's table", sizeof(*m));
		*rc = -ENOMEM;
		return NULL;
	}
	m->d = *d;
	m->l = *d;
	m->El = d->E;
	m->SF = d->S * d->Fe;
	m->ep = 1;
	m->Ve = d->V;
	build_table(m);
	if (mm && mm->mesh && mm->mesh->num_devices > 1) {
		*rc = plan_model(m, mm, err, errlen);
		if (*rc == -ENOMEM)
			snprintf(err, errlen, "model: out of memory for the plans");
		if (*rc) {
			params_free(m);
			free(m);
			return NULL;
		}
	}
	lay_out_params(m, mm && mm->bucket_align > 1 ? (size_t)mm->bucket_align : 1);
	return m;
}

void params_free(struct model *m)
{
	free(m->ep_blk);
	m->ep_blk = NULL;
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

const struct model_dims *model_dims(const struct model *m) { return &m->d; }
/* The whole model's table without a model: `meshrun schedule` sizes one
 * pipelined layer from it before anything is allocated. */
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

int model_num_params(const struct model *m) { return m->ntable; }
const struct param_info *model_param(const struct model *m, int i) { return &m->table[i]; }
uint32_t model_rows_axes(const struct model *m) { return m->rows; }

int model_plan_rows(const struct model_mesh *mm, int C, uint32_t *rows, char *err, size_t errlen)
{
	struct plan_axes a;
	*rows = UINT32_MAX;
	return act_axes(&a, rows, mm, "activation", "activation_embed", C, 1, err, errlen);
}

const struct plan_param *model_param_plan(const struct model *m, int i)
{
	for (int id = 0; m->mesh && id < P_COUNT; id++)
		if (m->pidx[id] == i)
			return &m->pp[id];
	return NULL;
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

static uint64_t name_hash(const char *s)
{
	return fnv1a(s, strlen(s));
}

/* N(0,1) for element i of a tensor: Box-Muller on two counter-based
 * uniforms; a pure function of (key, i). */
static float normal_at(uint64_t key, size_t i)
{
	uint64_t a = mix64(key ^ (2 * (uint64_t)i));
	uint64_t b = mix64(key ^ (2 * (uint64_t)i + 1));
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
			uint64_t key = mix64(seed ^ name_hash(p->name));
			for (size_t i = 0; i < p->numel; i++)
				w[i] = std * normal_at(key, param_global_index(m, p, i));
		}
	}
}


double model_flops_per_token(const struct model_dims *d)
{
	double C = d->C, QD = (double)d->Hq * d->D, KD = (double)d->Hkv * d->D;
	double attn = C * QD * 2 + C * KD * 2, att_dot = QD * 2;
	if (d->mla) {
		double H = d->Hq, VD = H * d->Dv;
		attn = (d->Rq ? (double)d->Rq * (C + QD) : C * QD) + C * (d->Rkv + d->Dr) +
		       (double)d->Rkv * H * (d->Dn + d->Dv) + VD * C;
		att_dot = QD + VD;
	}
	double dense = 3.0 * C * d->F;
	double moe = C * d->E + 3.0 * C * d->Fe * (d->K + d->S);
	double mat = d->L * attn + d->L_dense * dense + d->L_moe * moe + (double)d->V * C;
	return 6.0 * mat + 6.0 * d->L * d->T * att_dot;
}
