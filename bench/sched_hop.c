/* The simulator (host/pipeline/sim.c) with a transfer's time: the table of
 * a config (S hosts x 1 device), simulated at F, I, W milliseconds an
 * action (B = I + W, the owners' actions 0, recompute as the config says)
 * and H milliseconds a message from its send's start to its data at the
 * receiver (every hop; `meshrun schedule` has no hop), of which SEND ms
 * keep the sending stage in its send call (its device thread's share:
 * `meshrun bench link --pingpong`'s oneway_us and "# send" line). Prints
 * the longest stage span with free messages and at H, SEND, in ms:
 *   "span0 spanH"
 * For bench/sched_sleep.sh. Built against build/libmeshrun.a:
 *   cc -std=c11 -D_GNU_SOURCE -O2 -I. -Ibuild bench/sched_hop.c build/libmeshrun.a $(LIBS)
 * usage: sched_hop CONFIG S F I W H SEND [key=value ...] */
#include <stdio.h>
#include <stdlib.h>

#include "host/config/config.h"
#include "host/model/model.h"
#include "host/pipeline/pipe_config.h"
#include "host/pipeline/schedule.h"

static double span_at(const struct pipe_config *pc, struct pipe_costs c, char *err, size_t errlen)
{
	struct pipe_table t;
	if (pipe_table_build(&t, &pc->shape, err, errlen))
		return -1;
	if (pc->shape.recompute) {
		c.b += c.f;
		c.i += c.f;
	}
	double p = pipe_table_simulate(&t, &c, false, err, errlen) ? -1 : t.period;
	pipe_table_free(&t);
	return p;
}

int main(int argc, char **argv)
{
	static struct cfg c;
	struct model_dims d;
	struct pipe_config pc;
	char err[1024];
	if (argc < 8) {
		fprintf(stderr, "usage: sched_hop CONFIG S F I W H SEND [key=value ...]\n");
		return 2;
	}
	int S = atoi(argv[2]);
	double f = atof(argv[3]), i = atof(argv[4]), w = atof(argv[5]), h = atof(argv[6]);
	double snd = atof(argv[7]);
	cfg_defaults(&c);
	int rc = cfg_load_file(&c, argv[1], err, sizeof(err));
	for (int k = 8; !rc && k < argc; k++)
		rc = cfg_override(&c, argv[k], err, sizeof(err));
	if (!rc)
		rc = cfg_finish(&c, S, 1, err, sizeof(err));
	if (!rc)
		rc = model_dims_from_cfg(&d, &c, err, sizeof(err));
	if (!rc)
		rc = pipe_config_resolve(&pc, &c, &d, err, sizeof(err));
	struct pipe_costs pcost = { .f = f, .i = i, .w = w, .b = i + w };
	double s0 = rc ? -1 : span_at(&pc, pcost, err, sizeof(err));
	pcost.hop = h;
	pcost.send = snd;
	double sh = s0 < 0 ? -1 : span_at(&pc, pcost, err, sizeof(err));
	if (sh < 0) {
		fprintf(stderr, "sched_hop: %s\n", err);
		return 1;
	}
	printf("%g %g\n", s0, sh);
	return 0;
}
