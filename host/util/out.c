/* See host/util/out.h. */
#include "host/util/out.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *util_errstr(int e, char *buf, size_t len)
{
	char tmp[128];
	/* GNU strerror_r: may return a static string instead of tmp */
	const char *s = strerror_r(e, tmp, sizeof(tmp));
	snprintf(buf, len, "%s", s ? s : "unknown error");
	if (len)
		buf[0] = (char)tolower((unsigned char)buf[0]);
	return buf;
}

int util_file_err(char *err, size_t errlen, const char *what, const char *action,
		  const char *path, int e)
{
	char es[128];
	snprintf(err, errlen, "%s: unable to %s '%s': %s", what, action, path,
		 util_errstr(e, es, sizeof(es)));
	return -e;
}

void util_dirname(const char *path, char *out, size_t len)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(out, len, ".");
	else if (slash == path)
		snprintf(out, len, "/");
	else
		snprintf(out, len, "%.*s", (int)(slash - path), path);
}

/* fsync of a directory by path: a rename in it must survive a crash. */
static int sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) ? -errno : 0;
	close(fd);
	return rc;
}

/* ---- a file written whole or not at all ---- */

/* A target that is not a regular file: opened as it is, never replaced. */
static int out_open_direct(struct util_out *o, const char *path, char *err, size_t errlen)
{
	o->direct = true;
	o->f = fopen(path, "w");
	return o->f ? 0 : util_file_err(err, errlen, o->what, "write", path, errno);
}

int util_out_open(struct util_out *o, const char *what, const char *path, char *err,
		  size_t errlen)
{
	struct stat st;
	char real[PATH_MAX];
	o->f = NULL;
	o->what = what;
	o->direct = false;
	if (!stat(path, &st) && !S_ISREG(st.st_mode))
		return out_open_direct(o, path, err, errlen);
	/* through a symbolic link: the file it names is the one replaced */
	const char *target = !lstat(path, &st) && S_ISLNK(st.st_mode) && realpath(path, real) ? real
												: path;
	if ((size_t)snprintf(o->path, sizeof(o->path), "%s", target) >= sizeof(o->path) ||
	    (size_t)snprintf(o->tmp, sizeof(o->tmp), "%s.tmp", target) >= sizeof(o->tmp))
		return util_file_err(err, errlen, what, "write", path, ENAMETOOLONG);
	/* a stale temporary from a crash is ours to replace; O_EXCL then
	 * refuses to write through anything else planted there */
	unlink(o->tmp);
	int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return util_file_err(err, errlen, what, "write", path, errno);
	o->f = fdopen(fd, "w");
	if (!o->f) {
		int e = errno;
		close(fd);
		unlink(o->tmp);
		return util_file_err(err, errlen, what, "write", o->tmp, e);
	}
	return 0;
}

void util_out_abort(struct util_out *o)
{
	if (!o->f)
		return;
	fclose(o->f);
	o->f = NULL;
	if (!o->direct)
		unlink(o->tmp);
}

int util_out_commit(struct util_out *o, char *err, size_t errlen)
{
	int e = 0;
	/* a failed fprintf leaves the stream's error flag, and errno from
	 * the write(2) that failed */
	if (ferror(o->f))
		e = errno ? errno : EIO;
	else if (fflush(o->f) || (!o->direct && fsync(fileno(o->f))))
		e = errno;
	if (e) {
		util_out_abort(o);
		return util_file_err(err, errlen, o->what, "write", o->path, e);
	}
	e = fclose(o->f) ? errno : 0;
	o->f = NULL;
	if (o->direct)
		return e ? util_file_err(err, errlen, o->what, "write", o->path, e) : 0;
	if (e || rename(o->tmp, o->path)) {
		e = e ? e : errno;
		unlink(o->tmp);
		return util_file_err(err, errlen, o->what, "write", o->path, e);
	}
	char dir[PATH_MAX];
	util_dirname(o->path, dir, sizeof(dir));
	int rc = sync_dir(dir);
	if (rc)
		return util_file_err(err, errlen, o->what, "sync the directory of", o->path, -rc);
	return 0;
}

int util_write_file(const char *what, const char *path, const void *buf, size_t len, char *err,
		    size_t errlen)
{
	struct util_out o;
	int rc = util_out_open(&o, what, path, err, errlen);
	if (rc)
		return rc;
	if (len && fwrite(buf, 1, len, o.f) != len) {
		int e = errno ? errno : EIO;
		util_out_abort(&o);
		return util_file_err(err, errlen, what, "write", path, e);
	}
	return util_out_commit(&o, err, errlen);
}

/* ---- an appended log ---- */

