/* Private to the executor (host/pipeline/exec.h): its state and the
 * calls between its files, which go one way only:
 *
 *	exec.c -> exec_win.c  (an action's weights: the window's slots,
 *	                       gathers, reduce-scatters; the owner's hooks)
 *	exec.c -> exec_post.c (receives posted ahead of their place; the W
 *	                       a receive's wait may run ahead)
 *
 * Window slots: the non-layer tensors in 0, the table's chunk slot k in
 * 1 + k, the layers outside the pipeline in the last. */
#ifndef MESHRUN_PIPELINE_EXEC_INT_H
#define MESHRUN_PIPELINE_EXEC_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "host/model/window.h"
#include "host/pipeline/exec.h"

/* receives posted ahead at most (the transport keeps as many); landing
 * buffers for those whose table buffer is still in use: pipe_landing_bufs
 * (host/pipeline/schedule.h) */
#define PIPE_PREPOST_MAX 8

/* A send from a buffer not waited yet: to dev (-1: none), (kind, idx). */
struct pipe_sent {
	int dev;
	uint32_t kind, idx;
};

struct pipe_exec {
	struct pipe_table t;
	const struct pipe_action *a; /* this stage's list */
	int n, stage, first_layer;
	int *stage_dev;
	struct model *m;
	size_t nf;                   /* floats of one microbatch's activations */
	int ntok;                    /* tokens of one microbatch */
	float *mem;                  /* every buffer below */
	size_t mem_n;
	float **buf;                 /* [bufs + scratch] */
	int nbuf;
	struct pipe_sent *sent;      /* [bufs] */
	bool *gzero;                 /* [window slots] the next gradient write zeroes them */
	int poison;
	int gathers;
	struct pipe_act_time *times;
	int ntimes;
	/* the owner's hooks, and when the table fires them */
	struct pipe_hooks hooks;
	int sums_at;                 /* the stage_sums hook before this action, or -1 */
	/* the gate (pipe_exec_set_gate): asked before the next step's first
	 * action that moves anything between stages or writes a gradient */
	int (*gate)(void *ctx);
	void *gate_ctx;
	bool ends_early;             /* the table's simulated end of this
				      * stage is before another stage's */
	uint8_t *after;              /* [n] AFTER_* events once the action at k ran */
	bool *last_rs;               /* [n] a reduce-scatter that is its group's last */
	int landing_k;               /* such a reduce-scatter in flight, or -1 */
	int landing_nl;              /* such a non-layer one gone out beside it, or -1 */
	/* filling receive waits (pipe_exec_set_fill) */
	bool fill;                   /* asked for */
	bool filling;                /* this step: asked, and possible */
	bool ahead;                  /* the action running is a W run ahead */
	int *w_of_i;                 /* [n] a W's I (its index), else -1 */
	bool *ran;                   /* [n] run ahead of its place this step */
	int fills;
	/* posting receives ahead (prepost) */
	int prepost;                 /* this step: how many may be outstanding (0: none) */
	bool hold;                   /* this step: posts before a send to their stage hold their word */
	bool later;                  /* this step: the other posts' words go from the transport's thread */
	bool *posted;                /* [n] a RECV posted ahead this step */
	bool *named;                 /* [nbuf] prepost's scratch: named from k on */
	int preposts, prepost_depth;
	/* landing buffers: a receive whose table buffer is still in use is
	 * posted into one of these, which takes the table buffer's place at
	 * the RECV (the two pointers swap) */
	float *land[PIPE_LANDING];
	bool land_busy[PIPE_LANDING];
	int land_max;                /* allocated */
	int nland;                   /* this step's (MESHRUN_PIPE_LANDING) */
	int8_t *land_of;             /* [n] the landing buffer a RECV was posted into, or -1 */
	int landed_early;            /* receives posted into a landing buffer */
	/* synthetic compute (pipe_exec_set_sleep): each compute action
	 * sleeps its time instead of running the model */
	bool sleep;
	struct pipe_costs sleep_s;   /* seconds */
	int slept;                   /* this step's sleeps */
	/* two parts a layer (pipe_exec_set_parts): the F or B running on one
	 * layer, whose window slot the model's mid call waits for or
	 * reduce-scatters part B of (slot -1: none) */
	bool parts;
	int mid_k, mid_op, last_b;   /* last_b: the table's last B, or -1 */
	bool mid_last, mid_sent;     /* the B running is it; it sent a part */
	/* the table's leading gathers, started before the step
	 * (pipe_exec_prefetch) */
	int npre;
	int pre_rc;
	/* held leading gathers [lead, lead_end): those of chunks the first
	 * chunk action (hold_at, or -1: none held) does not read (after a
	 * receive, with parts: every chunk's), started when it starts
	 * (exec_mark_hold) */
	int lead, lead_end, hold_at;
	bool held;                   /* this step: not started yet */
	/* the step in progress */
	const int32_t *inputs, *targets;
	struct model_step *st;
	const struct pipe_p2p *io;
};

