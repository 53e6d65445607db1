/* The FSDP weight window: compute-shaped copies of the weights stored
 * sharded over the mesh (all-gathered before use), and their gradients
 * until they are reduce-scattered back to the shards. It moves weights and
 * gradients and computes nothing; which layer goes where, and when, is the
 * caller's schedule.
 *
 * A group is the non-layer tensors (embedding, final norm, head: the range
 * [WIN_NONLAYER, 0)) or a range of layers [l0, l1) of at most `lcap`
 * layers. The caller holds groups in slots it numbers itself (any slot for
 * any group); a slot moves
 *
 *	FREE --gather_start--> GATHERING --wait--> READY --release--> FREE
 *
 * and while READY its weights can be read (win_block) and its gradients
 * accumulated, zeroed (win_zero_grads) and sent back (win_scatter_start).
 *
 * The memory is fixed at creation and is what one gather and one
 * reduce-scatter in flight need: per kind (non-layer, layers) one
 * compute-shaped window of weights and one of gradients, and one packed
 * buffer each way for the collectives. Hence the rules (programmer errors,
 * asserted): at most one slot GATHERING at a time; at most one READY slot
 * per kind, so wait() for a layer group needs the READY layer slot
 * released first; the gradients of a READY slot are free again once its
 * reduce-scatter has started. A gather lands packed and is placed into
 * the window by wait(); that is why a READY group and a GATHERING one
 * fit in the memory of one window and one packed buffer.
 *
 * Errors: every call returns the step's error (0 or the first hook
 * error, a negative errno), which lives in the int given to win_begin;
 * once it is set no collective starts, but the states still move, so the
 * caller's schedule runs on and win_end cleans up. */
#ifndef MESHRUN_WINDOW_H
#define MESHRUN_WINDOW_H

#include <stdbool.h>
#include <stddef.h>

#include "host/mesh/mesh.h"
#include "host/mesh/plan.h"
#include "host/model/model.h"

#define WIN_NONLAYER (-1)
#define WIN_SLOTS 4

/* One tensor of the model as the window sees it (p NULL: absent). Only
 * tensors whose plan gathers them (pp->gather) are in the window. */
struct win_tensor {
	const struct param_info *p;     /* storage shard: shape, offset */
	const struct plan_param *pp;    /* gathered axes, compute shape */
	int first, count;               /* stacked: its slices are of layers [first, first + count) */
};

struct win;

/* Lays out the window for tensors t[0, n) (copied; the pointers in them
 * must outlive the window) with layer groups of at most lcap layers; no
 * buffers yet. NULL when out of memory or the tensors are gathered over
 * more different axis sets than it keeps groups for. */
struct win *win_new(const struct mesh *ms, int device, const struct win_tensor *t, int n, int lcap);
/* Allocates the buffers (zeroed); params and grads are the model's one
 * allocation each, which gathers read and reduce-scatters add into.
 * 0 or -ENOMEM. */
int win_alloc(struct win *w, float *params, float *grads);
void win_free(struct win *w);
/* Floats the buffers take (whether allocated or not). */
size_t win_numel(const struct win *w);

/* A step begins: the collectives to use and where its error lives. */
void win_begin(struct win *w, const struct model_comm *comm, int *rc);
/* Starts all-gathering group [l0, l1) into FREE slot k (in the
 * background when the hooks allow it). */
int win_gather_start(struct win *w, int k, int l0, int l1);
/* Waits for slot k's gather and places the weights in the window: k is
 * READY. */
int win_wait(struct win *w, int k);
/* The caller is done with READY slot k's weights. */
void win_release(struct win *w, int k);
/* Zeroes READY slot k's gradient window (its gradients accumulate). */
void win_zero_grads(struct win *w, int k);
/* Starts reduce-scattering READY slot k's gradients into the gradient
 * shards (adding to them), after finishing the one before: one in
 * flight. The gradient window is free again on return. */
int win_scatter_start(struct win *w, int k);
/* Waits for the reduce-scatter in flight, if any, and adds it in. */
int win_scatter_finish(struct win *w);
/* The step ends: waits for whatever is still in flight (after a failure;
 * what it brings is dropped) and frees every slot. */
int win_end(struct win *w);

/* The compute-shaped weights (or gradients) of gathered tensor i for
 * layer l (ignored for a non-layer tensor): its group must be READY. */
float *win_block(struct win *w, bool grads, int i, int l);

#endif
