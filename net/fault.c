/* See net/fault.h: parsing fault specs and deciding, frame by frame, when
 * one fires. Pure bookkeeping: the link acts on the answer. */
#include "net/fault.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {
	[FAULT_CLOSE] = "close", [FAULT_DELAY] = "delay", [FAULT_CORRUPT] = "corrupt",
	[FAULT_BLACKHOLE] = "blackhole", [FAULT_DROP] = "drop", [FAULT_HALFOPEN] = "halfopen",
	[FAULT_KILL] = "kill", [FAULT_STOP] = "stop",
};

const char *fault_kind_name(enum fault_kind k)
{
	return k >= FAULT_CLOSE && k <= FAULT_STOP ? kind_names[k] : "?";
}

/* Field bits, for what each kind needs and allows. */
enum { F_LINK = 1, F_HOST = 2, F_FRAME = 4, F_BYTES = 8, F_MS = 16, F_FROM = 32, F_S = 64,
       F_STEP = 128, F_DIR = 256 };

static const struct {
	unsigned need, allow;
	const char *usage;
} kind_fields[] = {
	[FAULT_CLOSE] = { F_LINK, F_LINK | F_FRAME | F_BYTES, "close:link=A-B:frame=K or close:link=A-B:bytes=N" },
	[FAULT_DELAY] = { F_LINK | F_MS, F_LINK | F_MS | F_FROM, "delay:link=A-B:ms=T[:from=K]" },
	[FAULT_CORRUPT] = { F_LINK | F_FRAME, F_LINK | F_FRAME, "corrupt:link=A-B:frame=K" },
	[FAULT_BLACKHOLE] = { F_LINK | F_FRAME | F_S, F_LINK | F_FRAME | F_S, "blackhole:link=A-B:frame=K:s=T" },
	[FAULT_DROP] = { F_LINK | F_FRAME, F_LINK | F_FRAME, "drop:link=A-B:frame=K" },
	[FAULT_HALFOPEN] = { F_LINK | F_FRAME, F_LINK | F_FRAME | F_DIR, "halfopen:link=A-B:frame=K[:dir=out|both]" },
	[FAULT_KILL] = { F_HOST | F_STEP, F_HOST | F_STEP, "kill:host=H:step=S" },
	[FAULT_STOP] = { F_HOST | F_STEP, F_HOST | F_STEP, "stop:host=H:step=S" },
};

/* A whole non-negative integer, or a non-negative number if frac. */
static bool parse_num(const char *v, bool frac, double *out)
{
	char *end;
	if (!*v || *v == '-' || *v == '+')
		return false;
	errno = 0;
	double x = frac ? strtod(v, &end) : (double)strtoull(v, &end, 10);
	if (*end || errno || !(x >= 0) || x > 1e15)
		return false;
	*out = x;
	return true;
}

static int bad(const char *spec, char *err, size_t errlen, const char *fmt, const char *what)
{
	char why[200];
	snprintf(why, sizeof(why), fmt, what);
	snprintf(err, errlen, "fault '%s': %s", spec, why);
	return -EINVAL;
}

/* One key=value field into s; seen collects the field bits. */
static int parse_field(struct fault_spec *s, const char *spec, char *f, unsigned *seen,
		       char *err, size_t errlen)
{
	char *eq = strchr(f, '=');
	if (!eq)
		return bad(spec, err, errlen, "field '%s' wants key=value", f);
	*eq = 0;
	const char *k = f, *v = eq + 1;
	double x;
	unsigned bit;
	if (!strcmp(k, "link")) {
		int a, b, used = 0;
		if (sscanf(v, "%d-%d%n", &a, &b, &used) != 2 || v[used] || a < 0 || b < 0 || a == b)
			return bad(spec, err, errlen, "link wants two different host ids A-B, got '%s'", v);
		s->from_host = a;
		s->to_host = b;
		bit = F_LINK;
	} else if (!strcmp(k, "host")) {
		if (!parse_num(v, false, &x))
			return bad(spec, err, errlen, "host wants a host id, got '%s'", v);
		s->from_host = (int)x;
		bit = F_HOST;
	} else if (!strcmp(k, "frame") || !strcmp(k, "from")) {
		if (!parse_num(v, false, &x) || x < 1)
			return bad(spec, err, errlen, "frame and from count data frames from 1, got '%s'", v);
		s->frame = (uint64_t)x;
		bit = k[1] == 'r' && k[2] == 'a' ? F_FRAME : F_FROM;
	} else if (!strcmp(k, "bytes")) {
		if (!parse_num(v, false, &x) || x < 1)
			return bad(spec, err, errlen, "bytes wants a positive byte count, got '%s'", v);
		s->bytes = (uint64_t)x;
		bit = F_BYTES;
	} else if (!strcmp(k, "ms") || !strcmp(k, "s")) {
		bool ms = k[0] == 'm';
		if (!parse_num(v, true, &x) || x <= 0 || x > (ms ? 3600e3 : 3600))
			return bad(spec, err, errlen, "ms and s want a positive time up to an hour, got '%s'", v);
		s->hold_ns = (uint64_t)(x * (ms ? 1e6 : 1e9));
		bit = ms ? F_MS : F_S;
	} else if (!strcmp(k, "dir")) {
		if (strcmp(v, "out") && strcmp(v, "both"))
			return bad(spec, err, errlen, "dir wants out or both, got '%s'", v);
		s->both = v[0] == 'b';
		bit = F_DIR;
	} else if (!strcmp(k, "step")) {
		if (!parse_num(v, false, &x))
			return bad(spec, err, errlen, "step wants a step number, got '%s'", v);
		s->step = (int64_t)x;
		bit = F_STEP;
	} else {
		return bad(spec, err, errlen, "unknown field '%s' (link, host, frame, bytes, ms, from, s, dir, step)", k);
	}
	if (*seen & bit)
		return bad(spec, err, errlen, "field '%s' given twice", k);
	*seen |= bit;
	return 0;
}