/* What an action completes (pipe_hooks.grads_done, landed false). */
enum { AFTER_CHUNK = 1, AFTER_HEAD = 2, AFTER_EMBED = 4 };

#define WSLOT_NONLAYER 0
#define WSLOT(k) (1 + (k))
#define WSLOT_OUTSIDE(w) (win_slots(w) - 1)

static inline int wslot(const struct pipe_exec *x, const struct pipe_action *a)
{
	struct win *w = model_window(x->m);
	if (a->chunk == PIPE_G_NONLAYER)
		return WSLOT_NONLAYER;
	if (a->chunk == PIPE_G_OUTSIDE)
		return WSLOT_OUTSIDE(w);
	return WSLOT(a->slot);
}

/* The decoder layers [*l0, *l1) of chunk c. */
static inline void chunk_layers(const struct pipe_exec *x, int c, int *l0, int *l1)
{
	*l0 = x->first_layer + c * x->t.shape.layers_per_stage;
	*l1 = *l0 + x->t.shape.layers_per_stage;
}

/* The layers outside the pipeline: [0, *nb) before it, [*a0, L) after. */
static inline void outside(const struct pipe_exec *x, int *nb, int *a0)
{
	*nb = x->first_layer;
	*a0 = x->first_layer + x->t.nchunks * x->t.shape.layers_per_stage;
}

/* The actions that compute (or sleep): the gaps between them are the
 * executor's. */
static inline bool compute_op(int op)
{
	return op == PA_F || op == PA_FC || op == PA_B || op == PA_I || op == PA_W || op == PA_EMBED ||
	       op == PA_HEAD || op == PA_EMBED_BACK;
}

/* exec_win.c: the weights' side of actions and the owner's hooks */
int exec_mark_events(struct pipe_exec *x);
int exec_before(struct pipe_exec *x, const struct pipe_action *a);
int exec_after(struct pipe_exec *x, int k);
int exec_landed(struct pipe_exec *x);
int exec_weights(struct pipe_exec *x, const struct pipe_action *a);
int exec_use_slot(struct pipe_exec *x, int k, bool grads);
/* The held leading gathers (struct pipe_exec's lead, hold_at): marked
 * once; started at the first chunk action (exec_start_held). */
void exec_mark_hold(struct pipe_exec *x);
int exec_start_held(struct pipe_exec *x);
/* the model's mid call in a layer's F or B in parts (ctx: the executor);
 * synthetic compute makes it as the model would */
int exec_mid(void *ctx, int l, bool backward, unsigned parts);
/* Whether W action k is its slot's last write of gradients before the
 * slot's reduce-scatter (the next action on the slot is that RS). */
bool exec_w_sends(const struct pipe_exec *x, int k);

/* exec_post.c: receives posted ahead */
int exec_owed_w(const struct pipe_exec *x, int k);
int exec_prepost(struct pipe_exec *x, int k);
bool exec_can_fill(const struct pipe_exec *x);

#endif
