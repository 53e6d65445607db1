/* (d) A YAML config with overrides (host/config/config.h): the input up to
 * its first NUL byte is the config file, each line after it one key=value
 * override. The file lies in a scratch directory beside a small base.yml,
 * so `base_config: base.yml` (and loops through cfg.yml itself) work; the
 * target is linked with -Wl,--wrap=fopen and opens nothing for reading
 * outside that directory, whatever path the input names (writes pass:
 * libFuzzer, linked into the same binary, writes its corpus with fopen).
 * Properties: a failure always says why; a config that loads is written
 * by cfg_write_yaml (what a checkpoint stores) and reads back to the same
 * canonical text. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "host/config/config.h"
#include "tests/fuzz/fuzz.h"

FILE *__real_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode);

FILE *__wrap_fopen(const char *path, const char *mode)
{
	const char *dir = fuzz_tmpdir();
	size_t n = strlen(dir);
	if (mode[0] == 'r' &&
	    (strncmp(path, dir, n) || path[n] != '/' || strstr(path + n, "/.."))) {
		errno = EACCES;
		return NULL;
	}
	return __real_fopen(path, mode);
}

static const char base_yml[] =
	"# a base config\n"
	"base_emb_dim: 64\n"
	"hosts: [\"127.0.0.1:7001\", \"127.0.0.1:7002\"]\n"
	"opt_type: muon\n"
	"learning_rate: 1e-3\n";

/* Strict UTF-8, as libyaml reads it (no overlong forms, no surrogates) */
static bool utf8_ok(const unsigned char *s)
{
	while (*s) {
		unsigned c = *s, cp, n;
		if (c < 0x80) {
			s++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			n = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 3, cp = c & 0x07;
		else
			return false;
		for (unsigned i = 1; i <= n; i++) {
			if ((s[i] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		s += n + 1;
	}
	return true;
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "rb");
	FUZZ_CHECK(f);
	static char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strdup(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct cfg c, d, e;
	static char path[256], base[256], out[256], out2[256], line[1024];
	char err[600];
	bool roundtrip = true;
	int rc;

	if (size > 16384)
		return 0;
	if (!path[0]) {
		snprintf(path, sizeof(path), "%s/cfg.yml", fuzz_tmpdir());
		snprintf(base, sizeof(base), "%s/base.yml", fuzz_tmpdir());
		snprintf(out, sizeof(out), "%s/out.yml", fuzz_tmpdir());
		snprintf(out2, sizeof(out2), "%s/out2.yml", fuzz_tmpdir());
		fuzz_write_file(base, base_yml, sizeof(base_yml) - 1);
	}
	const uint8_t *nul = memchr(data, 0, size);
	size_t ylen = nul ? (size_t)(nul - data) : size;
	fuzz_write_file(path, data, ylen);

	cfg_defaults(&c);
	err[0] = 0;
	rc = cfg_load_file(&c, path, err, sizeof(err));
	FUZZ_CHECK(rc <= 0 && (rc == 0 || err[0]));
	if (rc)
		return 0;
	if (nul) {
		const uint8_t *s = nul + 1, *end = data + size;
		while (s < end) {
			const uint8_t *nl = memchr(s, '\n', (size_t)(end - s));
			size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
			size_t k = n < sizeof(line) - 1 ? n : sizeof(line) - 1;
			memcpy(line, s, k);
			line[k] = 0;            /* a NUL inside ends the line early */
			/* the file can hold only UTF-8; libyaml reads nothing else */
			roundtrip &= utf8_ok((const unsigned char *)line);
			err[0] = 0;
			rc = cfg_override(&c, line, err, sizeof(err));
			FUZZ_CHECK(rc == 0 || (rc == -EINVAL && err[0]));
			if (rc)
				return 0;
			s += n + (nl ? 1 : 0);
		}
	}

	e = c;
	err[0] = 0;
	rc = cfg_finish(&e, 0, 0, err, sizeof(err));
	FUZZ_CHECK(rc == 0 || (rc == -EINVAL && err[0]));
	e = c;
	err[0] = 0;
	rc = cfg_finish(&e, 2, 4, err, sizeof(err));
	FUZZ_CHECK(rc == 0 || (rc == -EINVAL && err[0]));
	if (!rc)
		FUZZ_CHECK(e.num_hosts == 2 && e.devices_per_host == 4);

	/* what a checkpoint writes reads back as the same config */
	if (!roundtrip)
		return 0;
	FUZZ_CHECK(!cfg_write_yaml(&c, out, err, sizeof(err)));
	cfg_defaults(&d);
	err[0] = 0;
	rc = cfg_load_file(&d, out, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "cfg_write_yaml wrote a file that does not load: %s\n", err);
		abort();
	}
	FUZZ_CHECK(!cfg_write_yaml(&d, out2, err, sizeof(err)));
	char *t1 = read_all(out), *t2 = read_all(out2);
	if (strcmp(t1, t2)) {
		fprintf(stderr, "cfg_write_yaml does not round-trip:\n--- written\n%s--- reread\n%s",
			t1, t2);
		abort();
	}
	uint8_t h1[32], h2[32];
	cfg_hash(&c, h1);
	cfg_hash(&d, h2);
	FUZZ_CHECK(!memcmp(h1, h2, sizeof(h1)));
	free(t1);
	free(t2);
	return 0;
}
