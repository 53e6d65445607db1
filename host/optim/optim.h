/* The optimizer, a room of its own: the state of this device's shards
 * (AdamW's m and v, or Muon's momentum in m), laid out gradient bucket by
 * gradient bucket, where a bucket whose state ZeRO-1 splits over `data`
 * keeps only this device's part; the buckets' sums over the mesh, the
 * global gradient norm and clipping, the learning rate, the update, the
 * DeepSeek router bias, and ZeRO-1's gathers of updated parameters. It
 * works on a model's one allocation of parameters and gradients
 * (host/model/model.h) and reaches other devices only through struct
 * optim_comm. */
#ifndef MESHRUN_OPTIM_H
#define MESHRUN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/model/model.h"

struct optim;

/* The collectives the optimizer uses: the model's by axis set (mc), and
 * an exact sum of doubles over an axis set (the same bits on every
 * member). Each returns 0 or -errno (the caller keeps the message). */
struct optim_comm {
	const struct model_comm *mc;
	int (*sum)(void *ctx, uint32_t axes, double *x, int n);
};

/* Where the optimizer's device sits: mesh NULL for one device; ndata > 1
 * when ZeRO-1 splits the state of buckets summed over `data` (rdata: this
 * device's data coordinate). */
struct optim_place {
	const struct mesh *mesh;
	int device;
	int ndata, rdata;
};

/* The state for model m's trained tensors on this device (m stays the
 * caller's and outlives it). 0 and *out; -EINVAL with err for Muon beside
 * ZeRO-1 (optim_check_zero's line); -ENOMEM with err naming the bytes. */
int optim_new(struct optim **out, struct model *m, const struct cfg *c, const struct optim_place *pl,
	      char *err, size_t errlen);
void optim_free(struct optim *o);

/* Muon needs whole matrices, ZeRO-1 cuts the state of every bucket
 * summed over `data` into flat parts: a Muon matrix in such a bucket is
 * refused. 0, or -EINVAL with one line in err naming the tensor. The
 * trainer's checks (host/train/check.c) and optim_new both ask it. */
int optim_check_zero(const struct model *m, bool muon, int ndata, char *err, size_t errlen);

/* What the optimizer keeps for tensor p on its device: the floats of
 * state (returned), in *slots buffers (AdamW: m and v, 2; Muon's
 * matrices: the momentum, 1; an untrained tensor: 0), and whether ZeRO-1
 * splits them over `data` (ndata > 1: a tensor summed over it). For
 * `meshrun shardings`. */
size_t optim_tensor_state(const struct param_info *p, bool muon, int ndata, int *slots, bool *zero);

/* Sums every gradient bucket over its axes (a ZeRO-1 bucket:
 * reduce-scattered over `data`, its part summed over the rest) and
 * returns in *ss this device's share of the squared global norm (each
 * element divided by the devices holding the same value, so the sum over
 * every device counts each element once). oc NULL on one device. 0 or
 * the failing collective's -errno. */
int optim_sum_grads(struct optim *o, const struct optim_comm *oc, double *ss);

/* The learning rate of step (0-based): warm-up, then cosine decay. */
float optim_lr(const struct optim *o, int64_t step);

/* Updates this device's shards from the summed gradients, each scaled
 * by clip first (1: none): AdamW element-wise, Muon per whole matrix
 * (a matrix split over devices is gathered, collective). Then the router
 * bias from the step's expert counts, and ZeRO-1's all-gather of the
 * updated parts. 0 or -errno. */
int optim_update(struct optim *o, const struct optim_comm *oc, int64_t step, float lr, float clip);

/* Checkpoints: m (which 0) or v (1) in the parameters' layout. On one
 * device the state is that layout already: optim_state returns it. */
float *optim_state(struct optim *o, int which);
/* loc (the layout's floats) = the state; ZeRO-1 parts are gathered over
 * `data` (collective over every device). 0 or -errno. */
int optim_state_to_layout(struct optim *o, const struct optim_comm *oc, int which, float *loc);
/* The state = this device's part of loc. */
void optim_layout_to_state(struct optim *o, int which, const float *loc);

#endif
