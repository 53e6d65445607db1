/* Decoder-only transformer (DESIGN §7): embedding; per layer RMSNorm ->
 * causal GQA attention with RoPE -> residual -> RMSNorm -> SwiGLU MLP or MoE
 * -> residual; final RMSNorm; output projection; softmax cross-entropy.
 *
 * Parameters and gradients each live in one allocation with the same
 * layout; every tensor is addressed by name, carries logical axis names
 * (DESIGN §6) and is stacked per layer ([layers, ...]) so a pipeline can view
 * it as [repeats, stages, layers_per_stage, ...]. Linear weights are stored
 * [out, in] as in Hugging Face checkpoints. */
#ifndef MESHRUN_MODEL_H
#define MESHRUN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/config.h"

struct model_dims {
	int V, C, T;           /* vocab, d_model, sequence length */
	int L, L_dense, L_moe; /* layers; first L_dense dense, then L_moe MoE */
	int Hq, Hkv, D;        /* heads, kv heads, head dim */
	int F;                 /* dense SwiGLU hidden */
	int E, K, Fe, S;       /* experts, top-k, expert hidden, shared experts */
	int moe_score;         /* enum moe_score */
	bool norm_topk, tied, router_bias;
	float routed_scale, eps, theta, lb_weight;
};

enum param_opt { OPT_ADAMW, OPT_MUON, OPT_NONE };

#define MODEL_MAX_DIMS 5
#define MODEL_MAX_PARAMS 32

/* One named parameter tensor (stacked over `layers` when stacked). */
struct param_info {
	char name[48];
	int ndim;
	int shape[MODEL_MAX_DIMS];
	const char *axes[MODEL_MAX_DIMS]; /* logical axis names */
	size_t offset, numel;             /* into the one allocation, in floats */
	enum param_opt opt;               /* AdamW, Muon (per 2-D matrix), none */
	bool decay;                       /* weight decay applies */
	int mat_rows, mat_cols;           /* Muon: each [rows, cols] slice */
	/* tensor parallelism: shape is this device's shard; the whole tensor
	 * is global_shape, split into nshard equal blocks along shard_dim
	 * (-1: not split), of which this device holds block shard_idx */
	int global_shape[MODEL_MAX_DIMS];
	int shard_dim, nshard, shard_idx;
};

struct model;

/* Reads and checks model dims from the config; -EINVAL with err naming the
 * key for impossible shapes. */
int model_dims_from_cfg(struct model_dims *d, const struct cfg *c, char *err, size_t errlen);

/* Allocates parameters, gradients and activations for B sequences of T,
 * as rank tpr of tp tensor-parallel devices (Megatron: heads, the MLP
 * hidden and the expert hidden split over tp) and rank epr of ep
 * expert-parallel devices (the routed experts split over ep; tokens travel
 * to their expert's device and back) and rank ttr of tt tensor-transpose
 * devices (the embedding dimension split: contractions over it are summed
 * over tt, RMSNorm statistics too); 1, 0 for none; at most one of the
 * three. NULL with
 * err on failure or when a split dimension is not divisible. */
struct model *model_new(const struct model_dims *d, int B, int tp, int tpr, int ep, int epr,
			int tt, int ttr, char *err, size_t errlen);
void model_free(struct model *m);
const struct model_dims *model_dims(const struct model *m);

/* The parameter table for dims d without allocating a model: copies up to
 * max entries (MODEL_MAX_PARAMS is enough) into out; returns the number of
 * parameters, or -ENOMEM. */
int model_param_table(const struct model_dims *d, struct param_info *out, int max);

/* Parameter table. */
int model_num_params(const struct model *m);
const struct param_info *model_param(const struct model *m, int i);
const struct param_info *model_param_by_name(const struct model *m, const char *name);
float *model_params(struct model *m);      /* the one allocation */
float *model_grads(struct model *m);       /* same layout */
size_t model_numel(const struct model *m); /* floats in each */

/* Deterministic init: the value of element i of the whole tensor depends
 * only on (seed, tensor name, i), so every sharding holds the same weights. */
void model_init(struct model *m, uint64_t seed, float std);

/* Sums per-expert token counts (n ints) over every replica, in place; 0 or
 * an error code. Called between forward and backward so the MoE
 * load-balance loss is that of the global batch, as on one device. */
typedef int (*model_counts_fn)(void *ctx, int32_t *counts, int n);

struct model_step {
	float loss_scale;        /* cross-entropy gradient scale: 1 / global tokens */
	float lb_weight;         /* load-balance loss weight (MoE) */
	double global_tokens;    /* tokens in the global batch */
	model_counts_fn counts;  /* NULL when this is the only replica */
	/* sums n floats over the tensor-parallel group in place (NULL: tp 1) */
	int (*tp_allreduce)(void *ctx, float *buf, size_t n);
	/* the same over the tensor-transpose group (NULL: tt 1) */
	int (*tt_allreduce)(void *ctx, float *buf, size_t n);
	/* expert parallelism: all = every expert-group member's n ints in rank
	 * order; all_to_all with per-peer byte counts (net/coll.h's contract) */
	int (*ep_all_gather)(void *ctx, int32_t *all, const int32_t *mine, int n);
	int (*ep_all_to_all)(void *ctx, void *out, const size_t *recv_bytes, const void *in,
			     const size_t *send_bytes);
	void *ctx;
	/* results */
	double loss_sum;         /* sum of the per-token losses of these rows */
	double aux;              /* this replica's share of the global load-balance loss */
};

/* Forward and backward on B x T tokens; gradients are ACCUMULATED into
 * model_grads (zero them first). Returns 0, or the counts hook's error. */
int model_forward_backward(struct model *m, const int32_t *inputs, const int32_t *targets,
			   struct model_step *st);
/* [first, end) of the routed experts' weights in the flat layout (0, 0 for
 * a dense model): under expert parallelism their gradients are summed only
 * over devices that hold the same experts. */
void model_expert_range(const struct model *m, size_t *first, size_t *end);

/* Flat index in the whole tensor of element i of this device's shard. */
size_t param_global_index(const struct param_info *p, size_t i);

/* Forward only (tp 1): sum of per-token cross-entropy over the first `rows` rows. */
double model_forward(struct model *m, const int32_t *inputs, const int32_t *targets, int rows);

/* Per-expert token counts of the last step, [L_moe, E] (NULL if dense),
 * summed over replicas by the counts hook; used by the router bias update. */
const int32_t *model_expert_counts(const struct model *m);

/* Matmul FLOPs per token for forward+backward (6 x matmul params active per
 * token + 12 x L x T x Hq x D for attention), for TFLOP/s and MFU. */
double model_flops_per_token(const struct model_dims *d);

#endif
