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

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"

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
	int shape[MODEL_MAX_DIMS];        /* this device's storage shard */
	int global_shape[MODEL_MAX_DIMS]; /* the whole tensor */
	int goff[MODEL_MAX_DIMS];         /* where the shard starts in it */
	const char *axes[MODEL_MAX_DIMS]; /* logical axis names */
	size_t offset, numel;             /* into the one allocation, in floats */
	enum param_opt opt;               /* AdamW, Muon (per 2-D matrix), none */
	bool decay;                       /* weight decay applies */
	bool stacked;                     /* dimension 0 is `layers` */
	int mat_rows, mat_cols;           /* Muon: each whole [rows, cols] matrix */
	uint32_t split;                   /* mesh axes the storage is sharded over */
	uint32_t mat_split;               /* those of them on the matrix dimensions */
	uint32_t gsum;                    /* axes the local gradient is summed over */
};

/* Where this device sits in a mesh; NULL for one device. */
struct model_mesh {
	const struct mesh *mesh;
	const struct shard_rules *rules;
	int device;                       /* global device id */
	/* each gradient bucket is padded to a multiple of this many floats
	 * (0 or 1: none), so ZeRO-1 can split it evenly in place */
	int bucket_align;
};

/* Collectives over the devices that differ from this one only on `axes`
 * (a mask of 1 << AX_*), ordered as mesh_group orders them. Each returns
 * 0 or an exit code (host/cli.h) and keeps its message for the caller. */
struct model_comm {
	int (*all_reduce)(void *ctx, uint32_t axes, float *buf, size_t n);
	int (*all_gather)(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes);
	/* out (n floats) = sum over members of their in[rank n, rank n + n) */
	int (*reduce_scatter)(void *ctx, uint32_t axes, float *out, const float *in, size_t n);
	int (*all_to_all)(void *ctx, uint32_t axes, void *out, const size_t *recv_bytes,
			  const void *in, const size_t *send_bytes);
	/* Optional (NULL: the model runs these synchronously): start an
	 * all_gather or reduce_scatter in the background and set *h; wait(h)
	 * returns its result. Buffers stay untouched until then. FSDP uses
	 * them to fetch the next layer's weights while one computes and to
	 * return gradients while the next layer's backward runs. */
	int (*start_all_gather)(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes, void **h);
	int (*start_reduce_scatter)(void *ctx, uint32_t axes, float *out, const float *in, size_t n, void **h);
	int (*wait)(void *ctx, void *h);
	void *ctx;
};

struct model;

/* Reads and checks model dims from the config; -EINVAL with err naming the
 * key for impossible shapes. */
int model_dims_from_cfg(struct model_dims *d, const struct cfg *c, char *err, size_t errlen);

/* Allocates parameters (this device's shards), gradients and activations
 * for B sequences of T. With a mesh, every tensor is placed by the
 * sharding rules and every linear layer planned (host/plan.h): weights
 * split over the rows' axes are gathered per layer (FSDP), heads, MLP and
 * vocabulary split over the tensor axes, the embedding over
 * tensor_transpose, experts over their `exp` axes (tokens travel to them
 * with all_to_all). NULL with err (a "config:" or "sharding:" line naming
 * the key, tensor and axes) when a shape does not split or a combination
 * cannot run. */
struct model *model_new(const struct model_dims *d, int B, const struct model_mesh *mm,
			char *err, size_t errlen);
/* The same placement and plans without any buffer: for describing a run
 * (`meshrun shardings`) before making it. Only the table, the plans and
 * the buckets may be read from it. */
struct model *model_plan_new(const struct model_dims *d, const struct model_mesh *mm,
			     char *err, size_t errlen);
void model_free(struct model *m);
const struct model_dims *model_dims(const struct model *m);

/* The parameter table of the whole (unsharded) model for dims d without
 * allocating one: copies up to max entries into out; returns the number
 * of parameters, or -ENOMEM. */
int model_param_table(const struct model_dims *d, struct param_info *out, int max);

/* Parameter table. */
int model_num_params(const struct model *m);
const struct param_info *model_param(const struct model *m, int i);
const struct param_info *model_param_by_name(const struct model *m, const char *name);
float *model_params(struct model *m);      /* the one allocation */
float *model_grads(struct model *m);       /* same layout */
size_t model_numel(const struct model *m); /* floats in each */

/* The layout is ordered by gradient-sum axes: bucket i is floats
 * [offset, offset + numel) whose gradients are all summed over `axes`,
 * followed by zeros up to offset + padded (a multiple of bucket_align). */
struct model_bucket {
	uint32_t axes;
	size_t offset, numel, padded;
};
int model_buckets(const struct model *m, struct model_bucket *out, int max);
/* The plan of parameter i (host/plan.h), NULL on one device; and the
 * mesh it was made for. */
struct plan_param;
const struct plan_param *model_param_plan(const struct model *m, int i);
const struct mesh *model_mesh(const struct model *m);
/* What one planned linear layer moves (axis masks, 0 for nothing): its
 * weight gathered before use (FSDP), its output's partial sums
 * all-reduced, backward: the input gradient's partial sums all-reduced,
 * the weight gradient reduce-scattered, then summed at the end of the
 * step over gsum. */
struct model_linear_info {
	const char *name, *weight;
	uint32_t gather, reduce, dx_reduce, dw_scatter, gsum;
};
int model_linears(const struct model *m, struct model_linear_info *out, int max);
/* Mesh axes that split the rows (activation_batch); 0 on one device. */
uint32_t model_rows_axes(const struct model *m);
/* The same axes before there is a model (a job sizes each model's batch
 * by them): the rules resolved for the activation of width C, as
 * model_new resolves them. 0 or -EINVAL with err. */
int model_plan_rows(const struct model_mesh *mm, int C, uint32_t *rows, char *err, size_t errlen);
/* Floats FSDP holds during a step besides the shards: gathered weights
 * (the non-layer tensors and two layers), their gradients (one layer),
 * and the buffers gathers and reduce-scatters move them through. */
size_t model_window_numel(const struct model *m);

/* Deterministic init: the value of element i of the whole tensor depends
 * only on (seed, tensor name, i), so every sharding holds the same weights. */
void model_init(struct model *m, uint64_t seed, float std);

struct model_step {
	float loss_scale;        /* cross-entropy gradient scale: 1 / global tokens */
	float lb_weight;         /* load-balance loss weight (MoE) */
	double global_tokens;    /* tokens in the global batch */
	const struct model_comm *comm; /* NULL on one device */
	/* results */
	double loss_sum;         /* sum of the per-token losses of these rows */
	double aux;              /* this replica's share of the global load-balance loss */
};

/* Forward and backward on B x T tokens; gradients are ACCUMULATED into
 * model_grads (zero them first). Returns 0, or the counts hook's error. */
int model_forward_backward(struct model *m, const int32_t *inputs, const int32_t *targets,
			   struct model_step *st);
/* Flat index in the whole tensor of element i of this device's shard. */
size_t param_global_index(const struct param_info *p, size_t i);

/* Forward only (one device): sum of per-token cross-entropy over the first `rows` rows. */
double model_forward(struct model *m, const int32_t *inputs, const int32_t *targets, int rows);

/* Per-expert token counts of the last step, [L_moe, E] (NULL if dense),
 * summed over replicas by the counts hook; used by the router bias update. */
const int32_t *model_expert_counts(const struct model *m);

/* Matmul FLOPs per token for forward+backward (6 x matmul params active per
 * token + 12 x L x T x Hq x D for attention), for TFLOP/s and MFU. */
double model_flops_per_token(const struct model_dims *d);

#endif
