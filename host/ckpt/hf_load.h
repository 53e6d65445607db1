/* Weights in from a checkpoint directory in Hugging Face layout (ours or
 * anyone's; docs/checkpoints.md#loading): config.json's model already
 * built, this fills each device's shards of it. A host opens the
 * directory once for its devices: every shard's header is checked before
 * any data is read, then each device reads only the byte ranges of its
 * own blocks (out of read-only mappings of the shards, or pread; never a
 * whole file into memory), and a block several devices of the host hold
 * is read once for all of them. Knows
 * safetensors files and the model's table; no networks. */
#ifndef MESHRUN_HF_LOAD_H
#define MESHRUN_HF_LOAD_H

#include <stdbool.h>
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
/* hf_src_open of one named safetensors file of the checkpoint (no index):
 * a run's optimizer.safetensors. */
int hf_src_open_file(struct hf_src **out, const char *dir, const char *file, int devices, char *err,
		     size_t errlen);
/* The checkpoint directory opened (ckpt_find's pick), and a value of its
 * (first) file's __metadata__ (NULL when absent). */
const char *hf_src_dir(const struct hf_src *s);
const char *hf_src_meta(const struct hf_src *s, const char *key);

/* Fills model m's weights (this device's shards, in m's layout, into
 * params) from the checkpoint. The host's first call checks every tensor
 * against m's table (the whole model's shapes): a tensor missing,
 * misshapen (the model is config.json's) or of no parameter is one line
 * naming it with the expected and found shape; tensors of a
 * multi-token-prediction layer beyond the model's layers, rotary inv_freq
 * buffers and lm_head.weight of a tied model are skipped and counted
 * (hf_src_summary). No tensor data is read before the whole check passed.
 * Devices of a host run this one at a time; params are filled when
 * hf_src_done returns (hf_src_load_into). 0; -EBADMSG, -ENOMEM, -EIO (a
 * file that changed under us) with err. */
int hf_src_load(struct hf_src *s, const struct model *m, float *params, char *err, size_t errlen);

/* One set of tensors to fill: those named prefix + a parameter's Hugging
 * Face name ("m." and "v." in optimizer.safetensors), into buf in m's
 * layout. */
struct hf_dest {
	const char *prefix;
	float *buf;
};
/* Floats [lo, hi) of m's layout. */
struct hf_range {
	size_t lo, hi;
};
/* hf_src_load for nd sets of tensors of one file and, with nr > 0, only
 * the floats of the layout inside the ranges r (sorted, disjoint, touching
 * ones merged): the rest of each buf is left as it is, and its bytes are
 * not read (ZeRO-1's state: a device holds part of each bucket). The
 * host's first call checks the file against all of its dests: every
 * tensor there must be one of theirs. Each of the `devices` devices of
 * hf_src_open calls this once (or fails before and calls hf_src_done
 * only): the reads of all of them are one batch, run by the last one's
 * call, so a block several devices hold whole is read once and written
 * to two of them from the same read (a third copies it). The reads run
 * on util_load_threads() threads; a device's buffers are filled when
 * its hf_src_done returns (when its own call returns if devices is 1);
 * the error is the first one in tensor order, and reaches every device
 * through hf_src_done. */
int hf_src_load_into(struct hf_src *s, const struct model *m, const struct hf_dest *d, int nd,
		     const struct hf_range *r, int nr, char *err, size_t errlen);

/* Every device of the host calls this once, after hf_src_load or instead
 * of it (rc and err: its own result): it blocks until all of them have,
 * since the last device's load fills the others' buffers too (and a
 * later device may copy blocks out of an earlier one's params); when a
 * device never loaded, the last to arrive runs the others' reads (or
 * drops them when one failed).
 * Returns rc; a device that succeeded while another failed gets the
 * first failure's rc and err, so every device reports the real cause. */
int hf_src_done(struct hf_src *s, int rc, char *err, size_t errlen);

/* hf_src_done(s, hf_src_load(s, m, params, ...)): what each device of
 * the host calls, on a thread of its own when there are several. */
int hf_src_load_done(struct hf_src *s, const struct model *m, float *params, char *err, size_t errlen);

/* Bytes this host read from the directory: the index, every shard's
 * length and header, and the tensor ranges. */
uint64_t hf_src_bytes_read(const struct hf_src *s);
/* What this host read: bytes before the tensors (index, lengths,
 * headers), tensor bytes, and the checkpoint's tensor bytes the model
 * uses; seconds from the first load to the last. */
struct hf_src_count {
	uint64_t headers, tensors, read, all;
	double seconds;
};
void hf_src_counts(const struct hf_src *s, struct hf_src_count *c);
/* One line for the log: what was read (headers, tensor bytes of the
 * checkpoint's total), from how many files, in how long, what skipped. */
void hf_src_summary(const struct hf_src *s, char *out, size_t outlen);
void hf_src_close(struct hf_src *s);

/* Whether tensors are read through read-only mappings of the files
 * (widened or copied straight out of the page cache) rather than pread
 * into a bounce buffer: MESHRUN_LOAD_MMAP=0 reads with pread. */
bool hf_load_mmap(void);

#endif
