/* Checkpoints as Hugging Face style directories of whole tensors. They
 * work on a view of the training state and know nothing of trainers or
 * meshes: whoever holds the state (the trainer, after gathering shards in
 * a mesh) fills a struct ckpt_state and calls these. */
#ifndef MESHRUN_CKPT_H
#define MESHRUN_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cfg;
struct model;

struct ckpt_state {
	const struct cfg *cfg;   /* saved as meshrun.yml and config.json */
	struct model *model;     /* the whole model's table: names, shapes, offsets */
	float *params, *m, *v;   /* whole tensors in model's layout, numel floats each */
	size_t numel;
	int64_t next_step;       /* the step to run after this state */
	/* the training data's position at next_step (host/data/data.h):
	 * global rows consumed and rows per epoch (0: no epochs); saved as
	 * metadata; -1 on load from a checkpoint without them */
	int64_t data_sample, data_epoch_rows;
};

/* A checkpoint directory (--checkpoint-dir DIR) holds one step directory
 * per checkpoint, DIR/step-000004 (named for the step to run next), with
 * model.safetensors, optimizer.safetensors, config.json and meshrun.yml.
 * A step directory is complete or absent: it is written as
 * DIR/step-000004.tmp, every file and the directory synced, then renamed;
 * only then are older step directories (and stale *.tmp ones) removed, so
 * a crash at any moment leaves the previous checkpoint loadable. */

/* Writes s as DIR/step-<s->next_step> (dir made if missing) as above.
 * 0 or -errno with err. Test-only: MESHRUN_TEST_CKPT_DELAY_MS=N sleeps N
 * ms after each file, to widen the window a crash test aims at. */
int ckpt_save(const struct ckpt_state *s, const char *dir, char *err, size_t errlen);

/* The checkpoint to load from dir: its newest complete step directory
 * (*.tmp ignored), or dir itself when it holds model.safetensors (a step
 * directory named directly, or a checkpoint written before step
 * directories). Writes the path into out and the step of its name into
 * *step (-1 when dir itself; may be NULL). 0, or -EBADMSG when there is
 * none. */
int ckpt_find(const char *dir, char *out, size_t outlen, int64_t *step, char *err, size_t errlen);

/* Fills s->params from the checkpoint ckpt_find picks in dir and, with
 * optimizer, s->m, s->v, s->next_step (both files must agree on the
 * step) and the data position. 0; -EBADMSG when there is none, or it is unreadable or does not
 * match the model; -ENOMEM. */
int ckpt_load(struct ckpt_state *s, const char *dir, bool optimizer, char *err, size_t errlen);

#endif
