/* Shared by the fuzz targets in tests/fuzz/: each defines
 * LLVMFuzzerTestOneInput, which libFuzzer drives (make fuzz, clang) and
 * replay.c drives over the seed corpora (make test, gcc). A broken
 * property aborts, so both report it as a crash. */
#ifndef MESHRUN_FUZZ_H
#define MESHRUN_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                              \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: fuzz property broken: %s\n", __FILE__, \
				__LINE__, #cond);                                     \
			abort();                                                      \
		}                                                                     \
	} while (0)

/* A private directory for the process's scratch files (created on first
 * use, removed with its contents at exit). */
const char *fuzz_tmpdir(void);
/* Writes len bytes to path; aborts on failure (the harness, not the code
 * under test, failed). */
void fuzz_write_file(const char *path, const void *data, size_t len);

/* With FUZZ_VERBOSE set, says why an input was turned away (to check
 * that a seed reaches the code it was written for). */
void fuzz_note(const char *what, const char *why);

#endif
