/* See host/ckpt/resume.h. The fit check reads the checkpoint's
 * meshrun.yml (the optimizer), config.json (the model, compared with the
 * one this run would write) and optimizer.safetensors' header (the
 * global batch); reading in place is two hf_src, one per file, with the
 * optimizer's m. and v. tensors as two dests of the same layout. */
#include "host/ckpt/resume.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/ckpt/ckpt.h"
#include "host/ckpt/safetensors.h"
#include "host/config/config.h"

struct ckpt_resume {
	struct hf_src *model, *opt;
	int64_t step, data_sample, data_epoch_rows;
	uint64_t id;
};

/* A decimal metadata value; -1 when absent or not a number. */
static int64_t meta_int(const char *v)
{
	char *end;
	if (!v || !*v)
		return -1;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	return errno || *end || x < 0 ? -1 : (int64_t)x;
}

/* The saved run's optimizer (its meshrun.yml, loaded into saved) against
 * this run's. */
static int fits_optimizer(const char *step_dir, const struct cfg *saved, const struct cfg *c, char *err,
			  size_t errlen)
{
	if (!strcmp(saved->opt_type, c->opt_type))
		return 0;
	snprintf(err, errlen, "config: --resume: the checkpoint '%s' was trained with opt_type=%s, this run "
		 "has opt_type=%s (its optimizer state would not fit)", step_dir, saved->opt_type, c->opt_type);
	return -EINVAL;
}

/* The model: every key of the checkpoint's config.json equal to the one
 * this run would write, the first that differs named; but torch_dtype
 * (checkpoint_dtype, a storage choice) and max_position_embeddings (the
 * sequence length: a property of the batch, fits_batch's; and checkpoints
 * of meshes before this check wrote 1 there). */
static int fits_model(const char *step_dir, const struct cfg *c, const struct model_dims *d, char *err,
		      size_t errlen)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof(path), "%s/config.json", step_dir);
	cJSON *have = json_read_file(path, err, errlen), *want = ckpt_config_json(c, d);
	int rc = 0;
	if (!have || !want) {
		rc = have ? -ENOMEM : -EBADMSG;
		if (!want)
			snprintf(err, errlen, "checkpoint: out of memory");
		goto out;
	}
	/* keys of both, in the order this run writes them, then the file's own */
	for (int pass = 0; pass < 2 && !rc; pass++) {
		const cJSON *a, *other = pass ? want : have, *list = pass ? have : want;
		cJSON_ArrayForEach(a, list) {
			const cJSON *b = cJSON_GetObjectItemCaseSensitive(other, a->string);
			if (!strcmp(a->string, "torch_dtype") || !strcmp(a->string, "max_position_embeddings") ||
			    (b && cJSON_Compare(a, b, true)))
				continue;
			char *ta = cJSON_PrintUnformatted(a), *tb = b ? cJSON_PrintUnformatted(b) : NULL;
			const char *h = pass ? ta : tb, *w = pass ? tb : ta;
			snprintf(err, errlen, "config: --resume: the checkpoint '%s' holds another model: its "
				 "config.json has %s %s, this run's model %s %s", step_dir, a->string,
				 h ? h : "nothing", w ? "has" : "has no", w ? w : "such key");
			free(ta);
			free(tb);
			rc = -EINVAL;
			break;
		}
	}
out:
	cJSON_Delete(have);
	cJSON_Delete(want);
	return rc;
}

/* The global batch: its sequence length (meshrun.yml) and its rows
 * (recorded since meshrun_global_batch exists) against this run's. The
 * rows may differ when the checkpoint records the data position
 * (meshrun_data_sample, host/data/data.h: the rows read so far), which
 * says where the data goes on whatever the rows per step. */
static int fits_batch(const char *step_dir, const struct cfg *saved, const struct cfg *c,
		      int64_t global_batch, char *err, size_t errlen)
{
	char path[PATH_MAX + 32];
	if (saved->max_target_length != c->max_target_length) {
		snprintf(err, errlen, "config: --resume: the checkpoint '%s' was trained on rows of "
			 "max_target_length=%lld tokens, this run's are %lld: the data would not continue",
			 step_dir, saved->max_target_length, c->max_target_length);
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "%s/optimizer.safetensors", step_dir);
	struct st_file *f = st_open_header(path, err, errlen);
	if (!f)
		return -EBADMSG;
	int64_t rows = meta_int(st_meta(f, "meshrun_global_batch"));
	bool pos = meta_int(st_meta(f, "meshrun_data_sample")) >= 0;
	st_close(f);
	/* older checkpoints do not say; one that holds the data position
	 * continues the data from there at any rows per step */
	if (rows < 0 || rows == global_batch || pos)
		return 0;
	int devices = c->num_hosts * c->devices_per_host;
	snprintf(err, errlen, "config: --resume: the checkpoint '%s' was trained with a global batch of "
		 "%" PRId64 " rows, this run's is %" PRId64 " (per_device_batch_size=%lld x %d device%s): the "
		 "data would not continue (per_device_batch_size x devices must be %" PRId64 ")", step_dir,
		 rows, global_batch, c->per_device_batch_size, devices, devices == 1 ? "" : "s", rows);
	return -EINVAL;
}

