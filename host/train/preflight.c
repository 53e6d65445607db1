/* See host/train/preflight.h. */
#include "host/train/preflight.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/ckpt/resume.h"
#include "host/model/model.h"
#include "host/pipeline/pipe_config.h"
#include "host/train/check.h"
#include "host/config/config.h"
#include "host/util/out.h"

/* The directory of an output file can take a new file, and the file, if
 * it is there, can be written (a device or a FIFO, such as /dev/stdout,
 * only that). */
static int probe_file_dir(const char *what, const char *path, char *err, size_t errlen)
{
	char dir[PATH_MAX];
	struct stat st;
	bool there = !stat(path, &st);
	int rc = 0;
	if (!there || S_ISREG(st.st_mode)) {
		util_dirname(path, dir, sizeof(dir));
		rc = util_probe_dir(what, dir, err, errlen);
	}
	if (!rc && there && access(path, W_OK))
		rc = util_file_err(err, errlen, what, "write", path, errno);
	return rc;
}

int train_resume_fits(const struct cfg *c, const char *dir, char *err, size_t errlen)
{
	struct model_dims d;
	int rc = train_check_keys(c, &d, err, errlen);
	int64_t global_batch = c->per_device_batch_size * c->num_hosts * c->devices_per_host;
	return rc ? rc : ckpt_resume_fits(dir, c, &d, global_batch, err, errlen);
}

int train_preflight(struct train_outputs *out, const struct cfg *c, const struct train_opts *o,
		    const char *job, char *err, size_t errlen)
{
	char stale[256];
	int rc = 0;
	out->lock.fd = -1;
	if (o->ckpt_dir && pipe_config_synthetic(c)) {
		snprintf(err, errlen, "config: --checkpoint-dir is refused with pipeline_compute=sleep "
			 "(synthetic compute trains nothing)");
		return -EINVAL;
	}
	if (o->ckpt_dir) {
		if ((rc = util_mkdir_p("checkpoint", o->ckpt_dir, err, errlen)) ||
		    (rc = util_lock_dir(&out->lock, "checkpoint", o->ckpt_dir, job, stale, sizeof(stale),
					err, errlen)))
			return rc;
		if (stale[0])
			fprintf(stderr, "meshrun: checkpoint: directory '%s': took over the lock of %s, "
				"which is gone (it did not end cleanly)\n", o->ckpt_dir, stale);
		rc = util_probe_dir("checkpoint", o->ckpt_dir, err, errlen);
	}
	if (!rc && o->metrics)
		rc = probe_file_dir("metrics", o->metrics, err, errlen);
	if (!rc && o->trace)
		rc = probe_file_dir("trace", o->trace, err, errlen);
	if (!rc && o->resume)
		rc = train_resume_fits(c, o->ckpt_dir, err, errlen);
	if (rc)
		train_outputs_release(out);
	return rc;
}

void train_outputs_release(struct train_outputs *out)
{
	util_unlock_dir(&out->lock);
}
