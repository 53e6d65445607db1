/* The sharded-matmul planner (docs/sharding.md#the-planner). From the partition specs of a
 * linear layer's input activation, its weight and the wanted output it
 * decides what has to move:
 *   - weight dimensions sharded on mesh axes the activation's rows are split
 *     on are all-gathered before use, and the weight gradient is
 *     reduce-scattered back over the same axes after it (FSDP);
 *   - a contraction dimension sharded on the same axes in both operands
 *     leaves partial sums, all-reduced over those axes (tensor parallelism
 *     after a row-parallel matmul, tensor-transpose after every contraction
 *     over the embedding);
 *   - backward is the transpose: the weight's output dimension, sharded,
 *     makes the input gradient partial over its axes (Megatron's
 *     column-parallel backward all-reduce); the gathered weight's gradient
 *     is reduce-scattered; rows' axes the weight is not sharded on sum the
 *     weight gradient at the end of the step (data parallelism).
 * Plans are made once at start-up; a combination the runtime cannot run
 * is refused there with the tensor and axes named, never computed wrong.
 * Pure arithmetic: no collectives, no allocation. Axis sets are bit masks
 * of 1 << AX_*. */
#ifndef MESHRUN_PLAN_H
#define MESHRUN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"

/* Where one parameter lives and how it is used. */
struct plan_param {
	/* storage: the rules' spec, with each dimension's gathered axes moved
	 * after its kept ones, so that gathering yields one contiguous block:
	 * the part of the tensor the activations line up with */
	struct shard_spec spec;
	uint32_t gather;       /* all-gathered before use (FSDP) */
	uint32_t slice;        /* replicated here but used in slices over these
				* (a norm weight under a split embedding) */
	uint32_t gsum;         /* the local gradient is summed over these at the
				* end of the step: rows' axes it is not sharded
				* on, and its slice axes */
	int cshape[SHARD_MAX_DIMS]; /* what compute sees: global / kept axes */
	size_t cnumel;
};

/* Resolves a parameter through the rules and plans it for activations
 * whose rows are split over `rows`. 0 or -EINVAL with err (shard_resolve's
 * messages, naming tensor, dimension and axes). */
int plan_param(struct plan_param *p, const struct shard_rules *r, const struct mesh *m,
	       const char *tensor, int ndim, const int *shape, const char *const *logical,
	       int head_dim, uint32_t rows, char *err, size_t errlen);

/* Marks dimension dim of a replicated parameter as used in slices over the
 * axes the activation splits that dimension on (cshape shrinks; gsum
 * grows). -EINVAL with err if the parameter is sharded there already on
 * other axes. */
struct plan_axes;
int plan_param_slice(struct plan_param *p, const struct mesh *m, int dim,
		     const struct plan_axes *axes, char *err, size_t errlen);

/* The kept axes of dimension d (sharded and not gathered), in storage
 * order; returns their count. */
int plan_kept_axes(const struct plan_param *p, int d, int *axes);

/* One linear layer y = x . W^T, W stored [out, in]. */
struct plan_linear {
	uint32_t reduce;       /* forward: y is partial over these; all-reduce */
	uint32_t dx_reduce;    /* backward: dx is partial over these; all-reduce */
	uint32_t dw_scatter;   /* backward: dW is reduce-scattered over these */
};

/* An activation dimension's axes, in the order its rule lists them. */
struct plan_axes {
	int n;
	int axis[AX_COUNT];
};

uint32_t plan_axes_mask(const struct plan_axes *a);
/* The axes of dimension d of a resolved activation spec. */
void plan_axes_of(struct plan_axes *a, const struct shard_spec *s, int d);

/* Plans linear `name` over weight w (dimensions out_dim, in_dim of its
 * compute shape; leading stacked dimensions are not contracted) for an
 * input whose contraction dimension is split over x_in and a wanted output
 * split over y_out (the rows are those w was planned for). Refuses, with
 * a line naming the linear, the logical dimension and both axis lists:
 * an input contraction split differently from the weight's (the
 * sequence-parallel all-gather is not implemented), and a weight output
 * split that differs from the wanted one. */
int plan_linear(struct plan_linear *l, const char *name, const struct plan_param *w,
		int out_dim, int in_dim, const struct plan_axes *x_in, const struct plan_axes *y_out,
		char *err, size_t errlen);

/* Offsets, per dimension, of the storage block of the device at coord
 * inside the tensor gathered over `axes` (a subset of the spec's axes that
 * is minor in each dimension: the gather set, or every axis of the spec
 * for the whole tensor). */
void plan_block_offsets(const struct plan_param *p, const struct mesh *m, uint32_t axes,
			const int coord[AX_COUNT], int *off);

/* Copies the block of shape bshape between a tensor of shape tshape (at
 * offsets off) and a dense buffer: into the tensor when `into`, out of it
 * otherwise. ndim <= SHARD_MAX_DIMS. */
void plan_copy_block(float *tensor, const int *tshape, float *block, const int *bshape,
		     const int *off, int ndim, bool into);

/* After an all-gather over members' axes (member r's block of shape
 * bshape at recv + r * per), puts each member's block in its place in
 * whole: the last dims dimensions of p's nd-dimensional tensor, whole of
 * shape wshape. */
void plan_place_gathered(const struct plan_param *p, const struct mesh *m,
			 const struct mesh_members *members, int nd, int dims, float *whole,
			 const int *wshape, const float *recv, const int *bshape, size_t per);

/* Human text of an axis set ("fsdp+expert", or "none"). */
void plan_mask_text(uint32_t mask, char *out, size_t outlen);

#endif
