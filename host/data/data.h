/* Data sources: the rows a run trains and evaluates on (docs/data.md).
 * A source is a type (host/data/source.h) with one implementation per
 * format: synthetic, text (bytes), and token shards on disk (llmc, raw,
 * megatron). A row is max_target_length + 1 tokens; inputs are its first
 * T, targets its last T. The global batch of training step t is a pure
 * function of (data_shuffle_seed, t), so any split of it over devices
 * and hosts reads the same rows, and a resume reads what an
 * uninterrupted run would. Shards are read by range, never mapped or
 * loaded whole: a host touches only the rows its devices consume. Every
 * read returns 0 or a negative errno with a one-line reason naming the
 * file: -EBADMSG for bad data (a token out of range, a document index
 * that disagrees with itself), -EIO when a read fails. */
#ifndef MESHRUN_DATA_H
#define MESHRUN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/data/source.h"

struct cfg;

/* Opens into *out the source the config names for role: dataset_type
 * and dataset_path (train); for eval, eval_dataset_type and
 * eval_dataset_path, else the eval_split_fraction of dataset_path held
 * out, else all of dataset_path. global_rows is the global batch (a
 * training source with fewer rows is refused). Checks everything it can
 * before the first step (docs/data.md#checks). 0, or with a one-line err
 * naming the file or key: -EINVAL for a key, -EBADMSG for a file (bad
 * contents, too few rows, missing), -ENOMEM. */
int data_open(struct data_source **out, const struct cfg *c, enum data_role role, int global_rows,
	      char *err, size_t errlen);
/* NULL is fine. */
void data_close(struct data_source *d);

const char *data_type_name(const struct data_source *d);
/* Sequence length T (max_target_length). */
int data_seq_len(const struct data_source *d);
/* Training: rows of one epoch; evaluation: the held-out rows; -1 when
 * unbounded (synthetic data; text training windows). */
int64_t data_rows(const struct data_source *d);
/* true when targets may be -1 (masked): documents respected, or an
 * evaluation batch padded past the end of the held-out rows. */
bool data_masks(const struct data_source *d);

/* Fills rows [row0, row0 + nrows) of the global batch of global_rows
 * rows for `step`: training step `step`, or evaluation batch `step`
 * (held-out rows step x global_rows onwards; rows past the end have
 * inputs 0 and targets -1). inputs and targets are (nrows, T). Requires
 * 0 <= row0, row0 + nrows <= global_rows. 0 or -errno with err. */
int data_batch(struct data_source *d, int64_t step, int global_rows, int row0, int nrows,
	       int32_t *inputs, int32_t *targets, char *err, size_t errlen);

/* The position of training step `step`'s batch (for checkpoints and the
 * epoch log). */
void data_position(const struct data_source *d, int64_t step, int global_rows,
		   struct data_pos *p);
/* Where p's row lives, for logs ("'shard_003.bin' token 1234"); "" for
 * sources without epochs. */
void data_where(const struct data_source *d, const struct data_pos *p, char *buf, size_t len);
/* News for the step log, for sources with epochs (else false):
 * data_describe says where step's batch begins (the run's first step,
 * and after a resume); data_epoch_note, when a new epoch begins inside
 * step's batch, which epoch, where and with which seed. */
bool data_describe(const struct data_source *d, int64_t step, int global_rows, char *buf,
		   size_t len);
bool data_epoch_note(const struct data_source *d, int64_t step, int global_rows, char *buf,
		     size_t len);
/* Resume: step `step`'s batch begins at p->sample (a checkpoint's
 * position; later steps follow on from it). -EBADMSG with err when the
 * checkpoint's epoch_rows is not this corpus's. */
int data_seek(struct data_source *d, int64_t step, const struct data_pos *p, char *err,
	      size_t errlen);

/* Evaluation batches of global_rows rows one evaluation runs: eval_steps
 * (> 0) or enough for every held-out row (eval_steps <= 0), never more
 * than that. -EINVAL with err for an unbounded source with eval_steps <= 0. */
int64_t data_eval_batches(const struct data_source *d, int global_rows, long long eval_steps,
			  char *err, size_t errlen);

#endif
