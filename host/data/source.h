/* A data source as a type (as net/conn.h's connection types): one table of
 * functions per format, each implementation embedding struct data_source
 * first. host/data/data.c (data.h) picks the type from dataset_type and
 * does what every type shares (keys, the position, the batch
 * bookkeeping); the types only open, count, read and describe, with the
 * helpers below (the epoch order, reads by range). Every read returns 0
 * or -errno with a one-line err naming the file. */
#ifndef MESHRUN_DATA_SOURCE_H
#define MESHRUN_DATA_SOURCE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A training source gives shuffled rows, epoch after epoch; an
 * evaluation source gives the held-out rows in order, once. */
enum data_role { DATA_TRAIN, DATA_EVAL };

/* Where a step's batch begins in the row order. */
struct data_pos {
	int64_t sample;       /* global rows consumed before it */
	int64_t epoch_rows;   /* rows of one epoch; 0: no epochs (synthetic, text) */
	int64_t epoch;        /* sample / epoch_rows (0 without epochs) */
	int64_t row;          /* the row `sample` reads (natural order); -1 without epochs */
	uint64_t seed;        /* the epoch's shuffle seed: data_shuffle_seed + epoch */
};

/* The epoch's row order: a bijection of [0, n) chosen by seed
 * (docs/data.md#shuffle: a 4-round Feistel network on the smallest even
 * number of bits covering n, cycle-walking back into range;
 * host/data/perm.c). */
uint64_t data_perm(uint64_t seed, uint64_t n, uint64_t i);

/* What data_open resolved from the config for one source. */
struct data_spec {
	enum data_role role;
	const char *path;          /* the file, directory, glob or prefix */
	/* the held-out fraction of path's rows (its last rows): a training
	 * source leaves them out, an evaluation source reads only them; 0:
	 * none */
	double split;
	int T;                     /* max_target_length */
	long long V;               /* vocab_size */
	uint64_t seed;             /* data_shuffle_seed */
	int token_bytes;           /* raw: dataset_token_bytes */
	bool respect_documents;
	long long eot;             /* eot_token; -1: none */
};

struct data_source {
	const struct data_type *type;
	enum data_role role;
	int T;
	long long V;
	uint64_t seed;
	bool masks;                /* targets may be -1 */
	/* resume: step base_step's batch begins at global row base_sample */
	int64_t base_step, base_sample;
};

/* One batch request: rows [row0, row0 + nrows) of the global batch of
 * `step`, whose row 0 is global row `sample` (for a source with epochs:
 * the sample-th row of the shuffled order). */
struct data_req {
	int64_t step, sample;
	int global_rows, row0, nrows;
};

struct data_type {
	const char *name;
	/* Makes *out, the source sp names (data.c fills the shared part and
	 * checks what every type shares afterwards). 0, or with err: -EINVAL
	 * for a key, -EBADMSG for a file, -ENOMEM. */
	int (*open)(struct data_source **out, const struct data_spec *sp, char *err, size_t errlen);
	/* see data_rows */
	int64_t (*rows)(const struct data_source *d);
	/* inputs and targets (nrows, T) for rq. 0 or -errno with err. */
	int (*batch)(struct data_source *d, const struct data_req *rq, int32_t *inputs,
		     int32_t *targets, char *err, size_t errlen);
	/* p->row for p->sample, p->epoch and p->epoch_rows already set (a
	 * type without epochs leaves -1); may name where the row lives in
	 * where (for logs; "" when nothing to say). */
	void (*position)(const struct data_source *d, struct data_pos *p, char *where,
			 size_t wherelen);
	void (*close)(struct data_source *d);
};

extern const struct data_type data_type_synthetic, data_type_text, data_type_llmc,
	data_type_raw, data_type_megatron;

/* Reads exactly len bytes of fd at off (retrying short reads and EINTR).
 * 0; -EIO with err naming path when the file ends early or a read
 * fails. (host/data/io.c) */
int data_pread(int fd, void *buf, size_t len, int64_t off, const char *path, char *err,
	       size_t errlen);
/* Opens path read-only for a source: a regular file, its size in *size.
 * fd, or -errno with err naming it (-EBADMSG: missing, not a regular
 * file, unreadable). */
int data_open_file(const char *path, int64_t *size, char *err, size_t errlen);

/* "data: ..." into err (NULL or 0 bytes: nothing); returns rc. */
static inline int data_err(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static inline int data_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return rc;
	int n = snprintf(err, errlen, "data: ");
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < errlen)
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return rc;
}

#endif