static int write_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Where the last complete line of fd ends: the offset after its last
 * newline (0 if none), scanning back from size. -errno on a read error. */
static off_t last_line_end(int fd, off_t size)
{
	char buf[4096];
	off_t at = size;
	while (at > 0) {
		size_t n = at < (off_t)sizeof(buf) ? (size_t)at : sizeof(buf);
		ssize_t r = pread(fd, buf, n, at - (off_t)n);
		if (r < 0)
			return -errno;
		if ((size_t)r != n)
			return -EIO;
		for (size_t i = n; i > 0; i--)
			if (buf[i - 1] == '\n')
				return at - (off_t)n + (off_t)i;
		at -= (off_t)n;
	}
	return 0;
}

int util_log_open(struct util_log *l, const char *what, const char *path, bool append, char *err,
		  size_t errlen)
{
	l->what = what;
	l->cut = false;
	snprintf(l->path, sizeof(l->path), "%s", path);
	/* read too when appending: a partial last line is looked for */
	l->fd = open(path, O_CREAT | O_CLOEXEC | (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC),
		     0644);
	if (l->fd < 0)
		return util_file_err(err, errlen, what, "open", path, errno);
	struct stat st;
	if (!append || fstat(l->fd, &st) || !S_ISREG(st.st_mode) || st.st_size == 0)
		return 0;
	off_t end = last_line_end(l->fd, st.st_size);
	if (end < 0 || (end < st.st_size && ftruncate(l->fd, end))) {
		int e = end < 0 ? (int)-end : errno;
		close(l->fd);
		l->fd = -1;
		return util_file_err(err, errlen, what, "cut the partial last line of", path, e);
	}
	l->cut = end < st.st_size;
	return 0;
}

int util_log_line(struct util_log *l, const char *line, char *err, size_t errlen)
{
	struct stat st;
	size_t n = strlen(line);
	if (fstat(l->fd, &st))
		return util_file_err(err, errlen, l->what, "write", l->path, errno);
	char *buf = malloc(n + 1);
	if (!buf)
		return util_file_err(err, errlen, l->what, "write", l->path, ENOMEM);
	memcpy(buf, line, n);
	buf[n] = '\n';
	int rc = write_all(l->fd, buf, n + 1);
	free(buf);
	if (!rc)
		return 0;
	/* a short write leaves part of the line: cut it, the file keeps its
	 * complete lines (best effort; the write's error is the news) */
	int cut = S_ISREG(st.st_mode) ? ftruncate(l->fd, st.st_size) : 0;
	(void)cut;
	return util_file_err(err, errlen, l->what, "write", l->path, -rc);
}

int util_log_close(struct util_log *l, char *err, size_t errlen)
{
	if (l->fd < 0)
		return 0;
	struct stat st;
	int e = 0;
	/* fsync on a pipe or a terminal (--metrics /dev/stdout) is EINVAL */
	if (!fstat(l->fd, &st) && S_ISREG(st.st_mode) && fsync(l->fd))
		e = errno;
	if (close(l->fd) && !e)
		e = errno;
	l->fd = -1;
	return e ? util_file_err(err, errlen, l->what, "write", l->path, e) : 0;
}

/* ---- directories ---- */

int util_probe_dir(const char *what, const char *dir, char *err, size_t errlen)
{
	char path[PATH_MAX], es[128];
	static const char block[512];
	int e = 0;
	snprintf(path, sizeof(path), "%s/.meshrun-probe-%ld", dir, (long)getpid());
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		e = errno;
	} else {
		int rc = write_all(fd, block, sizeof(block));
		if (rc || fsync(fd))
			e = rc ? -rc : errno;
		if (close(fd) && !e)
			e = errno;
		if (unlink(path) && !e)
			e = errno;
	}
	if (!e)
		return 0;
	snprintf(err, errlen, "%s: directory '%s' cannot take a new file: %s", what, dir,
		 util_errstr(e, es, sizeof(es)));
	return -e;
}

int util_mkdir_p(const char *what, const char *dir, char *err, size_t errlen)
{
	char tmp[PATH_MAX], es[128];
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s", dir) >= sizeof(tmp))
		return util_file_err(err, errlen, what, "create directory", dir, ENAMETOOLONG);
	for (char *p = tmp + 1;; p++) {
		if (*p && *p != '/')
			continue;
		char c = *p;
		*p = 0;
		if (mkdir(tmp, 0755) && errno != EEXIST) {
			int e = errno;
			snprintf(err, errlen, "%s: unable to create directory '%s': %s", what, tmp,
				 util_errstr(e, es, sizeof(es)));
			return -e;
		}
		if (!c)
			break;
		*p = c;
	}
	return 0;
}
