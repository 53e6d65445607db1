/* Training on one device's rows and shards: model + optimizer + data. A
 * step computes gradients for rows [row0, row0+rows) of the global batch
 * (the model runs its plans' collectives), sums each gradient bucket over
 * its axes (data parallelism; ZeRO-1 reduce-scatters over `data` instead),
 * clips by the global norm, and updates this device's shards. The step
 * loop is driven from outside so a pipeline schedule can drive it later. */
#ifndef MESHRUN_TRAIN_H
#define MESHRUN_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "host/ckpt/ckpt.h"
#include "host/ckpt/resume.h"
#include "host/config/config.h"
#include "host/model/model.h"
#include "host/optim/optim.h"
#include "host/pipeline/exec.h"

struct trainer;

/* What became of a step's update under pipeline_update_ahead. */
enum step_ahead {
	AHEAD_OFF,     /* the key is off (or no pipeline) */
	AHEAD_WAITED,  /* updated after the step's sums, as without the key */
	AHEAD_KEPT,    /* updated ahead of them, and that update stood */
	AHEAD_REDONE,  /* updated ahead, then redone with the clip factor */
	AHEAD_PENDING, /* updated ahead, not checked yet */
};

struct step_stats {
	double loss;        /* mean cross-entropy over the global batch */
	double aux;         /* load-balance loss (MoE) */
	double grad_norm;   /* before clipping */
	double lr;
	int weight_gathers; /* FSDP all-gathers of layer groups this step */
	double window_copies; /* floats the FSDP window copied since the last step */
	double muon_ns;     /* Muon: matrices orthogonalised, every device's */
	double muon_bytes;  /* Muon: bytes sent for it, every device's */
	double muon_gflop[3]; /* Muon: Newton-Schulz GFLOP, every device's;
			       * the busiest and least busy device's (the plan's) */
	/* util_now_s() times, for traces */
	double t_data0, t_data1; /* reading this device's rows */
	double t_fb0, t_fb1;    /* forward and backward */
	double cpu_fb;          /* the device thread's CPU seconds in it */
	double t_opt0, t_opt1;  /* clipping and optimizer update */
	/* pipeline_update_ahead: AHEAD_PENDING when the loss, aux and
	 * grad_norm above are not known yet (NaN): trainer_settled gives
	 * them once a later step (or trainer_settle) has checked them */
	enum step_ahead ahead;
};

/* How devices talk: the model's collectives by axis set, and an exact sum
 * of doubles over an axis set (gathered, then added in rank order, so
 * every member gets the same bits). 0 or -errno with *err filled. */
struct train_comm {
	struct model_comm mc;
	int (*sum)(void *ctx, uint32_t axes, double *x, int n);
	/* the same sum in the background: sum_start copies x's n doubles
	 * and sets *h (NULL: nothing to wait for, x is its own sum);
	 * sum_wait(h, x) waits and writes the n sums into x. On a queue of
	 * its own: it holds up no other collective. NULL: not offered. */
	int (*sum_start)(void *ctx, uint32_t axes, const double *x, int n, void **h);
	int (*sum_wait)(void *ctx, void *h, double *x);
	/* the gradient buckets' all-reduces in the background (all_reduce
	 * NULL: they run synchronously) */
	struct optim_bg bg;
	/* point-to-point messages (a pipeline over `stage`); unused otherwise */
	struct pipe_p2p p2p;
	char *err;               /* where the collectives write their errors */
	size_t errlen;
};

/* rows = sequences this device computes per step; mm places it in a mesh
 * (NULL: one device). Opens the training data and, with eval_interval >
 * 0, the held-out data (host/data/data.h). 0 and *t, or with err:
 * -EINVAL for impossible shapes, combinations, shardings and data keys
 * (train_check, host/train/check.h, finds them all before);
 * -EBADMSG when the data is bad (its files); -ENOMEM when the model's buffers cannot be had. */
int trainer_open(struct trainer **t, const struct cfg *c, int rows, const struct model_mesh *mm,
		 char *err, size_t errlen);
/* trainer_open for `meshrun eval`: the held-out data only (no training
 * data is opened; trainer_step must not be called). */
int trainer_open_eval(struct trainer **t, const struct cfg *c, int rows,
		      const struct model_mesh *mm, char *err, size_t errlen);
/* trainer_open for callers that need no error class: NULL on failure. */
struct trainer *trainer_new(const struct cfg *c, int rows, const struct model_mesh *mm,
			    char *err, size_t errlen);
void trainer_free(struct trainer *t);
struct model *trainer_model(struct trainer *t);
int trainer_rows(const struct trainer *t);

