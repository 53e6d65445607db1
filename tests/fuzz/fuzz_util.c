/* Scratch files for the targets that read from a path (fuzz.h). */
#include "tests/fuzz/fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

static void remove_tmpdir(void)
{
	DIR *d = opendir(tmpdir);
	struct dirent *e;
	char p[512];
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(tmpdir);
}

const char *fuzz_tmpdir(void)
{
	if (!tmpdir[0]) {
		const char *base = getenv("TMPDIR");
		snprintf(tmpdir, sizeof(tmpdir), "%.40s/meshrun-fuzz.XXXXXX",
			 base && base[0] ? base : "/tmp");
		if (!mkdtemp(tmpdir)) {
			perror("mkdtemp");
			abort();
		}
		atexit(remove_tmpdir);
	}
	return tmpdir;
}

void fuzz_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f)) {
		perror(path);
		abort();
	}
}

void fuzz_note(const char *what, const char *why)
{
	static int verbose = -1;
	if (verbose < 0)
		verbose = getenv("FUZZ_VERBOSE") != NULL;
	if (verbose)
		fprintf(stderr, "%s: %s\n", what, why);
}
