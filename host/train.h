/* Training on one device's rows: model + optimizer + data. A step computes
 * gradients for rows [row0, row0+rows) of the global batch, hands them to a
 * reduce callback (identity on one device; an all-reduce over the data
 * devices in a mesh), clips by the global norm, and updates. The step loop
 * is driven from outside so a pipeline schedule can drive it later. */
#ifndef MESHRUN_TRAIN_H
#define MESHRUN_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "host/config.h"
#include "host/model.h"

struct trainer;

struct step_stats {
	double loss;        /* mean cross-entropy over the global batch */
	double aux;         /* load-balance loss (MoE) */
	double grad_norm;   /* before clipping */
	double lr;
	/* run_now() times, for traces */
	double t_fb0, t_fb1;    /* forward and backward */
	double t_opt0, t_opt1;  /* clipping and optimizer update */
};

/* How replicas talk. reduce sums n floats and nscalars doubles over every
 * device that holds a replica, in place; counts sums MoE expert counts
 * between forward and backward. 0 or an exit code, with err filled. */
struct train_comm {
	int (*reduce)(void *ctx, float *grads, size_t n, double *scalars, int nscalars,
		      char *err, size_t errlen);
	model_counts_fn counts;
	/* sums partial activations/gradients over the tensor-parallel group */
	int (*tp_allreduce)(void *ctx, float *buf, size_t n);
	int (*tt_allreduce)(void *ctx, float *buf, size_t n);
	/* expert parallelism (see struct model_step) */
	int (*ep_all_gather)(void *ctx, int32_t *all, const int32_t *mine, int n);
	int (*ep_all_to_all)(void *ctx, void *out, const size_t *recv_bytes, const void *in,
			     const size_t *send_bytes);
	/* sums n doubles over the model-parallel (tensor or expert) group */
	int (*tp_sum)(void *ctx, double *x, int n, char *err, size_t errlen);
	/* all = every model-parallel group member's n floats, in rank order */
	int (*tp_all_gather)(void *ctx, float *all, const float *mine, size_t n, char *err, size_t errlen);
	/* optimizer sharding (see trainer_set_shards): reduce-scatter full
	 * (nshards * shard_n floats) into this replica's shard, summed over
	 * every replica; all-gather full in place from each replica's shard;
	 * sum n doubles over the shard group */
	int (*shard_reduce_scatter)(void *ctx, float *shard, const float *full, size_t shard_n,
				    char *err, size_t errlen);
	int (*shard_all_gather)(void *ctx, float *full, size_t shard_n, char *err, size_t errlen);
	int (*shard_sum)(void *ctx, double *x, int n, char *err, size_t errlen);
	void *ctx;
	char *err;               /* where counts writes its error */
	size_t errlen;
};

/* rows = sequences this device computes per step; rank tpr of tp
 * tensor-parallel, epr of ep expert-parallel and ttr of tt
 * tensor-transpose devices (1, 0 for none). NULL with err. */
struct trainer *trainer_new(const struct cfg *c, int rows, int tp, int tpr, int ep, int epr,
			    int tt, int ttr, char *err, size_t errlen);
void trainer_free(struct trainer *t);
struct model *trainer_model(struct trainer *t);
int trainer_rows(const struct trainer *t);

/* Shards the optimizer (ZeRO): this replica keeps and updates 1/nshards of
 * the flat parameter layout (shard `rank`); gradients are reduce-scattered
 * and parameters all-gathered through the train_comm shard functions. 0 or
 * -EINVAL (Muon needs whole matrices) with err. */
int trainer_set_shards(struct trainer *t, int nshards, int rank, char *err, size_t errlen);
size_t trainer_shard_len(const struct trainer *t);
/* Sharded only: fill the whole optimizer state (trainer_opt_m/v) from
 * every shard (collective), or take this replica's shard from it. */
int trainer_opt_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen);
void trainer_opt_take_shard(struct trainer *t);

/* One optimizer step (0-based) over rows [row0, row0 + rows) of a global
 * batch of global_rows sequences; comm is NULL on one device. */
int trainer_step(struct trainer *t, int64_t step, int global_rows, int row0,
		 const struct train_comm *comm, struct step_stats *st, char *err, size_t errlen);

/* Checkpoint (host/ckpt.c): a Hugging Face style directory. */
int trainer_save(struct trainer *t, const char *dir, int64_t next_step, char *err, size_t errlen);
/* Loads params and optimizer state; *next_step = the step to run next. */
int trainer_load(struct trainer *t, const char *dir, int64_t *next_step, char *err, size_t errlen);

/* Tensor parallelism: checkpoints hold whole tensors. trainer_tp_gather
 * (collective over the tensor group) fills the whole-model buffers from every
 * device's shard; trainer_tp_prepare_load makes them before a load, and
 * trainer_tp_scatter takes this device's shard from them. The checkpoint
 * code reads and writes trainer_ckpt_*: the whole-model buffers when tp > 1,
 * else the trainer's own. */
int trainer_tp_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen);
int trainer_tp_prepare_load(struct trainer *t, char *err, size_t errlen);
void trainer_tp_scatter(struct trainer *t);
struct model *trainer_ckpt_model(struct trainer *t);
float *trainer_ckpt_params(struct trainer *t);
float *trainer_ckpt_m(struct trainer *t);
float *trainer_ckpt_v(struct trainer *t);
size_t trainer_ckpt_numel(struct trainer *t);

/* Optimizer state in the parameters' layout, for the checkpoint code (when
 * sharded: the whole-state buffers filled by trainer_opt_gather). */
float *trainer_opt_m(struct trainer *t);
float *trainer_opt_v(struct trainer *t);
const struct cfg *trainer_cfg(const struct trainer *t);
struct dataset *trainer_data(struct trainer *t);

#endif
