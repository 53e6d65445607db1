/* Data sources (see data.h): the type a config names, what every type
 * shares (keys, the rows of a batch and where they begin, epochs, resume),
 * and the calls into the type's table. */
#include "host/data/data.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "host/config/config.h"

static const struct data_type *const types[] = {
	&data_type_synthetic, &data_type_text, &data_type_llmc, &data_type_raw, &data_type_megatron,
};

static const struct data_type *type_named(const char *name)
{
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (!strcmp(types[i]->name, name))
			return types[i];
	return NULL;
}

/* The keys every source checks, and which data the role reads. */
static int spec_from_cfg(struct data_spec *sp, const struct data_type **ty, const struct cfg *c,
			 enum data_role role, char *err, size_t errlen)
{
	if (c->max_target_length < 1 || c->max_target_length > (1 << 24))
		return data_err(err, errlen, -EINVAL, "key 'max_target_length' must be in [1, %d], got %lld",
				1 << 24, c->max_target_length);
	if (c->vocab_size < 1 || c->vocab_size > INT32_MAX)
		return data_err(err, errlen, -EINVAL, "key 'vocab_size' must be in [1, %d], got %lld",
				INT32_MAX, c->vocab_size);
	if (!(c->eval_split_fraction >= 0 && c->eval_split_fraction < 1))
		return data_err(err, errlen, -EINVAL, "key 'eval_split_fraction' must be in [0, 1), got %g",
				c->eval_split_fraction);
	if (c->eot_token >= c->vocab_size)
		return data_err(err, errlen, -EINVAL, "key 'eot_token' is %lld, not below vocab_size %lld",
				c->eot_token, c->vocab_size);
	bool own_eval = role == DATA_EVAL && c->eval_dataset_path[0];
	const char *tname = own_eval && c->eval_dataset_type[0] ? c->eval_dataset_type : c->dataset_type;
	*ty = type_named(tname);
	if (!*ty)
		return data_err(err, errlen, -EINVAL, "key '%s' has unknown value '%s' (synthetic | text | "
				"llmc | raw | megatron)", tname == c->dataset_type ? "dataset_type" :
				"eval_dataset_type", tname);
	*sp = (struct data_spec){
		.role = role,
		.path = own_eval ? c->eval_dataset_path : c->dataset_path,
		.split = own_eval ? 0 : c->eval_split_fraction,
		.T = (int)c->max_target_length,
		.V = c->vocab_size,
		.seed = (uint64_t)c->data_shuffle_seed,
		.token_bytes = (int)c->dataset_token_bytes,
		.respect_documents = c->dataset_respect_documents,
		.eot = c->eot_token,
	};
	bool tokens = *ty != &data_type_synthetic && *ty != &data_type_text;
	if (sp->respect_documents && !tokens)
		return data_err(err, errlen, -EINVAL, "key 'dataset_respect_documents' needs token shards "
				"(dataset_type llmc, raw or megatron), not '%s'", (*ty)->name);
	if (*ty == &data_type_text && c->vocab_size < 256)
		return data_err(err, errlen, -EINVAL, "dataset_type 'text' has byte tokens and needs key "
				"'vocab_size' >= 256, got %lld", c->vocab_size);
	if (*ty == &data_type_text && !sp->path[0])
		return data_err(err, errlen, -EINVAL, "dataset_type 'text' needs key 'dataset_path'");
	return 0;
}

int data_open(struct data_source **out, const struct cfg *c, enum data_role role, int global_rows,
	      char *err, size_t errlen)
{
	const struct data_type *ty = NULL;
	struct data_spec sp;
	int rc;
	*out = NULL;
	if ((rc = spec_from_cfg(&sp, &ty, c, role, err, errlen)))
		return rc;
	struct data_source *d;
	if ((rc = ty->open(&d, &sp, err, errlen)))
		return rc;
	d->type = ty;
	d->role = role;
	d->T = sp.T;
	d->V = sp.V;
	d->seed = sp.seed;
	d->masks = d->masks || role == DATA_EVAL;
	int64_t rows = ty->rows(d);
	if (role == DATA_TRAIN && rows >= 0 && rows < global_rows) {
		rc = data_err(err, errlen, -EBADMSG, "'%s' gives %lld rows of %d tokens for training, "
			      "fewer than one global batch of %d", sp.path, (long long)rows, sp.T + 1,
			      global_rows);
	} else if (role == DATA_EVAL && rows == 0) {
		rc = data_err(err, errlen, -EBADMSG, "'%s' gives no held-out row of %d tokens", sp.path,
			      sp.T + 1);
	}
	if (rc) {
		data_close(d);
		return rc;
	}
	*out = d;
	return 0;
}

void data_close(struct data_source *d)
{
	if (d)
		d->type->close(d);
}