int fault_parse(struct fault_plan *p, const char *spec, int num_hosts, char *err, size_t errlen)
{
	char buf[256];
	struct fault_spec s = { .from_host = -1, .to_host = -1 };
	unsigned seen = 0;
	int kind = -1;

	if (p->n >= FAULT_MAX)
		return bad(spec, err, errlen, "more than %s faults", "16");
	if (strlen(spec) >= sizeof(buf))
		return bad(spec, err, errlen, "%s", "longer than 255 bytes");
	if (strchr(spec, ','))
		return bad(spec, err, errlen, "%s", "fields are separated by ':', not ','");
	snprintf(buf, sizeof(buf), "%s", spec);
	char *save = NULL, *tok = strtok_r(buf, ":", &save);
	for (int k = FAULT_CLOSE; tok && k <= FAULT_STOP; k++)
		if (!strcmp(tok, kind_names[k]))
			kind = k;
	if (kind < 0)
		return bad(spec, err, errlen, "unknown kind '%s' (close, delay, corrupt, blackhole, drop, halfopen, kill, stop)",
			   tok ? tok : "");
	s.kind = (enum fault_kind)kind;
	while ((tok = strtok_r(NULL, ":", &save)))
		if (parse_field(&s, spec, tok, &seen, err, errlen))
			return -EINVAL;
	unsigned need = kind_fields[kind].need, allow = kind_fields[kind].allow;
	bool close_ok = kind != FAULT_CLOSE || !(seen & F_FRAME) != !(seen & F_BYTES);
	if ((seen & need) != need || (seen & ~allow) || !close_ok)
		return bad(spec, err, errlen, "wants %s", kind_fields[kind].usage);
	if (kind == FAULT_DELAY && !s.frame)
		s.frame = 1;
	int top = s.from_host > s.to_host ? s.from_host : s.to_host;
	if (num_hosts > 0 && top >= num_hosts) {
		char why[64];
		snprintf(why, sizeof(why), "%d", num_hosts);
		return bad(spec, err, errlen, "names a host beyond the job's %s hosts", why);
	}
	p->spec[p->n++] = s;
	return 0;
}

bool fault_decide(struct fault_plan *p, int self, int peer, uint64_t bytes, struct fault_hit *hit)
{
	bool fired = false;
	for (int i = 0; i < p->n; i++) {
		struct fault_spec *s = &p->spec[i];
		if (s->kind >= FAULT_KILL || s->from_host != self || s->to_host != peer)
			continue;
		uint64_t k = ++s->seen_frames;
		s->seen_bytes += bytes;
		if (fired || (s->fired && s->kind != FAULT_DELAY))
			continue;
		bool now;
		if (s->kind == FAULT_DELAY)
			now = k >= s->frame;
		else if (s->kind == FAULT_CLOSE && s->bytes)
			now = s->seen_bytes > s->bytes;
		else
			now = k == s->frame;
		if (!now)
			continue;
		s->fired = true;
		*hit = (struct fault_hit){ .kind = s->kind, .frame = k, .hold_ns = s->hold_ns,
					   .first = k == s->frame, .both = s->both };
		fired = true;
	}
	return fired;
}

int fault_host_action(const struct fault_plan *p, int host, int64_t step)
{
	for (int i = 0; i < p->n; i++) {
		const struct fault_spec *s = &p->spec[i];
		if ((s->kind == FAULT_KILL || s->kind == FAULT_STOP) && s->from_host == host &&
		    s->step == step)
			return s->kind;
	}
	return -1;
}