/* One optimizer step (0-based) over rows [row0, row0 + rows) of a global
 * batch of global_rows sequences; comm is NULL on one device. When the
 * data masks targets (documents respected), the loss is the mean over
 * the global batch's unmasked targets. 0, or with err the data's
 * -errno (a bad row) or the first failing collective's. */
int trainer_step(struct trainer *t, int64_t step, int global_rows, int row0,
		 const struct train_comm *comm, struct step_stats *st, char *err, size_t errlen);

/* One evaluation: data_eval_batches batches of the held-out data, this
 * device computing rows [row0, row0 + rows) of each (collective over
 * every device, like a step; a pipeline runs its forward and backward
 * and drops the gradients). *loss = the mean cross-entropy over every
 * unmasked target, *tokens their number. 0 or -errno with err. */
/* ZeRO-1's parameter gathers the last update left in flight (the next
 * step's table waits for each as it needs it) waited for: the
 * parameters are whole; and the next step's first FSDP gathers the
 * update started, waited for and dropped. trainer_eval and
 * trainer_ckpt_gather call it; the loop after the last step. 0 or
 * -errno with err. */
int trainer_sync(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen);
/* pipeline_update_ahead: checks the update that went ahead, if any (the
 * step's global sums waited for; redone, with the clip factor, when
 * clipping scaled the gradients), so that the parameters are the step's
 * (before an evaluation, a checkpoint, the end). trainer_sync calls it.
 * Collective. 0 or -errno with err. */
int trainer_settle(struct trainer *t, char *err, size_t errlen);
/* The step last checked (-1: none) and its loss, aux, grad_norm and what
 * became of its update, into st's fields of those names. */
int64_t trainer_settled(const struct trainer *t, struct step_stats *st);
int trainer_eval(struct trainer *t, int global_rows, int row0, const struct train_comm *comm,
		 double *loss, int64_t *tokens, char *err, size_t errlen);

/* Checkpoints (host/ckpt/ckpt.h) hold whole tensors. trainer_ckpt_state
 * fills a view of them: in a mesh the whole-model buffers that
 * trainer_ckpt_gather (collective over every device) fills from every
 * device's shards and trainer_ckpt_scatter takes this device's shards
 * from (trainer_ckpt_prepare makes them before a load); on one device the
 * trainer's own buffers. */
int trainer_ckpt_prepare(struct trainer *t, char *err, size_t errlen);
int trainer_ckpt_gather(struct trainer *t, const struct train_comm *comm, char *err, size_t errlen);
int trainer_ckpt_scatter(struct trainer *t, char *err, size_t errlen);
void trainer_ckpt_state(struct trainer *t, struct ckpt_state *s, int64_t next_step);
/* ckpt_save / ckpt_load of trainer_ckpt_state; on load, *next_step (may be
 * NULL: parameters only) is the step to run next, and the training data
 * continues from the checkpoint's data position (trainer_seek_data). */
int trainer_save(struct trainer *t, const char *dir, int64_t next_step, char *err, size_t errlen);
int trainer_load(struct trainer *t, const char *dir, int64_t *next_step, char *err, size_t errlen);
/* Resume on any mesh: this device reads its own shards of the weights
 * and of the optimizer state (its part of a ZeRO-1 bucket only) from r,
 * opened by its host (host/ckpt/resume.h), then waits for the host's
 * other devices (ckpt_resume_done). Every device of the host calls it.
 * 0, or -EBADMSG, -EIO, -ENOMEM with err. */
int trainer_resume_read(struct trainer *t, struct ckpt_resume *r, char *err, size_t errlen);
/* the optimizer buffers of trainer_ckpt_state (tests compare them) */
float *trainer_ckpt_m(struct trainer *t);
float *trainer_ckpt_v(struct trainer *t);

const struct cfg *trainer_cfg(const struct trainer *t);
/* The step's executor (a table of one stage without a pipeline). */
struct pipe_exec *trainer_pipe(struct trainer *t);
/* The training and held-out data (NULL when not opened). */
struct data_source *trainer_data(struct trainer *t);
struct data_source *trainer_eval_data(struct trainer *t);
/* Step `step`'s batch begins at global row `sample` of the training data
 * (a checkpoint's data position, whose epochs held epoch_rows rows; -1:
 * a checkpoint from before data positions, nothing to do). 0 or -EBADMSG
 * with err (another corpus). */
int trainer_seek_data(struct trainer *t, int64_t step, int64_t sample, int64_t epoch_rows,
		      char *err, size_t errlen);

#endif
