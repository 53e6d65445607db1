/* Resuming a run from its own checkpoint on any mesh that fits it
 * (docs/checkpoints.md#resume-on-another-mesh). A checkpoint holds whole
 * tensors, so the mesh, the sharding and ZeRO-1 are layouts, not part of
 * the format: a resume needs only the same model, the same optimizer and
 * the same global batch. Each host opens the step directory once for its
 * devices and each device reads only its shards of the weights and of
 * the optimizer state (the ranged reads of host/ckpt/hf_load.h). Knows
 * files, configs and the model's table; no networks, no trainer. */
#ifndef MESHRUN_CKPT_RESUME_H
#define MESHRUN_CKPT_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "host/ckpt/hf_load.h"

struct cfg;
struct model;
struct model_dims;
struct ckpt_resume;

/* Whether the newest complete checkpoint in dir can continue this run: c
 * (finished for its mesh), its model d and its global batch (rows per
 * step). Refused, each with one line naming what differs: nothing left
 * to run (the checkpoint at or past `steps`), another opt_type, another
 * model (a config.json key other than torch_dtype differs from the one
 * this run would write), another sequence length
 * (max_target_length), another global batch when the checkpoint has no
 * data position to continue from (recorded since meshrun_global_batch
 * exists; older ones are not checked; one with meshrun_data_sample
 * continues its data at any rows per step). The mesh, devices, hosts, sharding rules and ZeRO-1 may all
 * differ. 0; -EINVAL (a config error: the run asks what cannot resume),
 * -EBADMSG (no checkpoint, or an unreadable one), -ENOMEM. */
int ckpt_resume_fits(const char *dir, const struct cfg *c, const struct model_dims *d,
		     int64_t global_batch, char *err, size_t errlen);

/* Opens the newest complete checkpoint in dir for this host's `devices`
 * devices: model.safetensors and optimizer.safetensors, their headers
 * checked, both at the same step and from the same save. 0 and *out;
 * -EBADMSG with one line naming the file; -ENOMEM. */
int ckpt_resume_open(struct ckpt_resume **out, const char *dir, int devices, char *err, size_t errlen);
void ckpt_resume_close(struct ckpt_resume *r);
/* The step to run next, and the save's meshrun_id (0 when the
 * checkpoint has none). */
int64_t ckpt_resume_step(const struct ckpt_resume *r);
uint64_t ckpt_resume_id(const struct ckpt_resume *r);
/* The training data's position at that step (struct ckpt_state's
 * data_sample and data_epoch_rows): -1 when the checkpoint has none. */
void ckpt_resume_data_pos(const struct ckpt_resume *r, int64_t *sample, int64_t *epoch_rows);

/* This device's shards (model m's table: its goff and local shapes, a
 * pipeline's storage order): the weights into params, and AdamW's m and
 * v (Muon's momentum in m) into mbuf and vbuf, in m's parameter layout,
 * only the floats inside ranges (sorted, disjoint, touching ones merged;
 * nr 0: all). Every tensor is checked before any data is read. The
 * host's devices call this one at a time, then each calls
 * ckpt_resume_done. 0; -EBADMSG, -EIO, -ENOMEM with err. */
int ckpt_resume_read(struct ckpt_resume *r, const struct model *m, float *params, float *mbuf,
		     float *vbuf, const struct hf_range *ranges, int nr, char *err, size_t errlen);
/* As hf_src_done, for both files: blocks until every device of the host
 * has called it (a later device may copy blocks out of an earlier one's
 * buffers, so none may free them before). Returns rc or the host's first
 * failure. */
int ckpt_resume_done(struct ckpt_resume *r, int rc, char *err, size_t errlen);
/* One line: what this host read of each file, of the checkpoint's bytes. */
void ckpt_resume_summary(const struct ckpt_resume *r, char *out, size_t outlen);

#endif
