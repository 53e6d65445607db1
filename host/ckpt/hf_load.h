/* Weights in from a checkpoint directory in Hugging Face layout (ours or
 * anyone's; docs/checkpoints.md#loading): config.json's model already
 * built, this fills each device's shards of it. A host opens the
 * directory once for its devices: every shard's header is checked before
 * any data is read, then each device reads only the byte ranges of its
 * own blocks (pread, never a whole file into memory), and a block that
 * another device of the host already read is copied from it. Knows
 * safetensors files and the model's table; no networks. */
#ifndef MESHRUN_HF_LOAD_H
#define MESHRUN_HF_LOAD_H

#include <stddef.h>
#include <stdint.h>

struct hf_src;
struct model;

/* Opens the checkpoint in dir (as ckpt_find picks it: a run's newest
 * complete step, or dir itself) for the `devices` devices of this host:
 * model.safetensors.index.json when there is one (the shard names as it
 * gives them), else model.safetensors, and every shard's header. An FP8
 * checkpoint (weight_scale_inv tensors) is refused by name. 0 and *out;
 * -EBADMSG (nothing there, a header that lies, an index that disagrees
 * with its shards, a tensor in two shards), -ENOMEM; err is one line
 * naming the file and tensor. */
int hf_src_open(struct hf_src **out, const char *dir, int devices, char *err, size_t errlen);

/* Fills model m's weights (this device's shards, in m's layout, into
 * params) from the checkpoint. The host's first call checks every tensor
 * against m's table (the whole model's shapes): a tensor missing,
 * misshapen (the model is config.json's) or of no parameter is one line
 * naming it with the expected and found shape; tensors of a
 * multi-token-prediction layer beyond the model's layers, rotary inv_freq
 * buffers and lm_head.weight of a tied model are skipped and counted
 * (hf_src_summary). No tensor data is read before the whole check passed.
 * Devices of a host run this one at a time. 0; -EBADMSG, -ENOMEM, -EIO
 * (a file that changed under us) with err. */
int hf_src_load(struct hf_src *s, const struct model *m, float *params, char *err, size_t errlen);

/* Every device of the host calls this once, after hf_src_load or instead
 * of it (rc and err: its own result): it blocks until all of them have,
 * since a later device may copy blocks out of an earlier one's params.
 * Returns rc; a device that succeeded while another failed gets the
 * first failure's rc and err, so every device reports the real cause. */
int hf_src_done(struct hf_src *s, int rc, char *err, size_t errlen);

/* Bytes this host read from the directory: the index, every shard's
 * length and header, and the tensor ranges. */
uint64_t hf_src_bytes_read(const struct hf_src *s);
/* One line for the log: what was read (headers, tensor bytes of the
 * checkpoint's total), from how many files, in how long, what skipped. */
void hf_src_summary(const struct hf_src *s, char *out, size_t outlen);
void hf_src_close(struct hf_src *s);

#endif