const char *data_type_name(const struct data_source *d) { return d->type->name; }
int data_seq_len(const struct data_source *d) { return d->T; }
int64_t data_rows(const struct data_source *d) { return d->type->rows(d); }
bool data_masks(const struct data_source *d) { return d->masks; }

/* The global row step's batch begins at. */
static int64_t first_sample(const struct data_source *d, int64_t step, int global_rows)
{
	return d->base_sample + (step - d->base_step) * global_rows;
}

int data_batch(struct data_source *d, int64_t step, int global_rows, int row0, int nrows,
	       int32_t *inputs, int32_t *targets, char *err, size_t errlen)
{
	assert(row0 >= 0 && nrows >= 0 && row0 + nrows <= global_rows);
	struct data_req rq = {
		.step = step, .sample = d->role == DATA_TRAIN ? first_sample(d, step, global_rows) : 0,
		.global_rows = global_rows, .row0 = row0, .nrows = nrows,
	};
	return d->type->batch(d, &rq, inputs, targets, err, errlen);
}

void data_position(const struct data_source *d, int64_t step, int global_rows, struct data_pos *p)
{
	int64_t rows = d->role == DATA_TRAIN ? d->type->rows(d) : -1;
	*p = (struct data_pos){ .sample = first_sample(d, step, global_rows), .row = -1 };
	p->epoch_rows = rows > 0 ? rows : 0;
	p->epoch = rows > 0 ? p->sample / rows : 0;
	p->seed = d->seed + (uint64_t)p->epoch;
	char where[8];
	if (rows > 0)
		d->type->position(d, p, where, sizeof(where));
}

void data_where(const struct data_source *d, const struct data_pos *p, char *buf, size_t len)
{
	struct data_pos q = *p;
	if (len)
		buf[0] = '\0';
	if (p->epoch_rows > 0)
		d->type->position(d, &q, buf, len);
}

bool data_describe(const struct data_source *d, int64_t step, int global_rows, char *buf,
		   size_t len)
{
	struct data_pos p;
	char where[512];
	data_position(d, step, global_rows, &p);
	if (!p.epoch_rows)
		return false;
	data_where(d, &p, where, sizeof(where));
	snprintf(buf, len, "data: %s, %lld rows of %d tokens per epoch, %d per step; step %lld begins "
		 "at epoch %lld, row %lld of it (shuffle seed %llu, %s)", d->type->name,
		 (long long)p.epoch_rows, d->T + 1, global_rows, (long long)step, (long long)p.epoch,
		 (long long)(p.sample % p.epoch_rows), (unsigned long long)p.seed, where);
	return true;
}

bool data_epoch_note(const struct data_source *d, int64_t step, int global_rows, char *buf,
		     size_t len)
{
	struct data_pos p;
	data_position(d, step, global_rows, &p);
	if (!p.epoch_rows || p.sample == 0)
		return false;
	/* the epoch of the batch's last row against the row before it */
	int64_t e = (p.sample + global_rows - 1) / p.epoch_rows;
	if (e == (p.sample - 1) / p.epoch_rows)
		return false;
	snprintf(buf, len, "data: epoch %lld begins at step %lld, row %lld of its global batch "
		 "(shuffle seed %llu)", (long long)e, (long long)step,
		 (long long)(e * p.epoch_rows - p.sample), (unsigned long long)(d->seed + (uint64_t)e));
	return true;
}

int data_seek(struct data_source *d, int64_t step, const struct data_pos *p, char *err,
	      size_t errlen)
{
	int64_t rows = d->type->rows(d);
	if (p->epoch_rows != (rows > 0 ? rows : 0))
		return data_err(err, errlen, -EBADMSG, "the checkpoint's data position counts %lld rows "
				"per epoch, but dataset_type '%s' at this dataset_path gives %lld (another "
				"corpus: start a new run from its weights with load_parameters_path)",
				(long long)p->epoch_rows, d->type->name, (long long)(rows > 0 ? rows : 0));
	if (p->sample < 0)
		return data_err(err, errlen, -EBADMSG, "the checkpoint's data position %lld is negative",
				(long long)p->sample);
	d->base_step = step;
	d->base_sample = p->sample;
	return 0;
}

int64_t data_eval_batches(const struct data_source *d, int global_rows, long long eval_steps,
			  char *err, size_t errlen)
{
	int64_t rows = d->type->rows(d);
	if (rows < 0 && eval_steps <= 0)
		return data_err(err, errlen, -EINVAL, "dataset_type '%s' has no end: key 'eval_steps' "
				"must be > 0, got %lld", d->type->name, eval_steps);
	int64_t all = rows < 0 ? eval_steps : (rows + global_rows - 1) / global_rows;
	return eval_steps > 0 && eval_steps < all ? eval_steps : all;
}
