/* See host/launch/hostfile.h. */
#include "host/launch/hostfile.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A host name or address: letters, digits, '.', '-', '_', or an IPv6
 * address in brackets. Nothing a shell or ssh would read as an option. */
static int valid_host(const char *h)
{
	size_t n = strlen(h);
	if (!n || h[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)h[i]) && !strchr(".-_", h[i]))
			return 0;
	return 1;
}

static int valid_user(const char *u)
{
	if (!*u || u[0] == '-')
		return 0;
	for (; *u; u++)
		if (!isalnum((unsigned char)*u) && !strchr("._-", *u))
			return 0;
	return 1;
}

/* One line's words (after comments are cut): the machine, then options. */
static int parse_line(char *s, struct hostfile_entry *e, char *what, size_t wl)
{
	char *save = NULL, *w = strtok_r(s, " \t\r", &save), *opt;
	memset(e, 0, sizeof(*e));
	char *at = strchr(w, '@');
	if (at) {
		*at = 0;
		if (strlen(w) >= sizeof(e->user) || !valid_user(w)) {
			snprintf(what, wl, "bad user name '%s'", w);
			return -1;
		}
		snprintf(e->user, sizeof(e->user), "%s", w);
		w = at + 1;
	}
	char *colon = strchr(w, ':');
	if (colon) {
		char *end;
		long p = strtol(colon + 1, &end, 10);
		if (!colon[1] || *end || p < 1 || p > 65535) {
			snprintf(what, wl, "bad ssh port '%s' (wants 1..65535)", colon + 1);
			return -1;
		}
		e->port = (int)p;
		*colon = 0;
	}
	if (strlen(w) >= sizeof(e->host) || !valid_host(w)) {
		snprintf(what, wl, "bad host '%s'", w);
		return -1;
	}
	snprintf(e->host, sizeof(e->host), "%s", w);
	while ((opt = strtok_r(NULL, " \t\r", &save))) {
		if (!strncmp(opt, "slots=", 6)) {
			char *end;
			long v = strtol(opt + 6, &end, 10);
			if (!opt[6] || *end || v != 1) {
				snprintf(what, wl,
					 "'%s': meshrun runs one agent per machine (slots=1 or none; "
					 "devices come from --devices-per-host)", opt);
				return -1;
			}
			continue;
		}
		snprintf(what, wl, "unexpected '%s' (a line is [user@]host[:port] [slots=1])", opt);
		return -1;
	}
	return 0;
}

int hostfile_parse(const char *name, const char *text, struct hostfile_entry **out, int *n,
		   char *err, size_t errlen)
{
	struct hostfile_entry *v = calloc(HOSTFILE_MAX_HOSTS, sizeof(*v));
	char *copy = strdup(text), what[256];
	int k = 0, lineno = 0, rc = 0;
	if (!v || !copy) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	/* strtok_r would skip empty lines and lose the count: walk by hand */
	for (char *line = copy, *next; line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		if (!line[strspn(line, " \t\r")])
			continue;
		if (k == HOSTFILE_MAX_HOSTS) {
			snprintf(err, errlen, "%s:%d: more than %d machines", name, lineno,
				 HOSTFILE_MAX_HOSTS);
			rc = -EBADMSG;
			goto out;
		}
		if (parse_line(line, &v[k], what, sizeof(what))) {
			snprintf(err, errlen, "%s:%d: %s", name, lineno, what);
			rc = -EBADMSG;
			goto out;
		}
		v[k].line = lineno;
		for (int j = 0; j < k; j++)
			if (!strcmp(v[j].host, v[k].host) && v[j].port == v[k].port) {
				snprintf(err, errlen, "%s:%d: '%s' is already on line %d (one agent per machine)",
					 name, lineno, v[k].host, v[j].line);
				rc = -EBADMSG;
				goto out;
			}
		k++;
	}
	if (!k) {
		snprintf(err, errlen, "%s: no machines in the hostfile", name);
		rc = -EBADMSG;
	}
out:
	free(copy);
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = k;
	return 0;
}

int hostfile_read(const char *path, struct hostfile_entry **out, int *n, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		int e = errno;
		snprintf(err, errlen, "unable to read hostfile '%s': %s", path, strerror(e));
		return -e;
	}
	char *buf = malloc(1 << 20);
	size_t got = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
	fclose(f);
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	buf[got] = 0;
	int rc = hostfile_parse(path, buf, out, n, err, errlen);
	free(buf);
	return rc;
}
