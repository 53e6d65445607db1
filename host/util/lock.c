/* See host/util/lock.h. */
#include "host/util/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/util/out.h"

/* The holder line of fd (up to its newline) into out; "" when empty. */
static void read_holder(int fd, char *out, size_t len)
{
	ssize_t r = pread(fd, out, len - 1, 0);
	out[r > 0 ? r : 0] = 0;
	out[strcspn(out, "\n")] = 0;
}

int util_lock_dir(struct util_lock *l, const char *what, const char *dir, const char *job,
		  char *stale, size_t stalelen, char *err, size_t errlen)
{
	char path[PATH_MAX], holder[256], host[128] = "?", line[512];
	l->fd = -1;
	stale[0] = 0;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, UTIL_LOCK_NAME) >= sizeof(path))
		return util_file_err(err, errlen, what, "lock", dir, ENAMETOOLONG);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return util_file_err(err, errlen, what, "create the lock file", path, errno);
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		int e = errno;
		if (e == EWOULDBLOCK) {
			read_holder(fd, holder, sizeof(holder));
			snprintf(err, errlen, "%s: directory '%s' is in use by %s (lock file '%s'); "
				 "one job per checkpoint directory", what, dir,
				 holder[0] ? holder : "another job (it is starting or ending)", path);
			close(fd);
			return -EBUSY;
		}
		close(fd);
		return util_file_err(err, errlen, what, "lock", path, e);
	}
	read_holder(fd, holder, sizeof(holder));
	snprintf(stale, stalelen, "%s", holder);
	gethostname(host, sizeof(host) - 1);
	host[sizeof(host) - 1] = 0;
	int n = snprintf(line, sizeof(line), "job %s (host %s, pid %ld)\n", job, host,
			 (long)getpid());
	if (ftruncate(fd, 0) || pwrite(fd, line, (size_t)n, 0) != n) {
		int e = errno ? errno : EIO;
		close(fd);
		return util_file_err(err, errlen, what, "write the lock file", path, e);
	}
	l->fd = fd;
	return 0;
}

void util_unlock_dir(struct util_lock *l)
{
	if (l->fd < 0)
		return;
	int rc = ftruncate(l->fd, 0);
	(void)rc;
	close(l->fd);
	l->fd = -1;
}
