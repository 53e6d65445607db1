/* Replays fuzz inputs through a target's LLVMFuzzerTestOneInput without
 * libFuzzer, so `make test` runs every corpus file under gcc's ASan and
 * UBSan: replay [FILE|DIR ...] (default: the target's seed directory,
 * FUZZ_CORPUS). Each input runs in its own child process, so one crash is
 * one failed input and the rest still run; LeakSanitizer checks each
 * child's exit. Prints one line per failure and closes with
 * "N passed, M failed"; exits non-zero if anything failed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

#ifndef FUZZ_CORPUS
#error "build with -DFUZZ_CORPUS=\"dir\""
#endif

/* UBSan's findings fail the input instead of scrolling past */
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

static int passed, failed;

/* open/read, not stdio: a target may wrap fopen (fuzz_config.c) */
static int run_one(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		fprintf(stderr, "replay: unable to open '%s': %s\n", path, strerror(errno));
		exit(1);
	}
	size_t n = (size_t)st.st_size, got = 0;
	/* an exact-size copy, as libFuzzer passes it, so reading one byte
	 * past the input is an ASan report */
	uint8_t *buf = malloc(n ? n : 1);
	while (buf && got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	if (!buf || got != n) {
		fprintf(stderr, "replay: unable to read '%s'\n", path);
		exit(1);
	}
	close(fd);
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	return 0;
}

static void replay_file(const char *path)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0)
		exit(run_one(path));
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		passed++;
		return;
	}
	failed++;
	if (WIFSIGNALED(st))
		printf("FAILED %s: killed by signal %d\n", path, WTERMSIG(st));
	else
		printf("FAILED %s: exit %d\n", path, WEXITSTATUS(st));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void replay_path(const char *path)
{
	struct stat st;
	if (stat(path, &st)) {
		fprintf(stderr, "replay: '%s': %s\n", path, strerror(errno));
		exit(1);
	}
	if (!S_ISDIR(st.st_mode)) {
		replay_file(path);
		return;
	}
	DIR *d = opendir(path);
	if (!d) {
		fprintf(stderr, "replay: unable to open '%s': %s\n", path, strerror(errno));
		exit(1);
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		names = realloc(names, sizeof(*names) * (n + 1));
		if (!names || asprintf(&names[n], "%s/%s", path, e->d_name) < 0) {
			fprintf(stderr, "replay: out of memory\n");
			exit(1);
		}
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		replay_file(names[i]);
		free(names[i]);
	}
	free(names);
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(p);
	return 0;
}

int main(int argc, char **argv)
{
	const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	/* the children's scratch files, all under one directory */
	char tmp[] = "/tmp/meshrun-replay.XXXXXX";
	if (!mkdtemp(tmp)) {
		perror("mkdtemp");
		return 1;
	}
	setenv("TMPDIR", tmp, 1);
	if (argc < 2)
		replay_path(FUZZ_CORPUS);
	for (int i = 1; i < argc; i++)
		replay_path(argv[i]);
	nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	if (passed + failed == 0) {
		printf("%s: no inputs found\n", name);
		failed = 1;
	}
	printf("%s: %d passed, %d failed\n", name, passed, failed);
	return failed ? 1 : 0;
}