int ckpt_resume_fits(const char *dir, const struct cfg *c, const struct model_dims *d,
		     int64_t global_batch, char *err, size_t errlen)
{
	char step_dir[PATH_MAX], path[PATH_MAX + 16];
	int64_t step = -1;
	int rc = ckpt_find(dir, step_dir, sizeof(step_dir), &step, err, errlen);
	if (rc)
		return rc;
	if (step >= 0 && step >= (int64_t)c->steps) {
		snprintf(err, errlen, "config: --resume: the checkpoint '%s' is at step %" PRId64
			 ", and steps=%lld leaves nothing to run (raise steps)", step_dir, step,
			 c->steps);
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "%s/meshrun.yml", step_dir);
	if (access(path, F_OK))
		return 0;   /* a checkpoint from elsewhere: the loader decides */
	struct cfg *saved = malloc(sizeof(*saved));
	char why[512];
	if (!saved) {
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	cfg_defaults(saved);
	if (cfg_load_file(saved, path, why, sizeof(why))) {
		snprintf(err, errlen, "checkpoint: %s", why);
		rc = -EBADMSG;
	}
	if (!rc)
		rc = fits_optimizer(step_dir, saved, c, err, errlen);
	if (!rc)
		rc = fits_model(step_dir, c, d, err, errlen);
	if (!rc)
		rc = fits_batch(step_dir, saved, c, global_batch, err, errlen);
	free(saved);
	return rc;
}

/* ---- reading in place ---- */

int ckpt_resume_open(struct ckpt_resume **out, const char *dir, int devices, char *err, size_t errlen)
{
	struct ckpt_resume *r = calloc(1, sizeof(*r));
	int rc;
	*out = NULL;
	if (!r) {
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	if ((rc = hf_src_open(&r->model, dir, devices, err, errlen)) ||
	    (rc = hf_src_open_file(&r->opt, hf_src_dir(r->model), "optimizer.safetensors", devices, err,
				   errlen)))
		goto fail;
	const char *dir1 = hf_src_dir(r->model);
	int64_t s1 = meta_int(hf_src_meta(r->model, "meshrun_step"));
	int64_t s2 = meta_int(hf_src_meta(r->opt, "meshrun_step"));
	const char *i1 = hf_src_meta(r->model, "meshrun_id"), *i2 = hf_src_meta(r->opt, "meshrun_id");
	if (s1 < 0 || s2 < 0) {
		snprintf(err, errlen, "checkpoint: '%s' has no valid meshrun_step metadata (not a run's checkpoint)",
			 dir1);
		rc = -EBADMSG;
	} else if (s1 != s2 || (i1 && i2 && strcmp(i1, i2)) || !i1 != !i2) {
		snprintf(err, errlen, "checkpoint: '%s': model.safetensors (step %" PRId64 ", save %s) and "
			 "optimizer.safetensors (step %" PRId64 ", save %s) are not from the same save", dir1,
			 s1, i1 ? i1 : "-", s2, i2 ? i2 : "-");
		rc = -EBADMSG;
	}
	/* the data position (host/data/data.h): -1 when the checkpoint
	 * predates it, refused when present and not a number */
	static const char *const dk[2] = { "meshrun_data_sample", "meshrun_data_epoch_rows" };
	int64_t *dv[2] = { &r->data_sample, &r->data_epoch_rows };
	for (int i = 0; i < 2 && !rc; i++) {
		const char *v = hf_src_meta(r->model, dk[i]);
		*dv[i] = meta_int(v);
		if (v && *dv[i] < 0) {
			snprintf(err, errlen, "checkpoint: '%s' has invalid %s metadata '%s'", dir1, dk[i], v);
			rc = -EBADMSG;
		}
	}
	if (rc)
		goto fail;
	r->step = s1;
	r->id = i1 ? strtoull(i1, NULL, 16) : 0;
	*out = r;
	return 0;
fail:
	ckpt_resume_close(r);
	return rc;
}

void ckpt_resume_close(struct ckpt_resume *r)
{
	if (!r)
		return;
	hf_src_close(r->model);
	hf_src_close(r->opt);
	free(r);
}

int64_t ckpt_resume_step(const struct ckpt_resume *r)
{
	return r->step;
}

uint64_t ckpt_resume_id(const struct ckpt_resume *r)
{
	return r->id;
}

void ckpt_resume_data_pos(const struct ckpt_resume *r, int64_t *sample, int64_t *epoch_rows)
{
	*sample = r->data_sample;
	*epoch_rows = r->data_epoch_rows;
}

int ckpt_resume_read(struct ckpt_resume *r, const struct model *m, float *params, float *mbuf,
		     float *vbuf, const struct hf_range *ranges, int nr, char *err, size_t errlen)
{
	const struct hf_dest opt[2] = { { "m.", mbuf }, { "v.", vbuf } };
	int rc = hf_src_load(r->model, m, params, err, errlen);
	return rc ? rc : hf_src_load_into(r->opt, m, opt, 2, ranges, nr, err, errlen);
}

int ckpt_resume_done(struct ckpt_resume *r, int rc, char *err, size_t errlen)
{
	rc = hf_src_done(r->model, rc, err, errlen);
	return hf_src_done(r->opt, rc, err, errlen);
}

void ckpt_resume_summary(const struct ckpt_resume *r, char *out, size_t outlen)
{
	struct hf_src_count a, b;
	hf_src_counts(r->model, &a);
	hf_src_counts(r->opt, &b);
	snprintf(out, outlen, "resume: read %llu bytes of '%s' on this host (weights: headers %llu, tensors "
		 "%llu of the checkpoint's %llu; optimizer state: headers %llu, tensors %llu of the "
		 "checkpoint's %llu) in %.2f s, to run step %" PRId64,
		 (unsigned long long)(a.read + b.read), hf_src_dir(r->model), (unsigned long long)a.headers,
		 (unsigned long long)a.tensors, (unsigned long long)a.all, (unsigned long long)b.headers,
		 (unsigned long long)b.tensors, (unsigned long long)b.all, a.seconds + b.seconds, r->step);
}
