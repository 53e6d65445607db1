/* What the host that writes a job's outputs (host 0, or `train`'s one
 * process) proves before rendezvous completes, so a run never trains for
 * an hour and then finds it cannot save: the checkpoint directory (made
 * if missing) and the directories of --trace and --metrics can each take
 * a new file; the checkpoint directory is this job's alone (its lock,
 * host/util/lock.h, held until train_outputs_release); and a --resume has
 * something to resume that fits (a checkpoint before the last step, of
 * the same model, optimizer and global batch: host/ckpt/resume.h; any
 * mesh). */
#ifndef MESHRUN_PREFLIGHT_H
#define MESHRUN_PREFLIGHT_H

#include <stddef.h>

#include "host/train/loop.h"
#include "host/util/lock.h"

struct cfg;

/* Held for the run: the checkpoint directory's lock. */
struct train_outputs {
	struct util_lock lock;
};

/* The checks above, in order, for job (its name in the lock file). A
 * stale lock (its job gone) is taken over, with one line on stderr naming
 * the old holder. 0, or -errno with one line in err: the errno of a
 * directory that cannot be made or take a file (naming it), -EBUSY when
 * another job holds the checkpoint directory (naming it), -EBADMSG when
 * --resume finds no checkpoint, -EINVAL when the one it finds is at or
 * past `steps` or was trained with another opt_type, model or global
 * batch. out is released on
 * failure; call train_outputs_release after a success. */
int train_preflight(struct train_outputs *out, const struct cfg *c, const struct train_opts *o,
		    const char *job, char *err, size_t errlen);
/* The --resume part alone: the newest complete checkpoint in dir can
 * continue this run (c finished for its mesh) on its mesh: steps left,
 * the same model, optimizer and global batch (host/ckpt/resume.h).
 * `local` runs it before it starts any agent. 0 or -errno with err. */
int train_resume_fits(const struct cfg *c, const char *dir, char *err, size_t errlen);
/* Lets the checkpoint directory go (its lock file then names nobody).
 * Safe on one never taken. */
void train_outputs_release(struct train_outputs *out);

#endif
