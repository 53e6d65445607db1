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
struct cJSON;
struct model;
struct model_dims;
struct param_info;

struct ckpt_state {
	const struct cfg *cfg;   /* saved as meshrun.yml and config.json */
	struct model *model;     /* the whole model's table: names, shapes, offsets */
	float *params, *m, *v;   /* whole tensors in model's layout, numel floats each */
	size_t numel;
	int64_t next_step;       /* the step to run after this state */
	int64_t global_batch;    /* rows per step (0: not known, not recorded) */
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

/* Both safetensors files of a step directory record in their metadata
 * meshrun_step (next_step), meshrun_global_batch (global_batch, when
 * known) and meshrun_id (a random number drawn for this save, so that a
 * host can tell whether it sees the same checkpoint as another). */

/* Writes s as DIR/step-<s->next_step> (dir made if missing) as above.
 * 0 or -errno with err. Test-only: MESHRUN_TEST_CKPT_DELAY_MS=N sleeps N
 * ms after each file, to widen the window a crash test aims at. */
int ckpt_save(const struct ckpt_state *s, const char *dir, char *err, size_t errlen);

/* The checkpoint to load from dir: its newest complete step directory
 * (*.tmp ignored), or dir itself when it holds model.safetensors or
 * model.safetensors.index.json (a step directory named directly, a
 * checkpoint written before step directories, a Hugging Face model). Writes the path into out and the step of its name into
 * *step (-1 when dir itself; may be NULL). 0, or -EBADMSG when there is
 * none. */
int ckpt_find(const char *dir, char *out, size_t outlen, int64_t *step, char *err, size_t errlen);

/* Fills s->params from the checkpoint ckpt_find picks in dir and, with
 * optimizer, s->m, s->v, s->next_step (both files must agree on the
 * step) and the data position. 0; -EBADMSG when there is none, or it is unreadable or does not
 * match the model; -ENOMEM. */
int ckpt_load(struct ckpt_state *s, const char *dir, bool optimizer, char *err, size_t errlen);

/* The config.json of model d trained with config c (docs/checkpoints.md):
 * model_type llama for a dense model with grouped-query attention,
 * deepseek_v3 for multi-head latent attention with (if any) DeepSeek-V3's
 * router (sigmoid scores, correction bias), meshrun_moe for any other
 * model (no Hugging Face class computes it). NULL when out of memory;
 * the caller deletes it with cJSON_Delete. */
struct cJSON *ckpt_config_json(const struct cfg *c, const struct model_dims *d);

/* Hugging Face tensor names (docs/checkpoints.md#tensor-names). A model
 * parameter is one tensor (embedding, final norm, output projection), one
 * per decoder layer (stacked ones), or one per layer and expert (routed
 * experts, ckpt_hf_per_expert). The first decoder layer a stacked
 * parameter has a slice for: */
int ckpt_hf_layer0(const struct model *m, const struct param_info *p);
bool ckpt_hf_per_expert(const struct param_info *p);
/* The name of parameter p's slice for decoder layer `layer` (-1: not
 * stacked) and expert `expert` (-1: not per expert). 0, or -ENOENT for a
 * parameter the table does not name. */
int ckpt_hf_name(const struct model *m, const struct param_info *p, int layer, int expert, char *out,
		 size_t outlen);

#endif
