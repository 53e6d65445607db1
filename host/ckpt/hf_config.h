/* A Hugging Face config.json read into a meshrun config
 * (docs/checkpoints.md#coming-in): the model keys a checkpoint
 * directory's config.json fixes, set before the run starts. The
 * config.json a checkpoint is written with is ckpt_config_json's
 * (host/ckpt/ckpt.h). Knows configs; reads no tensors. */
#ifndef MESHRUN_HF_CONFIG_H
#define MESHRUN_HF_CONFIG_H

#include <stddef.h>

struct cfg;

/* When c->load_parameters_path is set: resolves it (ckpt_find: a run's
 * newest complete step, or the directory itself) to an absolute path
 * written back into c, reads its config.json and sets every model key it
 * fixes, for model_type llama, deepseek_v3 and meshrun_moe (what meshrun
 * writes for a model no Hugging Face class computes). Keys the file does
 * not give take Hugging Face's defaults for that model type. A key the
 * user fixed (named in cmdline, n "key=value" strings, or set to other
 * than its default by a config file) that contradicts the file is
 * refused naming both. 0 (nothing to do without load_parameters_path);
 * -EINVAL (a contradiction, or something meshrun does not compute: an
 * activation, a bias, a rope_scaling type), -EBADMSG (no checkpoint
 * there, config.json unreadable or a value of the wrong type), with err. */
int hf_config_apply(struct cfg *c, const char *const *cmdline, int n, char *err, size_t errlen);

#endif
