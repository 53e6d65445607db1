/* `meshrun bench WHAT`: matmul peak, raw TLS link throughput, collectives.
 * Benchmarks print figures; they never pass or fail on speed. link and
 * collectives start their own agents on loopback, which run this command
 * again with --agent. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "host/agent/agent.h"
#include "host/bench/bench_coll.h"
#include "host/bench/bench_link.h"
#include "host/bench/bench_matmul.h"
#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"

#define END_FLAGS { NULL, 0, NULL, 0, 0, NULL }

static int cmd_bench_matmul(int argc, char **argv)
{
	int threads = 0, size = 2048, reps = 5;
	struct args a;
	char err[256];
	const struct arg_flag flags[] = {
		{ "--threads", ARG_INT, &threads, 1, 1024, NULL },
		{ "--size", ARG_INT, &size, 1, 16384, NULL },
		{ "--reps", ARG_INT, &reps, 1, 1000, NULL },
		END_FLAGS,
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (!rc && a.noverrides) {
		snprintf(err, sizeof(err), "unexpected argument '%s'", a.overrides[0]);
		rc = -EINVAL;
	}
	args_release(&a);
	if (rc) {
		fprintf(stderr, "meshrun: bench matmul: %s\n"
				"usage: meshrun bench matmul [--threads N] [--size N] [--reps N]\n", err);
		return EXIT_USAGE;
	}
	return cli_exit_code(bench_matmul_run(threads, size, reps));
}

/* A comma-separated list of byte counts, each in [lo, hi]. */
static int parse_list(const char *s, size_t *out, int *n, size_t lo, size_t hi)
{
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*n == BENCH_MAX_LIST || cfg_parse_bytes(t, &out[*n]) || out[*n] < lo || out[*n] > hi)
			return -EINVAL;
		(*n)++;
	}
	return *n ? 0 : -EINVAL;
}

/* The agent half of link and collectives: this host's agent runs job. */
static int bench_agent(const char *who, const struct args *a, const struct mesh_args *m,
		       int want_hosts, agent_job_fn job, void *arg)
{
	static struct cfg cfg;
	char err[640];
	int host_id = -1;
	int rc = cli_agent_cfg(a, m, &cfg, &host_id, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: %s\n", who, err);
		return rc;
	}
	if (want_hosts && cfg.num_hosts != want_hosts) {
		fprintf(stderr, "%s: needs exactly %d hosts, the mesh has %d\n", who, want_hosts,
			cfg.num_hosts);
		return EXIT_USAGE;
	}
	rc = agent_run(&cfg, host_id, NULL, job, arg, err, sizeof(err));
	if (rc)
		fprintf(stderr, "%s: host %d: %s\n", who, host_id, err);
	return cli_exit_code(rc);
}

static const struct arg_flag launcher_only[] = {
	{ "--hosts", ARG_INT, NULL, 0, 0, NULL },
	END_FLAGS,
};

static int cmd_bench_link(int argc, char **argv)
{
	static struct link_opts o;
	const char *sizes = NULL;
	bool agent = false;
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	const struct arg_flag flags[] = {
		{ "--agent", ARG_BOOL, &agent, 0, 0, NULL },
		{ "--oneway", ARG_BOOL, &o.oneway, 0, 0, NULL },
		{ "--sizes", ARG_STR, &sizes, 0, 0, NULL },
		{ "--iters", ARG_INT, &o.iters, 1, 10000000, NULL },
		END_FLAGS,
	};
	memset(&o, 0, sizeof(o));
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { flags, mesh, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "bench link: %s\n", err);
		rc = EXIT_USAGE;
	} else if (!sizes) {
		fprintf(stderr, "usage: meshrun bench link --hosts 2 --sizes 16M[,64K...] [--iters K] [--oneway]\n");
		rc = EXIT_USAGE;
	} else if (parse_list(sizes, o.sizes, &o.nsizes, 1, 1ull << 32)) {
		fprintf(stderr, "bench link: bad size list '%s'\n", sizes);
		rc = EXIT_USAGE;
	} else if (agent) {
		rc = bench_agent("bench link", &a, &m, 2, bench_link_job, &o);
	} else if (m.hosts != 2) {
		fprintf(stderr, "bench link: give --hosts 2\n");
		rc = EXIT_USAGE;
	} else {
		static const char *const prefix[] = { "bench", "link", "--agent" };
		rc = cli_launch_local("bench link", 2, &a, argv, launcher_only, prefix, 3);
	}
	args_release(&a);
	return rc;
}

