/* One job per directory: an advisory lock file, DIR/meshrun.lock, held
 * with flock(2) for as long as the job runs and holding one line that
 * names the holder ("host H pid P job J"). The kernel drops the flock
 * when the holder exits, however it exits; a lock file whose flock is
 * free but that still names a holder was left by a job that did not end
 * cleanly (killed, crashed) and is taken over. */
#ifndef MESHRUN_UTIL_LOCK_H
#define MESHRUN_UTIL_LOCK_H

#include <stddef.h>

#define UTIL_LOCK_NAME "meshrun.lock"

struct util_lock {
	int fd;                  /* -1: not held */
};

/* Takes DIR's lock for job (a short name, e.g. "local-4242"). 0 when
 * held; then stale holds the previous holder's line when a job that is
 * gone left it ("" otherwise), for the caller to log. -EBUSY when another
 * process holds it, err naming the holder ("... is in use by job J (host
 * H, pid P)"); another -errno with err when the lock file cannot be made.
 * what is the subject of err ("checkpoint"). */
int util_lock_dir(struct util_lock *l, const char *what, const char *dir, const char *job,
		  char *stale, size_t stalelen, char *err, size_t errlen);

/* Ends the holding: empties the lock file (a clean end names no holder)
 * and closes it. Safe on a lock not held. */
void util_unlock_dir(struct util_lock *l);

#endif
