/* Checked writes: every output meshrun writes (metrics, trace, step log,
 * report, checkpoint files) goes through these, so a full disk or a
 * directory that cannot be written is an error with one line naming the
 * file and the errno text, never a silent truncation. Each write, flush,
 * fsync and close is checked; a failure leaves no partial file behind (a
 * whole-file write keeps the old file, an appended log is cut back to its
 * last complete line). */
#ifndef MESHRUN_UTIL_OUT_H
#define MESHRUN_UTIL_OUT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* The errno text in lower case, as every error line is ("no space left on
 * device"). Returns buf. */
const char *util_errstr(int e, char *buf, size_t len);

/* Writes "WHAT: unable to ACTION 'PATH': ERRNO TEXT" into err and returns
 * -e (e > 0). */
int util_file_err(char *err, size_t errlen, const char *what, const char *action,
		  const char *path, int e);

/* A file written whole or not at all: written as PATH.tmp, then flushed,
 * synced, closed and renamed over PATH (and the directory synced). Until
 * util_out_commit returns 0, PATH is as it was. A PATH that is a symbolic
 * link is written at its target; one that is not a regular file (a
 * device such as /dev/null, a FIFO) is written directly, still checked. */
struct util_out {
	FILE *f;                 /* write here (fprintf, fputs, ...) */
	const char *what;        /* subject of error lines: "trace", "report" */
	bool direct;             /* not a regular file: no temporary */
	char path[PATH_MAX];
	char tmp[PATH_MAX + 8];
};

/* Creates PATH.tmp (a stale one from a crash is replaced). 0 or -errno
 * with err. */
int util_out_open(struct util_out *o, const char *what, const char *path, char *err,
		  size_t errlen);
/* Checks every write so far, flushes, fsyncs, closes and renames; on any
 * failure removes PATH.tmp. 0 or -errno with err naming the file. o is
 * finished either way. */
int util_out_commit(struct util_out *o, char *err, size_t errlen);
/* Gives up: closes and removes PATH.tmp. Safe after a commit. */
void util_out_abort(struct util_out *o);
/* A whole buffer as PATH through util_out. 0 or -errno with err. */
int util_write_file(const char *what, const char *path, const void *buf, size_t len, char *err,
		    size_t errlen);

/* An appended log of lines (--metrics): each line reaches the file whole
 * with one write(2), or not at all. */
struct util_log {
	int fd;                  /* -1: closed */
	const char *what;        /* "metrics" */
	char path[PATH_MAX];
	bool cut;                /* util_log_open cut a partial last line */
};

/* Opens PATH (created 0644), truncated or (append) at its end; when
 * appending to a file whose last line lacks its newline (a writer that
 * crashed mid-line), that partial line is cut first and l->cut says so.
 * 0 or -errno with err. */
int util_log_open(struct util_log *l, const char *what, const char *path, bool append, char *err,
		  size_t errlen);
/* Appends line and a newline. On failure the file is cut back to what it
 * held before, and -errno with err ("metrics: unable to write 'm.jsonl':
 * no space left on device"). */
int util_log_line(struct util_log *l, const char *line, char *err, size_t errlen);
/* fsync and close, both checked. 0 or -errno with err; closed either way.
 * A closed log is 0. */
int util_log_close(struct util_log *l, char *err, size_t errlen);

/* Proves dir can take a new file before anything depends on it: creates a
 * file there, writes and fsyncs a block, removes it. 0 or -errno with err
 * ("WHAT: directory 'DIR' cannot take a new file: permission denied"). */
int util_probe_dir(const char *what, const char *dir, char *err, size_t errlen);

/* The directory part of path ("." when it has none) into out. */
void util_dirname(const char *path, char *out, size_t len);

/* mkdir -p dir (mode 0755). 0 or -errno with err naming the part that
 * could not be made. */
int util_mkdir_p(const char *what, const char *dir, char *err, size_t errlen);

#endif