/* The collectives' own flags, checked; 0 or EXIT_USAGE (printed). */
static int coll_check_opts(struct bench_opts *o, const char *op, const char *sizes,
			   const char *counts)
{
	o->all_ops = op && !strcmp(op, "all");
	for (int k = 0; op && k < B_NOPS; k++)
		if (!strcmp(op, bench_coll_op_names[k]))
			o->op = k;
	if (op && !o->all_ops && o->op < 0) {
		fprintf(stderr, "bench collectives: unknown op '%s' (all_gather, reduce_scatter, "
			"all_reduce, all_to_all, permute, broadcast, all)\n", op);
		return EXIT_USAGE;
	}
	if (sizes && parse_list(sizes, o->sizes, &o->nsizes, 0, SIZE_MAX)) {
		fprintf(stderr, "bench collectives: bad size list '%s'\n", sizes);
		return EXIT_USAGE;
	}
	if (counts && parse_list(counts, o->counts, &o->ncounts, 0, SIZE_MAX)) {
		fprintf(stderr, "bench collectives: bad count list '%s'\n", counts);
		return EXIT_USAGE;
	}
	if (!o->ncounts && !o->nsizes) {
		fprintf(stderr, "bench collectives: give --sizes (with --op) or --check-counts\n");
		return EXIT_USAGE;
	}
	if (!o->ncounts && o->op < 0 && !o->all_ops) {
		fprintf(stderr, "bench collectives: give --op (all_gather, reduce_scatter, "
			"all_reduce, all_to_all, permute, broadcast, all)\n");
		return EXIT_USAGE;
	}
	return 0;
}

static int cmd_bench_coll(int argc, char **argv)
{
	static struct bench_opts o;
	const char *op = NULL, *sizes = NULL, *counts = NULL;
	bool agent = false;
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	o = (struct bench_opts){ .op = -1, .iters = 20, .warmup = 5, .direct_max = -1 };
	const struct arg_flag flags[] = {
		{ "--agent", ARG_BOOL, &agent, 0, 0, NULL },
		{ "--corrupt-for-test", ARG_BOOL, &o.corrupt, 0, 0, NULL },
		{ "--barrier", ARG_BOOL, &o.barrier, 0, 0, NULL },
		{ "--async", ARG_BOOL, &o.async, 0, 0, NULL },
		{ "--op", ARG_STR, &op, 0, 0, NULL },
		{ "--sizes", ARG_STR, &sizes, 0, 0, NULL },
		{ "--check-counts", ARG_STR, &counts, 0, 0, NULL },
		{ "--iters", ARG_INT, &o.iters, 1, 1000000000, NULL },
		{ "--warmup", ARG_INT, &o.warmup, 0, 1000000000, NULL },
		{ "--direct-max", ARG_LONG, &o.direct_max, 0, 1000000000, NULL },
		END_FLAGS,
	};
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { flags, mesh, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "bench collectives: %s\n", err);
		rc = EXIT_USAGE;
	} else if ((rc = coll_check_opts(&o, op, sizes, counts))) {
		/* printed */
	} else if (agent) {
		rc = bench_agent("bench collectives", &a, &m, 0, bench_coll_job, &o);
	} else if (m.hosts < 1) {
		fprintf(stderr, "bench collectives: give --hosts N\n");
		rc = EXIT_USAGE;
	} else {
		static const char *const prefix[] = { "bench", "collectives", "--agent" };
		rc = cli_launch_local("bench collectives", m.hosts, &a, argv, launcher_only, prefix, 3);
	}
	args_release(&a);
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "matmul"))
		return cmd_bench_matmul(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "link"))
		return cmd_bench_link(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "collectives"))
		return cmd_bench_coll(argc - 1, argv + 1);
	fprintf(stderr, "usage: meshrun bench matmul [--threads N] [--size N]\n"
			"       meshrun bench link --hosts 2 --sizes 16M[,64K] [--iters K] [--oneway]\n"
			"       meshrun bench collectives --hosts N [--devices-per-host D] --op OP "
			"--sizes 64K,1M,16M [--iters K] [--warmup W] [--barrier] [--async] [key=value ...]\n");
	return EXIT_USAGE;
}
