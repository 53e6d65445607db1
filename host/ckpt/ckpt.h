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
};

/* Writes model.safetensors, optimizer.safetensors, config.json and
 * meshrun.yml into dir (made if missing), each atomically. 0 or -errno
 * with err. */
int ckpt_save(const struct ckpt_state *s, const char *dir, char *err, size_t errlen);

/* Fills s->params from dir and, with optimizer, s->m, s->v and
 * s->next_step (both files must agree on the step). 0; -EBADMSG when the
 * directory is missing, unreadable or does not match the model; -ENOMEM. */
int ckpt_load(struct ckpt_state *s, const char *dir, bool optimizer, char *err, size_t errlen);

#endif
