/* Private to host/train: the trainer's state, shared by train.c (the
 * trainer and its step), step_end.c (the step's end: sums, clipping, the
 * update, the update ahead) and train_ckpt.c (whole tensors for
 * checkpoints). Calls go one way: train.c calls step_end.c, and nothing of
 * train_ckpt.c; step_end.c calls neither. */
#ifndef MESHRUN_TRAIN_INT_H
#define MESHRUN_TRAIN_INT_H

#include "host/optim/optim.h"
#include "host/train/train.h"

#define MAX_TGROUPS 8

struct trainer {
	struct cfg cfg;
	struct model *model;
	struct optim *opt;           /* the optimizer state and update (host/optim/) */
	struct data_source *data, *eval;    /* training and held-out data, or NULL */
	int rows, global_rows;
	const struct mesh *mesh;     /* NULL on one device */
	int device, coord[AX_COUNT];
	int32_t *inputs, *targets;
	size_t win_copied;           /* the FSDP window's copies at the last step */
	struct pipe_exec *px;        /* the step's executor (a pipeline over
				      * `stage`, or a table of one stage) */
	const struct model_comm *step_mc;  /* the step's collectives, for the
				      * next step's first gathers (prefetch) */
	/* the update ahead (pipeline_update_ahead; train.c) */
	struct ahead {
		bool all;            /* the key in a pipeline: every device sums the
				      * step's scalars in the background */
		bool on;             /* and this stage ends early: it updates ahead */
		bool pending;        /* the last update went ahead, not checked yet */
		bool clipped;        /* the last step checked was clipped: wait */
		bool redo;           /* the check found the update must be redone */
		const struct train_comm *comm;
		void *h[2];          /* the scalars' sums in flight */
		double x[3];         /* loss sum, aux, squares; then their sums */
		int64_t step;        /* the step whose update is pending or was checked last */
		float lr, clip;
		double denom;
		/* the step checked last (or updated after its sums) */
		int64_t done_step;   /* -1: none */
		double done[3];      /* its loss, aux, grad_norm */
		enum step_ahead how; /* what became of its update */
	} ah;
	/* checkpoints: the whole model's table and buffers, and the groups
	 * that gather split tensors (train_ckpt.c) */
	struct model *gmodel;
	float *gp, *gm, *gv;
	struct mesh_members tg[MAX_TGROUPS];
	int ntg;
};

/* ---- step_end.c: the step's end ---- */

/* After forward and backward: the sums, clipping, the learning rate, the
 * update (or, with pipeline_update_ahead on a stage that goes ahead, the
 * update before the sums, checked at the next table's gate); st's loss,
 * aux, grad_norm, lr and ahead. 0 or -errno with comm's err. */
int step_end(struct trainer *t, const struct train_comm *comm, int64_t step, const struct model_step *ms,
	     double denom, struct step_stats *st);
/* The executor's gate (pipe_exec_set_gate; ctx the trainer) of a step
 * after an update ahead: 0 when that update stands, -EAGAIN to stop the
 * table (t->ah.redo), or a failing sum's -errno. */
int step_end_gate(void *ctx);
/* After the gate stopped the table (or trainer_settle found it must):
 * the update redone from the kept state with the clip factor; nothing in
 * flight reads the parameters (the stopped table dropped its gathers,
 * trainer_settle the prefetch's). 0 or -errno. */
int step_end_redo(struct trainer *t);

/* The optimizer's view of comm (NULL: one device). */
static inline const struct optim_comm *trainer_optim_comm(const struct train_comm *comm,
							  struct optim_comm *oc)
{
	if (!comm)
		return NULL;
	*oc = (struct optim_comm){ .mc = &comm->mc, .sum = comm->sum, .bg = comm->bg.all_reduce_v ? &comm->bg : NULL };
	return oc;
}

#endif
