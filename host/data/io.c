/* File reads shared by the source types (host/data/source.h): every read
 * is by range, so no source ever holds a file in memory. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/data/source.h"

int data_pread(int fd, void *buf, size_t len, int64_t off, const char *path, char *err,
	       size_t errlen)
{
	char *p = buf;
	while (len > 0) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return data_err(err, errlen, -EIO, "unable to read '%s' at byte %lld: %s", path,
					(long long)off, strerror(errno));
		if (r == 0)
			return data_err(err, errlen, -EIO, "'%s' ends at byte %lld, before the %zu bytes "
					"wanted there (did it shrink?)", path, (long long)off, len);
		p += r;
		off += r;
		len -= (size_t)r;
	}
	return 0;
}

int data_open_file(const char *path, int64_t *size, char *err, size_t errlen)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return data_err(err, errlen, -EBADMSG, "unable to open '%s': %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return data_err(err, errlen, -EBADMSG, "unable to stat '%s': %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return data_err(err, errlen, -EBADMSG, "'%s' is not a regular file", path);
	}
	/* rows are read all over the file: read-ahead would fetch what no
	 * device asked for */
	posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	*size = (int64_t)st.st_size;
	return fd;
}
